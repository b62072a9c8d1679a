"""Run the selected task inside Hydra's run directory and record how it ended.

A crash is logged and recorded as `failed` in results.json, the loggers are always finished, and
in a multirun the exception is swallowed so the next job still runs (a single run re-raises, so
its exit status tells the truth). Divergence is a result, not a crash: `diverged` with its step.
"""

from __future__ import annotations

import logging
import traceback
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from medvqa.evaluation.scoring import failed_items
from medvqa.provenance import environment
from medvqa.record import RunRecord
from medvqa.tracking import finish, instantiate_group, log_config, log_status
from medvqa.training.module import Diverged

log = logging.getLogger("medvqa")


def run(cfg: DictConfig) -> dict[str, float] | None:
    hydra_cfg = HydraConfig.get()
    out_dir = Path(hydra_cfg.runtime.output_dir)
    record = RunRecord(out_dir, cfg, choices=dict(hydra_cfg.runtime.choices))
    # Filled by the task as it loads data, model and metrics; written with every status.
    record.provenance = environment()
    previous = None if cfg.force else record.finished_before()
    if previous is not None:
        log.info(
            "already finished with this config (%s); skipping. force=true re-runs it.", record.path
        )
        return previous["metrics"]
    record.write("running")
    loggers = []
    status = "failed"
    try:
        loggers = instantiate_group(cfg.logger)
        log_config(loggers, cfg)  # first, so even a crashed run shows its config
        # `task.name` names the run in results.json; the task function does not take it.
        options = [key for key in cfg.task if key != "name"]
        task = instantiate(OmegaConf.masked_copy(cfg.task, options))
        metrics = task(cfg=cfg, out_dir=out_dir, loggers=loggers, provenance=record.provenance)
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
        log.exception("run failed")
        record.write(
            "failed", error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc()
        )
        if hydra_cfg.mode != RunMode.MULTIRUN:
            raise
        return None
    finally:
        finish(loggers, status)
