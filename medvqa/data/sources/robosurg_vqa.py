"""RoboSurg-VQA as released: closed questions about EndoVis 2017/2018 frames, one fixed label list
per task, asked in several wordings (docs/datasets.md#robosurg-vqa).

Layout under `root` (a checkout of the release, with the frame arrays placed where its manifest
says):

| file                        | what it holds                                                   |
|-----------------------------|-----------------------------------------------------------------|
| `configs/questions.json`    | `{"tasks": {task: {canonical, train_paraphrases[], heldout_paraphrase}}}`; its key order is the task order |
| `data/manifest.jsonl`       | one row per frame: `record_id`, `site`, `split` (train/test), `video_key`, `image_path`, `mask_path`, ... |
| `data/vqa_records.jsonl`    | one row per frame x applicable task: `qa_id`, `record_id`, `task`, `answer`, `valid_answers`, `source_sequence_id`, `validation_role` (train_core/validation/test), the three wordings |
| `external_data/<site>/<split>/image/*.npy` | the frames: uint8 RGB arrays (height x width x 3) |

A source sequence is `(split, video_key)`, written `"<split>|<video_key>"` as the release does:
EndoVis 2018 numbers its training and test videos from 1 each, so `site2/video1` names two
different sequences. That key is the record's `case_id`, the cluster every bootstrap resamples.

Records. Every (frame, task) of `vqa_records.jsonl` becomes closed records whose candidates are
the task's fixed labels (`valid_answers`) and whose `question_id` is the task id. The wording,
kept in the `wording` column, follows the release's protocol:

- train (`train_core`): the canonical question and each training paraphrase, one record each;
- validate (`validation`, the release's four validation sequences): the canonical question;
- test: one record in the wording `test_wording` names: `canonical`, `heldout_paraphrase`, or
  `wrong_question` (the canonical question of the next task in task order, cyclically: the
  control that shows whether the model reads the question at all).

`neutral_question=true` replaces every question, in every split, by one task-free question:
the image-only control (the release zeroes the question features; a VLM gets a question that
carries no task). Every prompt lists the release's global answer vocabulary (all tasks' labels
in task order), never the task's own list: the release scores a single shared answer space
without task-specific filtering, so telling the model the task's labels would hand it the task
the question is meant to convey. An answer outside the task's labels is invalid.

Tasks with a single label (q1 procedure, q3 view: constant in this release) are dropped by a
named cleaning step: they measure nothing, and a closed record needs two candidates.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from PIL import Image

from medvqa.data import records as R
from medvqa.data.annotated import (
    DEFAULT_ON_BAD_ROW,
    IDENTIFIER,
    TEXT,
    TEXT_OR_NUMBER,
    AnnotatedSource,
    BadRows,
    read_manifest,
)
from medvqa.data.cleaning import CleaningLog, Step
from medvqa.data.regions import NAMES_NO_REGION, NO_REGION_FILE, REGION, REGION_MISSING, Region
from medvqa.errors import DataError

QUESTIONS_FILE = "configs/questions.json"
MANIFEST_FILE = "data/manifest.jsonl"
RECORDS_FILE = "data/vqa_records.jsonl"
# The release's validation_role -> the normalised source split.
ROLES = {"train_core": "train", "validation": "validate", "test": "test"}
TEST_WORDINGS = ("canonical", "heldout_paraphrase", "wrong_question")
# `wording` column values besides TEST_WORDINGS.
TRAIN_PARAPHRASE = "train_paraphrase"
NEUTRAL = "neutral"
NEUTRAL_QUESTION = "Which answer applies to this image?"
WORDING = "wording"
QUESTION_ID = "question_id"
SEQUENCE = "source_sequence_id"
MANIFEST_KEYS = ("record_id", "site", "split", "video_key", "image_path")
# The tasks whose question is about the frame's official mask (q2: the anatomy with the largest
# mask area; q8: instrument-mask coverage of the central window): their region is every
# labelled (non-zero) pixel of the frame's mask (`mask_path`). The other tasks name no region.
REGION_TASKS = ("q2", "q8.mask_center_5pct_v1")
RECORD_KEYS = ("qa_id", "record_id", "task", "answer", "valid_answers", SEQUENCE, "validation_role")
# What each field read from either file must hold (checked per row; a wrong type is a bad
# row). `valid_answers` is a list, checked by the loader.
FIELD_TYPES = {
    **dict.fromkeys(("record_id", "qa_id"), IDENTIFIER),
    "answer": TEXT_OR_NUMBER,
    **dict.fromkeys(
        (
            "site",
            "split",
            "video_key",
            "image_path",
            "mask_path",
            "task",
            SEQUENCE,
            "validation_role",
        ),
        TEXT,
    ),
}


def sequence_key(split: str, video_key: str) -> str:
    """The release's source-sequence id: split and video key (video numbers repeat per split)."""
    return f"{split}|{video_key}"


def prompt(text: str, vocabulary: Sequence[str]) -> str:
    """The question as asked: its text plus the shared answer vocabulary."""
    return f"{text} Answer with one of: {'; '.join(vocabulary)}."


CLEANING = (
    Step(
        "drop_single_label_tasks",
        "A task whose fixed label list has one label (q1 procedure, q3 view in the release) "
        "cannot be answered wrongly by a valid answer and a closed record needs two candidates.",
        lambda t: t["labels"].map(len) >= 2,
    ),
)


class RoboSurgVqa(AnnotatedSource):
    """RoboSurg-VQA in its release layout under `root` (see the module docstring)."""

    name = "robosurg_vqa"
    loader_version = 3  # 3: regions
    metadata_fields = (QUESTION_ID, WORDING, "site", "video_key", "mask", REGION, REGION_MISSING)
    field_types = FIELD_TYPES

    def __init__(
        self,
        root: str | Path,
        cache_dir: str | Path | None = None,
        on_bad_row: str = DEFAULT_ON_BAD_ROW,
        test_wording: str = "canonical",
        neutral_question: bool = False,
    ) -> None:
        super().__init__(root, cache_dir, on_bad_row)
        if test_wording not in TEST_WORDINGS:
            raise ValueError(
                f"{self.name}: dataset.test_wording must be one of {TEST_WORDINGS}, got "
                f"{test_wording!r}."
            )
        self.test_wording = test_wording
        self.neutral_question = bool(neutral_question)

    def annotation_files(self) -> list[Path]:
        return [self.root / QUESTIONS_FILE, self.root / MANIFEST_FILE, self.root / RECORDS_FILE]

    # -- reading ---------------------------------------------------------------------------------

    def _questions(self) -> dict[str, dict[str, Any]]:
        """Task id -> its wordings, in the file's (the release's) task order."""
        path = self.require(self.root / QUESTIONS_FILE, "RoboSurg-VQA questions.json")
        try:
            tasks = json.loads(path.read_text(encoding="utf-8"))["tasks"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise DataError(
                f"{self.name}: {path} must be JSON with a 'tasks' object ({err!r}); restore the "
                "release's file."
            ) from err
        for task, spec in tasks.items():
            ok = (
                isinstance(spec, dict)
                and isinstance(spec.get("canonical"), str)
                and isinstance(spec.get("heldout_paraphrase"), str)
                and isinstance(spec.get("train_paraphrases"), list)
                and all(isinstance(p, str) for p in spec["train_paraphrases"])
            )
            if not ok:
                raise DataError(
                    f"{self.name}: {path} task {task!r} needs 'canonical', 'heldout_paraphrase' "
                    "(strings) and 'train_paraphrases' (a list of strings); fix the entry."
                )
        if len(tasks) < 2:
            raise DataError(f"{self.name}: {path} defines {len(tasks)} task(s); expected several.")
        return tasks

    def _frames(self, bad: BadRows) -> dict[str, dict[str, Any]]:
        """record_id -> manifest row (frame paths, site, split, video key)."""
        path = self.require(self.root / MANIFEST_FILE, "RoboSurg-VQA manifest")
        frames: dict[str, dict[str, Any]] = {}
        for _, where, row in self.valid_rows(
            read_manifest(path, self.name), path, bad, MANIFEST_KEYS
        ):
            if self.field(row, "split", where, bad, ("train", "test")) is None:
                continue
            rid = str(row["record_id"])
            if rid in frames:
                bad("duplicate_id", where, f"record_id {rid!r} occurs more than once")
                continue
            image = self.image_ref(str(row["image_path"]), where, bad)
            if image is None:
                continue
            mask = row.get("mask_path")
            if mask is not None:
                mask = self.image_ref(str(mask), where, bad)
                if mask is None:
                    continue
            frames[rid] = {**row, "image_path": image, "mask_path": mask}
        return frames

    def _base_rows(
        self, questions: Mapping[str, Mapping[str, Any]], frames: Mapping[str, Any], bad: BadRows
    ) -> pd.DataFrame:
        """One row per (frame, task) record, checked against the manifest and questions.json."""
        path = self.require(self.root / RECORDS_FILE, "RoboSurg-VQA vqa_records.jsonl")
        labels_of: dict[str, list[str]] = {}
        rows, seen = [], set()
        for _, where, row in self.valid_rows(
            read_manifest(path, self.name), path, bad, RECORD_KEYS
        ):
            task, rid = str(row["task"]), str(row["record_id"])
            role = self.field(row, "validation_role", where, bad, tuple(ROLES))
            if role is None:
                continue
            if task not in questions:
                bad("malformed", where, f"task {task!r} is not in {QUESTIONS_FILE}")
                continue
            if rid not in frames:
                bad("malformed", where, f"record_id {rid!r} is not a frame of {MANIFEST_FILE}")
                continue
            if row["qa_id"] in seen:
                bad("duplicate_id", where, f"qa_id {row['qa_id']!r} occurs more than once")
                continue
            frame = frames[rid]
            problem = self._mismatch(row, frame, questions[task], role)
            if not isinstance(row["valid_answers"], list):
                bad("malformed", where, f"valid_answers {row['valid_answers']!r} is not a list")
                continue
            labels = [str(v) for v in row["valid_answers"]]
            known = labels_of.setdefault(task, labels)
            if problem is None and known != labels:
                problem = f"valid_answers {labels} differ from task {task!r}'s {known}"
            if problem is None and str(row["answer"]) not in labels:
                problem = f"answer {row['answer']!r} is not one of valid_answers {labels}"
            if problem is not None:
                bad("malformed", where, problem)
                continue
            seen.add(row["qa_id"])
            rows.append(
                {
                    "qa_id": str(row["qa_id"]),
                    "frame": rid,
                    "task": task,
                    R.ANSWER: str(row["answer"]),
                    "labels": labels,
                    R.SOURCE_SPLIT: ROLES[role],
                    SEQUENCE: str(row[SEQUENCE]),
                    "site": str(frame["site"]),
                    "video_key": str(frame["video_key"]),
                    R.IMAGE: frame["image_path"],
                    "mask": frame["mask_path"],
                }
            )
        return pd.DataFrame(
            rows,
            columns=[
                "qa_id",
                "frame",
                "task",
                R.ANSWER,
                "labels",
                R.SOURCE_SPLIT,
                SEQUENCE,
                "site",
                "video_key",
                R.IMAGE,
                "mask",
            ],
        )

    @staticmethod
    def _mismatch(
        row: Mapping[str, Any], frame: Mapping[str, Any], wordings: Mapping[str, Any], role: str
    ) -> str | None:
        """Why a record disagrees with its frame or its task's wordings (None if it does not)."""
        expected = sequence_key(str(frame["split"]), str(frame["video_key"]))
        if str(row[SEQUENCE]) != expected:
            return f"source_sequence_id {row[SEQUENCE]!r} is not the frame's {expected!r}"
        if (role == "test") != (frame["split"] == "test"):
            return f"validation_role {role!r} contradicts the frame's split {frame['split']!r}"
        for key in ("canonical", "heldout_paraphrase", "train_paraphrases"):
            given = row.get(f"question_{key}")
            if given is not None and given != wordings[key]:
                return f"question_{key} {given!r} differs from {QUESTIONS_FILE}"
        return None

    # -- records ---------------------------------------------------------------------------------

    def build(self, bad: BadRows, cleaning: CleaningLog) -> pd.DataFrame:
        questions = self._questions()
        base = self._base_rows(questions, self._frames(bad), bad)
        vocabulary = _vocabulary(base, list(questions))
        base = cleaning.apply(base, CLEANING)
        order = list(questions)
        wrong = {task: order[(i + 1) % len(order)] for i, task in enumerate(order)}
        parts = []
        for split, rows in base.groupby(R.SOURCE_SPLIT, sort=False):
            for wording, suffix, text_of in self._wordings(str(split), questions, wrong):
                texts = rows["task"].map(text_of)
                asked = rows.loc[texts.notna()]
                parts.append(
                    asked.assign(
                        **{
                            R.ID: asked["qa_id"] + suffix,
                            R.QUESTION: texts[texts.notna()].map(lambda t: prompt(t, vocabulary)),
                            WORDING: wording,
                        }
                    )
                )
        columns = [*R.CORE_COLUMNS, QUESTION_ID, WORDING, "site", "video_key", "mask"]
        columns += [REGION, REGION_MISSING]
        if not parts:
            return pd.DataFrame(columns=columns)
        table = pd.concat(parts, ignore_index=True)
        return table.assign(
            **{
                R.ANSWER_TYPE: "closed",
                R.QUESTION_TYPE: table["task"],
                QUESTION_ID: table["task"],
                R.CANDIDATES: table["labels"],
                R.CASE_ID: table[SEQUENCE],
                R.IMAGE_ID: table["frame"],
                **_regions(table["task"], table["mask"]),
            }
        )[columns]

    def _wordings(
        self, split: str, questions: Mapping[str, Mapping[str, Any]], wrong: Mapping[str, str]
    ) -> list[tuple[str, str, Callable[[str], str | None]]]:
        """(wording, id suffix, task -> question text or None) per record a base row gives here.

        Only training paraphrases get an id suffix: a test record's id is its qa_id whatever
        the wording, so runs under different wordings pair up row by row."""
        if self.neutral_question:
            return [(NEUTRAL, "", lambda _t: NEUTRAL_QUESTION)]
        if split == "test":
            if self.test_wording == "wrong_question":
                return [(self.test_wording, "", lambda t: questions[wrong[t]]["canonical"])]
            return [(self.test_wording, "", lambda t: questions[t][self.test_wording])]
        out = [("canonical", "", lambda t: questions[t]["canonical"])]
        if split == "train":
            longest = max(len(q["train_paraphrases"]) for q in questions.values())
            for k in range(longest):
                out.append(
                    (
                        TRAIN_PARAPHRASE,
                        f"#{TRAIN_PARAPHRASE}_{k + 1}",
                        lambda t, k=k: _nth(questions[t]["train_paraphrases"], k),
                    )
                )
        return out

    # -- images ----------------------------------------------------------------------------------

    def check_image(self, ref: str, record_id: str | None = None) -> None:
        """A frame array is checked from its header only (memory-mapped, nothing read)."""
        path = self.image_path(ref, record_id)
        if path.suffix.lower() != ".npy":
            super().check_image(ref, record_id)
            return
        _rgb_array(path, self.name, record_id)

    def load_image(self, ref: str, record_id: str | None = None) -> Image.Image:
        """The release stores frames as uint8 RGB arrays; other files go through PIL."""
        path = self.image_path(ref, record_id)
        if path.suffix.lower() != ".npy":
            return super().load_image(ref, record_id)
        return Image.fromarray(np.ascontiguousarray(_rgb_array(path, self.name, record_id)))


def _regions(tasks: pd.Series, masks: pd.Series) -> dict[str, list[str | None]]:
    """The `region` and `region_missing` cells of each record: the frame's mask where its task
    is about the mask (`REGION_TASKS`), else none, saying why."""
    cells = [_region(t, m) for t, m in zip(tasks, masks, strict=True)]
    return {REGION: [c[0] for c in cells], REGION_MISSING: [c[1] for c in cells]}


def _region(task: str, mask: Any) -> tuple[str | None, str | None]:
    if task not in REGION_TASKS:
        return None, NAMES_NO_REGION
    if not isinstance(mask, str) or not mask:
        return None, NO_REGION_FILE
    return Region(mask=mask).text(), None


def _nth(paraphrases: Sequence[str], k: int) -> str | None:
    """The k-th training paraphrase, None if the task has fewer (it then gets fewer records)."""
    return paraphrases[k] if k < len(paraphrases) else None


def _vocabulary(base: pd.DataFrame, order: Sequence[str]) -> list[str]:
    """The shared answer space: every task's labels in task order, first occurrence kept."""
    labels_of = base.drop_duplicates("task").set_index("task")["labels"].to_dict()
    out: dict[str, None] = {}
    for task in order:
        out.update(dict.fromkeys(labels_of.get(task, [])))
    return list(out)


def _rgb_array(path: Path, source: str, record_id: str | None) -> np.ndarray:
    """A frame as the release stores it (uint8, height x width x 3), memory-mapped."""
    where = f" (record {record_id!r})" if record_id is not None else ""
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as err:
        raise DataError(
            f"{source}: cannot read frame array {path}{where}: {err}. Re-create it as the "
            "release's data preparation describes (np.save of a uint8 RGB array)."
        ) from err
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
        raise DataError(
            f"{source}: frame array {path}{where} has dtype {array.dtype} and shape "
            f"{array.shape}; expected uint8 height x width x 3 (RGB)."
        )
    return array
