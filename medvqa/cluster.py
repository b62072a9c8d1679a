"""The size of a scheduler job and its ranks' log names, from the trainer config: the Hydra
resolvers conf/hydra/launcher/slurm.yaml and conf/hydra/default.yaml use (registered by
medvqa.config), in a module of their own that imports nothing of medvqa's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# `trainer.accelerator` values that mean CUDA GPUs.
GPU_ACCELERATORS = ("gpu", "cuda")


def device_count(devices: Any) -> int | None:
    """How many devices per node `trainer.devices` asks for, in any of Lightning's forms (2, "2",
    "0,1", [0, 1]); None for -1 and "auto" (every visible device, known only where it runs)."""
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
    return None


def slurm_tasks(devices: Any) -> int:
    """SLURM tasks per node for `trainer.devices`: Lightning wants one task per device there.

    -1 and "auto" (every visible device) cannot size a job, which must ask for its GPUs before
    it sees any; so they fail here, in the sweep process, before anything is submitted.
    """
    count = device_count(devices)
    if count is None:
        raise ValueError(
            f"trainer.devices={devices!r} cannot size a SLURM job: every visible device is only "
            "known once the job runs. Ask for N devices per job with trainer.devices=N "
            "(hydra.launcher.tasks_per_node and gpus_per_node follow it)."
        )
    return count


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
    from lightning.fabric.utilities.rank_zero import _get_rank  # lightning: only when resolved

    rank = _get_rank() or 0
    return f"{stem}.log" if rank == 0 else f"{stem}_rank{rank}.log"
