"""`task=splits`: build the splits of (dataset, shift) and write their report; no model."""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig

from medvqa.tasks.common import prepare_splits
from medvqa.tracking import log_metrics


def splits(
    cfg: DictConfig,
    out_dir: Path,
    loggers: Sequence[Logger] = (),
    provenance: MutableMapping[str, Any] | None = None,
) -> dict[str, float]:
    """Return the split sizes as metrics (`splits/<split>/n`), so results.json records them."""
    _, built = prepare_splits(cfg, out_dir, limit=False, provenance=provenance)
    report = built.report()
    metrics = {
        f"splits/{split}/{key}": float(value)
        for split, counts in report["splits"].items()
        for key, value in counts.items()
    }
    log_metrics(loggers, metrics)
    return metrics
