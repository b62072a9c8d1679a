"""Per-aspect adjudication for Kvasir-VQA-x1 (SPEC §4), on the LLM judge's machinery.

A Kvasir question can combine several atomic questions, each of a `question_class` (an
"aspect": polyp_type, instrument_presence, ...). For every class of a row the judge model
reads the question, the aspect, the ground truth and the prediction, and answers with
``{"score": 0|1, "reason": "..."}``: does the prediction get *this* aspect right? The rubric
is versioned by hash like the judge's, and `logits` mode (labels 0/1, argmax) works the same.

Everything else is the judge's (`medvqa.evaluation.judge.JudgeMetric`): backend (`hf` or
`openai`), SQLite cache, retries with a reminder, failure recording, and counters, here under
`aspect_judge/` (`calls`, `retries`, `cache_hits`, `shortcut_hits`, `failures`; counted per
(row, aspect) judgment). The cache key holds the aspect, so each aspect of an item is judged
and cached on its own; identical (question, ground truth, prediction, aspect) items are judged
once. Hybrid shortcut: a prediction equal to the ground truth after `normalize_answer` scores
1 on every aspect without a call.

Columns per row: `aspect_scores` (dict class -> 0/1, NaN where the judgment failed),
`aspect_reasons` (dict class -> reason or error), `aspect_acc` (mean over the row's judged
aspects) and `aspect_failed` (aspects that could not be judged). A row without question
classes has `aspect_acc` NaN and empty dicts. Aggregates: `aspect_acc` (mean over all judged
(row, aspect) pairs), `aspect_acc_<class>` for each class present, `aspect_failures`. Per
complexity level: `evaluation.breakdown=[complexity]`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from medvqa.data.records import ANSWER, QUESTION
from medvqa.evaluation.families.traditional import normalize_answer
from medvqa.evaluation.judge import (
    INPUT_KEYS,
    PREDICTION,
    SHORTCUT_REASON,
    JudgeItem,
    JudgeMetric,
    Judgment,
    Rubric,
    as_text,
)
from medvqa.evaluation.judge_backends import JudgeBackend
from medvqa.evaluation.judge_cache import JudgeCache

log = logging.getLogger(__name__)

__all__ = [
    "ASPECT",
    "ASPECT_ACC",
    "ASPECT_FAILED",
    "ASPECT_REASONS",
    "ASPECT_RUBRIC",
    "ASPECT_SCORES",
    "QUESTION_CLASS",
    "AspectJudgeMetric",
    "aspects_of",
]

QUESTION_CLASS = "question_class"
ASPECT = "aspect"
ASPECT_SCORES = "aspect_scores"
ASPECT_REASONS = "aspect_reasons"
ASPECT_ACC = "aspect_acc"
ASPECT_FAILED = "aspect_failed"

ASPECT_TEXT = (
    "You check one aspect of an answer given by a visual question answering system for "
    "gastrointestinal endoscopy images. The user message is a JSON object with the "
    '"question", the "aspect" to check, the "ground_truth" answer and the system\'s '
    '"prediction". A question may ask about several aspects at once (for example the type of '
    "a polyp and whether an instrument is visible); the aspect names one of them, as an "
    "identifier with words joined by underscores (e.g. polyp_type, instrument_presence).\n\n"
    "You do not see the image. Find what the ground truth says about this aspect only, and "
    "decide whether the prediction says the same about it. What the prediction says about "
    "other aspects, right or wrong, does not count. Wording, synonyms, abbreviations and "
    "letter case do not matter; a different finding, type, count, colour, size, location or "
    "a yes where the ground truth says no does.\n\n"
    "Give a score:\n"
    "1 = the prediction answers this aspect as the ground truth does.\n"
    "0 = the prediction contradicts the ground truth on this aspect, or says nothing about "
    "it.\n\n"
    'Reply with only a JSON object: {"score": <0 or 1>, "reason": "<one short sentence>"}'
)

ASPECT_RUBRIC = Rubric(
    "aspect",
    ASPECT_TEXT,
    ("0", "1"),
    (0, 1),
    "argmax",
    input_keys=(INPUT_KEYS[0], ASPECT, *INPUT_KEYS[1:]),
)


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


class AspectJudgeMetric(JudgeMetric):
    """The per-aspect judge as a metric family (`per_sample` / `aggregate` / `counters`).

    Built like the judge: `AspectJudgeMetric.from_config(cfg.judge)` (conf/metric/
    aspect_judge.yaml), or from a backend and an optional cache.
    """

    name = "aspect_judge"

    def __init__(
        self,
        backend: JudgeBackend,
        cache: JudgeCache | None = None,
        rubric: Rubric = ASPECT_RUBRIC,
        on_judgment: Callable[[str, Judgment], None] | None = None,
    ) -> None:
        super().__init__(backend, cache, on_judgment=on_judgment)
        if ASPECT not in rubric.input_keys:
            raise ValueError(f"aspect rubric {rubric.name!r} does not show the judge the aspect")
        self.rubric = rubric

    def item_key(self, question: str, answer: str, prediction: str, aspect: str) -> str:
        """The cache key of one (item, aspect) judgment."""
        return JudgeCache.key(
            self.backend.judge_id, f"{self.rubric.id}:{aspect}", question, answer, prediction
        )

    def per_sample(self, preds: pd.DataFrame) -> pd.DataFrame:
        missing = [c for c in (QUESTION, ANSWER, PREDICTION, QUESTION_CLASS) if c not in preds]
        if missing:
            raise ValueError(
                f"the aspect judge needs column(s) {missing} in the predictions table (has "
                f"{list(preds.columns)}); it is meant for Kvasir-VQA-x1, whose rows carry "
                "question_class"
            )
        rubric = self.rubric
        n = len(preds)
        scores: list[dict[str, float]] = [{} for _ in range(n)]
        reasons: list[dict[str, str]] = [{} for _ in range(n)]
        failed = np.zeros(n)
        items: dict[str, JudgeItem] = {}
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
            norm = normalize_answer(a)
            shortcut = bool(norm) and normalize_answer(p) == norm
            for aspect in aspects_of(classes):
                if shortcut:
                    scores[i][aspect] = rubric.max_value
                    reasons[i][aspect] = SHORTCUT_REASON
                    self._counters.add("shortcut_hits")
                    continue
                scores[i][aspect] = math.nan
                key = self.item_key(q, a, p, aspect)
                item = items.setdefault(
                    key, JudgeItem(key, rubric, q, a, p, extra={ASPECT: aspect})
                )
                item.rows.append(i)

        judgments = self._lookup(items)
        pending = [item for key, item in items.items() if key not in judgments]
        if pending:
            judgments.update(self._judge_all(pending))
        for key, item in items.items():
            j, aspect = judgments[key], item.extra[ASPECT]
            for i in item.rows:
                if j.status == "ok":
                    scores[i][aspect] = float(j.score)
                    reasons[i][aspect] = j.reason
                else:
                    failed[i] += 1
                    reasons[i][aspect] = j.error
        n_failed = int(failed.sum())
        if n_failed:
            first = next(j for j in judgments.values() if j.status == "failed")
            log.warning(
                "aspect judge: %d (row, aspect) pair(s) could not be judged (recorded in "
                "aspect_failed; retried on the next run). First error: %s",
                n_failed,
                first.error,
            )
        log.info("aspect judge %s: %s", self.backend.judge_id, self.counters())
        acc = [_mean([v for v in row.values() if not math.isnan(v)]) for row in scores]
        return pd.DataFrame(
            {
                ASPECT_SCORES: pd.Series(scores, index=preds.index, dtype=object),
                ASPECT_REASONS: pd.Series(reasons, index=preds.index, dtype=object),
                ASPECT_ACC: acc,
                ASPECT_FAILED: failed,
            },
            index=preds.index,
        )

    def aggregate(self, scored: pd.DataFrame) -> dict[str, float]:
        """`aspect_acc` over every judged (row, aspect) pair, `aspect_acc_<class>` for each
        class present in `scored` (NaN when none of its pairs could be judged), and
        `aspect_failures` (pairs that could not be)."""
        per_class: dict[str, list[float]] = {}
        for row in scored[ASPECT_SCORES]:
            if isinstance(row, Mapping):
                for aspect, value in row.items():
                    per_class.setdefault(str(aspect), []).append(_float(value))
        judged = {k: [v for v in vs if not math.isnan(v)] for k, vs in per_class.items()}
        out = {ASPECT_ACC: _mean([v for vs in judged.values() for v in vs])}
        for aspect in sorted(judged):
            out[f"{ASPECT_ACC}_{aspect}"] = _mean(judged[aspect])
        out["aspect_failures"] = float(scored[ASPECT_FAILED].sum())
        return out


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else math.nan
