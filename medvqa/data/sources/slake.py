"""SLAKE (English part) in its native layout, with the cleaning that reproduces SURE-VQA.

Layout under `root`: `train.json`, `validate.json`, `test.json` (lists of rows with `img_id,
img_name, question, answer, q_lang, location, modality, answer_type, base_type, content_type,
qid`) and `imgs/<img_name>` (e.g. `imgs/xmlab0/source.jpg`). The Hugging Face copy calls the
validation file `validation.json`; either name is read (both present is an error).

Cleaning (docs/datasets.md): keep English rows; drop CLOSED rows whose answer is not yes/no when the
question offers more than two options or does not contain the answer. These rows are really
multiple-choice or free questions mislabelled as closed, and closed accuracy cannot score them.
Result on the real files: train 4866, validate 1043, test 1050. Those counts include an English
OPEN row of train.json whose answer is the empty string: it is kept, as the paper kept it, and
counted in splits.json (`kept_oddities`), like the 91 answers "Transverse  Plane" (double blank,
kept as released) and any answer stored as a JSON number (kept as its text). A CLOSED row with
an empty answer cannot be scored and is a bad row.

Regions (`medvqa.data.regions`): where an image's folder has the release's `detection.json` (a
list of `{label: [x, y, width, height]}` objects, boxes in the image's pixels), a question that
names one of the release's labels (any image's; case-insensitive, whole words, a plural `s`
allowed) gets the boxes of the labels it names that its image has, refined by the folder's
`mask.png` (its labelled pixels inside them) where the release has one. The others say why they
have none: no `detection.json`, no label named, or a label named that the image lacks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

import pandas as pd

from medvqa.data import records as R
from medvqa.data.annotated import (
    DEFAULT_ON_BAD_ROW,
    IDENTIFIER,
    TEXT,
    TEXT_OR_NUMBER,
    AnnotatedSource,
    BadRows,
    answer_text,
)
from medvqa.data.cleaning import CleaningLog, Step
from medvqa.data.questions import closed_candidates, is_yes_no, question_options
from medvqa.data.regions import (
    LABEL_UNMATCHED,
    NAMES_NO_REGION,
    NO_REGION_FILE,
    REGION,
    REGION_MISSING,
    Region,
)
from medvqa.errors import DataError

# The names each split's file has in the release and in its copies.
SPLIT_FILES = {
    "train": ("train.json",),
    "validate": ("validate.json", "validation.json"),
    "test": ("test.json",),
}
REQUIRED = ("qid", "img_id", "img_name", "question", "answer", "q_lang", "answer_type")
METADATA = ("modality", "location", "content_type", "base_type")
# Beside each image (`imgs/<folder>/`): its organs' boxes and its organs' mask, where released.
DETECTION_FILE, MASK_FILE = "detection.json", "mask.png"
Box = tuple[float, float, float, float]
# What each field read must hold (checked per row; a wrong type is a bad row).
FIELD_TYPES = {
    **dict.fromkeys(("qid", "img_id"), IDENTIFIER),
    **dict.fromkeys(("question", "answer"), TEXT_OR_NUMBER),
    **dict.fromkeys(("img_name", "q_lang", "answer_type", *METADATA), TEXT),
}


def keep_closed(row: pd.Series) -> bool:
    """The SURE-VQA rule for one row (True keeps it)."""
    if row["answer_type"] != "CLOSED" or is_yes_no(row["answer"]):
        return True
    answer, question = str(row["answer"]).strip().lower(), str(row["question"]).lower()
    return len(question_options(row["question"])) <= 2 and answer in question


CLEANING = (
    Step(
        "keep_english",
        "SLAKE is bilingual; the paper uses the English questions only (q_lang == 'en').",
        lambda t: t["q_lang"] == "en",
    ),
    Step(
        "drop_multichoice_closed",
        "CLOSED rows with a non-yes/no answer and more than two options, or whose answer is "
        "not in the question, are not binary questions; closed accuracy cannot score them.",
        lambda t: t.apply(keep_closed, axis=1),
    ),
)


class Slake(AnnotatedSource):
    """SLAKE from `root`; `languages` and `clean_closed` exist to reproduce other protocols."""

    name = "slake"
    # 2: empty and numeric answers kept; 3: validation.json, per-split oddities; 4: "A or B"
    # candidates keep multi-word sides and drop articles
    loader_version = 5  # 5: regions
    metadata_fields = (*METADATA, "q_lang", REGION, REGION_MISSING)
    field_types = FIELD_TYPES

    def __init__(
        self,
        root: str | Path,
        cache_dir: str | Path | None = None,
        on_bad_row: str = DEFAULT_ON_BAD_ROW,
        languages: tuple[str, ...] | list[str] = ("en",),
        clean_closed: bool = True,
    ) -> None:
        super().__init__(root, cache_dir, on_bad_row)
        self.languages = list(languages)
        self.clean_closed = clean_closed

    def annotation_files(self) -> list[Path]:
        return self.split_files(SPLIT_FILES, "SLAKE")

    def region_files(self) -> list[Path]:
        return sorted((self.root / "imgs").glob(f"*/{DETECTION_FILE}"))

    def _native(self, bad: BadRows) -> pd.DataFrame:
        rows = []
        for split, where, row in self.split_rows(SPLIT_FILES, bad, REQUIRED, ("answer",)):
            if self.field(row, "answer_type", where, bad, ("OPEN", "CLOSED")) is None:
                continue
            answer = answer_text(row["answer"])
            if row["answer_type"] == "CLOSED" and not answer.strip():
                bad("malformed", where, "a CLOSED question with an empty answer cannot be scored")
                continue
            ref = self.image_ref(f"imgs/{row['img_name']}", where, bad)
            if ref is None:
                continue
            self.text_oddities(row, ("question", "answer"), where, f"{split}/{row['qid']}")
            rows.append(
                {
                    **{k: row[k] for k in REQUIRED},
                    "answer": answer,
                    **{k: row.get(k) for k in METADATA},
                    R.IMAGE: ref,
                    R.SOURCE_SPLIT: split,
                }
            )
        return pd.DataFrame(rows, columns=[*REQUIRED, *METADATA, R.IMAGE, R.SOURCE_SPLIT])

    def build(self, bad: BadRows, cleaning: CleaningLog) -> pd.DataFrame:
        native = self._native(bad)
        steps = [
            Step(
                CLEANING[0].name,
                CLEANING[0].why,
                lambda t: t["q_lang"].isin(self.languages),
            ),
            *(CLEANING[1:] if self.clean_closed else ()),
        ]
        native = cleaning.apply(native, steps)
        closed = native["answer_type"] == "CLOSED"
        answers = native["answer"].str.strip()
        answers = answers.where(~answers.map(is_yes_no), answers.str.lower())
        table = pd.DataFrame(
            {
                R.ID: native[R.SOURCE_SPLIT] + "/" + native["qid"].astype(str),
                R.IMAGE: native[R.IMAGE],
                R.QUESTION: native["question"].astype(str).str.strip(),
                R.ANSWER: answers,
                R.ANSWER_TYPE: closed.map({True: "closed", False: "open"}),
                R.QUESTION_TYPE: native["content_type"],
                R.CANDIDATES: [
                    closed_candidates(q, a) if c else None
                    for q, a, c in zip(native["question"], answers, closed, strict=True)
                ],
                R.CASE_ID: native["img_id"].astype(str),
                R.IMAGE_ID: native["img_id"].astype(str),
                R.SOURCE_SPLIT: native[R.SOURCE_SPLIT],
                **{k: native[k] for k in METADATA},
                "q_lang": native["q_lang"],
            }
        )
        return table.assign(**self._regions(table))

    def _regions(self, table: pd.DataFrame) -> dict[str, list[str | None]]:
        """Each row's `region` and `region_missing` (the module docstring)."""
        folders = [str(PurePosixPath(ref).parent) for ref in table[R.IMAGE]]
        found = {folder: self._detections(folder) for folder in set(folders)}
        labels = {label for boxes in found.values() if boxes for label in boxes}
        cells = [
            _region(question, found[folder], folder, labels)
            for question, folder in zip(table[R.QUESTION], folders, strict=True)
        ]
        return {REGION: [c[0] for c in cells], REGION_MISSING: [c[1] for c in cells]}

    def _detections(self, folder: str) -> dict[str, list[Box]] | None:
        """The boxes of an image folder's `detection.json` by label (lower case, single
        blanks), as (x0, y0, x1, y1); None where the folder has no such file."""
        path = self.root / folder / DETECTION_FILE
        if not path.is_file():
            return None
        try:
            entries = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            entries = None
        if not isinstance(entries, list) or not all(_is_detection(e) for e in entries):
            raise DataError(
                f"{self.name}: {path} is not a list of {{label: [x, y, width, height]}} "
                "objects; restore the release's file"
            )
        boxes: dict[str, list[Box]] = {}
        for entry in entries:
            for label, (x, y, w, h) in entry.items():
                boxes.setdefault(" ".join(label.lower().split()), []).append((x, y, x + w, y + h))
        return boxes


def _is_detection(entry: object) -> bool:
    """One object of `detection.json`: labels, each with a box [x, y, width, height]."""
    return isinstance(entry, Mapping) and all(
        isinstance(label, str)
        and isinstance(box, list)
        and len(box) == 4
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in box)
        for label, box in entry.items()
    )


def _named(question: str, label: str) -> bool:
    """Whether `question` names `label` (whole words, any case, a plural `s` allowed)."""
    words = r"\s+".join(re.escape(w) for w in label.split())
    return re.search(rf"(?<![a-z]){words}s?(?![a-z])", question.lower()) is not None


def _region(
    question: str, boxes: Mapping[str, Sequence[Box]] | None, folder: str, labels: set[str]
) -> tuple[str | None, str | None]:
    """A row's region (the boxes of the labels it names that its image has, refined by the
    folder's mask where it exists), or why it has none."""
    if boxes is None:
        return None, NO_REGION_FILE
    named = sorted(label for label in labels if _named(question, label))
    if not named:
        return None, NAMES_NO_REGION
    present = tuple(b for label in named for b in boxes.get(label, ()))
    if not present:
        return None, LABEL_UNMATCHED
    return Region(mask=f"{folder}/{MASK_FILE}", boxes=present).text(), None
