"""The interface every metric family implements, and how a family registers itself.

A family is one module in this package (or a module named in MEDVQA_PLUGINS) with a subclass
of `MetricFamily` that sets `name`; its constructor's typed parameters are its config schema
(`conf/metric/<name>.yaml` starts from `<name>_schema`). `metric=[traditional,judge]` selects
families, and `medvqa.evaluation.scoring` joins their per-sample columns and aggregates.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import pandas as pd

from medvqa.data import records as R
from medvqa.evaluation.statistics import BootstrapCI, paired_bootstrap_diff
from medvqa.plugins import Plugin


class MetricFamily(Plugin, ABC):
    """Scores predictions: per-sample columns for every row, flat aggregates over any subset.

    `preds` holds the normalised record columns plus `prediction`. Per-sample columns are named
    like the scores; an aggregate over rows where a score does not apply is NaN, never 0.
    A family may also define `counters() -> dict[str, float]` (e.g. the judge's call counts)
    and `ci_columns() -> {score: (per-sample column, answer type)}` for its scores that are
    per-sample means; `paired_delta` compares two evaluations of the same questions.

    A family whose scoring can fail per item (a judge that did not answer) names in
    `failures_key` the aggregate that counts such items, `<prefix>_failures`, and names its
    scores `<prefix>_...` (so a NaN score can be traced to its failures). Every aggregate over
    rows that include a failed item is NaN, never a mean over the rest, and a run with any is
    recorded `incomplete`.
    """

    plugin_kind: ClassVar[str] = "metric"
    failures_key: ClassVar[str | None] = None

    @classmethod
    def owns(cls, score: str) -> bool:
        """Whether `score` is one of this family's (a family that can fail per item names its
        scores after its `failures_key`: `judge_closed_acc` and `judge_failures`)."""
        return bool(cls.failures_key) and score.startswith(
            cls.failures_key.removesuffix("failures")
        )

    @abstractmethod
    def per_sample(self, preds: pd.DataFrame) -> pd.DataFrame:
        """Score columns for every row of `preds` (same index, no input columns)."""

    @abstractmethod
    def aggregate(self, scored: pd.DataFrame) -> dict[str, float]:
        """Flat scores (no split prefix) over the rows of `scored`."""

    def provenance(self) -> dict[str, Any]:
        """What identifies the scores beyond the family's config (the judge: its model and
        rubric hashes), for the `provenance` of results.json."""
        return {}

    def paired_delta(
        self, scored_a: pd.DataFrame, scored_b: pd.DataFrame, score: str, **bootstrap: Any
    ) -> BootstrapCI | None:
        """`score` of a minus `score` of b, two scored tables of the same questions, with a
        paired interval; None when this family does not compute `score` or cannot pair it.

        The default covers scores that are per-sample means (`ci_columns`): a paired case
        bootstrap (`bootstrap`: B, seed, level). A family whose score is not a mean of
        per-row values (macro-F1 over labels) overrides this to recompute it per resample."""
        columns = getattr(self, "ci_columns", None)
        if not callable(columns) or score not in columns():
            return None
        column, answer_type = columns()[score]
        return mean_paired_delta(scored_a, scored_b, column, answer_type, **bootstrap)


def mean_paired_delta(
    scored_a: pd.DataFrame,
    scored_b: pd.DataFrame,
    column: str,
    answer_type: str,
    **bootstrap: Any,
) -> BootstrapCI | None:
    """mean(a) − mean(b) of a per-sample `column` over the rows of `answer_type`, with a
    paired case-bootstrap interval (one draw of cases for both sides).

    None (no number) when a side lacks the column, when the two sides are not the same
    questions (record ids), or when a row of either side has no value: a difference over the
    rows that were scored would describe the survivors."""
    sides = []
    for frame in (scored_a, scored_b):
        if column not in frame or R.CASE_ID not in frame or R.ID not in frame:
            return None
        sides.append(frame.loc[frame[R.ANSWER_TYPE] == answer_type, [R.ID, R.CASE_ID, column]])
    a, b = sides
    if a.empty or set(a[R.ID]) != set(b[R.ID]) or a[R.ID].duplicated().any():
        return None
    joined = a.merge(b, on=R.ID, suffixes=("_a", "_b"))
    if joined[[f"{column}_a", f"{column}_b"]].isna().any().any():
        return None
    return paired_bootstrap_diff(
        joined[f"{column}_a"].to_numpy(float),
        joined[f"{R.CASE_ID}_a"].to_numpy(object),
        joined[f"{column}_b"].to_numpy(float),
        joined[f"{R.CASE_ID}_b"].to_numpy(object),
        paired=True,
        **bootstrap,
    )
