"""Collect run records (results.json, or W&B runs: `analysis.wandb_runs`) into one tidy
table: the rows of each record (`analysis.rows`), runs of one method that differ in config
labelled apart (`analysis.variants`), one display name per method (`analysis.methods`), and a
`table` key per setting (x model).

Everything is read from what a run logged, never from directory names, so a sweep can be
moved, merged or renamed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from medvqa.analysis.methods import distinct_names, newest_names
from medvqa.analysis.rows import ID_COLUMNS, SKIPPED, placed_rows, skipped_row
from medvqa.analysis.summary import COLUMNS
from medvqa.analysis.variants import mark_variants
from medvqa.record import RESULTS_FILE, read_record


def find_records(dirs: Sequence[Path | str]) -> list[Path]:
    """Every results.json under the directories (recursively), in a stable order."""
    paths: list[Path] = []
    for d in map(Path, dirs):
        if d.is_file() and d.name == RESULTS_FILE:
            paths.append(d)
        elif d.is_dir():
            paths.extend(sorted(d.rglob(RESULTS_FILE)))
        else:
            raise FileNotFoundError(
                f"{d}: no such directory; pass the run or sweep directories that hold "
                f"{RESULTS_FILE} files (e.g. logs/multiruns/<date>/<time>)"
            )
    return paths


def records_frame(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Rows -> DataFrame with identity columns first and a `table` key per setting (× model).

    `table` is the setting, with the model appended only when several models were run, so a
    single-model study keeps short table names.
    """
    frame = pd.DataFrame.from_records(list(rows))
    if frame.empty:
        return pd.DataFrame(columns=[*ID_COLUMNS, *COLUMNS])
    frame = newest_names(frame)
    if "_what" in frame:
        frame = mark_variants(frame).drop(columns=["_what", "_flat"], errors="ignore")
    frame = distinct_names(frame)
    # Skipped records (model "?") are no model of the study.
    several_models = frame.loc[frame["status"] != SKIPPED, "model"].nunique() > 1
    frame["table"] = (
        frame["setting"] + " · " + frame["model"].astype(str)
        if several_models
        else frame["setting"]
    )
    headline = [c for col in COLUMNS for c in (col, f"{col} ci_half")]
    for col in (*ID_COLUMNS, *headline):
        if col not in frame:
            frame[col] = None if col in ID_COLUMNS else math.nan
    rest = [c for c in frame.columns if c not in ID_COLUMNS]
    return frame[[*ID_COLUMNS, *rest]]


def collect(dirs: Sequence[Path | str]) -> pd.DataFrame:
    """Tidy table of every results.json under the directories.

    A record that cannot be read (not JSON, not a JSON object, no status or metrics) or not
    placed in a table (no config) is not skipped silently: a warning names the file, and it
    becomes an `unreadable` row with the reason, which the report lists among its issues.
    """
    rows: list[dict[str, Any]] = []
    for path in find_records(dirs):
        try:
            record = read_record(path)
        except ValueError as err:
            rows.append(skipped_row(str(path), str(err)))
            continue
        rows.extend(placed_rows(record, str(path)))
    return records_frame(rows)


def merge(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Several sources in one table (the `table` key is recomputed over all of them)."""
    frames = [f for f in frames if not f.empty]
    if not frames:
        return records_frame([])
    rows = pd.concat(frames, ignore_index=True).drop(columns=["table"]).to_dict("records")
    return records_frame(rows)
