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

from medvqa.plugins import Plugin


class MetricFamily(Plugin, ABC):
    """Scores predictions: per-sample columns for every row, flat aggregates over any subset.

    `preds` holds the normalised record columns plus `prediction`. Per-sample columns are named
    like the scores; an aggregate over rows where a score does not apply is NaN, never 0.
    A family may also define `counters() -> dict[str, float]` (e.g. the judge's call counts).

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
