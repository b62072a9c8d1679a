"""Experiment tracking: metrics and tables go to whichever Lightning loggers are configured."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.utils import instantiate
from lightning.pytorch.loggers import CSVLogger, Logger, WandbLogger
from omegaconf import DictConfig, OmegaConf

from medvqa.record import SUMMARY_PREFIX
from medvqa.redaction import redact_secrets

log = logging.getLogger(__name__)


class WandbRunLogger(WandbLogger):
    """Lightning's WandbLogger without its `anonymous=None`, which wandb >= 0.22 warns about
    on every run however it is set (the setting is gone)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._wandb_init.pop("anonymous", None)


def instantiate_group(group: DictConfig | None) -> list[Any]:
    """Objects of a `name: {_target_: ...}` mapping (loggers, callbacks); null gives []."""
    if not group:
        return []
    return [instantiate(node) for node in group.values() if node is not None and "_target_" in node]


def log_config(loggers: Sequence[Logger], cfg: DictConfig) -> None:
    params = redact_secrets(OmegaConf.to_container(cfg, resolve=True))
    for lg in loggers:
        lg.log_hyperparams(params)  # type: ignore[arg-type]


def log_metrics(
    loggers: Sequence[Logger], metrics: Mapping[str, float], step: int | None = None
) -> None:
    for lg in loggers:
        lg.log_metrics(dict(metrics), step=step)


def _table_frame(df: pd.DataFrame) -> pd.DataFrame:
    """W&B tables want scalar cells: lists (candidates) become strings."""
    out = df.copy()
    for col in out.columns:
        if out[col].map(lambda v: isinstance(v, list | tuple | dict)).any():
            out[col] = out[col].map(lambda v: v if v is None else str(v))
    return out


def log_table(loggers: Sequence[Logger], key: str, df: pd.DataFrame) -> None:
    """W&B gets a wandb.Table; the CSV logger gets `<key>.csv` in its log directory."""
    for lg in loggers:
        if isinstance(lg, WandbLogger):
            lg.log_table(key=key, dataframe=_table_frame(df))
        elif isinstance(lg, CSVLogger):
            path = Path(lg.log_dir) / f"{key}.csv"
            path.parent.mkdir(parents=True, exist_ok=True)
            df.to_csv(path, index=False)
        else:
            log.debug("logger %s has no table support; %s not logged", type(lg).__name__, key)


# The W&B rows table's column of each row's image (a wandb.Image), before the row's own columns.
IMAGE_COLUMN = "thumbnail"


def log_rows(
    loggers: Sequence[Logger], key: str, rows: pd.DataFrame, images: Sequence[Path | None] | None
) -> None:
    """`log_table`, with W&B's table holding each row's image (`images`: image files or None,
    aligned with the rows) as a wandb.Image in `IMAGE_COLUMN`, so a workspace shows and groups
    them. Rows that share a file share one wandb.Image: W&B stores each image once (with the
    table, in the run's `run_table` artifact, which copies the files when it is logged). The
    CSV logger gets the rows alone."""
    for lg in loggers:
        if not isinstance(lg, WandbLogger) or images is None:
            log_table([lg], key, rows)
            continue
        import wandb

        made: dict[Path, Any] = {}
        cells = []
        for image in images:
            if image is not None and image not in made:
                made[image] = wandb.Image(str(image))
            cells.append(None if image is None else made[image])
        frame = _table_frame(rows)
        frame.insert(0, IMAGE_COLUMN, cells)
        lg.log_table(key=key, dataframe=frame)


def log_status(loggers: Sequence[Logger], status: str, **details: Any) -> None:
    """Put the record's status (and e.g. `failed_items`, `diverged_step`) in the W&B summary:
    W&B itself only knows whether the process ended cleanly, so a diverged or incomplete run
    would read as finished there."""
    for lg in loggers:
        if isinstance(lg, WandbLogger):
            try:
                summary = lg.experiment.summary
                for key, value in {"status": status, **details}.items():
                    summary[f"{SUMMARY_PREFIX}{key}"] = value
            except Exception:  # the record holds the status anyway
                log.exception("could not log the status to W&B")


def finish(loggers: Sequence[Logger], status: str = "success") -> None:
    """Close every logger (W&B runs especially), also after a crash."""
    for lg in loggers:
        try:
            lg.finalize(status)
        except Exception:  # a failing logger must not hide the run's own error
            log.exception("could not finalize logger %s", type(lg).__name__)
    try:
        import wandb

        if wandb.run is not None:
            wandb.finish(exit_code=0 if status == "success" else 1)
    except ImportError:
        pass
