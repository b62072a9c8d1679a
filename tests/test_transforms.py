"""Transform shifts: per-sample seeded corruptions and Kvasir augments, applied on load."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from medvqa.data import records as R
from medvqa.data.shifts import IMAGE_TRANSFORM, Shift, make_splits, transform_spec
from medvqa.data.transforms import (
    CORRUPTION_LEVELS,
    apply_transform,
    corrupt,
    kernel_sigma,
    kvasir_variant,
    rng_for,
)


def _image(seed: int = 0, size: int = 32) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(40, 200, (size, size, 3), dtype=np.uint8))


def test_kernel_sigma_matches_opencv_rule() -> None:
    assert kernel_sigma(5) == pytest.approx(1.1)
    assert kernel_sigma(7) == pytest.approx(1.4)
    assert kernel_sigma(11) == pytest.approx(2.0)


def test_corruption_is_a_function_of_seed_and_record_only() -> None:
    img = _image()
    a = apply_transform(img, "corruption:high:0", "test/7", "img7")
    b = apply_transform(img, "corruption:high:0", "test/7", "img7")
    c = apply_transform(img, "corruption:high:0", "test/8", "img7")
    d = apply_transform(img, "corruption:high:1", "test/7", "img7")
    assert np.array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(np.asarray(a), np.asarray(c))
    assert not np.array_equal(np.asarray(a), np.asarray(d))
    assert not np.array_equal(np.asarray(a), np.asarray(img))
    assert a.size == img.size and a.mode == "RGB"


@pytest.mark.parametrize("strength", list(CORRUPTION_LEVELS))
def test_stronger_corruptions_move_images_further(strength: str) -> None:
    """Mean absolute change grows with the level (averaged over many samples)."""
    img = _image(1)
    base = np.asarray(img, dtype=np.float32)

    def change(level: str) -> float:
        return float(
            np.mean(
                [
                    np.abs(np.asarray(corrupt(img, level, rng_for(0, f"r{i}"))) - base).mean()
                    for i in range(40)
                ]
            )
        )

    if strength != "low":
        weaker = list(CORRUPTION_LEVELS)[list(CORRUPTION_LEVELS).index(strength) - 1]
        assert change(strength) > change(weaker)


def test_at_least_one_corruption_always_fires() -> None:
    img = _image(2)
    for i in range(50):
        out = corrupt(img, "low", rng_for(3, f"k{i}"))
        assert not np.array_equal(np.asarray(out), np.asarray(img))


def test_unknown_strength_is_rejected() -> None:
    with pytest.raises(ValueError, match="low"):
        corrupt(_image(), "extreme", rng_for(0, "x"))
    with pytest.raises(ValueError, match=r"transform\.strength"):
        Shift(name="c", transform={"name": "corruption", "strength": "extreme"})
    with pytest.raises(ValueError, match=r"transform\.name"):
        Shift(name="c", transform={"name": "jpeg"})


def test_kvasir_variants_are_shared_by_an_images_questions() -> None:
    img = _image(3)
    # Two questions on the same image that land on the same variant see the same pixels.
    ids = [f"q{i}" for i in range(200)]
    by_variant: dict[int, list[str]] = {}
    for rid in ids:
        by_variant.setdefault(kvasir_variant(rid, 10, 0), []).append(rid)
    assert set(by_variant) == set(range(1, 11))
    first, second = by_variant[4][:2]
    a = apply_transform(img, "kvasir_augment:10:0", first, "img3")
    b = apply_transform(img, "kvasir_augment:10:0", second, "img3")
    assert np.array_equal(np.asarray(a), np.asarray(b))
    other = apply_transform(img, "kvasir_augment:10:0", by_variant[5][0], "img3")
    assert not np.array_equal(np.asarray(a), np.asarray(other))
    assert a.size == img.size


def _table(n_images: int = 12) -> pd.DataFrame:
    rows = []
    for i in range(n_images):
        for q in range(2):
            rows.append(
                {
                    R.ID: f"i{i}_q{q}",
                    R.IMAGE: f"img{i}.png",
                    R.QUESTION: "q?",
                    R.ANSWER: "yes",
                    R.ANSWER_TYPE: "closed",
                    R.QUESTION_TYPE: "x",
                    R.CANDIDATES: ["yes", "no"],
                    R.CASE_ID: f"c{i}",
                    R.IMAGE_ID: f"img{i}",
                    R.SOURCE_SPLIT: ("train", "test")[i % 2],
                    "complexity": 1 + i % 3,
                }
            )
    return pd.DataFrame(rows)


@pytest.mark.parametrize("side", ["ood", "iid"])
def test_transform_shift_copies_iid_test(side: str) -> None:
    transform = {"name": "corruption", "strength": "low", "seed": 5}
    shift = Shift(name="c", transform=transform, transformed=side)
    splits = make_splits(_table(), shift, seed=0)
    spec = transform_spec(transform)
    assert spec == "corruption:low:5"
    pd.testing.assert_series_equal(splits["test_ood"][R.ID], splits["test_iid"][R.ID])
    transformed = {k for k, df in splits.frames.items() if (df[IMAGE_TRANSFORM] == spec).all()}
    untouched = {k for k, df in splits.frames.items() if df[IMAGE_TRANSFORM].isna().all()}
    if side == "ood":
        assert transformed == {"test_ood"} and untouched == {"train", "val", "test_iid"}
    else:
        assert transformed == {"train", "val", "test_iid"} and untouched == {"test_ood"}


def test_stratified_validation_keeps_every_stratum_and_whole_images() -> None:
    table = _table(60)
    shift = Shift(name="s", field="complexity", ood_values=[3], val_stratify=["complexity"])
    splits = make_splits(table, shift, seed=0)
    train, val = splits["train"], splits["val"]
    assert set(val["complexity"]) == set(train["complexity"]) == {1, 2}
    assert not set(train[R.IMAGE_ID]) & set(val[R.IMAGE_ID])


def test_any_of_combines_parts_and_merges_per_part() -> None:
    table = _table(12)
    table["organ"] = ["LEG" if i % 4 == 0 else "HEAD" for i in range(len(table))]
    shift = Shift.from_config(
        {
            "name": "multi",
            "any_of": [
                {"field": "organ", "ood_values": ["LEG"], "merge_train_ood": True},
                {"field": "complexity", "ood_values": [3], "merge_train_ood": False},
            ],
        }
    )
    splits = make_splits(table, shift, seed=0)
    ood, train = splits["test_ood"], splits["train"]
    assert ((ood["organ"] == "LEG") | (ood["complexity"] == 3)).all()
    assert not ((train["organ"] == "LEG") | (train["complexity"] == 3)).any()
    # LEG train rows were merged into the OoD test; complexity-3 train rows were not.
    merged = ood[ood[R.SOURCE_SPLIT] == "train"]
    assert len(merged) and (merged["organ"] == "LEG").all()
    assert splits.dropped["ood_in_train_not_merged"] == int(
        (
            (table[R.SOURCE_SPLIT] == "train")
            & (table["complexity"] == 3)
            & (table["organ"] != "LEG")
        ).sum()
    )


def test_dataset_applies_the_rows_transform(tmp_path: Path, monkeypatch) -> None:
    """VQADataset loads a transformed row's image through the transform, others untouched."""
    from medvqa.data.base import VQASource
    from medvqa.training.datamodule import VQADataset

    img = _image(4)
    img.save(tmp_path / "img0.png")

    class One(VQASource):
        name = "one"

        def table(self) -> pd.DataFrame:  # pragma: no cover - not used
            raise NotImplementedError

    seen = []

    def fake_encode(processor, question, image, answer=None, system=None):
        seen.append(np.asarray(image))
        return {}

    frame = _table(1).iloc[:1].assign(**{R.IMAGE: "img0.png", R.IMAGE_ID: "img0"})
    monkeypatch.setattr("medvqa.training.datamodule.encode", fake_encode)
    VQADataset(frame.assign(**{IMAGE_TRANSFORM: None}), One(tmp_path), None, False)[0]
    spec = "corruption:medium:0"
    VQADataset(frame.assign(**{IMAGE_TRANSFORM: spec}), One(tmp_path), None, False)[0]
    assert np.array_equal(seen[0], np.asarray(img))
    expected = apply_transform(img, spec, frame[R.ID].iloc[0], "img0")
    assert np.array_equal(seen[1], np.asarray(expected))
