"""Method vs method on the same test questions: paired differences with case-bootstrap CIs.

Two methods of one table and seed answered the same questions, so their difference is measured
far more precisely than the two scores' own intervals suggest: the question's difficulty
cancels out. For every such pair this reads both runs' scored tables (`scores.parquet`, next to
their `results.json`), matches the rows by split and id, and reports the difference of each
headline score (A − B) with a paired bootstrap CI that resamples cases once for both sides. A
pair where either side has a missing per-sample score (an item the judge could not score) gets
no number.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from medvqa.analysis.aggregate import method_sort_key
from medvqa.analysis.tables import USABLE, role
from medvqa.data import records as R
from medvqa.evaluation.scoring import SCORES_FILE
from medvqa.evaluation.statistics import paired_bootstrap_diff
from medvqa.record import RESULTS_FILE

COLUMNS = [
    "table",
    "seed",
    "method_a",
    "method_b",
    "split",
    "score",
    "n",
    "diff",
    "ci_lo",
    "ci_hi",
]
SPLITS = ("test_iid", "test_ood")


def _scored_table(source: str) -> pd.DataFrame | None:
    """The scored table next to a local results.json (None for W&B runs or older runs)."""
    path = Path(source)
    if path.name != RESULTS_FILE or not (path.parent / SCORES_FILE).is_file():
        return None
    return pd.read_parquet(path.parent / SCORES_FILE)


def _pairs(
    a: pd.DataFrame, b: pd.DataFrame, column: str, answer_type: str, split: str
) -> pd.DataFrame | None:
    sides = []
    for frame in (a, b):
        if column not in frame or R.CASE_ID not in frame:
            return None
        rows = frame[(frame[R.SPLIT] == split) & (frame[R.ANSWER_TYPE] == answer_type)]
        sides.append(rows[[R.ID, R.CASE_ID, column]])
    joined = sides[0].merge(sides[1], on=R.ID, suffixes=("_a", "_b"))
    if joined.empty or joined[[f"{column}_a", f"{column}_b"]].isna().any().any():
        return None  # nothing in common, or an item without a score: no number
    return joined


def paired_differences(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (table, seed, method pair, split, headline score) with both scored tables
    (the bootstrap's defaults: B 2000, seed 42, 95%)."""
    if frame.empty:
        return pd.DataFrame(columns=COLUMNS)
    runs = frame[(frame["kind"] == "run") & frame["status"].isin(USABLE)]
    runs = runs[runs.apply(role, axis=1) == "method"]
    out: list[dict[str, Any]] = []
    for (table, run_seed), group in runs.groupby(["table", "seed"], sort=True):
        loaded: dict[str, tuple[pd.DataFrame, Mapping[str, Any], pd.Series]] = {}
        order = {m: i for i, m in enumerate(dict.fromkeys(group["method_id"]))}
        for _, row in group.iterrows():
            scored = _scored_table(str(row["source"]))
            if scored is not None:
                loaded[row["method_id"]] = (scored, row.get("score_columns") or {}, row)
        ids = sorted(loaded, key=lambda m: method_sort_key(m, order))
        for id_a, id_b in itertools.combinations(ids, 2):
            (a, columns, row_a), (b, _, row_b) = loaded[id_a], loaded[id_b]
            for score in (row_a["primary_closed"], row_a["primary_open"]):
                if score not in columns:
                    continue
                column, answer_type = columns[score]
                for split in SPLITS:
                    joined = _pairs(a, b, column, answer_type, split)
                    if joined is None:
                        continue
                    ci = paired_bootstrap_diff(
                        joined[f"{column}_a"].to_numpy(float),
                        joined[f"{R.CASE_ID}_a"].to_numpy(object),
                        joined[f"{column}_b"].to_numpy(float),
                        joined[f"{R.CASE_ID}_b"].to_numpy(object),
                        paired=True,
                    )
                    out.append(
                        {
                            "table": table,
                            "seed": run_seed,
                            "method_a": row_a["method"],
                            "method_b": row_b["method"],
                            "split": split,
                            "score": score,
                            "n": len(joined),
                            "diff": ci.point,
                            "ci_lo": ci.lo,
                            "ci_hi": ci.hi,
                        }
                    )
    return pd.DataFrame(out, columns=COLUMNS)
