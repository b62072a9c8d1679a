"""Kvasir-VQA-x1's layout: the Hub snapshot's parquet files (or a `save_to_disk` folder) under
`Kvasir-VQA-x1/` and Kvasir-VQA's images as `Kvasir-VQA/images/<img_id>.jpg`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from tests.native import write_image

ANNOTATION_DIR = "Kvasir-VQA-x1"
IMAGE_DIR = "Kvasir-VQA/images"


class Kind(NamedTuple):
    """One question asked of every image."""

    complexity: int
    classes: tuple[str, ...]
    question: str
    answer: str
    closed: bool  # exactly yes/no: closed [yes, no] with yes_no_closed


ROW_KINDS: tuple[Kind, ...] = (
    Kind(1, ("polyp_count",), "How many polyps are visible?", "There is one polyp.", False),
    Kind(1, ("instrument_presence",), "Is there an instrument in the image?", "No", True),
    Kind(1, ("procedure_type",), "Was this a colonoscopy?", "Yes.", True),
    Kind(
        2,
        ("polyp_type", "polyp_size"),
        "What type of polyp is seen and how large is it?",
        "A paris IIa polyp of 5-10mm.",
        False,
    ),
    Kind(
        3,
        ("landmark_identification", "finding_count", "instrument_presence"),
        "Which landmark is visible, how many findings are there, and is a tool present?",
        "The cecum with two findings; no tool is present.",
        False,
    ),
)


@dataclass
class KvasirFixture:
    root: Path
    counts: dict[str, int] = field(default_factory=dict)  # rows per source split
    closed: dict[str, int] = field(default_factory=dict)  # yes/no rows per source split
    images: dict[str, list[str]] = field(default_factory=dict)  # img_ids per split
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)  # the native rows


def native_frame(img_ids: list[str], kinds=ROW_KINDS) -> pd.DataFrame:
    rows = [
        {
            "img_id": img_id,
            "complexity": kind.complexity,
            "question": kind.question,
            "answer": kind.answer,
            "original": json.dumps(
                [{"question": f"atomic {c}?", "answer": kind.answer} for c in kind.classes]
            ),
            "question_class": list(kind.classes),
        }
        for img_id in img_ids
        for kind in kinds
    ]
    return pd.DataFrame(rows)


def write(
    root: Path,
    images: dict[str, int] | None = None,
    layout: str = "parquet",
    kinds=ROW_KINDS,
) -> KvasirFixture:
    """Every image gets one row of every kind; `layout` is `parquet` (Hub) or `disk`."""
    images = images or {"train": 12, "test": 4}
    fixture = KvasirFixture(root)
    n = 0
    for split, n_images in images.items():
        ids = [f"cl8k2u1{n + i:03d}" for i in range(n_images)]
        for i, img_id in enumerate(ids):
            write_image(root / IMAGE_DIR / f"{img_id}.jpg", seed=n + i, size=24)
        n += n_images
        fixture.images[split] = ids
        fixture.frames[split] = native_frame(ids, kinds)
        fixture.counts[split] = len(fixture.frames[split])
        fixture.closed[split] = n_images * sum(k.closed for k in kinds)
    ann = root / ANNOTATION_DIR
    if layout == "parquet":
        (ann / "data").mkdir(parents=True, exist_ok=True)
        for split, frame in fixture.frames.items():
            frame.to_parquet(ann / "data" / f"{split}-00000-of-00001.parquet", index=False)
    elif layout == "disk":
        from datasets import Dataset, DatasetDict

        DatasetDict(
            {
                split: Dataset.from_pandas(frame, preserve_index=False)
                for split, frame in fixture.frames.items()
            }
        ).save_to_disk(str(ann))
    else:
        raise ValueError(f"layout must be parquet or disk, got {layout!r}")
    return fixture
