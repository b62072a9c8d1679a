"""Which Lightning strategy does what: DeepSpeed trains (ZeRO-2 shards what full fine-tuning
cannot hold), DDP generates.

ZeRO-2 shards optimizer state and gradients; inference has neither, so DeepSpeed brings nothing
to generation and its inference set-up costs a re-broadcast of the weights and, worse, wipes
every module hook (Lightning's `_initialize_deepspeed_inference` calls `remove_module_hooks`),
including the output-capturing hooks transformers installs once per model: a LLaVA's vision
tower then returns no hidden states and generation fails from the second call on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hydra.utils import get_class
from lightning.pytorch.strategies import DeepSpeedStrategy as LightningDeepSpeed

# Floating dtype names DeepSpeed's config accepts for communication and gradient accumulation.
DEEPSPEED_DTYPES = ("fp32", "bf16", "fp16")


class DeepSpeedStrategy(LightningDeepSpeed):
    """Lightning's DeepSpeed strategy with gradients reduced and accumulated in float32.

    DeepSpeed casts the whole module to bf16 and, unless told otherwise, reduces gradients and
    accumulates them over micro-batches in bf16 (deepspeed `engine.py`: `communication_data_type`
    and `data_types.grad_accum_dtype` default to the model dtype). A bf16 sum over 8 ranks or
    4 micro-batches keeps 8 bits of mantissa; the fp32 master weights then step on a rounded
    gradient, and the run trains other numbers than the same job under DDP (fp32 gradients).
    `communication_data_type` and `grad_accum_dtype` go into the generated DeepSpeed config.
    """

    cuda_only = True  # Lightning's DeepSpeed refuses other accelerators (see needs_cuda)

    def __init__(
        self,
        *args: Any,
        communication_data_type: str | None = "fp32",
        grad_accum_dtype: str | None = "fp32",
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        for key, value in (
            ("communication_data_type", communication_data_type),
            ("grad_accum_dtype", grad_accum_dtype),
        ):
            if value is not None and value not in DEEPSPEED_DTYPES:
                raise ValueError(
                    f"trainer.strategy.{key}={value!r}: choose one of {list(DEEPSPEED_DTYPES)} "
                    "or null (DeepSpeed's default: the model's dtype)."
                )
        assert isinstance(self.config, dict)  # Lightning built or loaded it above
        if communication_data_type is not None:
            self.config.setdefault("communication_data_type", communication_data_type)
        if grad_accum_dtype is not None:
            self.config.setdefault("data_types", {}).setdefault(
                "grad_accum_dtype", grad_accum_dtype
            )


def is_deepspeed(strategy: Any) -> bool:
    """Whether a `trainer.strategy` value is DeepSpeed: a registry name ("deepspeed_stage_2"),
    an object spec (`_target_` a DeepSpeedStrategy subclass) or a strategy instance."""
    if isinstance(strategy, str):
        return "deepspeed" in strategy.lower()
    if isinstance(strategy, Mapping):
        target = strategy.get("_target_")
        if target is None:
            return False
        try:
            return issubclass(get_class(str(target)), LightningDeepSpeed)
        except (ImportError, ValueError):  # resolved when the trainer is built; say it there
            return "deepspeed" in str(target).lower()
    return isinstance(strategy, LightningDeepSpeed)


def needs_cuda(strategy: Any) -> bool:
    """DeepSpeed runs on CUDA GPUs only (Lightning checks at set-up, after the data and model
    are loaded); a subclass that runs elsewhere says so with `cuda_only = False` (the tests'
    CPU strategy)."""
    if not is_deepspeed(strategy):
        return False
    if isinstance(strategy, Mapping):
        try:
            return bool(getattr(get_class(str(strategy["_target_"])), "cuda_only", True))
        except (ImportError, ValueError):
            return True
    return bool(getattr(strategy, "cuda_only", True))


def prediction_strategy(strategy: Any, devices: Any = 1, num_nodes: int = 1) -> Any:
    """The strategy generation runs under: the run's own, except DeepSpeed, which becomes DDP on
    the same devices (the process group the fit made is reused; precision stays the run's), or
    Lightning's single-device default where the run has one device."""
    if not is_deepspeed(strategy):
        return strategy
    one_device = str(devices).strip() in ("1", "[0]") and int(num_nodes) == 1
    return "auto" if one_device else "ddp"
