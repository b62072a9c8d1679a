"""Test-only callbacks that make one rank of a multi-process run misbehave."""

from __future__ import annotations

from typing import Any

import lightning as L


class NaNImagesOnRank(L.Callback):
    """At optimiser step `step`, rank `rank`'s batch gets NaN images: that rank alone computes a
    NaN loss (as a bad sample or an overflow on one GPU would), the others a finite one."""

    def __init__(self, rank: int, step: int) -> None:
        self.rank = rank
        self.step = step

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            batch["pixel_values"].fill_(float("nan"))
