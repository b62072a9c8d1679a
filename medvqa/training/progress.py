"""Progress lines for Lightning loops (`medvqa.progress`): fitting and generation.

Global rank 0 logs them; the other ranks' work is in the totals (a fit's steps are global; a
generation's rows count every rank's shard, each rank doing about the same share).
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

from medvqa.progress import Ticker, settings


def _scalar(value: Any) -> float | None:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.detach())
    return float(value) if isinstance(value, int | float) else None


class FitProgress(L.Callback):
    """A line every `progress.every_n_steps` optimiser steps or `progress.every_s` seconds:
    step / total, epoch, loss, learning rate, samples/s, ETA (`medvqa.progress`)."""

    def __init__(self) -> None:
        self.ticker: Ticker | None = None
        self.samples = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        total = int(trainer.estimated_stepping_batches)
        self.ticker = Ticker(
            "fit",
            total if total > 0 else None,
            "steps",
            every_n=int(settings().every_n_steps),
            first=int(trainer.global_step),  # a resumed fit's rate is this process's steps
        )
        self.samples = 0

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        ticker = self.ticker
        if ticker is None:
            return
        self.samples += int(batch["input_ids"].shape[0]) * trainer.world_size
        step = int(trainer.global_step)
        if not ticker.due(step):
            return
        extra = {"epoch": f"{trainer.current_epoch + 1}/{trainer.max_epochs}"}
        for key in ("train/loss", "val/loss"):
            value = _scalar(trainer.callback_metrics.get(key))
            if value is not None:
                extra[key.replace("/", " ")] = f"{value:.4g}"
        if trainer.optimizers:
            extra["lr"] = f"{trainer.optimizers[0].param_groups[0]['lr']:.3g}"
        elapsed = ticker.clock() - ticker.start
        if elapsed > 0:
            extra["samples/s"] = f"{self.samples / elapsed:.3g}"
        ticker.update(step, extra)


class PredictProgress(L.Callback):
    """A line every `progress.every_s` seconds of a predict loop: rows / total, rows/s, ETA."""

    def __init__(self, what: str = "generate") -> None:
        self.what = what
        self.ticker: Ticker | None = None
        self.rows = 0

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        data = trainer.datamodule
        total = getattr(data, "n_todo", None)
        what = getattr(data, "progress_label", None) or self.what
        self.ticker = Ticker(what, int(total) if total is not None else None, "rows")
        self.rows = 0

    def on_predict_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self.ticker is None:
            return
        # Every rank answers about as many rows per batch as this one.
        self.rows += len(outputs) * trainer.world_size if outputs is not None else 0
        total = self.ticker.total
        self.ticker.update(min(self.rows, total) if total is not None else self.rows)
