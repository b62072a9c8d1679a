"""Multiple-choice metrics for the oncology MCQ set (docs/metrics.md).

A response is **valid** if it resolves to exactly one of the row's options; the accuracy is
taken over valid responses only, and the invalid rate is reported beside it (docs/metrics.md: invalid
excluded and reported). Because excluding invalid responses flatters a model that answers only
the questions it is sure of, ``mcq_acc_strict`` (invalid counted as wrong) is reported too.

Questions have 2-5 options, so chance level differs between pools: the random baseline is the
mean of 1/k over the pool's questions (all of them, valid or not: it describes the question
pool, not the model). The 95 % interval of the accuracy resamples **cases** (several questions
come from one report) as the run's `evaluation.bootstrap` says (2000 resamples, seed 42), via
:mod:`medvqa.statistics.bootstrap`, and is reported as ``mcq_acc ± mcq_acc_ci_half`` with the exact bounds in ``_ci_lo`` / ``_ci_hi``.

A reply is resolved to an option by `medvqa.data.answers.resolve_prediction` (the rules
are listed there); the answer key may be the option's text or its letter
(`answers.key_option`), and a key that is neither is an error rather than a silent zero.

``matching`` picks the reading. ``medvqa`` (the default) is the one above. ``vlmevalkit_exact``
is VLMEvalKit's exact matching (`medvqa.scoring.vlmevalkit_matching`, its scorer without a
judge model), under which every key is ``mcq_vlmevalkit_exact_*``: its
``mcq_vlmevalkit_exact_acc_strict`` is the accuracy VLMEvalKit prints for the file. The readings
differ on real replies ("b", "B" with a long explanation after it), so a key always says
which one it is; ``mcq_acc_strict`` is medvqa's reading with invalid replies counted wrong, not
VLMEvalKit's number. A row read from a VLMEvalKit file keeps its option letters
(`records.OPTION_LETTERS`): VLMEvalKit's reading uses them, and a key naming an option the
file left empty (VLMEvalKit's loader reads an option "None" as missing, so the model was never
shown it) is scored as VLMEvalKit scores it, never right.
"""

from __future__ import annotations

import logging
import string
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, get_args

import numpy as np
import pandas as pd

from medvqa.data.answers import key_option, resolve_prediction
from medvqa.data.records import (
    ANSWER,
    ANSWER_TYPE,
    CANDIDATES,
    CASE_ID,
    OPTION_LETTERS,
    PREDICTION,
)
from medvqa.errors import ConfigError
from medvqa.scoring import vlmevalkit_matching
from medvqa.scoring.metrics.base import (
    COUNT,
    ERROR_RATE,
    REFERENCE,
    MetricFamily,
    ScoreInfo,
    answer_rows,
    no_candidates,
)
from medvqa.statistics.bootstrap import Bootstrap, cluster_bootstrap, mean_or_nan

log = logging.getLogger(__name__)

__all__ = [
    "MCQ_CHANCE",
    "MCQ_CHOICE",
    "MCQ_CORRECT",
    "MCQ_INVALID",
    "MCQ_MATCHINGS",
    "McqMetric",
]

# How a reply is read as an option: medvqa's rules, or VLMEvalKit's exact matching.
Matching = Literal["medvqa", "vlmevalkit_exact"]
MCQ_MATCHINGS: tuple[str, ...] = get_args(Matching)
# An option letter as VLMEvalKit's option columns name them (its build_choices scans A-Z).
_LETTERS = string.ascii_uppercase


class McqMetric(MetricFamily):
    """Accuracy over valid responses with a case-clustered CI, invalid rate, random baseline.

    Keys: ``mcq_acc``, ``mcq_acc_ci_lo``, ``mcq_acc_ci_hi``, ``mcq_acc_ci_half``,
    ``mcq_acc_strict``, ``mcq_invalid_rate``, ``mcq_random_baseline``, ``mcq_n``,
    ``mcq_n_valid``; ``mcq_vlmevalkit_exact_*`` under ``matching=vlmevalkit_exact``. Only
    closed rows with options are MCQ rows; others are NaN per sample and ignored by the
    aggregate.
    """

    name = "mcq"
    not_performance: ClassVar[dict[str, ScoreInfo]] = {
        "n": COUNT,
        "n_valid": COUNT,
        "invalid_rate": ERROR_RATE,
        "random_baseline": REFERENCE,
    }

    def __init__(
        self,
        bootstrap: Bootstrap | Mapping[str, Any],
        cluster_field: str = CASE_ID,
        matching: Matching = "medvqa",
    ) -> None:
        if matching not in MCQ_MATCHINGS:
            raise ConfigError(
                f"{self.name}: matching must be one of {MCQ_MATCHINGS}, got {matching!r}; "
                "e.g. metric.mcq.matching=vlmevalkit_exact for VLMEvalKit's exact matching."
            )
        self.bootstrap = Bootstrap.of(bootstrap)  # conf/metric/mcq.yaml: ${evaluation.bootstrap}
        self.cluster_field = cluster_field
        self.matching = matching
        # Every key says its reading: mcq_acc (medvqa), mcq_vlmevalkit_exact_acc (VLMEvalKit).
        self.key_prefix = self.prefix + ("" if matching == "medvqa" else f"{matching}_")

    def key(self, base: str) -> str:
        """The name of this family's column or score `base` under its reading."""
        return f"{self.key_prefix}{base}"

    def headline(self) -> dict[str, str]:
        """Accuracy over the multiple-choice rows, under this family's matching."""
        return {"closed": self.key("acc")}

    def per_sample(self, preds: pd.DataFrame) -> pd.DataFrame:
        """``mcq_choice`` (None = invalid) and float ``mcq_correct`` (NaN if invalid),
        ``mcq_invalid``, ``mcq_chance`` per row."""
        missing = [c for c in (PREDICTION, ANSWER, ANSWER_TYPE, CANDIDATES) if c not in preds]
        if missing:
            raise ValueError(f"{self.name}: predictions table lacks column(s) {missing}.")
        n = len(preds)
        choice: list[str | None] = [None] * n
        correct, invalid, chance = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
        letter_cells = preds[OPTION_LETTERS] if OPTION_LETTERS in preds else [None] * n
        for i, ((kind, pred, answer, options), cell) in enumerate(
            zip(answer_rows(preds), letter_cells, strict=True)
        ):
            if kind != "closed" or no_candidates(options):
                continue
            options = [str(o) for o in options]
            lettering = _letters(cell, options, preds.index[i])
            key = _key(answer, options, lettering)
            if key is None:
                raise ValueError(
                    f"{self.name}: row {preds.index[i]!r} has answer key {answer!r}, which is "
                    f"neither one of its options {options} nor the letter of one; fix the key "
                    f"or the row's `{CANDIDATES}`."
                )
            if self.matching == "medvqa":
                hit = resolve_prediction(pred, options)
            else:
                letters = lettering or list(_LETTERS[: len(options)])
                read = vlmevalkit_matching.can_infer(pred, dict(zip(letters, options, strict=True)))
                hit = options[letters.index(read)] if read in letters else None
            choice[i] = hit
            invalid[i] = float(hit is None)
            correct[i] = np.nan if hit is None else float(hit == key)
            chance[i] = 1.0 / len(options)
        return pd.DataFrame(
            {
                self.key("choice"): pd.Series(choice, index=preds.index, dtype=object),
                self.key("correct"): correct,
                self.key("invalid"): invalid,
                self.key("chance"): chance,
            },
            index=preds.index,
        )

    def aggregate(self, scored: pd.DataFrame) -> dict[str, float]:
        """MCQ scores of any subset of scored rows (NaN where there is nothing to average)."""
        needed = [
            self.key("correct"),
            self.key("invalid"),
            self.key("chance"),
            self.cluster_field,
        ]
        missing = [c for c in needed if c not in scored.columns]
        if missing:
            raise ValueError(
                f"{self.name}: scored table lacks column(s) {missing}; join the records "
                f"(which carry `{self.cluster_field}`) with McqMetric.per_sample's columns."
            )
        mcq = scored[scored[self.key("invalid")].notna()]
        correct = mcq[self.key("correct")].to_numpy(dtype=float)
        valid = ~np.isnan(correct)
        boot = self.bootstrap
        ci = cluster_bootstrap(
            correct,
            mcq[self.cluster_field].to_numpy(),
            B=max(boot.samples, 1),
            seed=boot.seed,
            level=boot.level,
        )
        acc = self.key("acc")
        return {
            acc: ci.point,
            **(ci.entries(acc) if boot.samples else {}),
            self.key("acc_strict"): mean_or_nan(np.where(valid, correct, 0.0)),
            self.key("invalid_rate"): mean_or_nan(mcq[self.key("invalid")].to_numpy(dtype=float)),
            self.key("random_baseline"): mean_or_nan(mcq[self.key("chance")].to_numpy(dtype=float)),
            self.key("n"): float(len(mcq)),
            self.key("n_valid"): float(valid.sum()),
        }


# The `mcq` family's per-sample columns under matching=medvqa (it writes `self.key(base)`).
MCQ_CHOICE = McqMetric.column("choice")
MCQ_CORRECT = McqMetric.column("correct")
MCQ_INVALID = McqMetric.column("invalid")
MCQ_CHANCE = McqMetric.column("chance")


# An answer key naming an option its row does not offer: VLMEvalKit scores the row, never right.
_NOT_OFFERED = ""


def _letters(cell: Any, options: list[str], row: Any) -> list[str] | None:
    """The letters the peer's file gave the options (`OPTION_LETTERS`); None without them."""
    if not isinstance(cell, list | tuple | np.ndarray):  # np.ndarray: a list read from Parquet
        return None
    letters = [str(letter) for letter in cell]
    if len(letters) != len(options) or not set(letters) <= set(_LETTERS):
        raise ValueError(
            f"mcq: row {row!r} has option letters {letters} for the options {options}; give "
            f"one letter A-Z per option in `{OPTION_LETTERS}`, or drop that column."
        )
    return letters


def _key(answer: Any, options: list[str], letters: list[str] | None) -> str | None:
    """The option the key names: its text or its letter (`answers.key_option`, or the file's
    own lettering); `_NOT_OFFERED` for a letter of that lettering the row leaves empty."""
    if letters is None or answer in options:
        return key_option(answer, options)
    if answer in letters:
        return options[letters.index(answer)]
    lone_letter = isinstance(answer, str) and len(answer) == 1 and answer in _LETTERS
    return _NOT_OFFERED if lone_letter else None
