"""What hardware a trainer needs: fail at once, with the fix in the message, when it is absent,
and size a scheduler's job from `trainer.devices` and `trainer.num_nodes`
(conf/hydra/launcher/slurm.yaml)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# `trainer.accelerator` values that mean CUDA GPUs.
GPU_ACCELERATORS = ("gpu", "cuda")
# The Lightning precision that autocasts to each half dtype (`model.dtype` names): half-precision
# frozen weights and fp32 trainables mix only inside autocast (medvqa.models.adapters.apply_method
# makes trainables fp32).
MIXED_PRECISION = {"bfloat16": "bf16-mixed", "float16": "16-mixed"}


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
        import torch  # here: medvqa.config imports this module for the resolvers below

        cuda_available = torch.cuda.is_available()
    from medvqa.training.strategies import needs_cuda  # here: lightning, for config's resolvers

    strategy = _strategy_name(trainer_cfg.get("strategy", "auto"))
    accelerator = str(trainer_cfg.get("accelerator", "auto"))
    if needs_cuda(trainer_cfg.get("strategy", "auto")) and not cuda_available:
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


def slurm_tasks(devices: Any) -> int:
    """SLURM tasks per node for `trainer.devices`: Lightning wants one task per device there.

    -1 and "auto" (every visible device) cannot size a job, which must ask for its GPUs before
    it sees any; so they fail here, in the sweep process, before anything is submitted.
    """
    if isinstance(devices, str):  # Lightning's string forms: "2", "-1", "auto", "0,1"
        text = devices.strip()
        if text.lstrip("-").isdigit():
            devices = int(text)
        elif text != "auto":
            devices = [d for d in text.split(",") if d.strip()]
    if isinstance(devices, int) and not isinstance(devices, bool) and devices > 0:
        return devices
    if isinstance(devices, Sequence) and not isinstance(devices, str) and len(devices) > 0:
        return len(devices)
    raise ValueError(
        f"trainer.devices={devices!r} cannot size a SLURM job: every visible device is only "
        "known once the job runs. Ask for N devices per job with trainer.devices=N "
        "(hydra.launcher.tasks_per_node and gpus_per_node follow it)."
    )


def slurm_gpus(accelerator: str, devices: Any) -> int | None:
    """GPUs per node for a SLURM job: one per task on a GPU trainer, none (null) on a CPU one."""
    return slurm_tasks(devices) if accelerator in GPU_ACCELERATORS else None


def slurm_mem_gb(tasks_per_node: Any, per_task_gb: Any, reserve_gb: Any) -> int:
    """Host memory per node of a SLURM job, GB: `per_task_gb` for every task (rank) on the node,
    which loads the whole model into host memory before it moves to its GPU, plus `reserve_gb`
    for global rank 0's scoring (asked on every node: one size fits all nodes of a job)."""
    tasks, per_task, reserve = int(tasks_per_node), int(per_task_gb), int(reserve_gb)
    if tasks < 1 or per_task < 0 or reserve < 0:
        raise ValueError(
            f"hydra.launcher.mem_gb: cannot size {tasks} tasks x {per_task} GB + {reserve} GB; "
            "set hydra.launcher.mem_gb=N (GB per node) by hand."
        )
    return tasks * per_task + reserve


def rank_log_name(stem: str = "run") -> str:
    """This process's job log file name: `run.log` on global rank 0, `run_rank<k>.log` on rank k.

    Under SLURM every task runs the whole Hydra job in the same run directory, and Hydra sets up
    the job's file log before the task runs, so the name comes from the environment: the rank
    Lightning will assume (RANK, LOCAL_RANK, SLURM_PROCID, ...; 0 when none is set), which is
    also the rank medvqa.distributed.global_rank() reports before any Trainer exists.
    """
    from lightning.fabric.utilities.rank_zero import _get_rank  # here: config imports this module

    rank = _get_rank() or 0
    return f"{stem}.log" if rank == 0 else f"{stem}_rank{rank}.log"


def check_precision(trainer_cfg: Any, model_cfg: Any) -> None:
    """A bf16/fp16 base must be fitted with a mixed trainer precision; say so before loading.

    With "32-true" the fp32 trainables meet half-precision activations without autocast and a
    matmul fails (the fp32 projector on bf16 image features); with "bf16-true"/"16-true"
    Lightning casts the trainables back to half and AdamW's updates round away.
    """
    from medvqa.config import TrainerSchema  # here: medvqa.config imports this module
    from medvqa.models.loading import model_option, torch_dtype

    dtype = str(torch_dtype(model_cfg)).removeprefix("torch.")
    precision = str(trainer_cfg.get("precision", TrainerSchema.precision))
    if dtype in MIXED_PRECISION and precision not in MIXED_PRECISION.values():
        raise HardwareError(
            f"model.dtype={model_option(model_cfg, 'dtype')} (half precision) cannot be fitted "
            f"with trainer.precision={precision!r}: the trainable parameters are float32 and "
            f"need autocast. Set trainer.precision={MIXED_PRECISION[dtype]} (trainer=gpu and "
            "trainer=deepspeed_zero2 do), or load the model in float32 with model.dtype=float32."
        )
