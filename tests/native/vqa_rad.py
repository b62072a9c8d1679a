"""VQA-RAD's OSF layout: `VQA_RAD Dataset Public.json` + `VQA_RAD Image Folder/<image_name>`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from tests.native import write_image

ORGANS = ("HEAD", "CHEST", "ABD")
ANNOTATION_FILE = "VQA_RAD Dataset Public.json"
IMAGE_DIR = "VQA_RAD Image Folder"


class Kind(NamedTuple):
    """One question asked of every image, and what the loader must make of it."""

    phrase_type: str
    group: str  # paraphrase group within the image (qid_linked_id)
    answer_type: str
    question_type: str
    question: str
    answer: Any
    fate: str  # kept | frame (dropped) | leak (dropped: paraphrase of a test question)
    candidates: tuple[str, ...] | None = None  # expected; None: open after loading
    # The release's quirks this row shows, as counted in `kept_oddities` (the row is kept).
    oddities: tuple[str, ...] = ()
    canonical_type: str | None = None  # expected question_type if not the first listed

    @property
    def expected_type(self) -> str:
        return self.canonical_type or self.question_type.split(",")[0].strip()


ROW_KINDS: tuple[Kind, ...] = (
    Kind("freeform", "g1", "CLOSED", "PRES", "Is there a mass?", "Yes", "kept", ("yes", "no")),
    Kind("para", "g1", "CLOSED", "PRES", "Is a mass present?", "yes", "kept", ("yes", "no")),
    Kind("frame", "g1", "CLOSED", "PRES", "Is there a mass in the organ?", "Yes", "frame"),
    # Counts are JSON numbers in the release (integers; 2.0 stands for a copy that wrote floats).
    Kind(
        "freeform",
        "g2",
        "OPEN",
        "COUNT",
        "How many lesions are there?",
        2,
        "kept",
        oddities=("non_string_answer",),
    ),
    Kind(
        "para",
        "g2",
        "OPEN",
        "COUNT",
        "What is the number of lesions?",
        2.0,
        "kept",
        oddities=("non_string_answer",),
    ),
    Kind(
        "freeform", "g3", "CLOSED", "MODALITY", "Is this a CT or MRI?", "MRI", "kept", ("MRI", "CT")
    ),
    # CLOSED in the release but names no options: loaded as an open question.
    Kind(
        "freeform",
        "g4",
        "CLOSED",
        "MODALITY, PLANE",
        "What imaging modality is used?",
        "CT",
        "kept",
        oddities=("combined_question_type",),
    ),
    Kind(
        "freeform",
        "g5",
        "CLOSED",
        "POS, PRES",
        "Is the lesion on the left or right?",
        "right",
        "kept",
        ("right", "left"),
        oddities=("combined_question_type",),
    ),
    Kind(
        "para",
        "g6",
        "CLOSED",
        "ATTRIB",
        "Which organ is affected, liver, kidney, or spleen?",
        "kidney",
        "kept",
        ("liver", "kidney", "spleen"),
    ),
    Kind("para", "t1", "OPEN", "ABN", "What is abnormal here?", "edema", "leak"),
    Kind("test_freeform", "t1", "OPEN", "ABN", "What is the abnormality?", "Edema", "kept"),
    Kind("test_para", "t1", "OPEN", "ABN", "What abnormality is seen?", "Edema", "kept"),
    Kind(
        "test_freeform",
        "t2",
        "CLOSED",
        "SIZE",
        "Is the heart enlarged?",
        "No",
        "kept",
        ("yes", "no"),
    ),
    Kind(
        "test_para",
        "t2",
        "CLOSED",
        "SIZE",
        "Does the heart look enlarged?",
        "no",
        "kept",
        ("yes", "no"),
    ),
    Kind(
        "test_freeform",
        "t3",
        "OPEN",
        "COUNT",
        "How many ribs are broken?",
        0,
        "kept",
        oddities=("non_string_answer",),
    ),
    # The release's quirks as they occur in its rows: "CLOSED " with a trailing blank,
    # misspelled (PRSE, ATRIB) and lower-case ("Other") question types, tabs inside and blanks
    # around the text, and "NULL" for a question without paraphrase link (group "NULL").
    Kind(
        "freeform",
        "g7",
        "CLOSED ",
        "PRSE",
        "was the patient positioned appropriately \twithout tilting?",
        "yes",
        "kept",
        ("yes", "no"),
        ("padded_answer_type", "misspelled_question_type", "inner_whitespace_question"),
        "PRES",
    ),
    Kind(
        "para",
        "g7",
        "CLOSED",
        "ATRIB, PRES",
        " is the patient straight on the table?",
        "Yes",
        "kept",
        ("yes", "no"),
        ("combined_question_type", "misspelled_question_type", "padded_question"),
        "ATTRIB",
    ),
    Kind(
        "freeform",
        "NULL",
        "OPEN",
        "Other",
        "Which organ systems are shown?",
        "Heart \tlungs",
        "kept",
        None,
        ("lower_case_question_type", "inner_whitespace_answer", "null_qid_linked_id"),
        "OTHER",
    ),
    Kind(
        "freeform",
        "g9",
        "OPEN",
        "POS",
        "Where is the gas?",
        " superficial to the patient's skin",
        "kept",
        None,
        ("padded_answer",),
    ),
)


def split_of(kind: Kind) -> str:
    return "test" if kind.phrase_type.startswith("test_") else "train"


@dataclass
class VqaRadFixture:
    root: Path
    rows: list[dict] = field(default_factory=list)
    kept: dict[str, int] = field(default_factory=dict)  # rows the loader keeps, per source split
    dropped: dict[str, int] = field(default_factory=dict)  # per cleaning fate (frame, leak)
    relabelled_open: int = 0  # CLOSED rows without options, loaded as open
    images: list[str] = field(default_factory=list)
    organ_of_image: dict[str, str] = field(default_factory=dict)


def write(root: Path, n_images: int = 6, kinds=ROW_KINDS) -> VqaRadFixture:
    """Every image gets one row of every kind; organs cycle HEAD, CHEST, ABD over images."""
    fixture = VqaRadFixture(root)
    qid = 0
    for img in range(n_images):
        name = f"synpic{1000 + img}.jpg"
        organ = ORGANS[img % 3]
        write_image(root / IMAGE_DIR / name, seed=img)
        fixture.images.append(name)
        fixture.organ_of_image[Path(name).stem] = organ
        for kind in kinds:
            qid += 1
            fixture.rows.append(
                {
                    "qid": qid,
                    "phrase_type": kind.phrase_type,
                    "qid_linked_id": "NULL" if kind.group == "NULL" else f"link-{img}-{kind.group}",
                    "image_case_url": f"https://medpix.nlm.nih.gov/case?id=case-{img}",
                    "image_name": name,
                    "image_organ": organ,
                    "evaluation": "given",
                    "question": kind.question,
                    "question_rephrase": "NULL",
                    "question_relation": "NULL",
                    "question_frame": "NULL",
                    "question_type": kind.question_type,
                    "answer": kind.answer,
                    "answer_type": kind.answer_type,
                }
            )
    for split in ("train", "test"):
        fixture.kept[split] = n_images * sum(
            k.fate == "kept" and split_of(k) == split for k in kinds
        )
    for fate in ("frame", "leak"):
        fixture.dropped[fate] = n_images * sum(k.fate == fate for k in kinds)
    fixture.relabelled_open = n_images * sum(
        k.fate == "kept" and k.answer_type == "CLOSED" and k.candidates is None for k in kinds
    )
    (root / ANNOTATION_FILE).write_text(json.dumps(fixture.rows, indent=1))
    return fixture
