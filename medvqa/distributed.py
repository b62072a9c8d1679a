"""Ranks: which process of a multi-GPU run writes, and how Lightning starts the other ranks.

Every rank runs the whole job (data, model, fit, generation); only global rank 0 writes the
record, the split report, the merged predictions, the scores and the logger output. The rank is
known before any Trainer exists: Lightning reads it from the environment (RANK, LOCAL_RANK,
SLURM_PROCID) at import, and its launcher sets LOCAL_RANK in the processes it starts.

On one machine the other ranks belong to one job: rank 0 starts them at the job's first Trainer
and, when the job ends, waits for them, destroys the process group and clears the launcher's
variables (`job_ranks`), so each job of a `-m` sweep starts ranks of its own.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from lightning.fabric.utilities.rank_zero import rank_zero_only

log = logging.getLogger(__name__)

# What Lightning's launcher writes into rank 0's own environment when it starts the other ranks
# (`_SubprocessScriptLauncher._call_children_scripts`). Left there, the next job of a `-m` sweep
# run in the same process believes its ranks were started externally, starts none, and waits
# on the previous job's dead peers.
LAUNCH_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")
# How long rank 0 waits, at the end of a job, for the ranks it started to exit by themselves
# (they leave right after the last generation) before it stops them; shorter after a failure,
# where they may wait in a collective rank 0 will never join.
CHILD_EXIT_TIMEOUT_S = {"finished": 300.0, "failed": 30.0}


def global_rank() -> int:
    """This process's global rank (0 in a single-process run)."""
    return int(getattr(rank_zero_only, "rank", 0) or 0)


def is_global_zero() -> bool:
    return global_rank() == 0


def child_command(local_rank: int) -> tuple[Sequence[str], str]:
    """How Lightning's launcher starts rank `local_rank` of this Hydra job: the job itself.

    Lightning's default re-runs the command line, which in a multirun (`-m`) starts the whole
    sweep again in every child. Instead each child runs this job's own overrides as a single
    run in the job's output directory, logging to its own file (`medvqa.cluster.rank_log_name`).
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.utils import get_original_cwd, to_absolute_path

    import __main__

    hydra_cfg = HydraConfig.get()
    if __main__.__spec__ is None:
        command = [sys.executable, to_absolute_path(sys.argv[0])]
    else:
        command = [sys.executable, "-m", __main__.__spec__.name]
    out_dir = hydra_cfg.runtime.output_dir
    command += [
        *hydra_cfg.overrides.task,
        f'hydra.run.dir="{out_dir}"',
        "hydra.output_subdir=null",  # the job's .hydra/ is rank 0's
        f"hydra.job.name=rank{local_rank}",
        # its log, run_rank<k>.log, is named from LOCAL_RANK (conf/hydra/default.yaml)
    ]
    return command, get_original_cwd()


class RankObserver(threading.Thread):
    """Watches the ranks this process started for one job, as Lightning's observer does: a rank
    that dies with an error takes the others and this process down, because they may wait for
    it in a collective forever (NCCL only times out after 30 minutes). Unlike Lightning's, it
    can be released when the job ends, so ranks stopped or exiting then end nothing else."""

    def __init__(self, procs: list[subprocess.Popen], period_s: float = 5.0) -> None:
        super().__init__(daemon=True, name="medvqa-rank-observer")
        self.procs = procs
        self.period_s = period_s
        self.main_pid = os.getpid()
        self._released = threading.Event()

    def run(self) -> None:
        while not self._released.wait(self.period_s):
            codes = [p.poll() for p in self.procs]
            if all(code == 0 for code in codes):
                return
            failed = [(p.pid, code) for p, code in zip(self.procs, codes, strict=True) if code]
            if failed and not self._released.is_set():
                log.error(
                    "rank process(es) %s ended with an error; stopping this job's ranks", failed
                )
                for proc in self.procs:
                    proc.send_signal(signal.SIGKILL)
                os.kill(self.main_pid, signal.SIGKILL)
                return

    def release(self) -> None:
        self._released.set()
        self.join()


_observers: list[RankObserver] = []


def _observe(child_processes: list[subprocess.Popen]) -> None:
    """Lightning's launcher calls this right after starting the other ranks."""
    observer = RankObserver(child_processes)
    observer.start()
    _observers.append(observer)


def use_job_command_for_ranks() -> None:
    """Make Lightning's subprocess launcher start the other ranks with `child_command` and
    watch them with a `RankObserver` that `job_ranks` releases at the end of the job."""
    from lightning.pytorch.strategies.launchers import subprocess_script

    subprocess_script._hydra_subprocess_cmd = child_command
    subprocess_script._launch_process_observer = _observe


@dataclass
class Job:
    """How a job ended on rank 0 ("finished" unless told otherwise): decides how long its ranks
    may take to exit."""

    outcome: str = "finished"


@contextmanager
def job_ranks() -> Iterator[Job]:
    """One job on global rank 0: the ranks Lightning starts for it (if any) belong to it alone.

    When the job ends, the ranks it started are waited for (stopped if they outstay
    `CHILD_EXIT_TIMEOUT_S` of the job's outcome), the process group is destroyed and the
    launcher's variables are removed from this process's environment, so that the next job of
    a `-m` sweep starts its own ranks on a fresh port. Ranks started outside (SLURM's srun,
    torchrun) are not touched.
    """
    before = {key: os.environ.get(key) for key in LAUNCH_ENV}
    use_job_command_for_ranks()
    job = Job()
    try:
        yield job
    except BaseException:
        job.outcome = "failed"
        raise
    finally:
        _end_job(before, job.outcome)


def _end_job(before: dict[str, str | None], outcome: str) -> None:
    if not _observers:
        return  # this job started no ranks
    import torch.distributed as dist

    def destroy_group() -> None:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()

    observers = list(_observers)
    _observers.clear()
    for observer in observers:
        observer.release()
    timeout_s = CHILD_EXIT_TIMEOUT_S[outcome]
    if (
        outcome == "failed"
    ):  # peers waiting in a collective with rank 0 get an error (gloo) and leave
        destroy_group()
    for proc in (p for observer in observers for p in observer.procs):
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log.warning(
                "rank process %d did not exit %.0f s after the job; stopping it",
                proc.pid,
                timeout_s,
            )
            proc.kill()
            proc.wait()
    destroy_group()
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


_HOST_GROUPS: dict[int, object] = {}


def host_sum(value: int) -> int:
    """`value` summed over the ranks of the process group, on the host: over gloo (the NCCL
    default group's gloo twin, made once per group by every rank at its first call), so the
    sum waits for the other ranks' hosts, never for a GPU. 1 rank or no group: `value`."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return int(value)
    world = dist.group.WORLD
    group = None  # the default group, when it already runs on gloo
    if dist.get_backend() != "gloo":
        key = id(world)
        if key not in _HOST_GROUPS:
            _HOST_GROUPS.clear()  # a group of an earlier job of this process is gone
            _HOST_GROUPS[key] = dist.new_group(backend="gloo")
        group = _HOST_GROUPS[key]
    total = torch.tensor([int(value)], dtype=torch.int64)
    dist.all_reduce(total, group=group)
    return int(total.item())
