"""Steps every task shares: the dataset, its splits under the shift, and their report."""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.utils import instantiate
from lightning.pytorch.loggers import Logger, WandbLogger
from omegaconf import DictConfig, OmegaConf

from medvqa.analysis.explorer import wandb_images
from medvqa.analysis.summary import print_summary, summary_table, write_summary
from medvqa.data import records as R
from medvqa.data.annotated import DEFAULT_ON_BAD_ROW, check_images
from medvqa.data.audit import audit_leakage, leakage_warnings
from medvqa.data.base import VQASource
from medvqa.data.shifts import SPLITS_FILE, Shift, Splits, limit_splits, make_splits
from medvqa.distributed import is_global_zero
from medvqa.errors import DataError
from medvqa.provenance import add_data
from medvqa.record import REHEARSAL_NOTE, is_rehearsal
from medvqa.scoring.pipeline import finite
from medvqa.tracking import log_metrics, log_rows, log_table

log = logging.getLogger(__name__)
# splits.json: each split's row ids as used (after data.limit and the image check), and the
# case keys of the training rows: what `task=eval` checks an evaluation's rows against
# (medvqa.tasks.from_run.check_unseen).
ROWS, TRAIN_CASES = "rows", "train_cases"
TRAIN = R.TRAIN


def report_run(
    cfg: DictConfig,
    out_dir: Path,
    loggers: Sequence[Logger],
    metrics: Mapping[str, float],
    rows: Sequence[tuple[str, str]],
    predictions: pd.DataFrame | None = None,
    source: VQASource | None = None,
) -> None:
    """The summary table (terminal, CSV, Markdown) and everything the loggers should get.

    `rows` are (label, metric-name prefix) pairs: the run itself first, then reference rows.
    `predictions`: the rows table (`explorer.run_rows`), logged as `predictions`; W&B's holds
    each row's image as `source` shows it to the model (`explorer.wandb_images`).
    """
    table = summary_table(metrics, rows, cfg.evaluation.primary_closed, cfg.evaluation.primary_open)
    note = REHEARSAL_NOTE if is_rehearsal(cfg) else None
    write_summary(table, out_dir, note)
    title = f"shift {cfg.shift.name} · {rows[0][0]} · seed {cfg.seed}"
    print_summary(table, title=f"{note} · {title}" if note else title)
    log_metrics(loggers, finite(metrics))
    log_table(loggers, "summary", table)
    if predictions is not None:
        wandb = source is not None and any(isinstance(lg, WandbLogger) for lg in loggers)
        with tempfile.TemporaryDirectory(prefix="medvqa-thumbnails-") as thumbs:
            images = wandb_images(predictions, source, Path(thumbs)) if wandb else None
            log_rows(loggers, "predictions", predictions, images)


def split_rows(frames: Mapping[str, pd.DataFrame]) -> dict[str, Any]:
    """What splits.json keeps of the rows: each split's ids, and the training rows' cases."""
    train = frames.get(TRAIN)
    cases = [] if train is None else sorted({str(c) for c in train[R.CASE_ID].dropna()})
    return {
        ROWS: {name: [str(i) for i in frame[R.ID]] for name, frame in frames.items()},
        TRAIN_CASES: cases,
    }


def prepare_splits(
    cfg: DictConfig,
    out_dir: Path,
    limit: bool = True,
    images: bool = False,
    provenance: MutableMapping[str, Any] | None = None,
) -> tuple[VQASource, Splits]:
    """Load the dataset table, apply the shift, write `splits.json` into the run directory.

    The report holds the source sizes after cleaning, the cleaning steps and skipped rows, the
    per-split counts and the leakage audit. With `limit`, the returned splits are capped by
    `data.limit` (debug runs; the report still counts the full splits). With `images`, every
    image the returned splits use is checked before any model is loaded (missing/unreadable
    files raise, or are skipped and counted with `dataset.on_bad_row=skip`). The dataset's
    fingerprint goes into `provenance`.
    """
    source: VQASource = instantiate(cfg.dataset)
    table = source.table()
    add_data(provenance, source)
    shift = Shift.from_config(OmegaConf.to_container(cfg.shift, resolve=True))  # type: ignore[arg-type]
    splits = make_splits(table, shift, seed=int(cfg.seed))
    report: dict[str, Any] = {
        "dataset": source.name,
        "shift": shift.name,
        **splits.report(),
        "leakage": audit_leakage(splits.frames),
        **source.report(),
    }
    for line in leakage_warnings(report["leakage"]):
        log.info("leakage audit: %s", line)
    if limit:
        caps = OmegaConf.to_container(cfg.data.limit, resolve=True)
        splits = limit_splits(splits, caps, int(cfg.seed))  # type: ignore[arg-type]

    def write_report(text: str) -> None:
        if is_global_zero():  # every rank makes the splits; one writes them
            (out_dir / SPLITS_FILE).write_text(text)

    write_report(json.dumps(report, indent=2, default=str))  # kept even if the image check fails
    if images:
        frames, report["image_check"] = check_images(
            source, splits.frames, str(cfg.dataset.get("on_bad_row", DEFAULT_ON_BAD_ROW))
        )
        splits = Splits(frames, splits.source_counts, splits.dropped)
        for name, frame in frames.items():
            if frame.empty:
                raise DataError(
                    f"{source.name}: split {name!r} has no rows left after skipping bad images "
                    f"({report['image_check']['counts']}); fix the image files."
                )
    write_report(json.dumps(report | split_rows(splits.frames), indent=2, default=str))
    sizes = ", ".join(f"{k} {v['n']}" for k, v in report["splits"].items())
    log.info("%s / shift %s: %s", source.name, shift.name, sizes)
    return source, splits
