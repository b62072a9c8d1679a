"""Multiple-choice metrics for the oncology MCQ set (docs/metrics.md).

A response is **valid** if it resolves to exactly one of the row's options; the accuracy is
taken over valid responses only, and the invalid rate is reported beside it (docs/metrics.md: invalid
excluded and reported). Because excluding invalid responses flatters a model that answers only
the questions it is sure of, ``mcq_acc_strict`` (invalid counted as wrong) is reported too.

Questions have 2-5 options, so chance level differs between pools: the random baseline is the
mean of 1/k over the pool's questions (all of them, valid or not: it describes the question
pool, not the model). The 95 % interval of the accuracy resamples **cases** (several questions
come from one report), B = 2000, seed 42, via :mod:`medvqa.evaluation.statistics`, and is
reported as ``mcq_acc ± mcq_acc_ci_half`` with the exact bounds in ``_ci_lo`` / ``_ci_hi``.

Resolution rules (:func:`resolve_prediction`), first match wins:

1. the option text (exactly, or ignoring case) or a bare letter ``B``, ``b``, ``B)``, ``(B)``,
   ``B.`` naming one of the row's options (a letter past the last option is invalid);
2. the same after a lead-in such as "Answer:", "The answer is", "Option" and without trailing
   periods ("The answer is (C)." -> C);
3. a letter followed by text, "B) liver": the letter's option, unless the text selects a
   *different* option (a contradiction, invalid);
4. the option text inside prose, by :func:`medvqa.evaluation.families.traditional.closed_choice`
   (normalised exact match or a unique whole-word containment; two options -> invalid).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from medvqa.data.records import ANSWER, ANSWER_TYPE, CANDIDATES, CASE_ID
from medvqa.data.sources.oncology_mcq import LETTERS, resolve_answer
from medvqa.evaluation.families.base import MetricFamily
from medvqa.evaluation.families.traditional import PREDICTION, closed_choice
from medvqa.evaluation.statistics import cluster_bootstrap, mean_or_nan

log = logging.getLogger(__name__)

__all__ = [
    "MCQ_CHANCE",
    "MCQ_CHOICE",
    "MCQ_CORRECT",
    "MCQ_INVALID",
    "McqMetric",
    "resolve_prediction",
]

# Per-sample columns: the resolved option (None = invalid) and floats.
MCQ_CHOICE = "mcq_choice"
MCQ_CORRECT = "mcq_correct"  # NaN where invalid: accuracy is over valid responses
MCQ_INVALID = "mcq_invalid"
MCQ_CHANCE = "mcq_chance"  # 1 / number of options

_LEAD_IN = re.compile(
    r"^(?:the\s+)?(?:correct\s+|final\s+|best\s+)?(?:answer|option|choice)\b\s*(?:is\b)?\s*[:\-]?\s*",
    re.IGNORECASE,
)
_LETTER_TEXT = re.compile(r"^\(?([A-Ea-e])\s*[).:]\s*(.+)$", re.DOTALL)


def _strip(text: str) -> str:
    return text.strip().rstrip(".").strip()


def resolve_prediction(prediction: Any, options: Sequence[str]) -> str | None:
    """The option a free-text response selects, or None if it selects none or several."""
    if prediction is None or (isinstance(prediction, float) and math.isnan(prediction)):
        return None
    options = [str(o) for o in options]
    text = str(prediction).strip()
    if not text:
        return None
    for candidate in (text, _strip(text), _strip(_LEAD_IN.sub("", text, count=1))):
        if candidate:
            hit = resolve_answer(candidate, options)
            if hit is not None:
                return hit
    body = _strip(_LEAD_IN.sub("", text, count=1))
    lettered = _LETTER_TEXT.match(body)
    if lettered is not None:
        index = LETTERS.index(lettered.group(1).upper())
        if index >= len(options):
            return None
        named = closed_choice(lettered.group(2), options)
        return options[index] if named in (None, options[index]) else None
    return closed_choice(text, options)


def _no_options(options: Any) -> bool:
    if options is None or (isinstance(options, float) and math.isnan(options)):
        return True
    return len(options) == 0


class McqMetric(MetricFamily):
    """Accuracy over valid responses with a case-clustered CI, invalid rate, random baseline.

    Keys: ``mcq_acc``, ``mcq_acc_ci_lo``, ``mcq_acc_ci_hi``, ``mcq_acc_ci_half``,
    ``mcq_acc_strict``, ``mcq_invalid_rate``, ``mcq_random_baseline``, ``mcq_n``,
    ``mcq_n_valid``. Only closed rows with options are MCQ rows; others are NaN per sample and
    ignored by the aggregate.
    """

    name = "mcq"

    def __init__(
        self, B: int = 2000, seed: int = 42, level: float = 0.95, cluster_field: str = CASE_ID
    ) -> None:
        self.B, self.seed, self.level = int(B), int(seed), float(level)
        self.cluster_field = cluster_field

    def per_sample(self, preds: pd.DataFrame) -> pd.DataFrame:
        """``mcq_choice`` (None = invalid) and float ``mcq_correct`` (NaN if invalid),
        ``mcq_invalid``, ``mcq_chance`` per row."""
        missing = [c for c in (PREDICTION, ANSWER, ANSWER_TYPE, CANDIDATES) if c not in preds]
        if missing:
            raise ValueError(f"{self.name}: predictions table lacks column(s) {missing}.")
        n = len(preds)
        choice: list[str | None] = [None] * n
        correct, invalid, chance = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
        rows = zip(
            preds[ANSWER_TYPE].to_numpy(),
            preds[PREDICTION].to_numpy(),
            preds[ANSWER].to_numpy(),
            preds[CANDIDATES].to_numpy(),
            strict=True,
        )
        for i, (kind, pred, answer, options) in enumerate(rows):
            if kind != "closed" or _no_options(options):
                continue
            options = [str(o) for o in options]
            hit = resolve_prediction(pred, options)
            choice[i] = hit
            invalid[i] = float(hit is None)
            correct[i] = np.nan if hit is None else float(hit == str(answer))
            chance[i] = 1.0 / len(options)
        return pd.DataFrame(
            {
                MCQ_CHOICE: pd.Series(choice, index=preds.index, dtype=object),
                MCQ_CORRECT: correct,
                MCQ_INVALID: invalid,
                MCQ_CHANCE: chance,
            },
            index=preds.index,
        )

    def aggregate(self, scored: pd.DataFrame) -> dict[str, float]:
        """MCQ scores of any subset of scored rows (NaN where there is nothing to average)."""
        needed = [MCQ_CORRECT, MCQ_INVALID, MCQ_CHANCE, self.cluster_field]
        missing = [c for c in needed if c not in scored.columns]
        if missing:
            raise ValueError(
                f"{self.name}: scored table lacks column(s) {missing}; join the records "
                f"(which carry `{self.cluster_field}`) with McqMetric.per_sample's columns."
            )
        mcq = scored[scored[MCQ_INVALID].notna()]
        correct = mcq[MCQ_CORRECT].to_numpy(dtype=float)
        valid = ~np.isnan(correct)
        ci = cluster_bootstrap(
            correct,
            mcq[self.cluster_field].to_numpy(),
            B=self.B,
            seed=self.seed,
            level=self.level,
        )
        return {
            "mcq_acc": ci.point,
            **ci.entries("mcq_acc"),
            "mcq_acc_strict": mean_or_nan(np.where(valid, correct, 0.0)),
            "mcq_invalid_rate": mean_or_nan(mcq[MCQ_INVALID].to_numpy(dtype=float)),
            "mcq_random_baseline": mean_or_nan(mcq[MCQ_CHANCE].to_numpy(dtype=float)),
            "mcq_n": float(len(mcq)),
            "mcq_n_valid": float(valid.sum()),
        }
