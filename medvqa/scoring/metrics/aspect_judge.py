"""Per-aspect adjudication for Kvasir-VQA-x1 (docs/judge.md), on the LLM judge's engine.

A Kvasir question can combine several atomic questions, each of a `question_class` (an
"aspect": polyp_type, instrument_presence, ...). For every class of a row the judge model
reads the question, the aspect, the ground truth and the prediction, and answers with
``{"score": 0|1, "reason": "..."}``: does the prediction get *this* aspect right? The rubric
(`CLASS_RUBRIC`) is versioned by hash like the judge's, and `logits` mode (labels 0/1,
argmax) works the same.

Everything else is the judge engine's (`medvqa.judge.engine`): backend (`hf` or
`openai`), SQLite cache, retries with a reminder, failure recording, and counters, here under
`aspect_judge/` (`calls`, `retries`, `cache_hits`, `shortcut_hits`, `failures`; counted per
(row, aspect) judgment). The cache key holds the aspect, so each aspect of an item is judged
and cached on its own; identical (question, ground truth, prediction, aspect) items are judged
once. Hybrid shortcut: a prediction equal to the ground truth after `normalize_answer` scores
1 on every aspect without a call.

Columns per row: `aspect_scores` (dict class -> 0/1, NaN where the judgment failed),
`aspect_reasons` (dict class -> reason or error), `aspect_acc` (mean over the row's aspects)
and `aspect_failed` (aspects that could not be judged). A row without question classes has
`aspect_acc` NaN and empty dicts. Aggregates: `aspect_acc` (mean over all (row, aspect)
pairs), `aspect_acc_<class>` for each class present, `aspect_failures`; any mean over a pair
that could not be judged is NaN. Per complexity level: `evaluation.breakdown=[complexity]`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from medvqa.data.records import ANSWER, PREDICTION, QUESTION
from medvqa.judge.base import JudgeBackend
from medvqa.judge.cache import JudgeCache
from medvqa.judge.engine import JudgeEngine, JudgeItem, as_text
from medvqa.judge.replies import Judgment
from medvqa.judge.rubrics import ASKED_CLASS, CLASS_RUBRIC, Rubric
from medvqa.judge.selfcheck import aspect_selfcheck_items
from medvqa.scoring.metrics.judged import JudgedFamily
from medvqa.statistics.bootstrap import mean_or_nan

__all__ = [
    "ASKED_CLASS",
    "CLASS_ACC",
    "CLASS_FAILED",
    "CLASS_REASONS",
    "CLASS_RUBRIC",
    "CLASS_SCORES",
    "QUESTION_CLASS",
    "AspectJudgeMetric",
    "aspects_of",
]

QUESTION_CLASS = "question_class"  # a record column (read, never written)


def aspects_of(value: Any) -> list[str]:
    """A row's question classes as distinct non-empty strings, in order: a list, tuple or
    array of names, or one name; missing (None, NaN) or malformed values give none."""
    if isinstance(value, str):
        value = [value]
    elif isinstance(value, np.ndarray):
        value = value.tolist()
    elif not isinstance(value, list | tuple):
        return []
    names = (str(v).strip() for v in value if isinstance(v, str | int))
    return list(dict.fromkeys(n for n in names if n))


class AspectJudgeMetric(JudgedFamily):
    """The per-aspect judge as a metric family (`per_sample` / `aggregate` / `counters`).

    Built like the judge: `AspectJudgeMetric.from_config(cfg.judge)` (conf/metric/
    aspect_judge.yaml), or from a backend and an optional cache.
    """

    name = "aspect_judge"

    def __init__(
        self,
        backend: JudgeBackend,
        cache: JudgeCache | None = None,
        rubric: Rubric = CLASS_RUBRIC,
        on_judgment: Callable[[str, Judgment], None] | None = None,
        selfcheck_floors: tuple[float, float] | None = None,
    ) -> None:
        """`selfcheck_floors`: run the self-check (its aspect items) before the first scoring,
        with these floors (minimum accuracy; the open tau does not apply); None: don't."""
        if ASKED_CLASS not in rubric.input_keys:
            raise ValueError(f"aspect rubric {rubric.name!r} does not show the judge the aspect")
        self.rubric = rubric
        self.engine = JudgeEngine(backend, cache, on_judgment)
        self.selfcheck_floors = selfcheck_floors

    def selfcheck_pairs(self) -> list[tuple[JudgeItem, float]]:
        return aspect_selfcheck_items(self.rubric)

    def rubric_ids(self) -> dict[str, str]:
        return {self.rubric.name: self.rubric.id}

    def item(self, question: str, answer: str, prediction: str, aspect: str) -> JudgeItem:
        """What the judge reads for one aspect of a row."""
        return JudgeItem(self.rubric, question, answer, prediction, {ASKED_CLASS: aspect})

    def item_key(self, question: str, answer: str, prediction: str, aspect: str) -> str:
        """The cache key of one (item, aspect) judgment."""
        return self.engine.key(self.item(question, answer, prediction, aspect))

    def per_sample(self, preds: pd.DataFrame) -> pd.DataFrame:
        missing = [c for c in (QUESTION, ANSWER, PREDICTION, QUESTION_CLASS) if c not in preds]
        if missing:
            raise ValueError(
                f"the aspect judge needs column(s) {missing} in the predictions table (has "
                f"{list(preds.columns)}); it is meant for Kvasir-VQA-x1, whose rows carry "
                "question_class"
            )
        n = len(preds)
        # One engine item per (row, aspect), remembered by position.
        items: list[JudgeItem] = []
        where: list[tuple[int, str]] = []
        for i, (q, a, p, classes) in enumerate(
            zip(
                preds[QUESTION],
                preds[ANSWER],
                preds[PREDICTION],
                preds[QUESTION_CLASS],
                strict=True,
            )
        ):
            q, a, p = as_text(q), as_text(a), as_text(p)
            for aspect in aspects_of(classes):
                items.append(self.item(q, a, p, aspect))
                where.append((i, aspect))
        judgments = self.judge(items, "(row, aspect) pair(s)")

        scores: list[dict[str, float]] = [{} for _ in range(n)]
        reasons: list[dict[str, str]] = [{} for _ in range(n)]
        failed = np.zeros(n)
        for (i, aspect), j in zip(where, judgments, strict=True):
            if j.status == "ok":
                scores[i][aspect] = float(j.score)
                reasons[i][aspect] = j.reason
            else:
                scores[i][aspect] = math.nan
                reasons[i][aspect] = j.error
                failed[i] += 1
        acc = [mean_or_nan(list(row.values())) for row in scores]
        return pd.DataFrame(
            {
                self.column("scores"): pd.Series(scores, index=preds.index, dtype=object),
                self.column("reasons"): pd.Series(reasons, index=preds.index, dtype=object),
                self.column("acc"): acc,
                self.column("failed"): failed,
            },
            index=preds.index,
        )

    def headline(self) -> dict[str, str]:
        """Accuracy over every (row, aspect) pair (open answers' aspects)."""
        return {"open": self.column("acc")}

    def aggregate(self, scored: pd.DataFrame) -> dict[str, float]:
        """`aspect_acc` over every (row, aspect) pair, `aspect_acc_<class>` for each class
        present in `scored`, and `aspect_failures` (pairs that could not be judged). A mean
        over pairs of which one could not be judged (NaN) is NaN, never a mean over the rest."""
        per_class: dict[str, list[float]] = {}
        for row in scored[self.column("scores")]:
            if isinstance(row, Mapping):
                for aspect, value in row.items():
                    per_class.setdefault(str(aspect), []).append(_float(value))
        acc = self.column("acc")
        out = {acc: mean_or_nan([v for vs in per_class.values() for v in vs])}
        for aspect in sorted(per_class):
            out[f"{acc}_{aspect}"] = mean_or_nan(per_class[aspect])
        out[self.failures_key] = float(scored[self.column("failed")].sum())
        return out


# The `aspect_judge` family's per-aspect columns (a family writes `self.column(base)`); the
# score names keep the word "aspect".
CLASS_SCORES = AspectJudgeMetric.column("scores")
CLASS_REASONS = AspectJudgeMetric.column("reasons")
CLASS_ACC = AspectJudgeMetric.column("acc")
CLASS_FAILED = AspectJudgeMetric.column("failed")


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan
