"""Shared image prefixes give the answers of the unshared path (float32, CPU), on the tiny twin of
every family that shares; PaliGemma (a prefix-LM) generates unshared and says why."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import pandas as pd
import pytest
import torch

from medvqa.data import records as R
from medvqa.generation import decode, settings
from medvqa.generation.data import GenerationDataset
from medvqa.generation.predict import generate_predictions, prediction_key
from medvqa.generation.prefix import (
    SHARED_KEY,
    collate_generation,
    share_prefixes,
    sliding_window,
)
from medvqa.models.loading import load_vlm
from medvqa.training.datamodule import META_KEY, VQADataset, make_loader
from tests.conftest import sampled
from tests.generating import settings as chosen
from tests.test_families import model_cfg

SHARING = ["llava_med", "qwen2_vl", "qwen2_5_vl", "medgemma", "smolvlm"]
TOLERANCE = 1e-4  # float32 rounding of the log-probabilities; the answers are equal


@pytest.fixture(scope="module")
def source(cache_dir: Path):
    from medvqa.data.sources.synthetic import SyntheticVQA

    return SyntheticVQA(cache_dir, n_cases=4, image_size=32, questions_per_image=5)


@pytest.fixture(scope="module")
def many(cache_dir: Path):
    """One image, 64 questions."""
    from medvqa.data.sources.synthetic import SyntheticVQA

    return SyntheticVQA(cache_dir / "many", n_cases=1, image_size=32, questions_per_image=64)


def _frame(source) -> pd.DataFrame:
    """Rows of several images interleaved (the order a table may have), and one image with a
    single question; questions of different lengths."""
    table = source.table()
    images = table[R.IMAGE].unique()
    lone = table.loc[table[R.IMAGE] == images[-1]].head(1)
    rest = table.loc[table[R.IMAGE] != images[-1]]
    rest = rest.iloc[sorted(range(len(rest)), key=lambda i: (i % 5, i))]  # interleaved
    return pd.concat([rest, lone]).reset_index(drop=True)


class Counter:
    """Counts the batches generated with shared prefixes and their groups."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.batches: list[int] = []
        real = decode.prefill_shared

        def spy(model, shared, cache):
            self.batches.append(len(shared["prefix"]["input_ids"]))
            return real(model, shared, cache)

        monkeypatch.setattr(decode, "prefill_shared", spy)


def _generate(
    model, processor, frame, source, path: Path, share: bool, batch: int = 6, engine="static"
):
    options = chosen(
        model, processor, batch_size=batch, max_new_tokens=6, share_image_prefix=share,
        decode=engine,
    )  # fmt: skip
    return generate_predictions(model, processor, frame, source, path, "test", options).set_index(
        R.ID
    )


def _same(shared: pd.DataFrame, unshared: pd.DataFrame) -> None:
    assert sorted(shared.index) == sorted(unshared.index)
    unshared = unshared.loc[shared.index]
    assert shared[R.PREDICTION].tolist() == unshared[R.PREDICTION].tolist()
    assert (shared[R.ANSWER_TOKENS] == unshared[R.ANSWER_TOKENS]).all()
    for column in (R.LOGPROB_MEAN, R.LOGPROB_MIN):
        a, b = shared[column].to_numpy(float), unshared[column].to_numpy(float)
        assert abs(a - b).max() < TOLERANCE, column


@pytest.mark.parametrize("name", sampled(SHARING, keep=2))
def test_shared_prefixes_give_the_unshared_answers(
    name: str, cache_dir: Path, source, many, tmp_path: Path, monkeypatch
) -> None:
    model, processor = load_vlm(model_cfg(name, cache_dir))
    model.eval()
    if sliding_window(model.config):  # the tiny Gemma's 64 tokens: its rows would not fit
        model.config.get_text_config().sliding_window = 4096
    frame = _frame(source)
    counter = Counter(monkeypatch)
    unshared = _generate(model, processor, frame, source, tmp_path / "plain.jsonl", False)
    assert counter.batches == []
    shared = _generate(model, processor, frame, source, tmp_path / "shared.jsonl", True)
    _same(shared, unshared)
    # 4 images (one with a single question), 16 rows ordered by image, batches of 6: each
    # batch holds the questions of 2 images at most, where the frame's order had 4.
    assert counter.batches and max(counter.batches) <= 2 and sum(counter.batches) < len(frame)

    # The last batch holds the lone image's question beside another image's (a group of one
    # within a shared batch). A batch where no image is asked twice goes the plain way.
    lone = frame.tail(1)
    counter.batches.clear()
    _same(
        _generate(model, processor, lone, source, tmp_path / "lone_s.jsonl", True),
        _generate(model, processor, lone, source, tmp_path / "lone_u.jsonl", False),
    )
    assert counter.batches == []
    # One image with 64 questions in one batch.
    rows = many.table()
    _same(
        _generate(model, processor, rows, many, tmp_path / "many_s.jsonl", True, batch=64),
        _generate(model, processor, rows, many, tmp_path / "many_u.jsonl", False, batch=64),
    )
    assert counter.batches == [1]


def test_rows_longer_than_a_sliding_window_are_not_shared(
    cache_dir: Path, source, tmp_path: Path, monkeypatch
) -> None:
    """A window counts the padding a shared row has in the middle: longer rows go unshared."""
    model, processor = load_vlm(model_cfg("medgemma", cache_dir))
    model.eval()
    assert sliding_window(model.config) == 64
    frame = _frame(source).head(6)
    counter = Counter(monkeypatch)
    shared = _generate(model, processor, frame, source, tmp_path / "s.jsonl", True)
    assert counter.batches == []
    _same(shared, _generate(model, processor, frame, source, tmp_path / "u.jsonl", False))


def test_a_resumed_split_with_shared_prefixes(
    cache_dir: Path, source, tmp_path: Path, monkeypatch
) -> None:
    model, processor = load_vlm(model_cfg("llava_med", cache_dir))
    model.eval()
    frame = _frame(source)
    path = tmp_path / "predictions.jsonl"
    _generate(model, processor, frame.head(7), source, path, True)  # killed after 7 rows
    counter = Counter(monkeypatch)
    resumed = _generate(model, processor, frame, source, path, True)
    assert sum(counter.batches) <= len(frame) - 7  # the 7 answered rows are not asked again
    _same(resumed, _generate(model, processor, frame, source, tmp_path / "u.jsonl", False))


def test_paligemma_generates_unshared_and_says_why(
    cache_dir: Path, source, tmp_path: Path, monkeypatch, caplog
) -> None:
    model, processor = load_vlm(model_cfg("paligemma", cache_dir))
    model.eval()
    counter = Counter(monkeypatch)
    frame = _frame(source).head(4)
    with caplog.at_level(logging.INFO, logger=settings.__name__):
        _generate(model, processor, frame, source, tmp_path / "p.jsonl", True)
    assert counter.batches == []
    assert "prefix-LM" in caplog.text
    # Its answers are the unshared ones: keyed as such.
    keys = _keys_by_sharing(model, processor, frame)
    assert keys[True] == keys[False]


def _keys_by_sharing(model, processor, frame: pd.DataFrame) -> dict[bool, str]:
    """The shared-answer key of `frame`'s answers with sharing asked for and not."""
    return {
        share: prediction_key(
            "w",
            model,
            processor,
            {"test": frame},
            chosen(model, processor, share_image_prefix=share),
        )
        for share in (True, False)
    }


def test_shared_answers_are_keyed_apart(cache_dir: Path, source) -> None:
    model, processor = load_vlm(model_cfg("llava_med", cache_dir))
    frame = _frame(source)
    keys = _keys_by_sharing(model, processor, frame)
    assert keys[True] != keys[False]


def _feature(ids: list[int]) -> dict[str, torch.Tensor]:
    tokens = torch.tensor(ids)
    return {
        "input_ids": tokens,
        "attention_mask": torch.ones_like(tokens),
        "pixel_values": torch.ones(1, 2),
    }


def test_an_image_after_the_shared_text_is_not_shared(cache_dir: Path, source) -> None:
    """A template whose image follows question-dependent text cannot share: the batch is
    generated unshared (the collate says why)."""
    image = 7
    features = [_feature([1, 2, q, image, image, 3]) for q in (10, 11)]
    assert "image token" in share_prefixes(features, ["a", "a"], 0, image)
    features = [_feature([1, image, image, 2, *q]) for q in ([10, 4], [11, 12, 4])]
    shared = share_prefixes(features, ["a", "a"], 0, image)
    assert not isinstance(shared, str)
    assert shared[SHARED_KEY]["prefix"]["input_ids"].tolist() == [[1, 7, 7, 2]]
    assert shared[SHARED_KEY]["rows"].tolist() == [0, 0]
    # [prefix][padding][suffix]: the padding masked, every token at its unshared position.
    assert shared["input_ids"].tolist() == [[1, 7, 7, 2, 0, 10, 4], [1, 7, 7, 2, 11, 12, 4]]
    assert shared["attention_mask"].tolist() == [[1, 1, 1, 1, 0, 1, 1], [1] * 7]


def test_rows_are_batched_by_image(cache_dir: Path, source) -> None:
    _, processor = load_vlm(model_cfg("llava_med", cache_dir))
    frame = _frame(source)
    dataset = VQADataset(frame, source, processor, with_answer=False)
    order = dataset.by_image()
    images = frame[R.IMAGE].iloc[order].tolist()
    assert images == sorted(images) and sorted(order) == list(range(len(frame)))
    loader = make_loader(
        GenerationDataset(frame.iloc[order], source, processor, with_answer=False),
        6,
        shuffle=False,
        padding_side="left",
        collate_fn=partial(
            collate_generation, image_token=processor.image_token_id, meta_key=META_KEY
        ),
    )
    batch = next(iter(loader))
    assert SHARED_KEY in batch and len(batch[META_KEY]) == 6
