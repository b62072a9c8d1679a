"""DeepSpeed ZeRO-2 wiring on CPU (test-only strategy): adapters train, save non-empty, reload."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf

from medvqa.data.datamodule import VQADataset, make_loader
from medvqa.models.adapters import apply_method
from medvqa.models.loading import load_vlm, roles
from medvqa.models.saving import WEIGHTS_FILE, load_trainable, save_trainable
from medvqa.training.module import VQAModule
from tests.conftest import SMALL, compose

deepspeed = pytest.importorskip("deepspeed", reason="deepspeed is in the dev extra")


def test_zero2_trains_saves_and_reloads_the_adapter(
    tiny_model_dir: Path, cache_dir: Path, tmp_path: Path
) -> None:
    from hydra.utils import instantiate
    from safetensors.torch import load_file

    from tests.zero2_cpu import CPUZero2Strategy

    cfg = compose([*SMALL, "peft=lora"], cache_dir)
    spec = OmegaConf.create({"name": "tiny", "pretrained": str(tiny_model_dir), "dtype": "float32"})
    model, processor = load_vlm(spec)
    model = apply_method(model, cfg.peft, roles(cfg.model))
    source = instantiate(cfg.dataset)
    loader = make_loader(
        VQADataset(source.table().head(16), source, processor, with_answer=True),
        4,
        shuffle=False,
        padding_side="right",
    )
    trainer = L.Trainer(
        accelerator="cpu",
        strategy=CPUZero2Strategy(),
        precision="bf16-mixed",
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(VQAModule(model, lr=1e-2), train_dataloaders=loader)
    assert isinstance(trainer.strategy.model, deepspeed.DeepSpeedEngine)
    assert trainer.strategy.config["zero_optimization"]["stage"] == 2
    assert trainer.global_step == 2

    save_trainable(model, tmp_path, "lora")
    saved = load_file(str(tmp_path / WEIGHTS_FILE))
    assert saved and all(t.numel() > 0 and torch.isfinite(t.float()).all() for t in saved.values())
    lora_b = [t for name, t in saved.items() if "lora_B" in name]
    assert lora_b and any(t.abs().sum() > 0 for t in lora_b), "ZeRO-2 updated the adapter"

    fresh, _ = load_vlm(spec)
    fresh = apply_method(fresh, cfg.peft, roles(cfg.model))
    load_trainable(fresh, tmp_path, "lora")
    for name, param in fresh.named_parameters():
        if param.requires_grad:
            assert torch.equal(param.detach(), saved[name].to(param.dtype)), name
