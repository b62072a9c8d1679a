"""The trainer spec (`conf/trainer/*.yaml`): the `lightning.Trainer` arguments. It sits with the
training code, which reads its defaults (`medvqa.training.hardware`); `medvqa.config` registers
it as the trainer group's schema."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class TrainerSchema:
    """The `lightning.Trainer` arguments this project uses (others would be typos)."""

    _target_: str = "lightning.Trainer"
    accelerator: str = "cpu"
    devices: Any = 1
    strategy: Any = "auto"
    precision: Any = "32-true"
    max_epochs: int | None = 1
    max_steps: int = -1
    min_epochs: int | None = None
    accumulate_grad_batches: int = 1
    gradient_clip_val: float | None = 1.0
    log_every_n_steps: int = 10
    val_check_interval: Any = None
    check_val_every_n_epoch: int | None = 1
    limit_train_batches: Any = None
    limit_val_batches: Any = None
    num_sanity_val_steps: int = 0
    enable_progress_bar: bool = True
    enable_model_summary: bool = True
    enable_checkpointing: bool = True
    # Machines, each with `devices` devices (world size = devices x num_nodes); under SLURM
    # hydra.launcher.nodes follows it (launch/README.md, "More than one node").
    num_nodes: int = 1
    deterministic: Any = False
    benchmark: bool | None = None
