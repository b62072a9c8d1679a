"""Test-only: DeepSpeed ZeRO stage 2 on CPU, to test the wiring without GPUs.

Lightning's DeepSpeedStrategy refuses anything but CUDA; this subclass of the project's
(`medvqa.training.strategies.DeepSpeedStrategy`, the one conf/trainer/deepspeed_zero2.yaml
names) skips that check and runs one process on `cpu:0` with the gloo backend. Never use it
for real training.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.strategies import DDPStrategy

from medvqa.training.strategies import DeepSpeedStrategy


class CPUZero2Strategy(DeepSpeedStrategy):
    cuda_only = False  # medvqa.training.hardware.check_trainer lets it run here

    def __init__(self, **kwargs: Any) -> None:
        """`kwargs` go to DeepSpeedStrategy (e.g. `exclude_frozen_parameters`), as in the configs."""
        super().__init__(
            stage=2,
            parallel_devices=[torch.device("cpu", 0)],
            process_group_backend="gloo",
            **kwargs,
        )

    def setup_environment(self) -> None:
        DDPStrategy.setup_environment(self)  # skip DeepSpeedStrategy's CUDA-only check
