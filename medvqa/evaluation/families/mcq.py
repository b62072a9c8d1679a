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

1. the whole reply is an option: its text (exactly, or ignoring case) or a bare letter ``B``,
   ``b``, ``B)``, ``(B)``, ``B.``, also after a lead-in ("Answer:", "The answer is", "Option"),
   and also inside a wrapper real models write: ``**B**``, ``[B]``, ``'B'``,
   ``<answer>B</answer>``, ``\boxed{B}`` (a letter past the last option is invalid);
2. the **committed** answers anywhere in the reply: the span after "the answer is", "Answer:",
   "My answer:", "I choose", a ``<answer>`` tag or ``\boxed{}``, "B is correct", and a letter
   (or an option's text) alone on the first or last line. A model that reasons through the
   options before committing names them all; only its commitment counts, so "Although Edema was
   considered, the answer is B." is B. Commitments that disagree ("Answer: A ... Answer: B"),
   name two options ("the answer is A or B") or contradict their letter ("B) liver" where B is
   not liver) are invalid;
3. with no commitment, a letter followed by text, "B) liver": the letter's option, unless the
   text selects a *different* option (a contradiction, invalid);
4. the option text inside prose, by :func:`medvqa.evaluation.families.traditional.closed_choice`
   (normalised exact match or a unique whole-word containment; two options -> invalid).

The answer key may be the option's text or its letter (:func:`key_option`); a key that is
neither is an error rather than a silent zero.
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
    "key_option",
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
# Any letter alone, in range or not ("E" with three options is an invalid pick, not prose).
_BARE_LETTER = re.compile(r"^\(?([A-Ea-e])[).:]?$")
# An upper-case letter opening a committed span: "B because ...", "B (lung)", "B - lung".
_LEAD_LETTER = re.compile(r"^\(?([A-E])\)?(?=$|[\s.,;:!?)\]\-])\s*[).:\-]?\s*(.*)$", re.DOTALL)
_TWO_LETTERS = re.compile(
    r"^\(?([A-Ea-e])\)?\s*(?:or|and|/|,|&)\s*\(?([A-Ea-e])\)?(?![A-Za-z])", re.IGNORECASE
)
_MARKDOWN = re.compile(r"\*\*|__")
_WRAPPERS = (
    re.compile(r"^<answer>\s*(.*?)\s*</answer>$", re.DOTALL | re.IGNORECASE),
    re.compile(r"^\\boxed\{(.*)\}$", re.DOTALL),
    re.compile(r"^\\text(?:bf)?\{(.*)\}$", re.DOTALL),
    re.compile(r"^\[(.*)\]$", re.DOTALL),
    re.compile(r"^'(.*)'$", re.DOTALL),
    re.compile(r'^"(.*)"$', re.DOTALL),
    re.compile(r"^`(.*)`$", re.DOTALL),
    re.compile(r"^\*(.*)\*$", re.DOTALL),
)
_SPAN_END = r"(.*?)(?=[.!?;](?:\s|$)|\n|$)"
# Where a reply commits to an answer; group 1 is the span that names it.
_COMMITS = (
    re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL | re.IGNORECASE),
    re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}"),
    re.compile(
        r"\b(?:answer|choice|option)s?\s*(?:is|would\s+be|should\s+be|will\s+be|:|=|\s[-–])\s*"
        r"(?:(?:option|choice|letter)\s+)?" + _SPAN_END,
        re.IGNORECASE,
    ),
    re.compile(
        r"\bI\s*(?:would\s+|will\s+|'d\s+|'ll\s+)?(?:choose|select|pick|go\s+with)\s+"
        r"(?:(?:option|choice|letter)\s+)?" + _SPAN_END,
        re.IGNORECASE,
    ),
    re.compile(
        r"(?:^|(?<=[\s(]))(?:[Oo]ption\s+|[Cc]hoice\s+)?(\(?[A-E]\)?)\s+is\s+(?:the\s+)?"
        r"(?:correct|right|best)\b"
    ),
)


def _strip(text: str) -> str:
    return text.strip().rstrip(".").strip()


def _unwrap(text: str) -> str:
    """The text inside the wrappers models put around an answer (``**B**``, ``[B]``, tags)."""
    text = _strip(_MARKDOWN.sub("", text))
    while True:
        for wrapper in _WRAPPERS:
            inner = wrapper.match(text)
            if inner is not None:
                text = _strip(inner.group(1))
                break
        else:
            return text


def _letter_pick(letter: str, rest: str, options: Sequence[str]) -> str | None:
    """The letter's option unless it is out of range or the text beside it names another."""
    index = LETTERS.index(letter.upper())
    if index >= len(options):
        return None
    named = closed_choice(rest, options) if rest.strip() else None
    return options[index] if named in (None, options[index]) else None


def _names_several(text: str, options: Sequence[str]) -> bool:
    return sum(closed_choice(text, [option]) is not None for option in options) > 1


def _span_picks(span: str, options: Sequence[str]) -> list[str | None]:
    """What a committed span names: [] nothing, [option], or [None] an invalid pick."""
    text = _unwrap(span)
    if not text or re.match(r"not\b", text, re.IGNORECASE):
        return []
    if _TWO_LETTERS.match(text) is not None:
        return [None]
    hit = resolve_answer(text, options)
    if hit is not None:
        return [hit]
    if _BARE_LETTER.match(text) is not None:
        return [None]  # a letter past the last option
    lettered = _LEAD_LETTER.match(text) or _LETTER_TEXT.match(text)
    if lettered is not None:
        return [_letter_pick(lettered.group(1), lettered.group(2), options)]
    named = closed_choice(text, options)
    if named is not None:
        return [named]
    return [None] if _names_several(text, options) else []


def _line_picks(line: str, options: Sequence[str]) -> list[str | None]:
    """A first or last line that is only a letter or an option ("B", "B) lung", "**lung**")."""
    text = _unwrap(line)
    hit = resolve_answer(text, options)
    if hit is not None:
        return [hit]
    if _BARE_LETTER.match(text) is not None:
        return [None]
    lettered = _LETTER_TEXT.match(text)
    if lettered is not None and lettered.group(1).isupper():
        return [_letter_pick(lettered.group(1), lettered.group(2), options)]
    return []


def _committed(text: str, options: Sequence[str]) -> list[str | None]:
    """Every answer the reply commits to, in no particular order (see the module docstring)."""
    text = _MARKDOWN.sub("", text)
    picks: list[str | None] = []
    for pattern in _COMMITS:
        for found in pattern.finditer(text):
            picks += _span_picks(found.group(1), options)
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) > 1:
        picks += _line_picks(lines[0], options) + _line_picks(lines[-1], options)
    return picks


def resolve_prediction(prediction: Any, options: Sequence[str]) -> str | None:
    """The option a free-text response selects, or None if it selects none or several."""
    if prediction is None or (isinstance(prediction, float) and math.isnan(prediction)):
        return None
    options = [str(o) for o in options]
    text = str(prediction).strip()
    if not text:
        return None
    body = _strip(_LEAD_IN.sub("", text, count=1))
    for candidate in (
        text,
        _strip(text),
        body,
        _unwrap(text),
        _unwrap(_LEAD_IN.sub("", _unwrap(text), count=1)),
    ):
        if candidate:
            hit = resolve_answer(candidate, options)
            if hit is not None:
                return hit
    picks = set(_committed(text, options))
    if picks:
        return picks.pop() if len(picks) == 1 else None
    if _TWO_LETTERS.match(_unwrap(body)) is not None:
        return None
    lettered = _LETTER_TEXT.match(body)
    if lettered is not None:
        return _letter_pick(lettered.group(1), lettered.group(2), options)
    return closed_choice(text, options)


def key_option(answer: Any, options: Sequence[str]) -> str | None:
    """The option an answer key names: its text (exactly or ignoring case) or its letter.

    Keys written as letters ("B") would otherwise never equal a resolved option's text and
    every row would score 0. None if the key names no option.
    """
    return resolve_answer(answer, [str(o) for o in options])


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
