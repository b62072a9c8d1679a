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
"""

from __future__ import annotations

from pathlib import Path

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

# The names each split's file has in the release and in its copies.
SPLIT_FILES = {
    "train": ("train.json",),
    "validate": ("validate.json", "validation.json"),
    "test": ("test.json",),
}
REQUIRED = ("qid", "img_id", "img_name", "question", "answer", "q_lang", "answer_type")
METADATA = ("modality", "location", "content_type", "base_type")
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
    loader_version = 4
    metadata_fields = (*METADATA, "q_lang")
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
        return pd.DataFrame(
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
