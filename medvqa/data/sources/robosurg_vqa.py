"""RoboSurg-VQA: nine fixed closed questions per surgical frame, read from one manifest.

Layout under `root`: a manifest (`manifest`, default `manifest.csv`; `.jsonl` and `.parquet`
are read by suffix) with one row per frame, plus the frame and mask files it points to (paths
relative to `root`). Rows are keyed by (site, split, id); row numbers in messages count data
rows from 0 (header excluded). Columns:

| column               | values                                                        |
|----------------------|---------------------------------------------------------------|
| site                 | the acquisition site (the `robosurg_site` shift's field)      |
| split                | train, val (or validate), test                                |
| id                   | frame id, unique within (site, split)                         |
| frame                | frame image path                                              |
| mask                 | instrument mask path (optional; kept as metadata)             |
| q1_context           | Q1, one of `context_labels`                                   |
| q2_anatomy           | Q2, one of `anatomy_labels`                                   |
| q3_view              | Q3: endoscopic, robotic camera, synthetic, Unknown            |
| q4_bleeding/smoke/occlusion | Q4's three artefact bits: yes, no                      |
| q5_quality           | Q5: clear, blurry, reflective, mixed, Unknown                 |
| q6_glare             | Q6: yes, no                                                   |
| q7_contrast          | Q7 (contrast normal): yes, no                                 |
| q8_centre_occluded   | Q8: yes, no, Unknown                                          |
| q9_smoke_region      | Q9: none, left, right, centre, multi                          |

Values match case-insensitively and are stored in the spelling of `QUESTIONS`; booleans in
JSONL/parquet count as yes/no. The benchmark fixes Q1 as 3-way and Q2 as 4-way but not their labels;
the defaults below are placeholders, so set `dataset.context_labels` / `dataset.anatomy_labels`
to the release's label sets.

Each frame becomes nine closed records (one per question, candidates = the answer space, a
`question_id` column Q1..Q9). Q4 is one record whose answer is the canonical tuple string
`bleeding=no, smoke=yes, occlusion=no` (candidates: all eight combinations); the bits are also
columns (`bleeding`, `smoke`, `occlusion`, on every record of the frame) so a closed-set metric
can score Q4 bit-wise and as a tuple (`parse_artefacts` turns a prediction back into bits).

Consistency rule (docs/datasets.md): smoke = no implies Q9 = none. A frame breaking it is a
well-formed row with a contradiction we cannot resolve (either answer may be the wrong one), so
the named cleaning step `drop_smoke_region_contradiction` drops the whole frame and the count
appears in the report, rather than treating it as a malformed row.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from medvqa.data import records as R
from medvqa.data.annotated import (
    MANIFEST_SPLITS,
    AnnotatedSource,
    BadRows,
    is_missing,
    read_manifest,
)
from medvqa.data.cleaning import CleaningLog, Step
from medvqa.data.questions import YES_NO

UNKNOWN = "Unknown"
ARTEFACTS = ("bleeding", "smoke", "occlusion")
DEFAULT_CONTEXT_LABELS = ("dissection", "suturing", "idle")
DEFAULT_ANATOMY_LABELS = ("liver", "gallbladder", "bowel", "other")


def format_artefacts(bits: Mapping[str, str]) -> str:
    """The canonical Q4 answer: 'bleeding=no, smoke=yes, occlusion=no' (fixed order)."""
    return ", ".join(f"{name}={bits[name]}" for name in ARTEFACTS)


def parse_artefacts(text: str) -> dict[str, str] | None:
    """The Q4 bits of an answer string, or None if it does not name all three exactly once."""
    bits: dict[str, str] = {}
    for part in str(text).lower().replace(";", ",").split(","):
        name, sep, value = part.partition("=")
        name, value = name.strip(), value.strip().rstrip(".")
        if not sep or name not in ARTEFACTS or value not in YES_NO or name in bits:
            return None
        bits[name] = value
    return bits if set(bits) == set(ARTEFACTS) else None


ARTEFACT_SPACE: tuple[str, ...] = tuple(
    format_artefacts(dict(zip(ARTEFACTS, combo, strict=True)))
    for combo in itertools.product(YES_NO, repeat=len(ARTEFACTS))
)

# Question id -> (question text, answer space). Q1/Q2 hold the default labels; an instance
# uses its configured `context_labels` / `anatomy_labels` instead (see `questions()`).
QUESTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "Q1": ("What is the surgical context of this frame?", DEFAULT_CONTEXT_LABELS),
    "Q2": ("Which anatomy is shown in this frame?", DEFAULT_ANATOMY_LABELS),
    "Q3": (
        "What kind of view is this image?",
        ("endoscopic", "robotic camera", "synthetic", UNKNOWN),
    ),
    "Q4": ("Which artefacts are present: bleeding, smoke, occlusion?", ARTEFACT_SPACE),
    "Q5": ("How is the image quality?", ("clear", "blurry", "reflective", "mixed", UNKNOWN)),
    "Q6": ("Is there glare in the image?", YES_NO),
    "Q7": ("Is the image contrast normal?", YES_NO),
    "Q8": ("Is the centre of the image occluded?", (*YES_NO, UNKNOWN)),
    "Q9": ("Where is the smoke in the image?", ("none", "left", "right", "centre", "multi")),
}
# Short content type per question (the `question_type` column).
QUESTION_TYPES = {
    "Q1": "context",
    "Q2": "anatomy",
    "Q3": "view",
    "Q4": "artefacts",
    "Q5": "quality",
    "Q6": "glare",
    "Q7": "contrast",
    "Q8": "centre_occluded",
    "Q9": "smoke_region",
}
# Manifest column holding each single-valued question's answer (Q4 uses the ARTEFACT columns).
ANSWER_COLUMNS = {
    "Q1": "q1_context",
    "Q2": "q2_anatomy",
    "Q3": "q3_view",
    "Q5": "q5_quality",
    "Q6": "q6_glare",
    "Q7": "q7_contrast",
    "Q8": "q8_centre_occluded",
    "Q9": "q9_smoke_region",
}
ARTEFACT_COLUMNS = {name: f"q4_{name}" for name in ARTEFACTS}
KEY_COLUMNS = ("site", "split", "id", "frame")
# Spellings accepted besides the canonical ones (case and spacing are ignored anyway).
ALIASES = {"center": "centre", "robotic_camera": "robotic camera"}


def prompt(qid: str, text: str, space: Sequence[str]) -> str:
    """The question as asked: the text plus the allowed answers, so the space is explicit."""
    if qid == "Q4":
        return f"{text} Answer as 'bleeding=yes|no, smoke=yes|no, occlusion=yes|no'."
    return f"{text} Answer with one of: {', '.join(space)}."


def _canonical(value: Any, space: Sequence[str]) -> str | None:
    """The answer-space spelling of a native value, or None if it is not in the space."""
    if isinstance(value, bool):
        value = "yes" if value else "no"
    text = " ".join(str(value).split()).lower()
    text = ALIASES.get(text, text)
    lookup = {s.lower(): s for s in space}
    return lookup.get(text.lower())


CLEANING = (
    Step(
        "drop_smoke_region_contradiction",
        "Consistency rule: smoke = no implies Q9 (smoke region) = none. A frame breaking it has a "
        "contradiction in its labels that cannot be resolved, so the whole frame is dropped.",
        lambda t: ~((t["smoke"] == "no") & (t["Q9"] != "none")),
    ),
)


class RoboSurgVqa(AnnotatedSource):
    """RoboSurg-VQA from a manifest under `root` (see the module docstring for the columns)."""

    name = "robosurg_vqa"
    loader_version = 1

    def __init__(
        self,
        root: str | Path,
        cache_dir: str | Path | None = None,
        on_bad_row: str = "error",
        manifest: str = "manifest.csv",
        context_labels: Sequence[str] = DEFAULT_CONTEXT_LABELS,
        anatomy_labels: Sequence[str] = DEFAULT_ANATOMY_LABELS,
    ) -> None:
        super().__init__(root, cache_dir, on_bad_row)
        self.manifest = manifest
        self.context_labels = [str(v) for v in context_labels]
        self.anatomy_labels = [str(v) for v in anatomy_labels]
        for key, labels in (
            ("context_labels", self.context_labels),
            ("anatomy_labels", self.anatomy_labels),
        ):
            if len(set(labels)) < 2 or len(set(labels)) != len(labels):
                raise ValueError(
                    f"{self.name}: dataset.{key} must list >= 2 distinct labels, got {labels}."
                )

    def questions(self) -> dict[str, tuple[str, tuple[str, ...]]]:
        """`QUESTIONS` with this instance's Q1/Q2 label sets."""
        return {
            **QUESTIONS,
            "Q1": (QUESTIONS["Q1"][0], tuple(self.context_labels)),
            "Q2": (QUESTIONS["Q2"][0], tuple(self.anatomy_labels)),
        }

    def annotation_files(self) -> list[Path]:
        return [self.root / self.manifest]

    def _native(self, bad: BadRows) -> pd.DataFrame:
        """One row per frame: keys, paths, and each answer in its canonical spelling."""
        path = self.require(self.root / self.manifest, "RoboSurg-VQA manifest")
        questions = self.questions()
        rows, seen = [], set()
        for _, where, row in self.valid_rows(
            read_manifest(path, self.name), path, bad, KEY_COLUMNS
        ):
            split = self.field(row, "split", where, bad, tuple(MANIFEST_SPLITS))
            if split is None:
                continue
            key = (str(row["site"]), MANIFEST_SPLITS[split], str(row["id"]))
            if key in seen:
                bad("duplicate", where, f"(site, split, id) = {key} occurs more than once")
                continue
            answers = self._answers(row, questions, where, bad)
            if answers is None:
                continue
            frame = self.image_ref(str(row["frame"]), where, bad)
            if frame is None:
                continue
            mask = row.get("mask")
            if not is_missing(mask) and str(mask) != "":
                mask = self.image_ref(str(mask), where, bad)
                if mask is None:
                    continue
            else:
                mask = None
            seen.add(key)
            rows.append(
                {
                    "site": key[0],
                    R.SOURCE_SPLIT: key[1],
                    "frame_id": key[2],
                    R.IMAGE: frame,
                    "mask": mask,
                    **answers,
                }
            )
        columns = ["site", R.SOURCE_SPLIT, "frame_id", R.IMAGE, "mask", *ANSWER_COLUMNS, *ARTEFACTS]
        return pd.DataFrame(rows, columns=columns)

    def _answers(
        self,
        row: Mapping[str, Any],
        questions: Mapping[str, tuple[str, tuple[str, ...]]],
        where: str,
        bad: BadRows,
    ) -> dict[str, str] | None:
        """The frame's answers keyed by question id (and the three Q4 bits), or None if bad."""
        wanted = [(qid, col, questions[qid][1]) for qid, col in ANSWER_COLUMNS.items()]
        wanted += [(name, col, YES_NO) for name, col in ARTEFACT_COLUMNS.items()]
        answers: dict[str, str] = {}
        for key, column, space in wanted:
            value = self.field(row, column, where, bad)
            if value is None:
                return None
            canonical = _canonical(value, space)
            if canonical is None:
                bad(
                    "malformed",
                    where,
                    f"field {column!r} is {value!r}; expected one of {list(space)}",
                )
                return None
            answers[key] = canonical
        return answers

    def build(self, bad: BadRows, cleaning: CleaningLog) -> pd.DataFrame:
        native = cleaning.apply(self._native(bad), CLEANING)
        questions = self.questions()
        q4 = [format_artefacts(bits) for bits in native[list(ARTEFACTS)].to_dict("records")]
        frames = []
        for qid, (text, space) in questions.items():
            answers = pd.Series(q4, index=native.index) if qid == "Q4" else native[qid]
            frame_key = native["site"] + "/" + native["frame_id"]
            frames.append(
                pd.DataFrame(
                    {
                        R.ID: native["site"]
                        + "/"
                        + native[R.SOURCE_SPLIT]
                        + "/"
                        + native["frame_id"]
                        + "/"
                        + qid,
                        R.IMAGE: native[R.IMAGE],
                        R.QUESTION: prompt(qid, text, space),
                        R.ANSWER: answers,
                        R.ANSWER_TYPE: "closed",
                        R.QUESTION_TYPE: QUESTION_TYPES[qid],
                        R.CANDIDATES: [list(space) for _ in range(len(native))],
                        R.CASE_ID: frame_key,
                        R.IMAGE_ID: frame_key,
                        R.SOURCE_SPLIT: native[R.SOURCE_SPLIT],
                        "site": native["site"],
                        "question_id": qid,
                        "mask": native["mask"],
                        **{name: native[name] for name in ARTEFACTS},
                    }
                )
            )
        columns = [*R.CORE_COLUMNS, "site", "question_id", "mask", *ARTEFACTS]
        if not frames or native.empty:
            return pd.DataFrame(columns=columns)
        return pd.concat(frames, ignore_index=True)[columns]
