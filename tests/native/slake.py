"""SLAKE's native layout: train/validate/test.json + imgs/xmlabN/source.jpg."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from tests.native import write_image

MODALITIES = ("CT", "MRI", "X-Ray")

# (q_lang, answer_type, content_type, question, answer, kept by the cleaning?)
# The real release's oddities are row kinds too, all kept and counted (`kept_oddities` in
# splits.json): an English OPEN row whose answer is the empty string (train.json has one; the
# paper's counts include it), the answer "Transverse  Plane" with a double blank (91 rows over
# the three files) and an answer stored as a JSON number.
ROW_KINDS: tuple[tuple[str, str, str, str, str | int, bool], ...] = (
    ("en", "OPEN", "Organ", "Which organ is shown?", "Lung", True),
    ("zh", "OPEN", "Organ", "图中显示的是哪个器官?", "肺", False),
    ("en", "CLOSED", "Abnormality", "Does the image look normal?", "No", True),
    (
        "en",
        "CLOSED",
        "Abnormality",
        "Is there a lesion, in the liver, spleen or kidney?",
        "Yes",
        True,
    ),
    ("zh", "CLOSED", "Abnormality", "图像正常吗?", "是", False),
    ("en", "CLOSED", "Size", "Which is bigger, liver or spleen?", "Liver", True),
    ("en", "CLOSED", "Modality", "Is this a CT or MRI?", "MRI", True),
    ("en", "CLOSED", "Organ", "Which organ is abnormal, liver, spleen or kidney?", "Liver", False),
    (
        "en",
        "CLOSED",
        "Organ",
        "Which organ is enlarged, liver, kidney, or spleen?",
        "Kidney",
        False,
    ),
    ("en", "CLOSED", "Position", "Where is the lesion, left or right?", "Center", False),
    ("en", "OPEN", "Size", "How large is the liver?", "Normal", True),
    ("en", "OPEN", "Position", "Where is the abnormality?", "Left Lung, Right", True),
    ("en", "OPEN", "Organ", "What is the largest organ in the picture?", "", True),
    ("en", "OPEN", "Quantity", "How many lungs are in this image?", 2, True),
    ("en", "OPEN", "Plane", "What is the scanning plane of this image?", "Transverse  Plane", True),
)


@dataclass
class SlakeFixture:
    root: Path
    kept: dict[str, int] = field(default_factory=dict)  # rows kept by the cleaning, per split
    raw: dict[str, int] = field(default_factory=dict)  # rows before cleaning
    english: dict[str, int] = field(default_factory=dict)  # rows before the closed-row rule
    rows: dict[str, list[dict]] = field(default_factory=dict)


def write(
    root: Path,
    images: dict[str, int] | None = None,
    kinds=ROW_KINDS,
    validate_file: str = "validate.json",
) -> SlakeFixture:
    """Every image gets one row of every kind; modality cycles CT, MRI, X-Ray over images.

    `validate_file="validation.json"` writes the Hugging Face copy's name for that split.
    """
    images = images or {"train": 6, "validate": 3, "test": 3}
    fixture = SlakeFixture(root)
    qid, img_id = 0, 0
    for split, n_images in images.items():
        rows = []
        for _ in range(n_images):
            name = f"xmlab{img_id}/source.jpg"
            write_image(root / "imgs" / name, seed=img_id)
            for lang, atype, ctype, question, answer, _ in kinds:
                rows.append(
                    {
                        "img_id": img_id,
                        "img_name": name,
                        "question": question,
                        "answer": answer,
                        "q_lang": lang,
                        "location": "Chest",
                        "modality": MODALITIES[img_id % 3],
                        "answer_type": atype,
                        "base_type": "vqa",
                        "content_type": ctype,
                        "triple": ["vhead", "_", "_"],
                        "qid": qid,
                    }
                )
                qid += 1
            img_id += 1
        fname = validate_file if split == "validate" else f"{split}.json"
        (root / fname).write_text(json.dumps(rows, ensure_ascii=False))
        fixture.rows[split] = rows
        fixture.raw[split] = len(rows)
        fixture.english[split] = n_images * sum(k[0] == "en" for k in kinds)
        fixture.kept[split] = n_images * sum(k[5] for k in kinds)
    return fixture


# The organs' boxes (x, y, width, height) the release's detection.json gives, in a 16 px image.
LIVER_BOX, LUNG_BOX = [2, 3, 6, 5], [8, 2, 5, 9]
MASK_COLUMNS = 4  # mask.png labels the image's first four columns


def write_regions(root: Path) -> None:
    """The release's per-image region files beside `write`'s images (`imgs/xmlabN/`): every
    third image from the first has a liver and a lung box and a `mask.png`, every third from
    the second a lung box only, the others no `detection.json`."""
    for folder in sorted((root / "imgs").iterdir()):
        n = int(folder.name.removeprefix("xmlab"))
        if n % 3 == 2:
            continue
        boxes = [{"Liver": LIVER_BOX}, {"Lung": LUNG_BOX}] if n % 3 == 0 else [{"Lung": LUNG_BOX}]
        (folder / "detection.json").write_text(json.dumps(boxes))
        if n % 3 == 0:
            labels = np.zeros((16, 16), dtype=np.uint8)
            labels[:, :MASK_COLUMNS] = 3
            Image.fromarray(labels).save(folder / "mask.png")
