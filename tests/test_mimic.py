"""MIMIC-CXR-VQA from its native layout: answers, candidates, demographics, bad input, shifts."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from medvqa.data import records as R
from medvqa.data.shifts import Shift, make_splits
from medvqa.data.sources.mimic_cxr_vqa import (
    MimicCxrVqa,
    choose_options,
    interpret,
    race_category,
    subject_ethnicity,
)
from medvqa.errors import DataError
from tests.conftest import compose
from tests.native import edit_json_row
from tests.native.mimic_cxr_vqa import ANNOTATIONS, HOSP, IMAGES, KINDS, SUBJECTS
from tests.native.mimic_cxr_vqa import write as write_mimic


@pytest.fixture
def mimic(tmp_path: Path):
    return write_mimic(tmp_path / "mimic")


@pytest.mark.parametrize(
    ("race", "category"),
    [
        ("WHITE", "WHITE"),
        ("WHITE - RUSSIAN", "WHITE"),
        ("PORTUGUESE", "WHITE"),
        ("BLACK/AFRICAN AMERICAN", "BLACK"),
        ("BLACK/CAPE VERDEAN", "BLACK"),
        ("HISPANIC OR LATINO", "HISPANIC/LATINO"),
        ("HISPANIC/LATINO - DOMINICAN", "HISPANIC/LATINO"),
        ("ASIAN - SOUTH EAST ASIAN", "ASIAN"),
        ("AMERICAN INDIAN/ALASKA NATIVE", "UNKNOWN/OTHER"),
        ("UNABLE TO OBTAIN", "UNKNOWN/OTHER"),
        ("SOUTH AMERICAN", "UNKNOWN/OTHER"),
        (float("nan"), "UNKNOWN/OTHER"),
    ],
)
def test_race_category(race, category) -> None:
    assert race_category(race) == category


def test_subject_ethnicity() -> None:
    assert subject_ethnicity(["WHITE", "WHITE - OTHER EUROPEAN"]) == "WHITE"
    assert subject_ethnicity(["ASIAN", "UNKNOWN", "PATIENT DECLINED TO ANSWER"]) == "ASIAN"
    assert subject_ethnicity(["WHITE", "BLACK/AFRICAN"]) == "UNKNOWN/OTHER"
    assert subject_ethnicity(["OTHER"]) == "UNKNOWN/OTHER"
    assert subject_ethnicity([]) == "UNKNOWN/OTHER"


def test_choose_options() -> None:
    template = "Which is present in the ${object_1}, ${attribute_1} or ${attribute_2}?"
    question = "Which is present in the left lung, lung opacity or pleural effusion?"
    assert choose_options(template, question) == ["lung opacity", "pleural effusion"]
    template = "Where is ${attribute_1} found, the ${object_1} or the ${object_2}?"
    question = "Where is atelectasis found, the left lung or the right lung?"
    assert choose_options(template, question) == ["left lung", "right lung"]
    # A question that does not follow its template: the template arguments decide.
    arguments = {"attribute": {"0": "atelectasis", "1": "pneumonia"}, "object": {"0": "x"}}
    template = "Which is present in the ${object_1}, ${attribute_1} or ${attribute_2}?"
    assert choose_options(template, "reworded", arguments) == ["atelectasis", "pneumonia"]
    assert choose_options(template, "reworded", {}) is None
    # Literal options are not an "A or B" template.
    assert choose_options("Is the gender of this patient male or female?", "...") is None


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"semantic_type": "verify", "answer": ["maybe"]}, "verify question needs"),
        ({"semantic_type": "verify", "answer": "yes"}, "answer should be a list"),
        ({"semantic_type": "choose", "answer": ["pneumonia", "a", "b"]}, "at most two"),
        ({"semantic_type": "choose", "answer": ["effusion"]}, "not among the question's options"),
        (
            {
                "semantic_type": "choose",
                "content_type": "plane",
                "template": "Which view is this image taken in, AP or PA?",
                "answer": ["lateral"],
            },
            "plane question needs one of ['AP', 'PA']",
        ),
        ({"semantic_type": "choose", "template": "Which one?"}, "cannot find the options"),
    ],
)
def test_interpret_rejects_bad_answers(row, reason) -> None:
    base = {
        "question": "Which is present in the left lung, atelectasis or pneumonia?",
        "template": "Which is present in the ${object_1}, ${attribute_1} or ${attribute_2}?",
        "content_type": "attribute",
        "answer": [],
    }
    parsed, why = interpret({**base, **row})
    assert parsed is None and reason in why


def test_every_row_matches_the_fixture(mimic, tmp_path: Path) -> None:
    source = MimicCxrVqa(mimic.root, cache_dir=tmp_path / "cache")
    table = source.table()
    assert table[R.SOURCE_SPLIT].value_counts().to_dict() == mimic.kept  # "valid" -> validate
    assert set(table[R.ID]) == set(mimic.truth)
    for row in table.itertuples(index=False):
        subject, kind = mimic.truth[row.id]
        assert row.answer == kind.expected(subject), row
        assert row.answer_type == ("open" if kind.candidates is None else "closed")
        assert (row.candidates is None) == (kind.candidates is None)
        if kind.candidates is not None:
            assert list(row.candidates) == kind.candidates
            assert row.closed_kind == kind.closed_kind
        assert row.question_type == row.content_type == kind.content_type
        assert row.case_id == str(subject.subject_id)
        assert row.ethnicity == subject.ethnicity
        if subject.gender is None:
            assert row.gender == "UNKNOWN" and pd.isna(row.age)
        else:
            assert row.gender == subject.gender and row.age == subject.age
        assert row.image.startswith(f"{IMAGES}/files/p10/p{subject.subject_id}/s")
        assert (mimic.root / row.image).is_file()  # also for the path given with files/
    kinds = {(k.semantic_type, k.closed_kind) for k in KINDS}
    assert kinds == {
        ("verify", "yes_no"),
        ("choose", "multilabel"),
        ("choose", "binary"),
        ("query", None),
    }
    (note,) = source.report()["cleaning"]
    assert note["step"] == "missing_demographics" and note["dropped"] == 0
    assert note["flagged_by_split"] == {k: v for k, v in mimic.missing_demographics.items() if v}
    assert note["subjects"] == sum(s.gender is None for s in SUBJECTS)


def test_drop_content_types_is_a_counted_step(mimic) -> None:
    source = MimicCxrVqa(mimic.root, drop_content_types=["gender"])
    table = source.table()
    assert "gender" not in set(table["content_type"])
    steps = {s["step"]: s for s in source.report()["cleaning"]}
    assert steps["drop_content_types"]["dropped_by_split"] == mimic.gender_questions
    counts = table[R.SOURCE_SPLIT].value_counts().to_dict()
    assert counts == {k: mimic.kept[k] - mimic.gender_questions[k] for k in mimic.kept}


@pytest.mark.parametrize(
    ("change", "kind", "message"),
    [
        ({"answer": None}, "malformed", "missing field 'answer'"),
        ({"subject_id": None}, "malformed", "missing field 'subject_id'"),
        ({"semantic_type": "count"}, "malformed", "'semantic_type' is 'count'"),
        ({"answer": ["maybe"]}, "malformed", "verify question needs"),
        ({"image_path": "../../../../../../x.jpg"}, "path_escape", "escapes"),
        ({"image_path": "/etc/x.jpg"}, "path_escape", "escapes"),
        ({"idx": 0}, "duplicate_id", "idx 0 occurs earlier"),
    ],
)
def test_bad_rows_error_or_skip(mimic, change, kind, message) -> None:
    edit_json_row(mimic.root / ANNOTATIONS / "train.json", 1, **change)  # row 1: a verify question
    with pytest.raises(DataError) as err:
        MimicCxrVqa(mimic.root).table()
    assert "train.json row 1" in str(err.value) and message in str(err.value)
    source = MimicCxrVqa(mimic.root, on_bad_row="skip")
    table = source.table()
    skipped = source.report()["skipped_rows"]
    assert skipped["counts"] == {kind: 1} and "train.json row 1" in skipped["examples"][0]
    assert (table[R.SOURCE_SPLIT] == "train").sum() == mimic.kept["train"] - 1


@pytest.mark.parametrize(
    ("path", "what"),
    [
        (ANNOTATIONS / "valid.json", "validate annotations"),
        (HOSP / "patients.csv", "patients table"),
        (HOSP / "admissions.csv", "admissions table"),
    ],
)
def test_missing_file_names_it(mimic, path: Path, what: str) -> None:
    (mimic.root / path).unlink()
    with pytest.raises(DataError, match=rf"{what}.* not found at .*{path.name}"):
        MimicCxrVqa(mimic.root).table()


def test_csv_without_a_column_names_it(mimic) -> None:
    path = mimic.root / HOSP / "admissions.csv"
    path.write_text(path.read_text().replace(",race", ",ethnicity_text"))
    with pytest.raises(DataError, match=r"admissions.csv lacks column\(s\) \['race'\]"):
        MimicCxrVqa(mimic.root).table()


def _splits(experiment: str, root: Path, tmp_path: Path):
    cfg = compose([f"+experiment={experiment}", f"dataset.root={root}"], tmp_path / "cache")
    shift = Shift.from_config(OmegaConf.to_container(cfg.shift, resolve=True))
    table = instantiate(cfg.dataset).table()
    return table, make_splits(table, shift, seed=0)


def _sizes(table: pd.DataFrame, iid: pd.Series, ood: pd.Series) -> dict[str, int]:
    src = table[R.SOURCE_SPLIT]
    return {
        "train": int(((src == "train") & iid).sum()),
        "val": int(((src == "validate") & iid).sum()),
        "test_iid": int(((src == "test") & iid).sum()),
        "test_ood": int(((src == "test") & ood).sum()),  # nothing merged
    }


def test_gender_shift(mimic, tmp_path: Path) -> None:
    table, splits = _splits("mimic_gender", mimic.root, tmp_path)
    assert "gender" not in set(table["content_type"])  # set by the experiment
    # SURE-VQA's rule: i.i.d. is "gender != F", so patients of unknown gender are i.i.d.
    sizes = _sizes(table, table["gender"] != "F", table["gender"] == "F")
    assert {k: len(v) for k, v in splits.frames.items()} == sizes and sizes["train"] >= 8
    assert set(splits["test_ood"]["gender"]) == {"F"}
    unknown = {s.subject_id for s in SUBJECTS if s.gender is None}
    for name in ("train", "test_iid"):
        assert set(splits[name]["gender"]) == {"M", "UNKNOWN"}
        assert set(splits[name].loc[splits[name]["gender"] == "UNKNOWN", R.CASE_ID]) == {
            str(i) for i in unknown
        }
    assert splits.dropped["excluded_by_shift"] == 0


def test_ethnicity_shift(mimic, tmp_path: Path) -> None:
    table, splits = _splits("mimic_ethnicity", mimic.root, tmp_path)
    ethnicity = table["ethnicity"]
    known = ethnicity != "UNKNOWN/OTHER"
    sizes = _sizes(table, ethnicity == "WHITE", known & (ethnicity != "WHITE"))
    assert {k: len(v) for k, v in splits.frames.items()} == sizes and sizes["train"] >= 8
    assert set(splits["test_ood"]["ethnicity"]) == {"BLACK", "ASIAN", "HISPANIC/LATINO"}
    assert all(set(splits[n]["ethnicity"]) == {"WHITE"} for n in ("train", "val", "test_iid"))


def test_age_shift(mimic, tmp_path: Path) -> None:
    table, splits = _splits("mimic_age", mimic.root, tmp_path)
    age = table["age"]
    sizes = _sizes(table, (age >= 60).fillna(False), (age < 40).fillna(False))
    assert {k: len(v) for k, v in splits.frames.items()} == sizes and sizes["train"] >= 8
    assert splits["test_ood"]["age"].max() < 40
    assert all(splits[n]["age"].min() >= 60 for n in ("train", "val", "test_iid"))
    # The 40-59 gap and unknown ages are in no split (SURE-VQA: NaN fails both age tests).
    used = pd.concat(splits.frames.values())
    assert not used["age"].between(40, 59).any() and used["age"].notna().all()
    assert "UNKNOWN" not in set(used["gender"])
