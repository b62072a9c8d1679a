"""VQA-RAD from its OSF layout: cleaning counts, candidates, paraphrase groups, bad input, shifts."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from medvqa.data import records as R
from medvqa.data.annotated import answer_text
from medvqa.data.shifts import Shift, make_splits
from medvqa.data.sources.vqa_rad import VqaRad, case_from_url, closed_options, question_types
from medvqa.errors import DataError
from tests.conftest import compose
from tests.native import edit_json_row
from tests.native.vqa_rad import ANNOTATION_FILE, ROW_KINDS, split_of
from tests.native.vqa_rad import write as write_vqa_rad


@pytest.fixture
def rad(tmp_path: Path):
    return write_vqa_rad(tmp_path / "vqa_rad")


def test_closed_options() -> None:
    assert closed_options("Is there a mass?", "Yes") == ["yes", "no"]
    assert closed_options("Is this a CT or MRI?", "CT") == ["CT", "MRI"]
    assert closed_options("Is this a CT or MRI?", "MRI") == ["MRI", "CT"]
    assert closed_options("Is the lesion on the left or right side?", "left") == ["left", "right"]
    assert closed_options("Are there 2 or 3 lesions?", "3") == ["3", "2"]
    assert closed_options("Which organ, liver, kidney, or spleen?", "Kidney") == [
        "liver",
        "Kidney",
        "spleen",
    ]
    # Nothing to choose from, or the answer is neither side: no candidate set.
    assert closed_options("What imaging modality is used?", "CT") is None
    assert closed_options("Is this a CT or MRI?", "both") is None


def test_field_parsers() -> None:
    assert question_types("PRES") == (["PRES"], [])
    assert question_types("PRES, POS") == (["PRES", "POS"], ["combined_question_type"])
    assert question_types("Other") == (["OTHER"], ["lower_case_question_type"])
    assert question_types("ATRIB") == (["ATTRIB"], ["misspelled_question_type"])
    assert question_types("PRSE") == (["PRES"], ["misspelled_question_type"])
    assert question_types("SHAPE") == (["SHAPE"], ["unknown_question_type"])
    assert case_from_url("https://medpix.nlm.nih.gov/case?id=abc-1", "x") == "abc-1"
    assert case_from_url("NULL", "synpic1") == "synpic1"


def test_counts_and_cleaning_match_the_fixture(rad, tmp_path: Path) -> None:
    source = VqaRad(rad.root, cache_dir=tmp_path / "cache")
    table = source.table()
    assert table[R.SOURCE_SPLIT].value_counts().to_dict() == rad.kept
    steps = {s["step"]: s for s in source.report()["cleaning"]}
    assert steps["drop_frame_questions"]["dropped"] == rad.dropped["frame"]
    assert steps["drop_train_paraphrases_of_test"]["dropped_by_split"] == {
        "train": rad.dropped["leak"]
    }
    assert "frame" not in set(table["phrasing"])
    relabelled = (table["answer_type_native"] == "CLOSED") & (table[R.ANSWER_TYPE] == "open")
    assert relabelled.sum() == rad.relabelled_open
    # Image references, ids and cases come from the release's fields.
    assert table[R.IMAGE].str.startswith("VQA_RAD Image Folder/synpic").all()
    assert table[R.ID].is_unique
    assert set(table[R.CASE_ID]) == {f"case-{i}" for i in range(len(rad.images))}
    organs = table.drop_duplicates(R.IMAGE_ID).set_index(R.IMAGE_ID)["image_organ"].to_dict()
    assert organs == rad.organ_of_image
    # Reading the cached table again gives the same content (candidates stay lists).
    again = VqaRad(rad.root, cache_dir=tmp_path / "cache").table()
    assert again.equals(table)
    assert all(
        isinstance(c, list) for c in again.loc[again[R.ANSWER_TYPE] == "closed", R.CANDIDATES]
    )


def test_every_row_kind_is_loaded_as_designed(rad) -> None:
    table = VqaRad(rad.root).table()
    by_qid = {str(r["qid"]): r for r in rad.rows}
    kinds = {k.question: k for k in ROW_KINDS}
    seen = set()
    for row in table.to_dict("records"):
        native = by_qid[row[R.ID].split("/", 1)[1]]
        kind = kinds[native["question"]]
        seen.add(kind)
        assert kind.fate == "kept" and row[R.SOURCE_SPLIT] == split_of(kind)
        assert row[R.ANSWER_TYPE] == ("closed" if kind.candidates else "open")
        assert row[R.CANDIDATES] == (list(kind.candidates) if kind.candidates else None)
        expected = answer_text(kind.answer).strip()
        assert row[R.ANSWER] == (expected.lower() if kind.candidates == ("yes", "no") else expected)
        assert row[R.QUESTION] == kind.question.strip()
        assert row[R.QUESTION_TYPE] == kind.expected_type
        assert row["question_type_raw"] == kind.question_type
        assert row["phrasing"] == kind.phrase_type.removeprefix("test_")
    assert seen == {k for k in ROW_KINDS if k.fate == "kept"}


def test_release_oddities_are_kept_and_counted(rad) -> None:
    """Every quirk of the release's rows is counted once per row showing it, split by where the
    row ended up; none of them costs a row."""
    source = VqaRad(rad.root)
    source.table()
    report = source.report()
    n_images = len(rad.images)
    expected: dict[str, int] = {}
    for kind in ROW_KINDS:
        for oddity in kind.oddities:
            expected[oddity] = expected.get(oddity, 0) + n_images
    assert report["kept_oddities"]["counts"] == expected
    assert report["skipped_rows"]["total"] == 0
    by_split = report["kept_oddities"]["by_split"]
    assert by_split["padded_answer_type"] == {"train": n_images}
    assert by_split["non_string_answer"] == {"train": 2 * n_images, "test": n_images}


def test_blank_question_is_a_bad_row(rad) -> None:
    edit_json_row(rad.root / ANNOTATION_FILE, 3, question=" \t ")
    with pytest.raises(DataError, match=r"row 3: field 'question' is blank"):
        VqaRad(rad.root).table()


def test_paraphrase_groups_never_straddle_source_splits(rad) -> None:
    table = VqaRad(rad.root).table()
    splits_per_group = table.groupby("paraphrase_group")[R.SOURCE_SPLIT].nunique()
    assert (splits_per_group == 1).all()
    # The linked free-form/paraphrase pairs survive as groups of two.
    assert (table.groupby("paraphrase_group").size() == 2).any()


@pytest.mark.parametrize(
    ("change", "kind", "message"),
    [
        ({"question": None}, "malformed", "missing field 'question'"),
        ({"phrase_type": "draft"}, "malformed", "'phrase_type' is 'draft'"),
        ({"image_organ": "LEG"}, "malformed", "'image_organ' is 'LEG'"),
        ({"image_name": "../../etc/passwd"}, "path_escape", "escapes the dataset root"),
        ({"qid": 1}, "duplicate_id", "qid '1' occurs more than once"),
    ],
)
def test_bad_rows_error_or_skip(rad, change, kind, message) -> None:
    edit_json_row(rad.root / ANNOTATION_FILE, 3, **change)  # row 3: a kept train question (kind 4)
    with pytest.raises(DataError) as err:
        VqaRad(rad.root).table()
    assert f"{ANNOTATION_FILE} row 3" in str(err.value) and message in str(err.value)
    source = VqaRad(rad.root, on_bad_row="skip")
    table = source.table()
    skipped = source.report()["skipped_rows"]
    assert skipped["counts"] == {kind: 1} and f"{ANNOTATION_FILE} row 3" in skipped["examples"][0]
    assert (table[R.SOURCE_SPLIT] == "train").sum() == rad.kept["train"] - 1


def test_missing_annotation_file_names_it(rad) -> None:
    (rad.root / ANNOTATION_FILE).unlink()
    with pytest.raises(DataError, match=r"VQA-RAD annotations not found at .*Public.json"):
        VqaRad(rad.root).table()


def test_the_releases_xlsx_copy_reads_as_its_json(rad) -> None:
    """`dataset.annotation_file='VQA_RAD Dataset Public.xlsx'` (openpyxl is a dependency): the
    same rows as the JSON copy."""
    rows = pd.read_json(rad.root / ANNOTATION_FILE)
    rows.to_excel(rad.root / "VQA_RAD Dataset Public.xlsx", index=False)
    from_json = VqaRad(rad.root).table()
    from_xlsx = VqaRad(rad.root, annotation_file="VQA_RAD Dataset Public.xlsx").table()
    pd.testing.assert_frame_equal(from_xlsx, from_json)


def _splits(experiment: str, root: Path, cache: Path):
    cfg = compose([f"+experiment={experiment}", f"dataset.root={root}"], cache)
    source = instantiate(cfg.dataset)
    assert isinstance(source, VqaRad)
    shift = Shift.from_config(OmegaConf.to_container(cfg.shift, resolve=True))
    assert shift.val_group == "paraphrase_group"
    splits = make_splits(source.table(), shift, seed=0)
    assert all(len(df) > 0 for df in splits.frames.values()) and len(splits["train"]) >= 8
    # No paraphrase group is on both sides of train|val, or of train+val|test.
    groups = {k: set(df["paraphrase_group"]) for k, df in splits.frames.items()}
    assert not groups["train"] & groups["val"]
    assert not (groups["train"] | groups["val"]) & (groups["test_iid"] | groups["test_ood"])
    return source.table(), splits


def test_vqarad_organ_splits(rad, tmp_path: Path) -> None:
    table, splits = _splits("vqarad_organ", rad.root, tmp_path / "cache")
    for name in ("train", "val", "test_iid"):
        assert set(splits[name]["image_organ"]) == {"HEAD", "CHEST"}
    assert set(splits["test_ood"]["image_organ"]) == {"ABD"}
    # Image-level shift: every ABD row, train ones included, is in the OoD test.
    assert len(splits["test_ood"]) == (table["image_organ"] == "ABD").sum()
    assert set(splits["test_ood"][R.SOURCE_SPLIT]) == {"train", "test"}
    assert (
        len(splits["test_iid"])
        == ((table["image_organ"] != "ABD") & (table[R.SOURCE_SPLIT] == "test")).sum()
    )


def test_vqarad_paraphrase_splits(rad, tmp_path: Path) -> None:
    table, splits = _splits("vqarad_paraphrase", rad.root, tmp_path / "cache")
    for name in ("train", "val"):
        assert set(splits[name]["phrase_type"]) == {"freeform"}
    assert set(splits["test_iid"]["phrase_type"]) == {"test_freeform"}
    assert set(splits["test_ood"]["phrase_type"]) == {"test_para"}
    assert len(splits["test_ood"]) == (table["phrase_type"] == "test_para").sum()
    assert len(splits["train"]) + len(splits["val"]) == (table["phrase_type"] == "freeform").sum()
    assert splits.dropped["ood_in_train_not_merged"] == (table["phrase_type"] == "para").sum()
