"""Which Lightning strategy does what: DeepSpeed trains (ZeRO-2 shards what full fine-tuning
cannot hold), DDP generates.

ZeRO-2 shards optimizer state and gradients; inference has neither, so DeepSpeed brings nothing
to generation and its inference set-up costs a re-broadcast of the weights and, worse, wipes
every module hook (Lightning's `_initialize_deepspeed_inference` calls `remove_module_hooks`),
including the output-capturing hooks transformers installs once per model: a LLaVA's vision
tower then returns no hidden states and generation fails from the second call on.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from hydra.utils import get_class
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from lightning.pytorch.strategies import DeepSpeedStrategy as LightningDeepSpeed

from medvqa.atomic import replace_dir
from medvqa.cluster import GPU_ACCELERATORS, device_count
from medvqa.training.checkpoints import load_weights_only
from medvqa.training.spec import TrainerSchema

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

    Its checkpoint (a directory: each rank writes its optimizer shard) is written under a
    temporary name and renamed by rank 0 once every rank has written, so a kill or a full disk
    mid-save leaves the previous `last.ckpt` whole (`medvqa.training.checkpoints`).
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

    def save_checkpoint(
        self, checkpoint: dict, filepath: Any, storage_options: Any | None = None
    ) -> None:
        final = Path(self.broadcast(str(filepath)))
        tmp = final.with_name(f".{final.name}.tmp")
        if self.is_global_zero and tmp.exists():  # an attempt killed mid-save
            shutil.rmtree(tmp)
        self.barrier("medvqa-checkpoint-start")
        super().save_checkpoint(checkpoint, tmp, storage_options)
        self.barrier("medvqa-checkpoint-written")  # every rank's shard is complete
        if self.is_global_zero:
            replace_dir(tmp, final)
        self.barrier("medvqa-checkpoint-renamed")

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> Any:
        """Resume with every file of the checkpoint read weights-only.

        DeepSpeed reads its shards with `torch.load(weights_only=False)` (deepspeed
        runtime/checkpoint_engine/torch_checkpoint_engine.py `load`): a planted
        `mp_rank_00_model_states.pt` would run its code. Its engine reads every file of a
        (non-universal) checkpoint through `checkpoint_engine.load`, which this replaces with
        `load_weights_only` allowing DeepSpeed's own plain-data classes (`deepspeed_safe_globals`).
        """
        engine = self.deepspeed_engine
        if engine is None or (self.load_full_weights and self.zero_stage_3):
            return super().load_checkpoint(checkpoint_path, weights_only=True)  # checkpoint_io
        if engine.load_universal_checkpoint():
            raise ValueError(
                "trainer.strategy: DeepSpeed's universal checkpoints (checkpoint.load_universal) "
                "are read with torch.load(weights_only=False), which could run code from the "
                f"checkpoint {checkpoint_path} (ckpt_path); resume from the checkpoint this "
                "strategy wrote, without load_universal."
            )
        allowed = deepspeed_safe_globals()

        def load(path: str, map_location: Any = None) -> Any:
            return load_weights_only(path, map_location=map_location, allowed=allowed)

        engine.checkpoint_engine.load = load  # an instance attribute: every engine type's load
        return super().load_checkpoint(checkpoint_path, weights_only=True)


def deepspeed_safe_globals() -> list[Any]:
    """DeepSpeed's classes in a ZeRO-2 checkpoint's optimizer shard (`*_optim_states.pt`, as
    `torch.serialization.get_unsafe_globals_in_checkpoint` lists them), beyond what weights-only
    loads allow. Plain data all: an int Enum (`zero_stage`), a dataclass of two ints
    (`param_slice_mappings`), the loss scalers (numbers, flags and a dtype: bf16 saves the static
    one, fp16 the dynamic one). Unpickling only creates them and sets their attributes."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [ZeroStageEnum, fragment_address, LossScaler, DynamicLossScaler]


class KeepOnDevice:
    """A strategy whose teardown leaves the model and the optimizer state on the device.

    Lightning's teardown moves the module and the optimizer state back to the host after every
    fit and predict. A job runs several Trainers on one model (zero-shot answers, the fit, the
    tuned answers, the extra image modes): a 7B model crossed the bus 15 GB at a time twice per
    Trainer, the host kept a full copy (and, after full fine-tuning, the AdamW moments) and the
    next Trainer moved it all back. With this, the next Trainer finds the model where it is.
    """

    def teardown(self) -> None:
        module = self.lightning_module  # type: ignore[attr-defined]
        self.optimizers = []  # type: ignore[attr-defined]  # (their state stays put; the fit is over)
        if module is None:
            super().teardown()  # type: ignore[misc]
            return
        module.cpu = lambda: module  # shadows nn.Module.cpu during Lightning's teardown only
        try:
            super().teardown()  # type: ignore[misc]
        finally:
            del module.cpu


class ResidentSingleDevice(KeepOnDevice, SingleDeviceStrategy):
    """One device; the model stays on it after each Trainer (KeepOnDevice)."""

    @classmethod
    def on(cls, device: torch.device | str) -> ResidentSingleDevice:
        return cls(device=torch.device(device))


class ResidentDDP(KeepOnDevice, DDPStrategy):
    """DDP over the run's devices; each rank's model stays on its device after each Trainer."""


def resident(
    strategy: Any, accelerator: Any, devices: Any, num_nodes: Any = TrainerSchema.num_nodes
) -> Any:
    """The strategy a job's Trainers run under: Lightning's default ("auto") and "ddp" become the
    same choice that keeps the model on its device (`KeepOnDevice`): one device, or DDP over
    several (on the CPU too, where two gloo ranks test the GPU path's DDP). Any other strategy,
    and "auto" with a device count known only where it runs (-1, "auto"), is left to Lightning;
    so is any accelerator but the CPU and a GPU (`accelerator=auto` picks its device itself)."""
    if not isinstance(strategy, str) or strategy not in ("auto", "ddp"):
        return strategy
    if str(accelerator) not in (*GPU_ACCELERATORS, "cpu"):
        return strategy
    count = device_count(devices)
    if strategy == "ddp" or (count or 0) > 1 or int(num_nodes) > 1:
        return ResidentDDP()
    if count is None:
        return strategy
    gpu = str(accelerator) in GPU_ACCELERATORS
    index = _device_index(devices) if gpu else None
    return ResidentSingleDevice.on(torch.device("cuda", index) if gpu else "cpu")


def _device_index(devices: Any) -> int:
    """The GPU index of a one-device `trainer.devices`: [k] or "k," picks GPU k, 1 the first."""
    if isinstance(devices, str) and "," in devices:
        return int(next(d for d in devices.split(",") if d.strip()))
    if isinstance(devices, Sequence) and not isinstance(devices, str):
        return int(devices[0])
    return 0


def _strategy_class(strategy: Any) -> type | None:
    """The class of a `trainer.strategy` object spec (`_target_`) or instance; None for a
    registry name, or a target that does not import here (the trainer says so when built)."""
    if isinstance(strategy, Mapping):
        try:
            return get_class(str(strategy.get("_target_")))
        except (ImportError, ValueError):
            return None
    return None if isinstance(strategy, str) else type(strategy)


def is_deepspeed(strategy: Any) -> bool:
    """Whether a `trainer.strategy` value is DeepSpeed: a registry name ("deepspeed_stage_2"),
    an object spec (`_target_` a DeepSpeedStrategy subclass) or a strategy instance."""
    cls = _strategy_class(strategy)
    if cls is None:
        name = strategy if isinstance(strategy, str) else str(strategy.get("_target_", ""))
        return "deepspeed" in name.lower()
    return issubclass(cls, LightningDeepSpeed)


def needs_cuda(strategy: Any) -> bool:
    """DeepSpeed runs on CUDA GPUs only (Lightning checks at set-up, after the data and model
    are loaded); a subclass that runs elsewhere says so with `cuda_only = False` (the tests'
    CPU strategy)."""
    return is_deepspeed(strategy) and bool(getattr(_strategy_class(strategy), "cuda_only", True))


def prediction_strategy(
    strategy: Any,
    devices: Any = TrainerSchema.devices,
    num_nodes: int = TrainerSchema.num_nodes,
    accelerator: Any = TrainerSchema.accelerator,
) -> Any:
    """The strategy generation runs under: the run's own (`resident`), except DeepSpeed, which
    becomes DDP on the same devices (the process group the fit made is reused; precision stays
    the run's), or the single-device one where the run has one device."""
    if is_deepspeed(strategy):
        single = device_count(devices) == 1 and int(num_nodes) == 1
        strategy = "auto" if single else "ddp"
    return resident(strategy, accelerator, devices, num_nodes)
