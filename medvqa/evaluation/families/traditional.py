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
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from medvqa.data.records import ANSWER, ANSWER_TYPE, CANDIDATES
from medvqa.evaluation.families.base import MetricFamily
from medvqa.evaluation.statistics import mean_or_nan

log = logging.getLogger(__name__)

__all__ = [
    "NUMBER_WORDS",
    "OPEN_METRICS",
    "bleu1",
    "closed_choice",
    "closed_correct",
    "exact_match",
    "normalize_answer",
    "per_sample_scores",
    "ref_word_precision",
    "same_answer",
    "score_predictions",
    "token_f1",
    "token_precision",
    "token_recall",
]

# --------------------------------------------------------------------------------------------
# Normalisation
# --------------------------------------------------------------------------------------------

NUMBER_WORDS: dict[str, str] = {
    w: str(i)
    for i, w in enumerate(
        [
            "zero",
            "one",
            "two",
            "three",
            "four",
            "five",
            "six",
            "seven",
            "eight",
            "nine",
            "ten",
            "eleven",
            "twelve",
            "thirteen",
            "fourteen",
            "fifteen",
            "sixteen",
            "seventeen",
            "eighteen",
            "nineteen",
            "twenty",
        ]
    )
}
ARTICLES: frozenset[str] = frozenset({"a", "an", "the"})

_APOSTROPHES = re.compile(r"['\u2019\u2018`]")
_DIGIT_COMMA = re.compile(r"(?<=\d),(?=\d)")
# Everything that is neither a word character, whitespace nor a period, plus the underscore
# (which \w would keep).
_PUNCT = re.compile(r"[^\w\s.]|_")
# A period survives only with a digit on both sides (a decimal point).
_NON_DECIMAL_PERIOD = re.compile(r"(?<!\d)\.|\.(?!\d)")


def _tokens(text: Any) -> list[str]:
    """Normalised tokens of ``text``; see :func:`normalize_answer` for the rules."""
    if text is None or (isinstance(text, float) and math.isnan(text)):
        return []
    s = str(text).lower()
    s = _APOSTROPHES.sub("", s)
    s = _DIGIT_COMMA.sub("", s)
    s = _PUNCT.sub(" ", s)
    s = _NON_DECIMAL_PERIOD.sub(" ", s)
    out = []
    for tok in s.split():
        tok = NUMBER_WORDS.get(tok, tok)
        if tok not in ARTICLES:
            out.append(tok)
    return out


def normalize_answer(text: str) -> str:
    """VQA-style normalisation so that surface variants of the same answer compare equal.

    Rules, applied in order (idempotent; identical for predictions, references, candidates):

    * lower-case; ``None``/NaN become the empty string;
    * apostrophes are deleted (``"patient's"`` -> ``"patients"``, ``"don't"`` -> ``"dont"``);
    * a comma between digits is deleted (``"1,000"`` -> ``"1000"``);
    * every other punctuation character, **including hyphens** and underscores, becomes a space,
      so ``"x-ray"``, ``"X ray"`` and ``"x_ray"`` all give ``"x ray"`` (two tokens; ``"xray"``
      stays one token and does not match). Splitting rather than deleting hyphens keeps
      ``"t2-weighted"`` comparable with ``"t2 weighted"``; a leading minus sign is lost, which is
      irrelevant for the answers in medical VQA data sets;
    * a period is kept only as a decimal point (digit on both sides: ``"2.5"``), otherwise it
      becomes a space (``"5."`` -> ``"5"``);
    * number words ``zero`` .. ``twenty`` become digits (``"two"`` -> ``"2"``); ``"none"`` is not
      mapped to ``"0"`` because in medical VQA it usually means "no finding";
    * the articles a / an / the are dropped and whitespace is collapsed.
    """
    return " ".join(_tokens(text))


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
    return _bleu1_counts(Counter(_tokens(pred)), Counter(_tokens(ref)))


def ref_word_precision(pred: str, ref: str) -> float:
    """What SURE-VQA / LLaVA-Med call "exact match": distinct reference words that occur in
    the prediction, divided by the number of prediction tokens (0 for an empty prediction).

    It is neither exact nor a match (a long correct answer is penalised, a single shared word
    scores, and because reference words are counted once but prediction tokens with
    multiplicity, even ``pred == ref`` scores below 1 when a word repeats: "liver liver" ->
    0.5), hence the honest name; the true string equality is :func:`exact_match`.
    """
    return _ref_word_precision_counts(Counter(_tokens(pred)), Counter(_tokens(ref)))


def token_precision(pred: str, ref: str) -> float:
    """tp / (tp + fp) over normalised tokens, tp/fp counted on the prediction."""
    return _prf_counts(Counter(_tokens(pred)), Counter(_tokens(ref)))[0]


def token_recall(pred: str, ref: str) -> float:
    """tp / (tp + fn); tp counted on the prediction, fn on the reference (LLaVA-Med)."""
    return _prf_counts(Counter(_tokens(pred)), Counter(_tokens(ref)))[1]


def token_f1(pred: str, ref: str) -> float:
    """Harmonic mean of :func:`token_precision` and :func:`token_recall` (0 when undefined)."""
    return _prf_counts(Counter(_tokens(pred)), Counter(_tokens(ref)))[2]


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


def _choice_from_normalised(pred: str, cands: Sequence[str], norm: Sequence[str]) -> str | None:
    """Core of :func:`closed_choice` on pre-normalised prediction and candidates."""
    exact = [i for i, n in enumerate(norm) if n == pred]
    if exact:
        return cands[exact[0]] if len(exact) == 1 else None
    padded = f" {pred} "
    hits = [i for i, n in enumerate(norm) if n and f" {n} " in padded]
    # A candidate contained (as whole words) in another matched candidate is not a separate
    # choice: "left lung" selects "left lung", not also "left".
    hits = [
        i
        for i in hits
        if not any(norm[j] != norm[i] and f" {norm[i]} " in f" {norm[j]} " for j in hits)
    ]
    return cands[hits[0]] if len(hits) == 1 else None


def closed_choice(pred: str, candidates: Sequence[str]) -> str | None:
    """The candidate a free-text prediction selects, or None if it selects none or several.

    A candidate matches if the normalised prediction equals it, or contains it as a whole-word
    token sequence ("yes, there is" selects "yes"; "yes or no" matches two -> None). Two
    refinements keep verbose but unambiguous answers valid: an exact match wins over
    containment matches, and a matched candidate that is itself contained in another matched
    candidate is dropped ("the left lung" with candidates "left"/"left lung" -> "left lung").
    Candidates that normalise to the same string are indistinguishable, hence ambiguous (None).
    """
    if candidates is None:
        return None
    cands = list(candidates)
    return _choice_from_normalised(
        normalize_answer(pred), cands, [normalize_answer(c) for c in cands]
    )


def same_answer(choice: str | None, answer: Any) -> bool:
    """Whether a selected candidate is the reference answer, both sides normalised alike.

    Candidates, references and predictions come from different writers (medvqa's yes/no space
    is lower case, SLAKE's raw answers are "Yes"/"No"), so a raw ``==`` would score a right
    answer 0; :func:`normalize_answer` on both sides makes "Yes", "yes" and "YES." agree.
    """
    return choice is not None and normalize_answer(choice) == normalize_answer(answer)


def closed_correct(pred: str, answer: str, candidates: Sequence[str]) -> float:
    """1.0 iff the prediction selects exactly the answer candidate (invalid counts as wrong)."""
    return float(same_answer(closed_choice(pred, candidates), answer))


# --------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------

PREDICTION = "prediction"
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


def _is_missing(cands: Any) -> bool:
    if cands is None:
        return True
    if isinstance(cands, float) and math.isnan(cands):
        return True
    return len(cands) == 0


def per_sample_scores(
    preds: pd.DataFrame, open_metrics: Sequence[str] | None = None
) -> pd.DataFrame:
    """Copy of ``preds`` with one score column per metric, for the predictions table.

    Added columns: ``open_<m>`` for each open metric (NaN on closed rows), ``closed_choice``
    (selected candidate or None), ``closed_correct`` and ``closed_invalid`` (NaN on open rows).
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
            scores = _open_scores(_tokens(pred_col[i]), _tokens(ans_col[i]))
            for m in names:
                open_vals[m][i] = scores[m]
        elif kind == "closed":
            cands = cand_col[i]
            if _is_missing(cands):
                no_cands += 1
                cands = []
            cands = [str(c) for c in cands]
            ch = _choice_from_normalised(
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
        out[f"open_{m}"] = open_vals[m]
    out[CLOSED_CHOICE] = pd.Series(choice, index=preds.index, dtype=object)
    out[CLOSED_CORRECT] = correct
    out[CLOSED_INVALID] = invalid
    return out


def _aggregate(scored: pd.DataFrame, names: Sequence[str]) -> dict[str, float]:
    closed = scored[ANSWER_TYPE] == "closed"
    open_ = scored[ANSWER_TYPE] == "open"
    out: dict[str, float] = {
        "closed_acc": mean_or_nan(scored.loc[closed, CLOSED_CORRECT], skipna=True),
        "closed_invalid_rate": mean_or_nan(scored.loc[closed, CLOSED_INVALID], skipna=True),
    }
    for m in names:  # every open row has every score: a NaN would mean a bug, so it shows
        out[f"open_{m}"] = mean_or_nan(scored.loc[open_, f"open_{m}"])
    out[EMPTY_REFS] = float(sum(not _tokens(ref) for ref in scored.loc[open_, ANSWER]))
    out["n_open"] = float(open_.sum())
    out["n_closed"] = float(closed.sum())
    out["n"] = float(len(scored))
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
            prefix = f"{field}={value}/"
            out[prefix + "closed_acc"] = sub["closed_acc"]
            for m in names:
                out[prefix + f"open_{m}"] = sub[f"open_{m}"]
            out[prefix + "n"] = sub["n"]
    return out


class TraditionalMetric(MetricFamily):
    """`metric=traditional`: the token-matching scores and closed accuracy as one metric family.

    Implements the interface every family shares (`medvqa.evaluation.scoring.Metric`).
    """

    name = "traditional"

    def __init__(self, open_metrics: Sequence[str] | None = None) -> None:
        self.open_metrics = _check_metrics(open_metrics)

    def per_sample(self, preds: pd.DataFrame) -> pd.DataFrame:
        scored = per_sample_scores(preds, self.open_metrics)
        return scored[[c for c in scored.columns if c not in preds.columns]]

    def aggregate(self, scored: pd.DataFrame) -> dict[str, float]:
        out = _aggregate(scored, self.open_metrics)
        for count in ("n", "n_open", "n_closed"):  # the scoring layer counts rows itself
            out.pop(count)
        return out

    def ci_columns(self) -> dict[str, tuple[str, str]]:
        """Aggregate name -> (per-sample column, answer type it averages over), for CIs."""
        return {
            "closed_acc": (CLOSED_CORRECT, "closed"),
            **{f"open_{m}": (f"open_{m}", "open") for m in self.open_metrics},
        }
