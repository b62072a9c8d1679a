"""What hardware a trainer needs: fail at once, with the fix in the message, when it is absent."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from medvqa.cluster import GPU_ACCELERATORS

# The Lightning precision that autocasts to each half dtype (`model.dtype` names): half-precision
# frozen weights and fp32 trainables mix only inside autocast (medvqa.models.adapters.apply_method
# makes trainables fp32).
MIXED_PRECISION = {"bfloat16": "bf16-mixed", "float16": "16-mixed"}


log = logging.getLogger(__name__)

# PyTorch reads it when its CUDA caching allocator starts (the first allocation).
ALLOC_CONF_ENV = "PYTORCH_CUDA_ALLOC_CONF"


def configure_cuda_allocator(setting: str | None, environ: Any = os.environ) -> None:
    """Apply `cuda_allocator` (e.g. "expandable_segments:True") before anything allocates on a
    GPU, for this process and the ranks it starts (they inherit the environment). A value the
    user exported wins; null leaves PyTorch's default. Why a default at all: on an H200 the
    study's 7B LoRA fit reserved 120.2 GiB for 103.2 allocated with PyTorch's default segments,
    104.0 with expandable ones, at the same speed
    (docs/gpus.md#a-whole-job-on-one-gpu-make-gpu-check)."""
    if not setting:
        return
    current = environ.get(ALLOC_CONF_ENV)
    if current is None:
        environ[ALLOC_CONF_ENV] = str(setting)
    elif current != str(setting):
        log.info(
            "%s=%s from the environment (cuda_allocator=%s not applied)",
            ALLOC_CONF_ENV,
            current,
            setting,
        )


class HardwareError(RuntimeError):
    """The chosen trainer cannot run on this machine."""


def _strategy_name(strategy: Any) -> str:
    """A strategy's name from the config: a registry string ("deepspeed_stage_2"), an object
    spec's `_target_` (lightning.pytorch.strategies.DeepSpeedStrategy) or an instance's class."""
    if isinstance(strategy, str):
        return strategy
    if isinstance(strategy, Mapping):
        return str(strategy.get("_target_", strategy))
    return type(strategy).__qualname__


def check_trainer(trainer_cfg: Any, cuda_available: bool | None = None) -> None:
    """DeepSpeed and `accelerator: gpu` need CUDA; say so before any data or model is loaded."""
    if cuda_available is None:
        import torch  # only when checking: the module is imported by config-only tools too

        cuda_available = torch.cuda.is_available()
    from medvqa.training.spec import TrainerSchema
    from medvqa.training.strategies import needs_cuda  # imports lightning: only when checking

    # A partial trainer config (tests, scripts) means the schema's values: declared there once.
    strategy_cfg = trainer_cfg.get("strategy", TrainerSchema.strategy)
    strategy = _strategy_name(strategy_cfg)
    accelerator = str(trainer_cfg.get("accelerator", TrainerSchema.accelerator))
    if needs_cuda(strategy_cfg) and not cuda_available:
        raise HardwareError(
            f"trainer strategy {strategy!r} (DeepSpeed ZeRO) needs CUDA GPUs, and "
            "torch.cuda.is_available() is False here. Use trainer=cpu on this machine, or run "
            "on a GPU node with the gpu extra installed (pip install -e '.[gpu]')."
        )
    if accelerator in GPU_ACCELERATORS and not cuda_available:
        raise HardwareError(
            f"trainer accelerator {accelerator!r} needs a CUDA GPU, and none is visible "
            "(torch.cuda.is_available() is False). Use trainer=cpu."
        )


def check_precision(trainer_cfg: Any, model_cfg: Any) -> None:
    """A bf16/fp16 base must be fitted with a mixed trainer precision; say so before loading.

    With "32-true" the fp32 trainables meet half-precision activations without autocast and a
    matmul fails (the fp32 projector on bf16 image features); with "bf16-true"/"16-true"
    Lightning casts the trainables back to half and AdamW's updates round away.
    """
    from medvqa.models.loading import model_option, torch_dtype
    from medvqa.training.spec import TrainerSchema

    dtype = str(torch_dtype(model_cfg)).removeprefix("torch.")
    precision = str(trainer_cfg.get("precision", TrainerSchema.precision))
    if dtype in MIXED_PRECISION and precision not in MIXED_PRECISION.values():
        raise HardwareError(
            f"model.dtype={model_option(model_cfg, 'dtype')} (half precision) cannot be fitted "
            f"with trainer.precision={precision!r}: the trainable parameters are float32 and "
            f"need autocast. Set trainer.precision={MIXED_PRECISION[dtype]} (trainer=gpu and "
            "trainer=deepspeed_zero2 do), or load the model in float32 with model.dtype=float32."
        )
