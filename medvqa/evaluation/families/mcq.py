"""Multiple-choice metrics for the oncology MCQ set (docs/metrics.md).

A response is **valid** if it resolves to exactly one of the row's options; the accuracy is
taken over valid responses only, and the invalid rate is reported beside it (docs/metrics.md: invalid
excluded and reported). Because excluding invalid responses flatters a model that answers only
the questions it is sure of, ``mcq_acc_strict`` (invalid counted as wrong) is reported too.

Questions have 2-5 options, so chance level differs between pools: the random baseline is the
mean of 1/k over the pool's questions (all of them, valid or not: it describes the question
pool, not the model). The 95 % interval of the accuracy resamples **cases** (several questions
come from one report) as the run's `evaluation.bootstrap` says (2000 resamples, seed 42), via
:mod:`medvqa.evaluation.statistics`, and is reported as ``mcq_acc ± mcq_acc_ci_half`` with the exact bounds in ``_ci_lo`` / ``_ci_hi``.

A reply is resolved to an option by `medvqa.evaluation.answers.resolve_prediction` (the rules
are listed there); the answer key may be the option's text or its letter
(`answers.key_option`), and a key that is neither is an error rather than a silent zero.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from medvqa.data.records import ANSWER, ANSWER_TYPE, CANDIDATES, CASE_ID, PREDICTION
from medvqa.evaluation.answers import key_option, resolve_prediction
from medvqa.evaluation.families.base import (
    COUNT,
    ERROR_RATE,
    REFERENCE,
    MetricFamily,
    ScoreInfo,
    answer_rows,
    no_candidates,
)
from medvqa.evaluation.statistics import Bootstrap, cluster_bootstrap, mean_or_nan

log = logging.getLogger(__name__)

__all__ = [
    "MCQ_CHANCE",
    "MCQ_CHOICE",
    "MCQ_CORRECT",
    "MCQ_INVALID",
    "McqMetric",
]


class McqMetric(MetricFamily):
    """Accuracy over valid responses with a case-clustered CI, invalid rate, random baseline.

    Keys: ``mcq_acc``, ``mcq_acc_ci_lo``, ``mcq_acc_ci_hi``, ``mcq_acc_ci_half``,
    ``mcq_acc_strict``, ``mcq_invalid_rate``, ``mcq_random_baseline``, ``mcq_n``,
    ``mcq_n_valid``. Only closed rows with options are MCQ rows; others are NaN per sample and
    ignored by the aggregate.
    """

    name = "mcq"
    not_performance: ClassVar[dict[str, ScoreInfo]] = {
        "n": COUNT,
        "n_valid": COUNT,
        "invalid_rate": ERROR_RATE,
        "random_baseline": REFERENCE,
    }

    def __init__(
        self, bootstrap: Bootstrap | Mapping[str, Any], cluster_field: str = CASE_ID
    ) -> None:
        self.bootstrap = Bootstrap.of(bootstrap)  # conf/metric/mcq.yaml: ${evaluation.bootstrap}
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
        for i, (kind, pred, answer, options) in enumerate(answer_rows(preds)):
            if kind != "closed" or no_candidates(options):
                continue
            options = [str(o) for o in options]
            key = key_option(answer, options)
            if key is None:
                raise ValueError(
                    f"{self.name}: row {preds.index[i]!r} has answer key {answer!r}, which is "
                    f"neither one of its options {options} nor the letter of one; fix the key "
                    f"or the row's `{CANDIDATES}`."
                )
            hit = resolve_prediction(pred, options)
            choice[i] = hit
            invalid[i] = float(hit is None)
            correct[i] = np.nan if hit is None else float(hit == key)
            chance[i] = 1.0 / len(options)
        return pd.DataFrame(
            {
                self.column("choice"): pd.Series(choice, index=preds.index, dtype=object),
                self.column("correct"): correct,
                self.column("invalid"): invalid,
                self.column("chance"): chance,
            },
            index=preds.index,
        )

    def aggregate(self, scored: pd.DataFrame) -> dict[str, float]:
        """MCQ scores of any subset of scored rows (NaN where there is nothing to average)."""
        needed = [
            self.column("correct"),
            self.column("invalid"),
            self.column("chance"),
            self.cluster_field,
        ]
        missing = [c for c in needed if c not in scored.columns]
        if missing:
            raise ValueError(
                f"{self.name}: scored table lacks column(s) {missing}; join the records "
                f"(which carry `{self.cluster_field}`) with McqMetric.per_sample's columns."
            )
        mcq = scored[scored[self.column("invalid")].notna()]
        correct = mcq[self.column("correct")].to_numpy(dtype=float)
        valid = ~np.isnan(correct)
        boot = self.bootstrap
        ci = cluster_bootstrap(
            correct,
            mcq[self.cluster_field].to_numpy(),
            B=max(boot.samples, 1),
            seed=boot.seed,
            level=boot.level,
        )
        acc = self.column("acc")
        return {
            acc: ci.point,
            **(ci.entries(acc) if boot.samples else {}),
            self.column("acc_strict"): mean_or_nan(np.where(valid, correct, 0.0)),
            self.column("invalid_rate"): mean_or_nan(
                mcq[self.column("invalid")].to_numpy(dtype=float)
            ),
            self.column("random_baseline"): mean_or_nan(
                mcq[self.column("chance")].to_numpy(dtype=float)
            ),
            self.column("n"): float(len(mcq)),
            self.column("n_valid"): float(valid.sum()),
        }


# The `mcq` family's per-sample columns (a family writes `self.column(base)`).
MCQ_CHOICE = McqMetric.column("choice")
MCQ_CORRECT = McqMetric.column("correct")
MCQ_INVALID = McqMetric.column("invalid")
MCQ_CHANCE = McqMetric.column("chance")
