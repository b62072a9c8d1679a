"""Run the selected task inside Hydra's run directory and record how it ended.

Every ending is written to results.json before the process moves on: `finished`, `incomplete`
(items a judge could not score), `diverged` (with its step), `failed` (with the error) or
`interrupted` (SIGTERM/SIGINT, a scheduler's requeue; with the stage and step). The loggers are
always finished. A single run then exits with its status's code (`EXIT_CODES`; interrupted:
128 + the signal). In a multirun, a job that did not finish raises `JobNotFinished` after its
record is written: Hydra runs the sweep's other jobs and exits 1 at the end, naming the first
such job. SIGINT (Ctrl-C) stops the whole sweep instead, and so does SIGTERM to a local sweep (a
`timeout`, a shutdown: whoever sends it wants it to stop), exiting 143; under SLURM each job keeps
its own handling (requeue, resume). A job of a sweep that the config check or task=eval's run
folder check refuses is recorded `failed` with the reason, as a crashed job is, so reports and
relaunches see it.

A refusal (a value that cannot work, a run folder that may not be evaluated: `REFUSALS`) reads
like one: its message on the console, without a traceback, which goes to the run's log file
(run.log); a single run refused before it starts exits 2 (`EXIT_REFUSED`), as medvqa-score does.

Global rank 0 holds the run directory's lock for the whole job (`RUN_LOCK`): a second launch
into the same directory refuses, naming the pid and host that run it. In a multi-GPU run every
rank runs the task; only global rank 0 writes the record and logs.
"""

from __future__ import annotations

import logging
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from medvqa import numerics, progress
from medvqa.atomic import LockHeld, describe_owner, hold_lock
from medvqa.config import check_config, check_judge_config
from medvqa.distributed import Job, global_rank, is_global_zero, job_ranks
from medvqa.errors import ConfigError, DataError
from medvqa.interrupts import as_interrupted, interrupts_job, where
from medvqa.judge.errors import JudgeConfigError
from medvqa.models.saving import WeightsMismatch
from medvqa.provenance import environment
from medvqa.record import RunRecord
from medvqa.scoring.pipeline import failed_items
from medvqa.tasks.from_run import RunFolderError, adopt_run, default_choices
from medvqa.tracking import finish, instantiate_group, log_config, log_status
from medvqa.training.hardware import (
    HardwareError,
    configure_compile_cache,
    configure_cuda_allocator,
)
from medvqa.training.module import Diverged
from medvqa.untrusted import UntrustedDataError

log = logging.getLogger("medvqa")

# A single run's exit status per record status (`interrupted`: 128 + the signal's number, the
# shell's convention: 143 for SIGTERM, 130 for SIGINT). A multirun exits 1 if any job did not
# finish. Hydra itself exits 1 on a config it cannot compose.
EXIT_CODES = {"finished": 0, "failed": 1, "incomplete": 3, "diverged": 4}
# A single run refused before it starts (a value that cannot work, a run folder that may not be
# evaluated): no record, this exit status.
EXIT_REFUSED = 2
# In the run directory; see medvqa.atomic.hold_lock.
RUN_LOCK = ".medvqa.lock"


class JobNotFinished(CompactHydraException):
    """A job of a multirun ended otherwise than `finished` (its record says how). Hydra prints
    its message at the end of the sweep without a traceback (each job's is in its run.log)."""


class RunDirBusy(RuntimeError):
    """Another live process is running a job in this run directory."""


# Errors that are refusals: a message that names the key, file or value and the fix, for which
# a traceback says nothing more (it goes to the run's log file).
REFUSALS = (
    ConfigError,
    DataError,
    JudgeConfigError,
    HardwareError,
    RunFolderError,
    UntrustedDataError,
    WeightsMismatch,
    RunDirBusy,
    FileNotFoundError,
)


def run(cfg: DictConfig) -> dict[str, float] | None:
    # Values that cannot work fail here, before any data, model or record. Before adopt_run:
    # task=eval adopts only what a run trained with (model, method, seed, precision, train
    # image); the checked data, shift, breakdown, trainer and judge values stay as composed.
    hydra_cfg = HydraConfig.get()
    out_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        check_judge_config(cfg)  # before anything could record a key pasted as its name
    except REFUSALS as err:
        _refused(err, hydra_cfg.mode)
    try:
        check_config(cfg)
        configure_cuda_allocator(cfg.cuda_allocator)  # before anything allocates on a GPU
        configure_compile_cache(cfg.paths.cache_dir)  # a sweep's jobs compile from one cache
        progress.configure(cfg.progress)  # progress lines where stdout is a file
        numerics.apply()  # MEDVQA_NUMERICS=portable: one thread, no oneDNN (before any kernel)
        if OmegaConf.select(cfg, "eval.from_run"):  # task=eval: the run's model, checked
            defaults = default_choices(hydra_cfg.job.config_name)
            overrides = hydra_cfg.overrides.task
            cfg, choices = adopt_run(cfg, hydra_cfg.runtime.choices, overrides, defaults)
        else:
            choices = dict(hydra_cfg.runtime.choices)
    except REFUSALS as err:
        if hydra_cfg.mode == RunMode.MULTIRUN and is_global_zero():
            _record_refusal(cfg, out_dir, hydra_cfg, err)
        _refused(err, hydra_cfg.mode)
    record = RunRecord(out_dir, cfg, choices=choices)
    # Filled by the task as it loads data, model and metrics; written with every status.
    record.provenance = environment()
    if not is_global_zero():
        return _other_rank(cfg, out_dir, record)
    try:
        with hold_lock(out_dir / RUN_LOCK, wait=False):
            previous = None if cfg.force else record.finished_before()
            if previous is not None:
                log.info(
                    "already finished with this config (%s); skipping. force=true re-runs it.",
                    record.path,
                )
                return previous["metrics"]
            with interrupts_job(), job_ranks() as job:  # the ranks it starts run this job alone
                metrics, status, err = _run_on_rank_zero(cfg, out_dir, record, job)
    except LockHeld as held:
        _refused(
            RunDirBusy(
                f"{out_dir} is in use by {describe_owner(held.owner)}: two jobs in one run "
                "directory would write the same checkpoints and predictions. Wait for it (or "
                "stop it), or give this run another directory (hydra.run.dir=...)."
            ),
            hydra_cfg.mode,
        )
    if status == "finished":
        return metrics
    return _not_finished(status, err, record, hydra_cfg.mode, _local(hydra_cfg))


def _local(hydra_cfg: Any) -> bool:
    """Whether the jobs run one after the other in this process (Hydra's basic launcher)."""
    return str(OmegaConf.select(hydra_cfg, "launcher._target_", default="")).endswith(
        "BasicLauncher"
    )


def _refused(err: BaseException, mode: RunMode | None) -> NoReturn:
    """Leave a job refused before it starts: the message on the console, the traceback in the
    log file; a single run exits `EXIT_REFUSED`, a sweep's job raises `JobNotFinished` (Hydra
    runs the other jobs and names it at the end)."""
    tell_refusal("refused", err)
    if mode == RunMode.MULTIRUN:
        raise JobNotFinished(f"the job was refused: {err}") from err
    raise SystemExit(EXIT_REFUSED) from err


def tell_refusal(what: str, err: BaseException) -> None:
    """`what: message` on stderr, without a traceback (as Hydra's own refusals are); the message
    and the traceback in the log files (run.log), for those who want it."""
    sys.stderr.write(f"{what}: {err}\n")
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    entry = log.makeRecord(log.name, logging.ERROR, __file__, 0, "%s: %s", (what, text), None)
    for handler in {*logging.getLogger().handlers, *log.handlers}:
        if isinstance(handler, logging.FileHandler):
            handler.handle(entry)


def _record_refusal(cfg: DictConfig, out_dir: Path, hydra_cfg: Any, err: BaseException) -> None:
    """A sweep job refused before it starts (the config check, task=eval's run folder check): a
    `failed` record with the reason, so that `medvqa-report` and a relaunch see it (a single
    run just exits with it)."""
    try:
        record = RunRecord(out_dir, cfg, choices=hydra_cfg.runtime.choices)
    except Exception as why:  # a value too broken to record (the refusal is raised anyway)
        log.warning("the refused job could not be recorded: %r", why)
        return
    record.write("failed", error=f"{type(err).__name__}: {err}")


def _not_finished(
    status: str,
    err: BaseException | None,
    record: RunRecord,
    mode: RunMode | None,
    local: bool = True,
) -> None:
    """Leave the job with its status: the exit code of a single run, `JobNotFinished` in a
    multirun (Hydra goes on with the other jobs); SIGINT ends a sweep, SIGTERM a local one."""
    if isinstance(err, SystemExit) and err.code not in (None, 0):
        # A scheduler's own exit: submitit requeued the job and leaves with sys.exit(-1) so that
        # no result is written for this attempt. It must leave as it came.
        raise err
    interrupted = as_interrupted(err) if err is not None else None
    if mode != RunMode.MULTIRUN:
        if status == "failed" and interrupted is None and isinstance(err, Exception):
            if isinstance(err, REFUSALS):  # its message is on the console, its traceback in run.log
                raise SystemExit(EXIT_CODES[status]) from err
            raise err  # Hydra prints it and exits 1
        raise SystemExit(interrupted.exit_code if interrupted else EXIT_CODES[status])
    if interrupted is not None and interrupted.signum == signal.SIGINT:
        raise KeyboardInterrupt from err  # Ctrl-C: the user stops the sweep
    if interrupted is not None and interrupted.signum == signal.SIGTERM and local:
        log.error("SIGTERM: the sweep stops; this job's record says where it was")
        raise SystemExit(interrupted.exit_code) from err  # `timeout`, a shutdown
    detail = f": {err}" if err is not None and status in ("failed", "interrupted") else ""
    raise JobNotFinished(f"the job is {status}{detail} (record: {record.path})")


def _run_on_rank_zero(
    cfg: DictConfig, out_dir: Path, record: RunRecord, job: Job
) -> tuple[dict[str, float] | None, str, BaseException | None]:
    """Run the task and record how it ended: (metrics, status, the error if any)."""
    record.write("running")
    loggers = []
    try:
        loggers = instantiate_group(cfg.logger)
        log_config(loggers, cfg)  # first, so even a crashed run shows its config
        metrics = _run_task(cfg, out_dir, loggers, record.provenance)
        failed = failed_items(metrics)
        ended = record.finish(metrics, failed)
        log_status(loggers, ended, **({"failed_items": failed} if failed else {}))
        finish(loggers, "success")
        return metrics, ended, None
    except Diverged as err:
        log.error("%s", err)
        record.write("diverged", diverged_step=err.step, error=str(err))
        log_status(loggers, "diverged", diverged_step=err.step)
        finish(loggers, "success")  # a recorded result, not a crash
        return None, "diverged", err
    except BaseException as err:
        job.outcome = "failed"
        interrupted = as_interrupted(err)
        if interrupted is not None:
            at = where()
            log.error("interrupted (%s) at %s", interrupted.reason, at or "start")
            record.write("interrupted", signal=interrupted.reason, **at)
            log_status(loggers, "interrupted", **at)
        else:
            if isinstance(err, REFUSALS):  # a refusal reads like one; the traceback: run.log
                tell_refusal("run failed", err)
            else:
                log.exception("run failed")
            error = f"{type(err).__name__}: {err}"
            record.write("failed", error=error, traceback=traceback.format_exc())
        finish(loggers, "failed")
        return None, "interrupted" if interrupted else "failed", err


def task_of(cfg: DictConfig) -> Callable[..., dict[str, float]]:
    """The task function with its `task.*` options bound (conf/task/*.yaml declares them, the
    function has no defaults of its own for them); it takes `cfg`, `out_dir`, and optionally
    `loggers` and `provenance`."""
    # `task.name` names the run in results.json; the task function does not take it.
    options = OmegaConf.to_container(cfg.task, resolve=True)  # may refer to other keys
    return instantiate({k: v for k, v in options.items() if k != "name"})  # type: ignore[union-attr]


def _run_task(cfg: DictConfig, out_dir: Path, loggers: list, provenance: dict) -> dict[str, float]:
    torch.set_float32_matmul_precision(str(cfg.matmul_precision))
    return task_of(cfg)(cfg=cfg, out_dir=out_dir, loggers=loggers, provenance=provenance)


def _other_rank(cfg: DictConfig, out_dir: Path, record: RunRecord) -> None:
    """A rank other than 0: the same task (it fits and generates its shard), writing nothing.

    It skips a job rank 0 would skip (finished with this config), and exits 128 + the signal
    when signalled (rank 0 records it)."""
    if not cfg.force and record.finished_before() is not None:
        return None
    log.info("global rank %d: running the task; rank 0 records it", global_rank())
    try:  # Lightning's loggers and callbacks act on rank 0 only, but every rank's Trainer has them
        with interrupts_job():
            _run_task(cfg, out_dir, instantiate_group(cfg.logger), record.provenance)
    except Diverged as err:
        log.error("%s", err)  # rank 0 records it
    except BaseException as err:
        interrupted = as_interrupted(err)
        if interrupted is None:
            raise
        raise SystemExit(interrupted.exit_code) from err
    return None
