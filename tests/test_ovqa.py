"""OVQA from its native layout: cleaning counts, candidates, bad input, the three shifts."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from medvqa.data import records as R
from medvqa.data.shifts import Shift, make_splits
from medvqa.data.sources.ovqa import Ovqa, closed_candidates, keep_closed, modality_options
from medvqa.errors import DataError
from tests.conftest import compose
from tests.native import edit_json_row
from tests.native.ovqa import RENAMED, ROW_KINDS
from tests.native.ovqa import write as write_ovqa


@pytest.fixture
def ovqa(tmp_path: Path):
    return write_ovqa(tmp_path / "ovqa")


def test_modality_options() -> None:
    assert modality_options("Is this a CT or X-Ray?") == ["CT", "X-Ray"]
    assert modality_options("Was this image taken with an MRI or CT?") == ["MRI", "CT"]
    assert modality_options("Was this taken with MRI or an x-ray.") == ["MRI", "x-ray"]
    assert modality_options("Is this an MRI or a CT scan?") == ["MRI", "CT"]
    assert modality_options("Which modality is this, CT, MRI or X-Ray?") is None
    assert modality_options("Is the lesion on the left or right side?") is None
    assert modality_options("Is this a CT or MRI or X-Ray?") is None
    assert modality_options("Is there a fracture?") is None


@pytest.mark.parametrize(("atype", "qtype", "question", "answer", "kept"), ROW_KINDS)
def test_every_row_kind_meets_the_rule(atype, qtype, question, answer, kept) -> None:
    row = pd.Series({"answer_type": atype, "answer": answer, "question": question})
    assert keep_closed(row) == kept


def test_cleaning_counts_match_the_fixture(ovqa, tmp_path: Path) -> None:
    source = Ovqa(ovqa.root, cache_dir=tmp_path / "cache")
    table = source.table()
    assert table[R.SOURCE_SPLIT].value_counts().to_dict() == ovqa.kept
    (step,) = source.report()["cleaning"]
    assert step["step"] == "drop_non_binary_closed"
    assert step["dropped_by_split"] == {k: ovqa.raw[k] - ovqa.kept[k] for k in ovqa.raw}
    assert source.report()["skipped_rows"]["total"] == 0
    unclean = Ovqa(ovqa.root, clean_closed=False).table()
    assert unclean[R.SOURCE_SPLIT].value_counts().to_dict() == ovqa.raw
    assert table[R.IMAGE].str.match(r"img/(leg|hand|chest|head)_\d+\.jpg").all()
    assert set(table["image_organ"]) == {"LEG", "HAND", "CHEST", "HEAD"}
    assert table[R.ID].is_unique and table[R.ID].str.match(r"(train|validate|test)/\d+").all()
    # Open answers are kept as written; closed ones lose the trailing period.
    assert "Fracture of the fifth metacarpal bone of left hand." in set(table[R.ANSWER])
    closed = table[table[R.ANSWER_TYPE] == "closed"]
    assert set(closed[R.ANSWER]) == {"yes", "no", "X-Ray", "MRI"}


def test_closed_candidates(ovqa) -> None:
    assert closed_candidates("Is there a fracture?", "yes") == ["yes", "no"]
    assert closed_candidates("Is this a CT or X-Ray?", "X-Ray") == ["CT", "X-Ray"]
    assert closed_candidates("Is this a CT or X-Ray?", "x-ray") == ["CT", "x-ray"]
    assert closed_candidates("Was this image taken with an MRI or CT?", "MRI") == ["MRI", "CT"]
    table = Ovqa(ovqa.root).table()
    closed = table[table[R.ANSWER_TYPE] == "closed"]
    pairs = zip(closed[R.ANSWER], closed[R.CANDIDATES], strict=True)
    assert all(a in c and len(c) == 2 for a, c in pairs)
    assert table.loc[table[R.ANSWER_TYPE] == "open", R.CANDIDATES].isna().all()


@pytest.mark.parametrize(
    ("change", "kind", "message"),
    [
        ({"answer": None}, "malformed", "missing field 'answer'"),
        ({"answer_type": "MAYBE"}, "malformed", "'answer_type' is 'MAYBE'"),
        ({"image_name": "../../secret.jpg"}, "path_escape", "escapes the dataset root"),
        ({"qid": 0}, "duplicate_id", "qid 0 occurs earlier"),
        ({"answer": ""}, "malformed", "a CLOSED question with an empty answer"),
    ],
)
def test_bad_rows_error_or_skip(ovqa, change, kind, message) -> None:
    edit_json_row(ovqa.root / "trainset.json", 5, **change)  # row 5: a kept closed yes/no row
    with pytest.raises(DataError) as err:
        Ovqa(ovqa.root).table()
    assert "trainset.json row 5" in str(err.value) and message in str(err.value)
    source = Ovqa(ovqa.root, on_bad_row="skip")
    table = source.table()
    skipped = source.report()["skipped_rows"]
    assert skipped["counts"] == {kind: 1} and "trainset.json row 5" in skipped["examples"][0]
    assert (table[R.SOURCE_SPLIT] == "train").sum() == ovqa.kept["train"] - 1


def test_missing_annotation_file_names_it(ovqa) -> None:
    (ovqa.root / "testset.json").unlink()
    with pytest.raises(
        DataError, match=r"OVQA test annotations not found .*testset.json, test.json"
    ):
        Ovqa(ovqa.root).table()


def test_release_names_and_renamed_copies_give_the_same_table(ovqa, tmp_path: Path) -> None:
    """The release ships trainset/valset/testset.json; SURE-VQA's instructions rename them to
    train/validate/test.json. Both are read as they are; both at once is an error."""
    renamed = write_ovqa(tmp_path / "renamed", names=RENAMED)
    assert not (renamed.root / "trainset.json").exists()
    assert Ovqa(renamed.root).table().equals(Ovqa(ovqa.root).table())
    (ovqa.root / "validate.json").write_text((ovqa.root / "valset.json").read_text())
    with pytest.raises(DataError, match=r"both .*valset.json and .*validate.json"):
        Ovqa(ovqa.root).table()


def test_oddities_are_kept_and_counted(ovqa) -> None:
    source = Ovqa(ovqa.root)
    table = source.table()
    n_images = {k: len({r["image_name"] for r in rows}) for k, rows in ovqa.rows.items()}
    total = sum(n_images.values())
    assert (table[R.ANSWER] == "3").sum() == total  # the JSON number, as text
    assert (table[R.ANSWER] == "").sum() == total  # an empty open answer is kept
    padded = table[table[R.QUESTION] == "Is the bone   intact?"]  # answer_type "CLOSED "
    assert len(padded) == total and set(padded[R.ANSWER_TYPE]) == {"closed"}
    assert all(c == ["yes", "no"] for c in padded[R.CANDIDATES])
    report = source.report()["kept_oddities"]
    assert report["counts"] == {
        "non_string_answer": total,
        "empty_answer": total,
        "padded_answer_type": total,
        "inner_whitespace_question": total,
    }
    assert report["by_split"]["padded_answer_type"] == n_images
    assert source.report()["skipped_rows"]["total"] == 0


def _splits(experiment: str, root: Path, tmp_path: Path):
    cfg = compose([f"+experiment={experiment}", f"dataset.root={root}"], tmp_path / "cache")
    shift = Shift.from_config(OmegaConf.to_container(cfg.shift, resolve=True))
    table = Ovqa(root).table()
    return table, make_splits(table, shift, seed=0)


def test_body_part_shift(ovqa, tmp_path: Path) -> None:
    table, splits = _splits("ovqa_body_part", ovqa.root, tmp_path)
    src, leg = table[R.SOURCE_SPLIT], table["image_organ"] == "LEG"
    assert {k: len(v) for k, v in splits.frames.items()} == {
        "train": int(((src == "train") & ~leg).sum()),
        "val": int(((src == "validate") & ~leg).sum()),
        "test_iid": int(((src == "test") & ~leg).sum()),
        "test_ood": int(((src != "validate") & leg).sum()),  # train LEG rows merged
    }
    assert set(splits["test_ood"]["image_organ"]) == {"LEG"}
    assert not set(splits["train"][R.IMAGE_ID]) & set(splits["test_ood"][R.IMAGE_ID])


def test_question_type_shift(ovqa, tmp_path: Path) -> None:
    table, splits = _splits("ovqa_question_type", ovqa.root, tmp_path)
    src, organ = table[R.SOURCE_SPLIT], table[R.QUESTION_TYPE] == "Organ System"
    assert len(splits["train"]) == int(((src == "train") & ~organ).sum()) >= 8
    assert len(splits["test_ood"]) == int(((src == "test") & organ).sum())  # not merged
    assert set(splits["test_ood"][R.QUESTION_TYPE]) == {"Organ System"}
    assert "Organ System" not in set(splits["test_iid"][R.QUESTION_TYPE])
    assert splits.dropped["ood_in_train_not_merged"] == int(((src == "train") & organ).sum())


def test_multimodal_shift(ovqa, tmp_path: Path) -> None:
    table, splits = _splits("ovqa_multimodal", ovqa.root, tmp_path)
    src = table[R.SOURCE_SPLIT]
    leg, organ = table["image_organ"] == "LEG", table[R.QUESTION_TYPE] == "Organ System"
    ood = leg | organ
    assert len(splits["train"]) == int(((src == "train") & ~ood).sum()) >= 8
    assert len(splits["val"]) == int(((src == "validate") & ~ood).sum())
    assert len(splits["test_iid"]) == int(((src == "test") & ~ood).sum())
    # Test OoD: every OoD test row, plus train LEG rows (Organ System ones on non-LEG images
    # stay out: merging them would leak train images).
    assert len(splits["test_ood"]) == int(
        ((src == "test") & ood).sum() + ((src == "train") & leg).sum()
    )
    for name in ("train", "val", "test_iid"):
        frame = splits[name]
        assert "LEG" not in set(frame["image_organ"])
        assert "Organ System" not in set(frame[R.QUESTION_TYPE])
    assert not set(splits["train"][R.IMAGE_ID]) & set(splits["test_ood"][R.IMAGE_ID])
