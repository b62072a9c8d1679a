"""Run the selected task inside Hydra's run directory and record how it ended.

A crash is logged and recorded as `failed` in results.json, the loggers are always finished, and
in a multirun the exception is swallowed so the next job still runs (a single run re-raises, so
its exit status tells the truth). Divergence is a result, not a crash: `diverged` with its step.
In a multi-GPU run every rank runs the task; only global rank 0 writes the record and logs.
"""

from __future__ import annotations

import logging
import traceback
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from medvqa.distributed import Job, global_rank, is_global_zero, job_ranks
from medvqa.evaluation.scoring import failed_items
from medvqa.provenance import environment
from medvqa.record import RunRecord, adopt_run
from medvqa.tracking import finish, instantiate_group, log_config, log_status
from medvqa.training.module import Diverged

log = logging.getLogger("medvqa")


def run(cfg: DictConfig) -> dict[str, float] | None:
    hydra_cfg = HydraConfig.get()
    out_dir = Path(hydra_cfg.runtime.output_dir)
    cfg, choices = adopt_run(cfg, hydra_cfg.runtime.choices)  # task=eval: the run's model
    record = RunRecord(out_dir, cfg, choices=choices)
    # Filled by the task as it loads data, model and metrics; written with every status.
    record.provenance = environment()
    previous = None if cfg.force else record.finished_before()
    if previous is not None:
        log.info(
            "already finished with this config (%s); skipping. force=true re-runs it.", record.path
        )
        return previous["metrics"]
    if not is_global_zero():
        return _other_rank(cfg, out_dir, record)
    with job_ranks() as job:  # the other ranks, if the trainer starts any, run this job alone
        return _run_on_rank_zero(cfg, out_dir, record, hydra_cfg.mode, job)


def _run_on_rank_zero(
    cfg: DictConfig, out_dir: Path, record: RunRecord, mode: RunMode | None, job: Job
) -> dict[str, float] | None:
    record.write("running")
    loggers = []
    status = "failed"
    try:
        loggers = instantiate_group(cfg.logger)
        log_config(loggers, cfg)  # first, so even a crashed run shows its config
        metrics = _run_task(cfg, out_dir, loggers, record.provenance)
        failed = failed_items(metrics)
        ended = record.finish(metrics, failed)
        log_status(loggers, ended, **({"failed_items": failed} if failed else {}))
        status = "success"
        return metrics
    except Diverged as err:
        log.error("%s", err)
        record.write("diverged", diverged_step=err.step, error=str(err))
        log_status(loggers, "diverged", diverged_step=err.step)
        status = "success"  # a recorded result, not a crash
        return None
    except Exception as err:
        job.outcome = "failed"
        log.exception("run failed")
        record.write(
            "failed", error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc()
        )
        if mode != RunMode.MULTIRUN:
            raise
        return None
    finally:
        finish(loggers, status)


def _run_task(cfg: DictConfig, out_dir: Path, loggers: list, provenance: dict) -> dict[str, float]:
    torch.set_float32_matmul_precision(str(cfg.matmul_precision))
    # `task.name` names the run in results.json; the task function does not take it.
    options = OmegaConf.to_container(cfg.task, resolve=True)  # may refer to other keys
    task = instantiate({k: v for k, v in options.items() if k != "name"})  # type: ignore[union-attr]
    return task(cfg=cfg, out_dir=out_dir, loggers=loggers, provenance=provenance)


def _other_rank(cfg: DictConfig, out_dir: Path, record: RunRecord) -> None:
    """A rank other than 0: the same task (it fits and generates its shard), writing nothing."""
    log.info("global rank %d: running the task; rank 0 records it", global_rank())
    try:  # Lightning's loggers and callbacks act on rank 0 only, but every rank's Trainer has them
        _run_task(cfg, out_dir, instantiate_group(cfg.logger), record.provenance)
    except Diverged as err:
        log.error("%s", err)  # rank 0 records it
    return None
