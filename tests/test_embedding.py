"""Embedding cosine with the packaged all-MiniLM-L6-v2 (medvqa.scoring.metrics.embedding)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from medvqa.scoring.metrics.embedding import (
    COSINE,
    COSINE_ALL,
    EMPTY_REFS,
    EmbeddingMetric,
    default_model_path,
    load_encoder,
)


@pytest.fixture(scope="module")
def metric() -> EmbeddingMetric:
    return EmbeddingMetric(batch_size=4)


def test_default_model_is_the_packaged_minilm() -> None:
    path = default_model_path()
    assert (path / "model.safetensors").is_file()
    assert (path / "modules.json").is_file()


def test_identical_strings_score_one(metric: EmbeddingMetric) -> None:
    texts = ["left lung", "Fracture of the fifth metacarpal bone of left hand."]
    assert metric.cosine(texts, texts) == pytest.approx(np.ones(2), abs=1e-5)


def test_paraphrase_beats_unrelated(metric: EmbeddingMetric) -> None:
    ref = ["the lesion is in the left lung", "the heart is enlarged"]
    paraphrase = ["a lesion located in the left lung", "enlargement of the heart"]
    unrelated = ["the patient fractured a toe", "the image is a knee MRI"]
    close = metric.cosine(paraphrase, ref)
    far = metric.cosine(unrelated, ref)
    assert (close > far + 0.2).all(), (close, far)


def test_cosine_is_the_normalised_dot_product(metric: EmbeddingMetric) -> None:
    # Independent check: raw (unnormalised) embeddings from the encoder, cosine by hand.
    a, b = "kidney", "renal cortex"
    raw = load_encoder(metric.model_path, "cpu").encode([a, b], normalize_embeddings=False)
    expected = float(raw[0] @ raw[1] / np.linalg.norm(raw[0]) / np.linalg.norm(raw[1]))
    assert metric.cosine([a], [b])[0] == pytest.approx(expected, abs=1e-5)


def test_batch_equals_one_at_a_time(metric: EmbeddingMetric) -> None:
    preds = ["liver", "a large mass in the right upper lobe of the lung", "no", "two nodules"]
    refs = ["hepatic", "right upper lobe mass", "yes", "2 nodules"]
    batched = EmbeddingMetric(model_path=metric.model_path, batch_size=8).cosine(preds, refs)
    single = np.array([metric.cosine([p], [r])[0] for p, r in zip(preds, refs, strict=True)])
    assert batched == pytest.approx(single, abs=1e-5)


def test_per_sample_and_aggregate(metric: EmbeddingMetric) -> None:
    preds = pd.DataFrame(
        {
            "id": ["a", "b", "c"],
            "question": ["q"] * 3,
            "answer": ["left lung", "yes", "liver"],
            "prediction": ["left lung", "no", None],
            "answer_type": ["open", "closed", "open"],
        },
        index=[5, 6, 7],
    )
    scores = metric.per_sample(preds)
    assert list(scores.index) == [5, 6, 7]
    assert list(scores.columns) == [COSINE]
    assert scores.loc[5, COSINE] == pytest.approx(1.0, abs=1e-5)
    assert scores[COSINE].notna().all()  # closed rows are scored too (for the _all mean)
    scored = preds.join(scores)
    agg = metric.aggregate(scored)
    assert agg[COSINE] == pytest.approx(scores.loc[[5, 7], COSINE].mean())
    assert agg[COSINE_ALL] == pytest.approx(scores[COSINE].mean())
    closed_only = metric.aggregate(scored.loc[[6]])
    assert math.isnan(closed_only[COSINE])
    assert closed_only[COSINE_ALL] == pytest.approx(scores.loc[6, COSINE])
    empty = metric.aggregate(scored.iloc[:0])
    assert math.isnan(empty[COSINE]) and math.isnan(empty[COSINE_ALL])
    assert empty[EMPTY_REFS] == 0


def test_bad_options_named(tmp_path) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        EmbeddingMetric(batch_size=0)
    with pytest.raises(FileNotFoundError, match="model_path"):
        EmbeddingMetric(model_path=str(tmp_path)).cosine(["a"], ["b"])
    with pytest.raises(ValueError, match="pair them"):
        EmbeddingMetric().cosine(["a"], [])


def test_an_empty_text_is_not_embedded_and_scores_zero(
    metric: EmbeddingMetric, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SLAKE's release has an English OPEN question whose answer is "".
    preds = pd.DataFrame(
        {
            "prediction": ["liver", "liver", " ", "lung", None],
            "answer": ["liver", "", "", "yes", "spleen"],
            "answer_type": ["open", "open", "open", "closed", "open"],
        }
    )
    seen: list[str] = []
    embed = metric.embed
    monkeypatch.setattr(metric, "embed", lambda texts: seen.extend(texts) or embed(texts))
    scores = metric.per_sample(preds)
    assert "" not in seen and sorted(set(seen)) == ["liver", "lung", "yes"]
    assert scores[COSINE].tolist()[1:3] == [0.0, 0.0]  # empty reference, any prediction
    assert scores.loc[4, COSINE] == 0.0  # no prediction
    agg = metric.aggregate(preds.join(scores))
    # Every open row counts: (1 + 0 + 0 + 0) / 4.
    assert agg[COSINE] == pytest.approx(1 / 4, abs=1e-6)
    assert agg[EMPTY_REFS] == 2
