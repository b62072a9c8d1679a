"""The interface every metric family implements, and how a family registers itself.

A family is one module in this package (or a module named in MEDVQA_PLUGINS) with a subclass
of `MetricFamily` that sets `name`; its constructor's typed parameters are its config schema
(`conf/metric/<name>.yaml` starts from `<name>_schema`). `metric=[traditional,judge]` selects
families, and `medvqa.scoring.pipeline.Scoring` joins their per-sample columns, aggregates,
and closes them.

Every column and score a family writes is `<prefix><base>`, the prefix derived from `name`
(`judge_` for `judge`), so a copy of a family under another name writes other columns and
scores beside its original. The families published before this rule keep the names their
scores were recorded (and compared with papers) under: `ESTABLISHED_PREFIXES`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from medvqa.data import records as R
from medvqa.plugins import Plugin
from medvqa.statistics.bootstrap import BootstrapCI, is_interval, paired_bootstrap_diff

# name -> prefix of the built-in families whose score names predate the `<name>_` rule
# (SURE-VQA's `closed_acc`/`open_bleu` for traditional, `rouge1`... for text).
ESTABLISHED_PREFIXES: dict[str, str] = {
    "traditional": "",
    "text": "",
    "closed_set": "cs_",
    "kvasir_official": "kvasir_",
    "aspect_judge": "aspect_",
}


def no_candidates(cell: Any) -> bool:
    """Whether a row's candidates cell offers nothing to choose from: None, NaN (how a table
    read back leaves an empty cell) or an empty list. Such a closed row cannot be answered."""
    if cell is None or (isinstance(cell, float) and math.isnan(cell)):
        return True
    return len(cell) == 0


def answer_rows(preds: pd.DataFrame) -> Iterator[tuple[Any, Any, Any, Any]]:
    """(answer type, prediction, reference answer, candidates) of each row of `preds`, in
    order: what a family that scores closed answers against their options reads per row."""
    return zip(
        preds[R.ANSWER_TYPE].to_numpy(),
        preds[R.PREDICTION].to_numpy(),
        preds[R.ANSWER].to_numpy(),
        preds[R.CANDIDATES].to_numpy(),
        strict=True,
    )


def _is_list(value: Any) -> bool:
    return isinstance(value, list | tuple | np.ndarray)  # arrays: list cells read from Parquet


def field_groups(frame: pd.DataFrame, field: str) -> Iterator[tuple[Any, pd.DataFrame]]:
    """(value, rows) per value of `field`, sorted (in order of appearance where the values are of
    several types that do not sort, 1 and "1"); a list cell puts its row in each of its values,
    an empty or missing cell in the NaN group. The one rule for breakdowns and subgroups."""
    key = field
    if frame[field].map(_is_list).any():
        cells = frame[field].map(lambda v: list(v) if isinstance(v, np.ndarray) else v)
        frame, key = frame.assign(_value=cells).explode("_value"), "_value"
    try:
        groups = list(frame.groupby(key, dropna=False, sort=True))
    except TypeError:
        groups = list(frame.groupby(key, dropna=False, sort=False))
    for value, group in groups:
        yield value, (group.drop(columns="_value") if key == "_value" else group)


def breakdown_prefix(field: str, value: Any) -> str:
    """`<field>=<value>/`, the prefix of a breakdown's scores; a "/" inside the value (MIMIC's
    ethnicity "HISPANIC/LATINO") is written "_", since "/" separates splits, breakdowns and
    scores."""
    return f"{field}={str(value).replace('/', '_')}/"


@dataclass(frozen=True)
class ScoreInfo:
    """What a score is: a performance (relative robustness and deltas apply to it) or not (a
    count, a rate of invalid replies, an interval bound, a reference level); which way is
    better."""

    performance: bool = True
    higher_is_better: bool = True


COUNT = ScoreInfo(performance=False, higher_is_better=True)
ERROR_RATE = ScoreInfo(performance=False, higher_is_better=False)
REFERENCE = ScoreInfo(performance=False, higher_is_better=True)  # e.g. chance accuracy


class MetricFamily(Plugin, ABC):
    """Scores predictions: per-sample columns for every row, flat aggregates over any subset.

    `preds` holds the normalised record columns plus `prediction`. Per-sample columns are named
    like the scores (`self.column(base)`); an aggregate over rows where a score does not apply
    is NaN, never 0. The hooks below are no-ops a family overrides: `counters` (e.g. the
    judge's call counts), `ci_columns` (its scores that are per-sample means), `provenance`,
    `paired_delta`, `close` (release what it holds, e.g. a judge's cache).

    A family whose scoring can fail per item (a judge that did not answer) sets `can_fail`;
    it counts such items in the aggregate `failures_key` (`<prefix>failures`). Every aggregate
    over rows that include a failed item is NaN, never a mean over the rest, and a run with any
    is recorded `incomplete`.
    """

    plugin_kind: ClassVar[str] = "metric"
    can_fail: ClassVar[bool] = False
    # The scores that are not performances, by base name (without the prefix) or its last
    # `_`-separated part(s) (`n` covers `n` and `<task>_n`), and the performances where lower
    # is better; anything else this family aggregates is a performance, higher better.
    not_performance: ClassVar[Mapping[str, ScoreInfo]] = MappingProxyType({})
    lower_is_better: ClassVar[tuple[str, ...]] = ()
    # Set per class from `name` (see the module doc).
    prefix: ClassVar[str] = ""
    failures_key: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        if "name" in cls.__dict__:
            cls.prefix = ESTABLISHED_PREFIXES.get(cls.name, f"{cls.name}_")
            cls.failures_key = f"{cls.prefix}failures" if cls.can_fail else None
        super().__init_subclass__(**kwargs)

    @classmethod
    def column(cls, base: str) -> str:
        """The name of this family's column or score `base` (`judge_` + `score`)."""
        return f"{cls.prefix}{base}"

    @classmethod
    def owns(cls, score: str) -> bool:
        """Whether `score` is one of this family's that can fail (`judge_closed_acc` and
        `judge_failures` are the judge's)."""
        return bool(cls.failures_key) and score.startswith(cls.prefix)

    @classmethod
    def score_info(cls, score: str) -> ScoreInfo:
        """What this family's aggregate `score` is (a split's or breakdown's `.../` stripped)."""
        score = score.rsplit("/", 1)[-1]
        if score == cls.failures_key or is_interval(score):
            return COUNT
        base = score.removeprefix(cls.prefix)
        for name, info in cls.not_performance.items():
            if base == name or base.endswith(f"_{name}"):
                return info
        return ScoreInfo(higher_is_better=base not in cls.lower_is_better)

    @abstractmethod
    def per_sample(self, preds: pd.DataFrame) -> pd.DataFrame:
        """Score columns for every row of `preds` (same index, no input columns)."""

    @abstractmethod
    def aggregate(self, scored: pd.DataFrame) -> dict[str, float]:
        """Flat scores (no split prefix) over the rows of `scored`."""

    def counters(self) -> dict[str, float]:
        """Counts over the whole run, added once after every split (`judge/calls`)."""
        return {}

    def over_rows(self, scored: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, float]]:
        """Figures over all of a job's main answers together, every split at once (calibration:
        a temperature fitted on the validation rows, applied to the others), with any per-sample
        columns they add; the scores' `split` column says which row is which. None by default
        (`medvqa.views.run_views` calls it after the views)."""
        return scored, {}

    def ci_columns(self) -> dict[str, tuple[str, str]]:
        """Score -> (per-sample column, answer type) for the scores that are per-sample means:
        they get case-bootstrap intervals and paired deltas."""
        return {}

    def headline(self) -> dict[str, str]:
        """Answer type (`closed`, `open`) -> the score that sums the family up on it: what a
        summary shows, and the headline (RR) where `evaluation.primary_*` names no score of
        the selected families (`metric=[mcq]` alone: mcq_acc). Empty: no such score (a view
        of calibration or subgroups, not a performance)."""
        return {}

    def provenance(self) -> dict[str, Any]:
        """What identifies the scores beyond the family's config (the judge: its model and
        rubric hashes), for the `provenance` of results.json."""
        return {}

    def close(self) -> None:
        """Release what the family holds (a judge's cache and backend); called once by the
        scoring pipeline when it is done, also after an error."""

    def paired_delta(
        self, scored_a: pd.DataFrame, scored_b: pd.DataFrame, score: str, **bootstrap: Any
    ) -> BootstrapCI | None:
        """`score` of a minus `score` of b, two scored tables of the same questions, with a
        paired interval; None when this family does not compute `score` or cannot pair it.

        The default covers scores that are per-sample means (`ci_columns`): a paired case
        bootstrap (`bootstrap`: B, seed, level). A family whose score is not a mean of
        per-row values (macro-F1 over labels) overrides this to recompute it per resample."""
        columns = self.ci_columns()
        if score not in columns:
            return None
        column, answer_type = columns[score]
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
