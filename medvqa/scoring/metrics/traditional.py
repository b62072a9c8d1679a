"""Per-sample "traditional" VQA metrics and split-level scoring (SURE-VQA / LLaVA-Med style).

Open questions are scored on normalised unigram tokens exactly as LLaVA-Med's evaluation code
counts them (SURE-VQA reuses it), so numbers are comparable with the paper. Closed questions are
scored by which candidate the free-text prediction selects, so a verbose "yes, there is" counts
as "yes" while a hedge ("yes or no") counts as invalid rather than as a lucky hit.

Normalisation (``normalize_answer``) is applied identically to prediction, reference and
candidates; the decisions it makes are documented there.

An open row whose reference normalises to the empty string (SLAKE's release has one) is scored
and stays in every mean, as in SURE-VQA's reference scoring: every token score is 0 on it (no
reference word to find), except ``exact_match``, which is 1 for an empty prediction (two equal
strings) and 0 otherwise. ``open_empty_ref_n`` counts such rows.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import ClassVar

import numpy as np
import pandas as pd

from medvqa.data.answers import (
    NUMBER_WORDS,
    SURE_NUMBER_WORDS,
    choice_from_normalised,
    normalize_answer,
    same_answer,
    tokens,
)
from medvqa.data.records import ANSWER, ANSWER_TYPE, CANDIDATES, PREDICTION
from medvqa.scoring.metrics.base import (
    COUNT,
    ERROR_RATE,
    MetricFamily,
    ScoreInfo,
    breakdown_prefix,
    no_candidates,
)
from medvqa.statistics.bootstrap import mean_or_nan

log = logging.getLogger(__name__)

__all__ = [
    "OPEN_METRICS",
    "bleu1",
    "exact_match",
    "per_sample_scores",
    "ref_word_precision",
    "score_predictions",
    "token_f1",
    "token_precision",
    "token_recall",
]

# --------------------------------------------------------------------------------------------
# Normalisation
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Open-question metrics on token counts
# --------------------------------------------------------------------------------------------


def _bleu1_counts(c: Counter[str], r: Counter[str]) -> float:
    """Unigram BLEU with brevity penalty and no smoothing (equals torchmetrics n_gram=1)."""
    c_len = sum(c.values())
    if c_len == 0:
        return 0.0
    clipped = sum(min(n, r[w]) for w, n in c.items() if w in r)
    if clipped == 0:
        return 0.0
    r_len = sum(r.values())
    bp = 1.0 if c_len > r_len else math.exp(1.0 - r_len / c_len)
    return bp * clipped / c_len


def _ref_word_precision_counts(c: Counter[str], r: Counter[str]) -> float:
    """Distinct reference words found in the prediction / number of prediction tokens."""
    total = sum(c.values())
    if total == 0:
        return 0.0
    return sum(1 for w in r if w in c) / total


def _prf_counts(c: Counter[str], r: Counter[str]) -> tuple[float, float, float]:
    """Precision, recall, F1 with LLaVA-Med's counting (tp/fp on prediction counts)."""
    tp = sum(n for w, n in c.items() if w in r)
    fp = sum(n for w, n in c.items() if w not in r)
    fn = sum(n for w, n in r.items() if w not in c)
    p = tp / (tp + fp) if tp + fp else 0.0
    rc = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * p * rc / (p + rc) if p + rc else 0.0
    return p, rc, f1


def bleu1(pred: str, ref: str) -> float:
    """BLEU-1 (unigram precision clipped by reference counts, times brevity penalty).

    Implemented with Counters rather than ``torchmetrics.functional.text.bleu_score`` because
    the latter costs ~0.05 ms of tensor overhead per call (more than scoring a whole row
    here); tests check the two agree.
    An empty prediction scores 0.
    """
    return _bleu1_counts(Counter(tokens(pred)), Counter(tokens(ref)))


def ref_word_precision(pred: str, ref: str) -> float:
    """What SURE-VQA / LLaVA-Med call "exact match": distinct reference words that occur in
    the prediction, divided by the number of prediction tokens (0 for an empty prediction).

    It is neither exact nor a match (a long correct answer is penalised, a single shared word
    scores, and because reference words are counted once but prediction tokens with
    multiplicity, even ``pred == ref`` scores below 1 when a word repeats: "liver liver" ->
    0.5), hence the honest name; the true string equality is :func:`exact_match`.
    """
    return _ref_word_precision_counts(Counter(tokens(pred)), Counter(tokens(ref)))


def token_precision(pred: str, ref: str) -> float:
    """tp / (tp + fp) over normalised tokens, tp/fp counted on the prediction."""
    return _prf_counts(Counter(tokens(pred)), Counter(tokens(ref)))[0]


def token_recall(pred: str, ref: str) -> float:
    """tp / (tp + fn); tp counted on the prediction, fn on the reference (LLaVA-Med)."""
    return _prf_counts(Counter(tokens(pred)), Counter(tokens(ref)))[1]


def token_f1(pred: str, ref: str) -> float:
    """Harmonic mean of :func:`token_precision` and :func:`token_recall` (0 when undefined)."""
    return _prf_counts(Counter(tokens(pred)), Counter(tokens(ref)))[2]


def exact_match(pred: str, ref: str) -> float:
    """1.0 iff the normalised strings are equal (the real exact match)."""
    return float(normalize_answer(pred) == normalize_answer(ref))


OPEN_METRICS: dict[str, Callable[[str, str], float]] = {
    "bleu1": bleu1,
    "ref_word_precision": ref_word_precision,
    "f1": token_f1,
    "precision": token_precision,
    "recall": token_recall,
    "exact_match": exact_match,
}


def _open_scores(pred_toks: list[str], ref_toks: list[str]) -> dict[str, float]:
    """All open metrics at once from already-normalised tokens (one Counter pass)."""
    c, r = Counter(pred_toks), Counter(ref_toks)
    p, rc, f1 = _prf_counts(c, r)
    return {
        "bleu1": _bleu1_counts(c, r),
        "ref_word_precision": _ref_word_precision_counts(c, r),
        "f1": f1,
        "precision": p,
        "recall": rc,
        "exact_match": float(pred_toks == ref_toks),
    }


# --------------------------------------------------------------------------------------------
# Closed questions
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------

# The base names of the traditional family's columns and scores. It writes them unprefixed
# (`TraditionalMetric.prefix` is ""), so these are also its column names; a family built on
# the functions below passes its own prefix (`prefix=self.prefix`).
#: Aggregate counting the open rows whose reference normalises to the empty string.
EMPTY_REFS = "open_empty_ref_n"
CLOSED_CHOICE = "closed_choice"
CLOSED_CORRECT = "closed_correct"
CLOSED_INVALID = "closed_invalid"


def _check_metrics(open_metrics: Sequence[str] | None) -> list[str]:
    names = list(OPEN_METRICS) if open_metrics is None else list(open_metrics)
    unknown = [m for m in names if m not in OPEN_METRICS]
    if unknown:
        raise ValueError(f"unknown open metric(s) {unknown}; known: {list(OPEN_METRICS)}")
    return names


def per_sample_scores(
    preds: pd.DataFrame,
    open_metrics: Sequence[str] | None = None,
    prefix: str = "",
    number_words: dict[str, str] = NUMBER_WORDS,
) -> pd.DataFrame:
    """Copy of ``preds`` with one score column per metric, for the predictions table.

    Added columns: ``open_<m>`` for each open metric (NaN on closed rows), ``closed_choice``
    (selected candidate or None), ``closed_correct`` and ``closed_invalid`` (NaN on open rows),
    each name after ``prefix`` (the family's, "" for `traditional`). Open answers are tokenised
    with `number_words` (`SURE_NUMBER_WORDS` for SURE-VQA's own open scores).
    Rows are neither dropped nor reordered. A closed row without candidates cannot select
    anything and counts as invalid (a warning is logged).
    """
    names = _check_metrics(open_metrics)
    missing = [c for c in (PREDICTION, ANSWER, ANSWER_TYPE) if c not in preds.columns]
    if missing:
        raise ValueError(f"predictions table lacks column(s) {missing}")
    n = len(preds)
    types = preds[ANSWER_TYPE].to_numpy()
    pred_col = preds[PREDICTION].to_numpy()
    ans_col = preds[ANSWER].to_numpy()
    cand_col = preds[CANDIDATES].to_numpy() if CANDIDATES in preds.columns else [None] * n

    open_vals = {m: np.full(n, np.nan) for m in names}
    choice: list[str | None] = [None] * n
    correct = np.full(n, np.nan)
    invalid = np.full(n, np.nan)
    no_cands = 0
    for i in range(n):
        kind = types[i]
        if kind == "open":
            scores = _open_scores(
                tokens(pred_col[i], number_words), tokens(ans_col[i], number_words)
            )
            for m in names:
                open_vals[m][i] = scores[m]
        elif kind == "closed":
            cands = cand_col[i]
            if no_candidates(cands):
                no_cands += 1
                cands = []
            cands = [str(c) for c in cands]
            ch = choice_from_normalised(
                normalize_answer(pred_col[i]), cands, [normalize_answer(c) for c in cands]
            )
            choice[i] = ch
            correct[i] = float(same_answer(ch, ans_col[i]))
            invalid[i] = float(ch is None)
        else:
            raise ValueError(f"row {i}: answer_type {kind!r} is neither 'open' nor 'closed'")
    if no_cands:
        log.warning("%d closed prediction(s) have no candidates; counted as invalid", no_cands)

    out = preds.copy()
    for m in names:
        out[f"{prefix}open_{m}"] = open_vals[m]
    out[prefix + CLOSED_CHOICE] = pd.Series(choice, index=preds.index, dtype=object)
    out[prefix + CLOSED_CORRECT] = correct
    out[prefix + CLOSED_INVALID] = invalid
    return out


def _aggregate(scored: pd.DataFrame, names: Sequence[str], prefix: str = "") -> dict[str, float]:
    """The split-level scores of :func:`per_sample_scores`'s columns (both named after
    ``prefix``), with the row counts ``n``, ``n_open``, ``n_closed``."""
    closed = scored[ANSWER_TYPE] == "closed"
    open_ = scored[ANSWER_TYPE] == "open"
    correct, invalid = prefix + CLOSED_CORRECT, prefix + CLOSED_INVALID
    out: dict[str, float] = {
        f"{prefix}closed_acc": mean_or_nan(scored.loc[closed, correct], skipna=True),
        f"{prefix}closed_invalid_rate": mean_or_nan(scored.loc[closed, invalid], skipna=True),
    }
    for m in names:  # every open row has every score: a NaN would mean a bug, so it shows
        out[f"{prefix}open_{m}"] = mean_or_nan(scored.loc[open_, f"{prefix}open_{m}"])
    out[prefix + EMPTY_REFS] = float(sum(not tokens(ref) for ref in scored.loc[open_, ANSWER]))
    out[f"{prefix}n_open"] = float(open_.sum())
    out[f"{prefix}n_closed"] = float(closed.sum())
    out[f"{prefix}n"] = float(len(scored))
    return out


def score_predictions(
    preds: pd.DataFrame,
    open_metrics: Sequence[str] | None = None,
    breakdown: Sequence[str] = (),
    *,
    scored: pd.DataFrame | None = None,
) -> dict[str, float]:
    """Split-level scores as a flat dict (names carry no split prefix; the caller adds it).

    Keys: ``closed_acc``, ``closed_invalid_rate``, ``open_<m>`` per open metric,
    ``open_empty_ref_n``, ``n_open``, ``n_closed``, ``n``; and for each ``breakdown`` field and each of its values ``v``:
    ``<field>=<v>/closed_acc``, ``<field>=<v>/open_<m>``, ``<field>=<v>/n``.

    A metric over zero rows (e.g. ``closed_acc`` on an open-only split or subgroup) is NaN,
    not 0: "not measured" must not look like "always wrong", and NaN propagates into the
    robustness ratio instead of producing a fake RR. Pass ``scored`` (the output of
    :func:`per_sample_scores` on ``preds``) to avoid scoring twice.
    """
    names = _check_metrics(open_metrics)
    if scored is None:
        scored = per_sample_scores(preds, names)
    out = _aggregate(scored, names)
    for field in breakdown:
        if field not in scored.columns:
            raise ValueError(f"breakdown field {field!r} is not a column of the predictions")
        for value, group in scored.groupby(field, dropna=False, sort=True):
            sub = _aggregate(group, names)
            prefix = breakdown_prefix(field, value)
            out[prefix + "closed_acc"] = sub["closed_acc"]
            for m in names:
                out[prefix + f"open_{m}"] = sub[f"open_{m}"]
            out[prefix + "n"] = sub["n"]
    return out


# Per-sample right/wrong by answer type, where one exists: closed questions by the chosen
# candidate, open ones by exact equality (token overlap scores are not a right/wrong).
BINARY_CORRECT = {"closed": "closed_correct", "open": "open_exact_match"}


def binary_correct(scored: pd.DataFrame) -> pd.Series:
    """1/0 per row of a table scored by this family (`BINARY_CORRECT`); NaN where it has no
    such column (an open question scored without `exact_match`)."""
    out = pd.Series(np.nan, index=scored.index)
    for answer_type, column in BINARY_CORRECT.items():
        if column in scored.columns:
            rows = scored[ANSWER_TYPE] == answer_type
            out[rows] = scored.loc[rows, column].astype(float)
    return out


class TraditionalMetric(MetricFamily):
    """`metric=traditional`: the token-matching scores and closed accuracy as one metric family.

    Implements the interface every family shares (`medvqa.scoring.pipeline.Metric`).
    """

    name = "traditional"
    not_performance: ClassVar[dict[str, ScoreInfo]] = {
        "n": COUNT,
        "n_open": COUNT,
        "n_closed": COUNT,
        "invalid_rate": ERROR_RATE,
    }

    def __init__(
        self, open_metrics: Sequence[str] | None = None, sure_number_words: bool = False
    ) -> None:
        """`sure_number_words`: open answers read numbers as SURE-VQA's scorer does ("none" is
        "0"; eleven..twenty stay words), so its published open scores are matched exactly;
        off, "none" stays "no finding" (docs/metrics.md#normalisation)."""
        self.open_metrics = _check_metrics(open_metrics)
        self.number_words = SURE_NUMBER_WORDS if sure_number_words else NUMBER_WORDS

    def per_sample(self, preds: pd.DataFrame) -> pd.DataFrame:
        scored = per_sample_scores(preds, self.open_metrics, self.prefix, self.number_words)
        return scored[[c for c in scored.columns if c not in preds.columns]]

    def aggregate(self, scored: pd.DataFrame) -> dict[str, float]:
        out = _aggregate(scored, self.open_metrics, self.prefix)
        for count in ("n", "n_open", "n_closed"):  # the scoring layer counts rows itself
            out.pop(self.column(count))
        return out

    def headline(self) -> dict[str, str]:
        """SURE-VQA's: closed accuracy and open token F1 (LLaVA-Med's counting)."""
        return {"closed": self.column("closed_acc"), "open": self.column("open_f1")}

    def ci_columns(self) -> dict[str, tuple[str, str]]:
        """Aggregate name -> (per-sample column, answer type it averages over), for CIs."""
        open_ = {
            self.column(f"open_{m}"): (self.column(f"open_{m}"), "open") for m in self.open_metrics
        }
        return {self.column("closed_acc"): (self.column(CLOSED_CORRECT), "closed"), **open_}
