"""The shift function: disjoint splits, the OoD rule, the gap, the merge flag, clear errors."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from medvqa.data import records as R
from medvqa.data.shifts import Shift, Splits, limit_splits, make_splits
from medvqa.errors import DataError

MODALITIES = ["ct", "mri", "x-ray"]


@st.composite
def tables(draw: st.DrawFn, with_validate: bool | None = None) -> pd.DataFrame:
    """Random normalised tables: images with several questions, ages and modalities."""
    n_images = draw(st.integers(min_value=12, max_value=40))
    has_val = draw(st.booleans()) if with_validate is None else with_validate
    splits = ["train", "validate", "test"] if has_val else ["train", "test"]
    rows = []
    for i in range(n_images):
        split = splits[i % len(splits)]
        modality = draw(st.sampled_from(MODALITIES))
        age = draw(st.integers(min_value=18, max_value=90))
        for q in range(draw(st.integers(min_value=1, max_value=3))):
            closed = draw(st.booleans())
            rows.append(
                {
                    R.ID: f"i{i}_q{q}",
                    R.IMAGE: f"img{i}.png",
                    R.QUESTION: f"q{q}?",
                    R.ANSWER: "yes" if closed else "ct",
                    R.ANSWER_TYPE: "closed" if closed else "open",
                    R.QUESTION_TYPE: draw(st.sampled_from(["modality", "size"])),
                    R.CANDIDATES: ["yes", "no"] if closed else None,
                    R.CASE_ID: f"c{i // 2}",
                    R.IMAGE_ID: f"img{i}",
                    R.SOURCE_SPLIT: split,
                    "modality": modality,
                    "age": age,
                }
            )
    return pd.DataFrame(rows)


def _ids(df: pd.DataFrame) -> set[str]:
    return set(df[R.ID])


def _try_splits(table: pd.DataFrame, shift: Shift):
    try:
        return make_splits(table, shift, seed=0)
    except DataError as err:  # random tables can leave a split empty; that must be reported
        assert "empty" in str(err) or "do not occur" in str(err)
        return None


@pytest.mark.heavy
@settings(max_examples=60, deadline=None)
@given(table=tables(), merge=st.booleans())
def test_categorical_shift_properties(table: pd.DataFrame, merge: bool) -> None:
    shift = Shift(name="m", field="modality", ood_values=["x-ray"], merge_train_ood=merge)
    before = table.copy()
    splits = _try_splits(table, shift)
    pd.testing.assert_frame_equal(table, before)  # pure: the input is untouched
    if splits is None:
        return
    parts = [_ids(splits[s]) for s in ("train", "val", "test_iid", "test_ood")]
    for a in range(4):
        for b in range(a + 1, 4):
            assert not parts[a] & parts[b], "splits must be disjoint"
    for name in ("train", "val", "test_iid"):
        assert (splits[name]["modality"] != "x-ray").all()
    assert (splits["test_ood"]["modality"] == "x-ray").all()
    ood_train = table[(table[R.SOURCE_SPLIT] == "train") & (table["modality"] == "x-ray")]
    assert _ids(ood_train) <= parts[3] if merge else not (_ids(ood_train) & parts[3])
    # test rows all land in one of the two test sets
    assert _ids(table[table[R.SOURCE_SPLIT] == "test"]) <= parts[2] | parts[3]
    # no image in both train and val (val carved by image when there is no validate split)
    assert not set(splits["train"][R.IMAGE_ID]) & set(splits["val"][R.IMAGE_ID])


@pytest.mark.heavy
@settings(max_examples=60, deadline=None)
@given(table=tables())
def test_threshold_shift_has_a_gap(table: pd.DataFrame) -> None:
    shift = Shift(name="age", field="age", iid_min=60, ood_max=40)
    splits = _try_splits(table, shift)
    if splits is None:
        return
    for name in ("train", "val", "test_iid"):
        assert (splits[name]["age"] >= 60).all()
    assert (splits["test_ood"]["age"] < 40).all()
    used = set().union(*(_ids(splits[s]) for s in ("train", "val", "test_iid", "test_ood")))
    gap = table[(table["age"] >= 40) & (table["age"] < 60)]
    assert not _ids(gap) & used
    assert splits.report()["dropped"]["excluded_by_shift"] == len(gap)


def _fixed_table() -> pd.DataFrame:
    rows = []
    for i, (split, mod) in enumerate(
        [
            ("train", "ct"),
            ("train", "x-ray"),
            ("train", "mri"),
            ("validate", "ct"),
            ("validate", "x-ray"),
            ("test", "ct"),
            ("test", "x-ray"),
            ("test", "mri"),
        ]
    ):
        rows.append(
            {
                R.ID: f"r{i}",
                R.IMAGE: f"{i}.png",
                R.QUESTION: "q",
                R.ANSWER: "yes",
                R.ANSWER_TYPE: "closed",
                R.QUESTION_TYPE: "t",
                R.CANDIDATES: ["yes", "no"],
                R.CASE_ID: f"c{i}",
                R.IMAGE_ID: f"i{i}",
                R.SOURCE_SPLIT: split,
                "modality": mod,
            }
        )
    return pd.DataFrame(rows)


def test_known_split_counts_and_report() -> None:
    shift = Shift(name="m", field="modality", ood_values=["x-ray"], merge_train_ood=True)
    report = make_splits(_fixed_table(), shift).report()
    assert report["source"] == {"train": 3, "validate": 2, "test": 3}
    assert {k: v["n"] for k, v in report["splits"].items()} == {
        "train": 2,
        "val": 1,
        "test_iid": 2,
        "test_ood": 2,
    }
    assert report["splits"]["train"] == {"n": 2, "open": 0, "closed": 2}


def test_iid_values_mode() -> None:
    shift = Shift(name="e", field="modality", iid_values=["ct"])
    splits = make_splits(_fixed_table(), shift)
    assert set(splits["test_ood"]["modality"]) == {"x-ray", "mri"}


def test_unknown_ood_value_lists_existing_values() -> None:
    shift = Shift(name="m", field="modality", ood_values=["pet"])
    with pytest.raises(DataError, match=r"pet.*ct.*mri.*x-ray"):
        make_splits(_fixed_table(), shift)


def test_unknown_field_is_named() -> None:
    with pytest.raises(DataError, match="organ"):
        make_splits(_fixed_table(), Shift(name="x", field="organ", ood_values=["a"]))


def test_empty_split_is_an_error() -> None:
    table = _fixed_table()
    table = table[(table[R.SOURCE_SPLIT] != "test") | (table["modality"] == "ct")]
    shift = Shift(name="m", field="modality", ood_values=["ct"])
    with pytest.raises(DataError, match=r"test_iid.*empty|empty.*test_iid"):
        make_splits(table, shift)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(),
        dict(ood_values=["a"], iid_values=["b"]),
        dict(iid_min=60),
        dict(iid_min=30, ood_max=40),
    ],
)
def test_invalid_shift_definitions(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        Shift(name="bad", field="age", **kwargs)


def test_limit_is_reproducible() -> None:
    shift = Shift(name="m", field="modality", ood_values=["x-ray"], merge_train_ood=True)
    splits = make_splits(_fixed_table(), shift)
    a = limit_splits(splits, {"train": 1}, seed=3)
    b = limit_splits(splits, {"train": 1}, seed=3)
    assert len(a["train"]) == 1 and a["train"].equals(b["train"])
    assert len(a["test_ood"]) == len(splits["test_ood"])


def test_val_limit_caps_only_validation_and_is_seeded() -> None:
    """`data.limit.val` (sweep=sure_study) shrinks the validation loss's rows, nothing else."""
    names = ("train", "val", "test_iid", "test_ood")
    frames = {n: pd.DataFrame({R.ID: [f"{n}{i}" for i in range(50)]}) for n in names}
    splits = Splits(frames=frames, source_counts={})
    capped = limit_splits(splits, {"val": 10}, seed=3)
    assert len(capped["val"]) == 10 and set(capped["val"][R.ID]) <= set(frames["val"][R.ID])
    assert all(capped[n].equals(frames[n]) for n in ("train", "test_iid", "test_ood"))
    assert capped["val"].equals(limit_splits(splits, {"val": 10}, seed=3)["val"])
    assert not capped["val"].equals(limit_splits(splits, {"val": 10}, seed=4)["val"])


@pytest.mark.parametrize(
    "kwargs",
    [{"ood_values": ["x-ray"]}, {"iid_values": ["ct", "mri"]}],
)
def test_rows_without_a_value_are_on_neither_side(kwargs) -> None:
    table = _fixed_table()
    table.loc[[0, 5], "modality"] = None  # a train and a test row with no modality
    splits = make_splits(table, Shift(name="m", field="modality", **kwargs))
    used = pd.concat(splits.frames.values())
    assert not used[R.ID].isin(["r0", "r5"]).any()
    assert splits.dropped["excluded_by_shift"] == 2
