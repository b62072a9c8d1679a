"""Test helper: train the tiny LLaVA with LoRA (float32, dropout 0) on 40 synthetic rows with a
given micro-batch, accumulation, number of gloo ranks and strategy, and save the trained tensors.
Spawned once per rank for the two-rank case (tests/test_split_invariance.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning as L
import torch
from omegaconf import OmegaConf

ROWS = 40  # 16 x 1: steps of 16, 16, 8 (a shorter last step in each epoch)


def train(
    tiny_model_dir: str,
    cache_dir: str,
    out: str,
    batch_size: int,
    accumulate: int,
    *,
    ranks: int = 1,
    rank: int = 0,
    port: int = 0,
    deepspeed: bool = False,
    step_tokens: bool = True,
    epochs: int = 2,
    rows: int = ROWS,
) -> None:
    """Fit, then (rank 0) save {name: tensor} of the trained parameters to `out`.
    `step_tokens=False`: the loader's step counts are dropped (each micro-batch its own token
    mean, the objective before the fix), to show the test can tell the two apart."""
    if ranks > 1:  # as a launcher would have set them: Lightning then starts no processes
        os.environ.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            WORLD_SIZE=str(ranks),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            NODE_RANK="0",
        )
    from hydra.utils import instantiate

    from medvqa.models.adapters import apply_method
    from medvqa.models.loading import load_vlm, roles
    from medvqa.training import datamodule as dm
    from medvqa.training.module import VQAModule
    from tests.conftest import SMALL, compose

    L.seed_everything(0, verbose=False)
    cfg = compose([*SMALL, "peft=lora", "peft.adapter.lora_dropout=0"], Path(cache_dir))
    spec = OmegaConf.create({"name": "tiny", "pretrained": tiny_model_dir, "dtype": "float32"})
    model, processor = load_vlm(spec)
    model = apply_method(model, cfg.peft, roles(cfg.model))
    source = instantiate(cfg.dataset)
    table = source.table()
    frames = {"train": table.head(rows), "val": table.head(4)}
    data = dm.VQADataModule(frames, source, processor, batch_size=batch_size, num_workers=0)
    if not step_tokens:
        data = _without_step_tokens(data)
    module = VQAModule.for_method(model, cfg.peft, roles(cfg.model)["projector"])
    strategy: Any = "ddp" if ranks > 1 else "auto"
    if deepspeed:
        from tests.zero2_cpu import CPUZero2Strategy

        strategy = CPUZero2Strategy()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=ranks,
        strategy=strategy,
        precision="32-true",
        max_epochs=epochs,
        accumulate_grad_batches=accumulate,
        gradient_clip_val=1.0,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, datamodule=data)
    if trainer.is_global_zero:
        trained = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        torch.save({"tensors": trained, "global_step": trainer.global_step}, out)


def _without_step_tokens(data: Any) -> Any:
    """`data` (a VQADataModule) with training batches that carry no step count."""
    build = data.train_dataloader

    def train_dataloader() -> Any:
        loader = build()
        loader._with_step_tokens = lambda batches, first: iter(batches)
        return loader

    data.train_dataloader = train_dataloader
    return data


def spawned(rank: int, kwargs: dict[str, Any]) -> None:
    """torch.multiprocessing entry point: rank `rank` of `kwargs["ranks"]`."""
    train(**kwargs, rank=rank)
