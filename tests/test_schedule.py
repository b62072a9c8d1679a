"""The learning-rate schedule the training module steps: linear warmup, then cosine to zero over
the optimiser steps Lightning estimates, gradient accumulation included."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
from omegaconf import OmegaConf

from medvqa.models.adapters import apply_method
from medvqa.models.loading import load_vlm, roles
from medvqa.training.datamodule import VQADataset, make_loader
from medvqa.training.module import VQAModule
from tests.conftest import SMALL, compose


class LrLog(L.Callback):
    """The rate of each group when an optimiser step is taken (after accumulation)."""

    def __init__(self) -> None:
        self.lrs: list[dict[str, float]] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.lrs.append({g["name"]: g["lr"] for g in optimizer.param_groups})


@pytest.mark.slow
def test_warmup_then_cosine_over_the_accumulated_steps(
    tiny_model_dir: Path, cache_dir: Path
) -> None:
    """16 rows, batch 2, accumulating 2 batches: 8 batches, 4 optimiser steps. Warmup ratio
    0.25 -> ceil(0.25 * 4) = 1 warmup step. transformers' cosine with warmup, by hand:
    step 0: 0/1 = 0; then 0.5 * (1 + cos(pi * p)) with p = (step - 1) / 3:
    step 1: p = 0 -> 1; step 2: p = 1/3 -> 0.75; step 3: p = 2/3 -> 0.25."""
    from hydra.utils import instantiate

    cfg = compose([*SMALL, "peft=lora"], cache_dir)
    model, processor = load_vlm(
        OmegaConf.create({"name": "tiny", "pretrained": str(tiny_model_dir)})
    )
    model = apply_method(model, cfg.peft, roles(cfg.model), processor)
    source = instantiate(cfg.dataset)
    rows = VQADataset(source.table().head(16), source, processor, with_answer=True)
    loader = make_loader(rows, 2, shuffle=False, padding_side="right")
    module = VQAModule(
        model,
        lr=1e-2,
        warmup_ratio=0.25,
        projector_lr=2e-5,
        projector=roles(cfg.model)["projector"],
    )
    lr_log = LrLog()
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        accumulate_grad_batches=2,
        logger=False,
        callbacks=[lr_log],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, train_dataloaders=loader)

    assert trainer.estimated_stepping_batches == 4 and trainer.global_step == 4
    factors = [0.0, 1.0, 0.75, 0.25]
    assert [s["method"] for s in lr_log.lrs] == pytest.approx([1e-2 * f for f in factors])
    assert [s["projector"] for s in lr_log.lrs] == pytest.approx([2e-5 * f for f in factors])
