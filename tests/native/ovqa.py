"""OVQA's native layout as released (`OVQA_publish/`): trainset/valset/testset.json + img/."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tests.native import write_image

ORGANS = ("LEG", "HAND", "CHEST", "HEAD")
RELEASE_NAMES = {"train": "trainset.json", "validate": "valset.json", "test": "testset.json"}
# The names SURE-VQA's setup instructions give the same files.
RENAMED = {"train": "train.json", "validate": "validate.json", "test": "test.json"}

# (answer_type, question_type, question, answer, kept by the cleaning?)
ROW_KINDS: tuple[tuple[str, str, str, str, bool], ...] = (
    ("OPEN", "Modality", "What imaging modality was used?", "X-Ray", True),
    ("CLOSED", "Modality", "Is this a CT or X-Ray?", "X-Ray", True),
    ("CLOSED", "Modality", "Was this image taken with an MRI or CT?", "MRI.", True),
    ("CLOSED", "Modality", "Which modality is this, CT, MRI or X-Ray?", "X-Ray", False),
    ("CLOSED", "Modality", "Is this a CT or X-Ray?", "Ultrasound", False),
    ("CLOSED", "Abnormality", "Is there a fracture?", "Yes", True),
    ("CLOSED", "Abnormality", "Is this image normal?", "no.", True),
    ("CLOSED", "Condition", "Is the lesion on the left or right side?", "Left", False),
    ("CLOSED", "Attribute Other", "How many fractures are there?", "Two", False),
    ("OPEN", "Organ System", "Which organ system is shown?", "Musculoskeletal", True),
    ("CLOSED", "Organ System", "Is this the musculoskeletal system?", "Yes", True),
    ("OPEN", "PLANE", "In which plane is this image taken?", "Coronal", True),
    (
        "OPEN",
        "Condition",
        "What is the diagnosis?",
        "Fracture of the fifth metacarpal bone of left hand.",
        True,
    ),
    # Kinds of text the loader must keep rather than reject (each counted in kept_oddities):
    # a count stored as a JSON number, an empty open answer, a label with a trailing blank.
    ("OPEN", "Attribute Other", "How many screws are visible?", 3, True),
    ("OPEN", "Condition", "What else is abnormal?", "", True),
    ("CLOSED ", "Abnormality", "Is the bone   intact?", "Yes", True),
)


@dataclass
class OvqaFixture:
    root: Path
    kept: dict[str, int] = field(default_factory=dict)  # rows kept by the cleaning, per split
    raw: dict[str, int] = field(default_factory=dict)  # rows before cleaning
    rows: dict[str, list[dict]] = field(default_factory=dict)


def write(
    root: Path,
    images: dict[str, int] | None = None,
    kinds=ROW_KINDS,
    names: dict[str, str] = RELEASE_NAMES,
) -> OvqaFixture:
    """Every image gets one row of every kind; the organ cycles LEG, HAND, CHEST, HEAD.

    Files carry the release's names unless `names=RENAMED`.
    """
    images = images or {"train": 8, "validate": 4, "test": 4}
    fixture = OvqaFixture(root)
    qid, img_id = 0, 0
    for split, n_images in images.items():
        rows = []
        for _ in range(n_images):
            organ = ORGANS[img_id % len(ORGANS)]
            name = f"{organ.lower()}_{img_id}.jpg"
            write_image(root / "img" / name, seed=img_id)
            for atype, qtype, question, answer, _ in kinds:
                rows.append(
                    {
                        "qid": qid,
                        "image_name": name,
                        "image_organ": organ,
                        "question": question,
                        "answer": answer,
                        "answer_type": atype,
                        "question_type": qtype,
                        "phrase_type": "freeform",
                    }
                )
                qid += 1
            img_id += 1
        (root / names[split]).write_text(json.dumps(rows))
        fixture.rows[split] = rows
        fixture.raw[split] = len(rows)
        fixture.kept[split] = n_images * sum(k[4] for k in kinds)
    return fixture
