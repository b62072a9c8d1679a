"""Reference-based text-generation metrics for open answers: ROUGE, chrF++, BLEU-4, METEOR.

Reported next to the token metrics of :mod:`medvqa.evaluation.families.traditional`
(docs/metrics.md). They are computed with maintained implementations (``rouge-score``, ``sacrebleu``, ``nltk``) so that the
numbers mean what the literature means by them; this module only fixes the choices those
libraries leave open and documents them:

* **Normalisation.** Prediction and reference first go through
  :func:`~medvqa.evaluation.families.traditional.normalize_answer` (lower case, punctuation, number words,
  articles), exactly as for the token metrics, so "Two lesions." and "2 lesions" agree in every
  family and the families stay comparable. The normalised text is split on whitespace and that
  tokenisation is handed to every library (ROUGE's default tokenizer would otherwise split
  "2.5" and drop non-ASCII letters; BLEU gets ``tokenize="none"``).
* **ROUGE-1/2/L**: F-measure, no stemming (the token metrics do not stem either).
* **chrF++**: ``sacrebleu.metrics.CHRF(word_order=2)`` at sentence level (character n-grams
  1..6 without whitespace plus word uni- and bigrams, beta = 2), divided by 100.
* **BLEU-4**: ``sacrebleu.metrics.BLEU(effective_order=True)`` sentence score with
  ``smooth_method="exp"`` (NIST geometric smoothing, Chen & Cherry 2014 method 3: the k-th
  zero n-gram precision is replaced by 1 / (2^k * n-gram count)), divided by 100. Effective
  order ignores n-gram orders longer than the hypothesis, so a correct one-word answer scores 1
  instead of 0, which matters in VQA where most answers are one to three words long.
* **METEOR**: :func:`nltk.translate.meteor_score.meteor_score` with its defaults (alpha 0.9,
  beta 3, gamma 0.5, Porter stemmer). Its synonym stage needs the WordNet corpus, which NLTK
  does not ship and which cannot be downloaded offline; without it ``meteor_score`` raises
  ``LookupError`` as soon as a word is left unmatched by exact matching. With ``wordnet="auto"``
  (default) the corpus is used when NLTK finds it (``nltk.download("wordnet")`` or
  ``NLTK_DATA``) and the score is reported as ``meteor``; otherwise METEOR runs with exact and
  stem matching only and is reported as ``meteor_no_syn``, so the two are never mixed up in a
  table. Note that METEOR's fragmentation penalty keeps even a perfect match below 1 for short
  answers: 1 - 0.5 * (1/n)^3 for n identical words (0.5 for a one-word answer).

Every score is in [0, 1]. A score is NaN on closed rows (they have their own accuracy) and on
open rows whose reference normalises to the empty string (nothing to compare against; counted
in a warning); an empty prediction against a non-empty reference scores 0.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from nltk.stem.porter import PorterStemmer
from nltk.translate.meteor_score import meteor_score
from rouge_score import rouge_scorer
from sacrebleu.metrics import BLEU, CHRF

from medvqa.data.records import ANSWER, ANSWER_TYPE
from medvqa.evaluation.families.base import MetricFamily
from medvqa.evaluation.families.traditional import PREDICTION, normalize_answer

log = logging.getLogger(__name__)

__all__ = ["TEXT_METRICS", "WORDNET_MODES", "TextMetric", "find_wordnet"]

#: Metric names a user may select (``meteor`` becomes ``meteor_no_syn`` without WordNet).
TEXT_METRICS: tuple[str, ...] = ("rouge1", "rouge2", "rouge_l", "chrf_pp", "bleu4", "meteor")
WORDNET_MODES: tuple[str, ...] = ("auto", "nltk", "none")
_ROUGE_KEYS = {"rouge1": "rouge1", "rouge2": "rouge2", "rouge_l": "rougeL"}


class _NoSynonyms:
    """A WordNet stand-in without synsets: METEOR's synonym stage then matches nothing."""

    def synsets(self, *_args: Any, **_kwargs: Any) -> list[Any]:
        return []


class _WhitespaceTokenizer:
    """ROUGE tokenizer for text that :func:`normalize_answer` has already tokenised."""

    def tokenize(self, text: str) -> list[str]:
        return text.split()


def find_wordnet() -> Any | None:
    """NLTK's WordNet corpus reader if the corpus is installed, else None.

    Probing with a lookup (not just the import) is needed because ``nltk.corpus.wordnet`` is a
    lazy loader that only fails on first use.
    """
    from nltk.corpus import wordnet

    try:
        wordnet.synsets("dog")
    except (LookupError, OSError):
        return None
    return wordnet


def _resolve_wordnet(mode: str) -> Any | None:
    if mode not in WORDNET_MODES:
        raise ValueError(
            f"metric.text.wordnet={mode!r} is not one of {WORDNET_MODES}: 'auto' uses WordNet "
            "when installed, 'nltk' requires it, 'none' never uses it"
        )
    if mode == "none":
        return None
    found = find_wordnet()
    if found is None and mode == "nltk":
        raise LookupError(
            "metric.text.wordnet='nltk' but NLTK's WordNet corpus is not installed; run "
            "`python -m nltk.downloader wordnet` (or point NLTK_DATA at a copy), or set "
            "metric.text.wordnet=auto to fall back to METEOR without synonyms (meteor_no_syn)"
        )
    if found is None:
        log.info("NLTK WordNet not found: METEOR without synonyms is reported as meteor_no_syn")
    return found


class TextMetric(MetricFamily):
    """`metric=text`: ROUGE-1/2/L, chrF++, BLEU-4 and METEOR on open answers (see module doc).

    Implements the interface every metric family shares (`medvqa.evaluation.scoring.Metric`):
    per-sample columns named like the scores, aggregates = mean over open rows.
    """

    name = "text"

    def __init__(self, metrics: Sequence[str] = TEXT_METRICS, wordnet: str = "auto") -> None:
        unknown = [m for m in metrics if m not in TEXT_METRICS]
        if unknown:
            raise ValueError(
                f"metric.text.metrics: unknown metric(s) {unknown}; known: {list(TEXT_METRICS)}"
            )
        if not metrics:
            raise ValueError(f"metric.text.metrics is empty; choose from {list(TEXT_METRICS)}")
        self.wordnet = _resolve_wordnet(wordnet) if "meteor" in metrics else None
        self.meteor_name = "meteor" if self.wordnet is not None else "meteor_no_syn"
        #: Output column / score names in the order requested.
        self.columns: list[str] = [self.meteor_name if m == "meteor" else m for m in metrics]
        self._selected = list(metrics)
        rouge = [_ROUGE_KEYS[m] for m in metrics if m in _ROUGE_KEYS]
        self._rouge = (
            rouge_scorer.RougeScorer(rouge, use_stemmer=False, tokenizer=_WhitespaceTokenizer())
            if rouge
            else None
        )
        self._chrf = CHRF(word_order=2)
        self._bleu = BLEU(effective_order=True, smooth_method="exp", tokenize="none")
        self._stemmer = PorterStemmer()
        self._no_syn = _NoSynonyms()

    def score_pair(self, prediction: Any, reference: Any) -> dict[str, float]:
        """All selected scores of one prediction against one reference (NaN if ref is empty)."""
        pred, ref = normalize_answer(prediction), normalize_answer(reference)
        if not ref:
            return dict.fromkeys(self.columns, math.nan)
        out: dict[str, float] = {}
        rouge = self._rouge.score(ref, pred) if self._rouge is not None else {}
        for metric, column in zip(self._selected, self.columns, strict=True):
            if metric in _ROUGE_KEYS:
                value = rouge[_ROUGE_KEYS[metric]].fmeasure
            elif metric == "chrf_pp":
                value = self._chrf.sentence_score(pred, [ref]).score / 100.0
            elif metric == "bleu4":
                value = self._bleu.sentence_score(pred, [ref]).score / 100.0
            else:
                value = meteor_score(
                    [ref.split()],
                    pred.split(),
                    stemmer=self._stemmer,
                    wordnet=self.wordnet if self.wordnet is not None else self._no_syn,
                )
            # sacrebleu's exp/log round trip gives 100.00000000000004 for a perfect match.
            out[column] = float(min(max(value, 0.0), 1.0))
        return out

    def per_sample(self, preds: pd.DataFrame) -> pd.DataFrame:
        """One float column per score; NaN on closed rows and on empty references."""
        missing = [c for c in (PREDICTION, ANSWER, ANSWER_TYPE) if c not in preds.columns]
        if missing:
            raise ValueError(f"metric.text: predictions table lacks column(s) {missing}")
        values = {c: np.full(len(preds), np.nan) for c in self.columns}
        types = preds[ANSWER_TYPE].to_numpy()
        empty_refs = 0
        for i, (pred, ref) in enumerate(
            zip(preds[PREDICTION].to_numpy(), preds[ANSWER].to_numpy(), strict=True)
        ):
            if types[i] != "open":
                continue
            scores = self.score_pair(pred, ref)
            empty_refs += math.isnan(scores[self.columns[0]])
            for c in self.columns:
                values[c][i] = scores[c]
        if empty_refs:
            log.warning(
                "metric.text: %d open reference(s) normalise to the empty string; their scores "
                "are NaN and left out of the means",
                empty_refs,
            )
        return pd.DataFrame(values, index=preds.index)

    def aggregate(self, scored: pd.DataFrame) -> dict[str, float]:
        """Mean of each score over the open rows of `scored` (NaN when there are none)."""
        rows = scored.loc[scored[ANSWER_TYPE] == "open", self.columns]
        return {c: float(rows[c].mean()) if rows[c].notna().any() else math.nan for c in rows}

    def ci_columns(self) -> dict[str, tuple[str, str]]:
        """Aggregate name -> (per-sample column, answer type it averages over), for CIs."""
        return {c: (c, "open") for c in self.columns}
