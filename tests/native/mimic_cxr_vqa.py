"""MIMIC-CXR-VQA's native layout: the builder's JSON files, the JPGs and MIMIC-IV hosp tables.

mimic-cxr-vqa/mimiccxrvqa/dataset/{train,valid,test}.json
physionet.org/files/mimic-cxr-jpg/2.0.0/files/p10/p<subject>/s<study>/<dicom>.jpg
physionet.org/files/mimic-iv/2.2/hosp/{patients.csv,admissions.csv}
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.native import write_image

ANNOTATIONS = Path("mimic-cxr-vqa/mimiccxrvqa/dataset")
IMAGES = Path("physionet.org/files/mimic-cxr-jpg/2.0.0")
HOSP = Path("physionet.org/files/mimic-iv/2.2/hosp")
SPLIT_FILES = {"train": "train.json", "validate": "valid.json", "test": "test.json"}


@dataclass(frozen=True)
class Subject:
    subject_id: int
    gender: str | None  # None: absent from patients.csv
    age: int | None
    races: tuple[str, ...]  # one admission per entry
    ethnicity: str  # what the loader must derive from `races`


SUBJECTS = (
    Subject(10000001, "M", 70, ("WHITE",), "WHITE"),
    Subject(10000002, "F", 30, ("BLACK/AFRICAN AMERICAN",), "BLACK"),
    # An unknown admission does not contradict a known one.
    Subject(10000003, "M", 25, ("ASIAN - CHINESE", "UNKNOWN"), "ASIAN"),
    Subject(10000004, "F", 65, ("WHITE", "WHITE - RUSSIAN"), "WHITE"),
    Subject(10000005, "M", 50, ("HISPANIC/LATINO - PUERTO RICAN",), "HISPANIC/LATINO"),
    # Conflicting known races: unknown.
    Subject(10000006, "F", 80, ("WHITE", "BLACK/CAPE VERDEAN"), "UNKNOWN/OTHER"),
    # No MIMIC-IV patient record: gender and age unknown.
    Subject(10000007, None, None, ("HISPANIC OR LATINO",), "HISPANIC/LATINO"),
    # No admission at all; the image path already starts with files/.
    Subject(10000008, "M", 62, (), "UNKNOWN/OTHER"),
)
# Which subjects have an image in which split.
SPLIT_SUBJECTS = {
    "train": (10000001, 10000002, 10000003, 10000004, 10000005, 10000006, 10000007, 10000008),
    "validate": (10000001, 10000002),
    "test": (10000001, 10000002, 10000003, 10000006, 10000007),
}

_ARGS_EMPTY = {"object": {}, "attribute": {}, "category": {}, "viewpos": {}, "gender": {}}


def _args(**kinds: list[str]) -> dict:
    return {**_ARGS_EMPTY, **{k: {str(i): v for i, v in enumerate(vs)} for k, vs in kinds.items()}}


def _female(s: Subject) -> bool:
    return s.gender == "F"


@dataclass(frozen=True)
class Kind:
    """One question of the fixture and what the loader must make of it."""

    semantic_type: str
    content_type: str
    template: str
    question: str
    arguments: dict
    answer: Callable[[Subject], list[str]]  # the builder's answer list
    expected: Callable[[Subject], str]  # normalised answer
    candidates: list[str] | None
    closed_kind: str | None


KINDS: tuple[Kind, ...] = (
    Kind(
        "verify",
        "presence",
        "Is there ${category_1} in the ${object_1}?",
        "Is there any disease in the left lung?",
        _args(category=["disease"], object=["left lung"]),
        lambda s: ["yes"],
        lambda s: "yes",
        ["yes", "no"],
        "yes_no",
    ),
    Kind(
        "verify",
        "abnormality",
        "Are there any abnormalities in the ${object_1}?",
        "Are there any abnormalities in the right lung?",
        _args(object=["right lung"]),
        lambda s: ["no"],
        lambda s: "no",
        ["yes", "no"],
        "yes_no",
    ),
    Kind(
        "choose",
        "attribute",
        "Which is present in the ${object_1}, ${attribute_1} or ${attribute_2}?",
        "Which is present in the left lung, atelectasis or pneumonia?",
        _args(object=["left lung"], attribute=["atelectasis", "pneumonia"]),
        lambda s: ["atelectasis"],
        lambda s: "atelectasis",
        ["atelectasis", "pneumonia", "none", "both"],
        "multilabel",
    ),
    Kind(
        "choose",
        "attribute",
        "Which ${category_1} is related to the ${object_1}, ${attribute_1} or ${attribute_2}?",
        "Which anatomical finding is related to the right lung, lung opacity or pleural effusion?",
        _args(
            category=["anatomical finding"],
            object=["right lung"],
            attribute=["lung opacity", "pleural effusion"],
        ),
        lambda s: ["lung opacity", "pleural effusion"],
        lambda s: "both",
        ["lung opacity", "pleural effusion", "none", "both"],
        "multilabel",
    ),
    Kind(
        "choose",
        "anatomy",
        "Where is ${attribute_1} found, the ${object_1} or the ${object_2}?",
        "Where is atelectasis found, the left lung or the right lung?",
        _args(attribute=["atelectasis"], object=["left lung", "right lung"]),
        lambda s: [],
        lambda s: "none",
        ["left lung", "right lung", "none", "both"],
        "multilabel",
    ),
    Kind(
        "choose",
        "gender",
        "Is the gender of this patient male or female?",
        "Is the gender of this patient male or female?",
        _ARGS_EMPTY,
        lambda s: ["f" if _female(s) else "m"],
        lambda s: "female" if _female(s) else "male",
        ["male", "female"],
        "binary",
    ),
    Kind(
        "choose",
        "plane",
        "Which view is this image taken in, AP or PA?",
        "Which view is this image taken in, AP or PA?",
        _ARGS_EMPTY,
        lambda s: ["pa" if s.subject_id % 2 else "ap"],
        lambda s: "PA" if s.subject_id % 2 else "AP",
        ["AP", "PA"],
        "binary",
    ),
    Kind(
        "query",
        "attribute",
        "List all findings in the ${object_1}.",
        "List all findings in the left lung.",
        _args(object=["left lung"]),
        lambda s: ["atelectasis", "lung opacity"],
        lambda s: "atelectasis, lung opacity",
        None,
        None,
    ),
    Kind(
        "query",
        "abnormality",
        "What abnormalities are seen in the ${object_1}?",
        "What abnormalities are seen in the cardiac silhouette?",
        _args(object=["cardiac silhouette"]),
        lambda s: [],
        lambda s: "none",
        None,
        None,
    ),
    Kind(
        "query",
        "gender",
        "What is the gender of this patient?",
        "What is the gender of this patient?",
        _ARGS_EMPTY,
        lambda s: ["f" if _female(s) else "m"],
        lambda s: "female" if _female(s) else "male",
        None,
        None,
    ),
    Kind(
        "verify",
        "gender",
        "Is this patient ${gender_1}?",
        "Is this patient female?",
        _args(gender=["f"]),
        lambda s: ["yes" if _female(s) else "no"],
        lambda s: "yes" if _female(s) else "no",
        ["yes", "no"],
        "yes_no",
    ),
)


@dataclass
class MimicFixture:
    root: Path
    kept: dict[str, int] = field(default_factory=dict)  # rows in the table, per split
    gender_questions: dict[str, int] = field(default_factory=dict)  # content_type == gender
    missing_demographics: dict[str, int] = field(default_factory=dict)  # rows of 10000007
    rows: dict[str, list[dict]] = field(default_factory=dict)
    # normalised id -> (subject, kind): the truth each table row is checked against
    truth: dict[str, tuple[Subject, Kind]] = field(default_factory=dict)


def write(root: Path) -> MimicFixture:
    """Each subject has one image per split it appears in, and every image every kind."""
    fixture = MimicFixture(root)
    by_id = {s.subject_id: s for s in SUBJECTS}
    idx = 0
    for split, subject_ids in SPLIT_SUBJECTS.items():
        rows = []
        for subject_id in subject_ids:
            subject = by_id[subject_id]
            study = 50000000 + idx
            dicom = f"{subject_id:x}-{split}-{study}"
            rel = f"p{str(subject_id)[:2]}/p{subject_id}/s{study}/{dicom}.jpg"
            write_image(root / IMAGES / "files" / rel, seed=idx)
            if subject_id == 10000008:
                rel = f"files/{rel}"
            for kind in KINDS:
                rows.append(
                    {
                        "split": "valid" if split == "validate" else split,
                        "idx": idx,
                        "image_id": dicom,
                        "question": kind.question,
                        "content_type": kind.content_type,
                        "semantic_type": kind.semantic_type,
                        "template": kind.template,
                        "template_program": "program_1",
                        "template_arguments": kind.arguments,
                        "answer": kind.answer(subject),
                        "subject_id": str(subject_id),
                        "study_id": str(study),
                        "image_path": rel,
                    }
                )
                fixture.truth[f"{split}/{idx}"] = (subject, kind)
                idx += 1
        path = root / ANNOTATIONS / SPLIT_FILES[split]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(rows, indent=1))
        fixture.rows[split] = rows
        fixture.kept[split] = len(rows)
        fixture.gender_questions[split] = len(subject_ids) * sum(
            k.content_type == "gender" for k in KINDS
        )
        fixture.missing_demographics[split] = sum(s == 10000007 for s in subject_ids) * len(KINDS)
    _write_hosp(root / HOSP)
    return fixture


def _write_hosp(hosp: Path) -> None:
    hosp.mkdir(parents=True, exist_ok=True)
    with (hosp / "patients.csv").open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["subject_id", "gender", "anchor_age", "anchor_year", "anchor_year_group"])
        for s in SUBJECTS:
            if s.gender is not None:
                out.writerow([s.subject_id, s.gender, s.age, 2150, "2008 - 2010"])
        out.writerow([19999999, "F", 44, 2150, "2008 - 2010"])  # a patient without questions
    with (hosp / "admissions.csv").open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["subject_id", "hadm_id", "admittime", "admission_type", "race"])
        hadm = 20000000
        for s in SUBJECTS:
            for race in s.races:
                out.writerow([s.subject_id, hadm, "2150-01-01 00:00:00", "EW EMER.", race])
                hadm += 1
