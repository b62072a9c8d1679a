"""Steps every task shares: the dataset, its splits under the shift, and their report."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.utils import instantiate
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig, OmegaConf

from medvqa.analysis.summary import print_summary, summary_table, write_summary
from medvqa.data.base import VQASource
from medvqa.data.shifts import Shift, Splits, limit_splits, make_splits
from medvqa.evaluation.evaluate import finite
from medvqa.tracking import log_metrics, log_table

log = logging.getLogger(__name__)
SPLITS_FILE = "splits.json"


def report_run(
    cfg: DictConfig,
    out_dir: Path,
    loggers: Sequence[Logger],
    metrics: Mapping[str, float],
    rows: Sequence[tuple[str, str]],
    predictions: pd.DataFrame | None = None,
) -> None:
    """The summary table (terminal, CSV, Markdown) and everything the loggers should get.

    `rows` are (label, metric-name prefix) pairs: the run itself first, then reference rows.
    """
    table = summary_table(metrics, rows, cfg.metric.primary_closed, cfg.metric.primary_open)
    write_summary(table, out_dir)
    print_summary(table, title=f"shift {cfg.shift.name} · {rows[0][0]} · seed {cfg.seed}")
    log_metrics(loggers, finite(metrics))
    log_table(loggers, "summary", table)
    if predictions is not None:
        log_table(loggers, "predictions", predictions)


def prepare_splits(cfg: DictConfig, out_dir: Path, limit: bool = True) -> tuple[VQASource, Splits]:
    """Load the dataset table, apply the shift, write `splits.json` into the run directory.

    The report always counts the full splits; with `limit`, the returned splits are capped by
    `data.limit` (debug runs).
    """
    source: VQASource = instantiate(cfg.dataset)
    table = source.table()
    shift = Shift.from_config(OmegaConf.to_container(cfg.shift, resolve=True))  # type: ignore[arg-type]
    splits = make_splits(table, shift, seed=int(cfg.seed))
    report: dict[str, Any] = {"dataset": source.name, "shift": shift.name, **splits.report()}
    (out_dir / SPLITS_FILE).write_text(json.dumps(report, indent=2))
    sizes = ", ".join(f"{k} {v['n']}" for k, v in report["splits"].items())
    log.info("%s / shift %s: %s", source.name, shift.name, sizes)
    if limit:
        caps = OmegaConf.to_container(cfg.data.limit, resolve=True)
        splits = limit_splits(splits, caps, int(cfg.seed))  # type: ignore[arg-type]
    return source, splits
