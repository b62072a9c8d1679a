"""Steps every task shares: the dataset, its splits under the shift, and their report."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from medvqa.data.base import VQASource
from medvqa.data.shifts import Shift, Splits, limit_splits, make_splits

log = logging.getLogger(__name__)
SPLITS_FILE = "splits.json"


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
