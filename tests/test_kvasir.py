"""Kvasir-VQA-x1 from parquet and save_to_disk layouts: counts, closed yes/no, bad input, shifts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from medvqa.data import records as R
from medvqa.data.shifts import IMAGE_TRANSFORM, Shift, make_splits, transform_spec
from medvqa.data.sources.kvasir_vqa_x1 import (
    KvasirVqaX1,
    class_list,
    medico_val_positions,
    yes_no,
)
from medvqa.data.transforms import apply_transform, kvasir_variant
from medvqa.errors import DataError
from tests.conftest import compose
from tests.native.kvasir_vqa_x1 import ANNOTATION_DIR
from tests.native.kvasir_vqa_x1 import write as write_kvasir

TRAIN_FILE = f"{ANNOTATION_DIR}/data/train-00000-of-00001.parquet"


@pytest.fixture
def kvasir(tmp_path: Path):
    return write_kvasir(tmp_path / "kvasir")


def test_field_parsers() -> None:
    assert class_list(np.array(["polyp_type", "polyp_size"])) == ["polyp_type", "polyp_size"]
    assert class_list('["landmark", "finding_count"]') == ["landmark", "finding_count"]
    assert class_list("polyp_count") == ["polyp_count"]
    assert class_list([]) is None and class_list(3) is None and class_list("[oops") is None
    assert yes_no(" Yes. ") == "yes" and yes_no("no") == "no"
    assert yes_no("Yes, one polyp.") is None and yes_no("No polyp is seen.") is None


@pytest.mark.parametrize("layout", ["parquet", "disk"])
def test_both_layouts_load_the_fixture(tmp_path: Path, layout: str) -> None:
    fx = write_kvasir(tmp_path / "kvasir", layout=layout)
    source = KvasirVqaX1(fx.root, cache_dir=tmp_path / "cache")
    table = source.table()
    assert table[R.SOURCE_SPLIT].value_counts().to_dict() == fx.counts
    closed = table.loc[table[R.ANSWER_TYPE] == "closed"]
    assert closed[R.SOURCE_SPLIT].value_counts().to_dict() == fx.closed
    assert set(closed[R.ANSWER]) == {"yes", "no"}
    assert all(c == ["yes", "no"] for c in closed[R.CANDIDATES])
    assert table.loc[table[R.ANSWER_TYPE] == "open", R.CANDIDATES].isna().all()
    assert set(table["complexity"]) == {1, 2, 3}
    assert all(
        isinstance(c, list) and all(isinstance(x, str) for x in c) for c in table["question_class"]
    )
    by_split = table.groupby(R.SOURCE_SPLIT)[R.IMAGE_ID].unique().map(sorted).to_dict()
    assert by_split == {k: sorted(v) for k, v in fx.images.items()}
    assert (table[R.IMAGE] == "Kvasir-VQA/images/" + table[R.IMAGE_ID] + ".jpg").all()
    assert table[R.ID].is_unique and (table[R.CASE_ID] == table[R.IMAGE_ID]).all()
    # The native rows come back in order, with their metadata.
    train = table.loc[table[R.SOURCE_SPLIT] == "train"].reset_index(drop=True)
    native = fx.frames["train"]
    assert train[R.QUESTION].tolist() == native["question"].tolist()
    assert train["original"].tolist() == native["original"].tolist()
    assert train["question_class"].tolist() == native["question_class"].tolist()
    # Cached table: same content, lists stay lists.
    again = KvasirVqaX1(fx.root, cache_dir=tmp_path / "cache").table()
    assert again.equals(table)


def test_yes_no_closed_can_be_switched_off(kvasir) -> None:
    table = KvasirVqaX1(kvasir.root, yes_no_closed=False).table()
    assert set(table[R.ANSWER_TYPE]) == {"open"}
    assert set(table[R.ANSWER]) >= {"No", "Yes."}  # the native text is kept


def _rewrite_train(root: Path, index: int, **changes) -> None:
    path = root / TRAIN_FILE
    frame = pd.read_parquet(path)
    for key, value in changes.items():
        frame[key] = frame[key].astype(object)
        frame.at[index, key] = value
    frame.to_parquet(path, index=False)


@pytest.mark.parametrize(
    ("change", "kind", "message"),
    [
        ({"question": None}, "malformed", "missing field 'question'"),
        ({"complexity": 4}, "malformed", "'complexity' is 4"),
        ({"question_class": []}, "malformed", "'question_class' is"),
        ({"img_id": "../../../etc/passwd"}, "path_escape", "escapes the dataset root"),
    ],
)
def test_bad_rows_error_or_skip(kvasir, change, kind, message) -> None:
    _rewrite_train(kvasir.root, 3, **change)
    with pytest.raises(DataError) as err:
        KvasirVqaX1(kvasir.root).table()
    assert f"{TRAIN_FILE} row 3" in str(err.value) and message in str(err.value)
    source = KvasirVqaX1(kvasir.root, on_bad_row="skip")
    table = source.table()
    skipped = source.report()["skipped_rows"]
    assert skipped["counts"] == {kind: 1} and f"{TRAIN_FILE} row 3" in skipped["examples"][0]
    assert (table[R.SOURCE_SPLIT] == "train").sum() == kvasir.counts["train"] - 1


def test_missing_annotations_and_columns_are_named(kvasir) -> None:
    path = kvasir.root / TRAIN_FILE
    pd.read_parquet(path).drop(columns=["complexity"]).to_parquet(path)
    with pytest.raises(
        DataError, match=r"train-00000-of-00001.parquet lacks column\(s\) \['complexity'\]"
    ):
        KvasirVqaX1(kvasir.root).table()
    path.rename(path.with_name("dev-00000-of-00001.parquet"))
    with pytest.raises(DataError, match=r"split\(s\) \['dev'\]"):
        KvasirVqaX1(kvasir.root).table()
    with pytest.raises(DataError, match=r"annotations not found under .*elsewhere"):
        KvasirVqaX1(kvasir.root, annotation_dir="elsewhere").table()


def _splits(experiment: str, root: Path, cache: Path):
    cfg = compose([f"+experiment={experiment}", f"dataset.root={root}"], cache)
    source = instantiate(cfg.dataset)
    assert isinstance(source, KvasirVqaX1)
    shift = Shift.from_config(OmegaConf.to_container(cfg.shift, resolve=True))
    assert list(shift.val_stratify) == ["complexity", "question_class"]
    splits = make_splits(source.table(), shift, seed=0)
    assert all(len(df) > 0 for df in splits.frames.values()) and len(splits["train"]) >= 8
    # Validation is carved from train by image; the OoD test is the i.i.d. test.
    assert not set(splits["train"][R.IMAGE_ID]) & set(splits["val"][R.IMAGE_ID])
    assert set(splits["train"][R.SOURCE_SPLIT]) == set(splits["val"][R.SOURCE_SPLIT]) == {"train"}
    assert splits["test_ood"][R.ID].tolist() == splits["test_iid"][R.ID].tolist()
    return source, shift, splits


@pytest.mark.parametrize(
    ("experiment", "transformed_side"),
    [
        ("kvasir_transformed", {"test_ood"}),
        ("kvasir_transformed_reverse", {"train", "val", "test_iid"}),
    ],
)
def test_transformed_track_splits(kvasir, tmp_path: Path, experiment, transformed_side) -> None:
    _, shift, splits = _splits(experiment, kvasir.root, tmp_path / "cache")
    spec = transform_spec(shift.transform)
    assert spec == "kvasir_augment:10:0"
    for name, frame in splits.frames.items():
        expected = spec if name in transformed_side else None
        assert frame[IMAGE_TRANSFORM].map(lambda v, e=expected: v == e).all(), name


def test_augment_is_deterministic_and_varies_by_variant(kvasir, tmp_path: Path) -> None:
    source, _, splits = _splits("kvasir_transformed", kvasir.root, tmp_path / "cache")
    rows = splits["test_ood"]
    image_id = rows[R.IMAGE_ID].iloc[0]
    same_image = rows.loc[rows[R.IMAGE_ID] == image_id]
    spec = same_image[IMAGE_TRANSFORM].iloc[0]

    def view(row: pd.Series) -> np.ndarray:
        img = source.load_image(row[R.IMAGE], row[R.ID])
        return np.asarray(apply_transform(img, spec, str(row[R.ID]), str(row[R.IMAGE_ID])))

    first = same_image.iloc[0]
    original = np.asarray(source.load_image(first[R.IMAGE], first[R.ID]))
    assert np.array_equal(view(first), view(first))  # reproducible
    assert view(first).shape == original.shape and not np.array_equal(view(first), original)
    # Questions on one image see that image's variant 1..10; different variants differ.
    variants = {rid: kvasir_variant(rid, 10, 0) for rid in same_image[R.ID]}
    assert all(1 <= v <= 10 for v in variants.values())
    by_variant = {v: same_image.loc[same_image[R.ID] == rid].iloc[0] for rid, v in variants.items()}
    assert len(by_variant) >= 2, variants
    a, b = list(by_variant.values())[:2]
    assert not np.array_equal(view(a), view(b))
    # Two questions asked on the same variant of an image see the very same picture.
    rid = first[R.ID]
    twin = next(
        f"test/{i}"
        for i in range(1000)
        if f"test/{i}" != rid and kvasir_variant(f"test/{i}", 10, 0) == variants[rid]
    )
    other = first.copy()
    other[R.ID] = twin
    assert np.array_equal(view(first), view(other))


# -- the Medico public validation subset (eval_subset: medico_val) -------------------------------


@pytest.mark.parametrize("n_rows", [20, 1501, 15955])
def test_medico_positions_are_datasets_shuffle_seed_42(n_rows: int) -> None:
    """The challenge takes `load_dataset(...)["test"].shuffle(seed=42).select(range(1500))`."""
    from datasets import Dataset

    size = min(n_rows, 1500)
    shuffled = Dataset.from_dict({"position": list(range(n_rows))}).shuffle(seed=42)
    expected = shuffled.select(range(size))["position"]
    assert medico_val_positions(n_rows, size, 42).tolist() == expected
    assert medico_val_positions(n_rows, size, 43).tolist() != expected


@pytest.mark.parametrize("layout", ["parquet", "disk"])
def test_medico_val_keeps_the_shuffled_test_rows_in_order(tmp_path: Path, layout: str) -> None:
    fx = write_kvasir(tmp_path / "kvasir", layout=layout)
    table = KvasirVqaX1(
        fx.root, eval_subset="medico_val", eval_subset_size=7, yes_no_closed=False
    ).table()
    test = table.loc[table[R.SOURCE_SPLIT] == "test"].reset_index(drop=True)
    positions = np.random.default_rng(42).permutation(fx.counts["test"])[:7]
    assert test[R.ID].tolist() == [f"test/{i}" for i in positions]
    # Each id maps back to its native row: same question, answer and image.
    native = fx.frames["test"].iloc[positions].reset_index(drop=True)
    assert test[R.QUESTION].tolist() == native["question"].tolist()
    assert test[R.ANSWER].tolist() == native["answer"].tolist()
    assert test[R.IMAGE_ID].tolist() == native["img_id"].tolist()
    # Train is untouched.
    assert (table[R.SOURCE_SPLIT] == "train").sum() == fx.counts["train"]


def test_medico_val_defaults_and_bad_options(kvasir, tmp_path: Path) -> None:
    cfg = compose(["dataset=kvasir_vqa_x1", "dataset.eval_subset=medico_val"], tmp_path)
    assert cfg.dataset.eval_subset_size == 1500 and cfg.dataset.eval_subset_seed == 42
    assert cfg.dataset.eval_subset == "medico_val"
    with pytest.raises(DataError, match=r"takes 1500 rows but the test split .* has 20"):
        KvasirVqaX1(kvasir.root, eval_subset="medico_val").table()
    with pytest.raises(ValueError, match=r"eval_subset='public' is not one of \['medico_val'\]"):
        KvasirVqaX1(kvasir.root, eval_subset="public")


def test_medico_val_subset_is_the_test_split_of_the_transformed_track(
    kvasir, tmp_path: Path
) -> None:
    cfg = compose(
        [
            "+experiment=kvasir_transformed",
            f"dataset.root={kvasir.root}",
            "dataset.eval_subset=medico_val",
            "dataset.eval_subset_size=9",
        ],
        tmp_path / "cache",
    )
    shift = Shift.from_config(OmegaConf.to_container(cfg.shift, resolve=True))
    splits = make_splits(instantiate(cfg.dataset).table(), shift, seed=0)
    positions = np.random.default_rng(42).permutation(kvasir.counts["test"])[:9]
    expected = [f"test/{i}" for i in positions]
    assert splits["test_iid"][R.ID].tolist() == expected
    assert splits["test_ood"][R.ID].tolist() == expected
    assert len(splits["train"]) + len(splits["val"]) == kvasir.counts["train"]
