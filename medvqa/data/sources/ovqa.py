"""OVQA (orthopaedic VQA) in its native layout, with the cleaning that reproduces SURE-VQA.

Layout under `root`: the release's folder `OVQA_publish` as downloaded, i.e. `trainset.json`,
`valset.json`, `testset.json` (lists of rows with `qid, image_name, question, answer,
answer_type, question_type, image_organ`) and `img/<image_name>`. The names SURE-VQA's
instructions rename them to (`train.json`, `validate.json`, `test.json`) are read as well; a
split present under both names is an error, so no file is silently ignored.
`question_type` is one of Modality, Abnormality, Attribute Other, Condition, Organ System, PLANE;
`image_organ` one of LEG, HAND, CHEST, HEAD (the shifts use both).

Cleaning (docs/datasets.md): drop CLOSED rows whose answer is not yes/no, except binary modality
questions ("Is this a CT or X-Ray?"): the others are free-text answers mislabelled as closed,
which closed accuracy cannot score. Result on the real files: train 13492, validate 1645,
test 1657.

Kept and counted in splits.json (`kept_oddities`): answers stored as JSON numbers (kept as their
digits), blanks around or inside the text, and blanks around `answer_type`, `question_type` or
`image_organ` (stripped, so the shifts see the release's labels).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

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
from medvqa.data.questions import YES_NO

# Each split's file as released, then as SURE-VQA's setup instructions rename it.
SPLIT_FILES = {
    "train": ("trainset.json", "train.json"),
    "validate": ("valset.json", "validate.json"),
    "test": ("testset.json", "test.json"),
}
# Labels the shifts compare exactly: stray blanks are stripped (and counted).
LABELS = ("answer_type", "question_type", "image_organ")
REQUIRED = ("qid", "image_name", "question", "answer", "answer_type", "question_type")
METADATA = ("image_organ",)
# What each field read must hold (checked per row; a wrong type is a bad row).
FIELD_TYPES = {
    "qid": IDENTIFIER,
    **dict.fromkeys(("question", "answer"), TEXT_OR_NUMBER),
    **dict.fromkeys(("image_name", *LABELS), TEXT),
}
# Imaging modalities a binary modality question may name (lower-case, as compared).
MODALITIES = frozenset({"ct", "mri", "x-ray", "xray", "ultrasound"})
# "... a CT or an X-Ray (scan)?": the option words either side of the question's single " or ".
_BINARY = re.compile(
    r"(?P<before>\S*)\s+(?P<a>[\w-]+)\s+or\s+(?:an?\s+|the\s+)?(?P<b>[\w-]+)",
    flags=re.IGNORECASE,
)


def normalise_answer(answer: Any) -> str:
    """Strip whitespace and a trailing period ("Yes." -> "Yes"); yes/no become lower-case."""
    text = answer_text(answer).strip().rstrip(".").strip()
    return text.lower() if text.lower() in YES_NO else text


def modality_options(question: str) -> list[str] | None:
    """The two modalities a binary modality question offers ("CT or X-Ray"), else None.

    A list of three ("CT, MRI or X-Ray") is not binary: the word before the first option must
    not end a comma-separated list.
    """
    if len(re.findall(r"\bor\b", question, flags=re.IGNORECASE)) != 1:
        return None
    match = _BINARY.search(question.strip())
    if match is None or match["before"].endswith(","):
        return None
    options = [match["a"], match["b"]]
    if (
        not all(o.lower() in MODALITIES for o in options)
        or options[0].lower() == options[1].lower()
    ):
        return None
    return options


def keep_closed(row: pd.Series) -> bool:
    """The SURE-VQA rule for one row (True keeps it)."""
    answer = normalise_answer(row["answer"])
    if row["answer_type"] != "CLOSED" or answer in YES_NO:
        return True
    options = modality_options(str(row["question"]))
    return options is not None and answer.lower() in (o.lower() for o in options)


def closed_candidates(question: str, answer: str) -> list[str]:
    """yes/no, or the two modalities the question names (the answer's own spelling kept)."""
    if answer in YES_NO:
        return list(YES_NO)
    options = modality_options(question)
    if options is None or answer.lower() not in (o.lower() for o in options):
        # Only reachable with clean_closed=false: the answer space is unknown, keep it binary.
        return [answer, f"not {answer}"]
    return [answer if o.lower() == answer.lower() else o for o in options]


CLEANING = (
    Step(
        "drop_non_binary_closed",
        "CLOSED rows whose answer is neither yes/no nor one of the two modalities of a binary "
        "modality question ('CT or X-Ray') are free-text answers mislabelled as closed; closed "
        "accuracy cannot score them.",
        lambda t: t.apply(keep_closed, axis=1) if len(t) else pd.Series(dtype=bool),
    ),
)


class Ovqa(AnnotatedSource):
    """OVQA from `root`; `clean_closed=false` keeps the mislabelled closed rows."""

    name = "ovqa"
    loader_version = 2  # 2: the release's file names, labels stripped, oddities counted
    metadata_fields = METADATA
    field_types = FIELD_TYPES

    def __init__(
        self,
        root: str | Path,
        cache_dir: str | Path | None = None,
        on_bad_row: str = DEFAULT_ON_BAD_ROW,
        clean_closed: bool = True,
    ) -> None:
        super().__init__(root, cache_dir, on_bad_row)
        self.clean_closed = clean_closed

    def annotation_files(self) -> list[Path]:
        return self.split_files(SPLIT_FILES, "OVQA")

    def _native(self, bad: BadRows) -> pd.DataFrame:
        rows = []
        seen: set[str] = set()  # record ids: a qid is unique within its split's file
        for split, where, row in self.split_rows(SPLIT_FILES, bad, REQUIRED, ("answer",)):
            labels = {
                k: row[k].strip() if isinstance(row.get(k), str) else row.get(k) for k in LABELS
            }
            if labels["answer_type"] not in ("OPEN", "CLOSED"):
                bad(
                    "malformed",
                    where,
                    f"field 'answer_type' is {row['answer_type']!r}; expected one of "
                    "['OPEN', 'CLOSED']",
                )
                continue
            if labels["answer_type"] == "CLOSED" and not answer_text(row["answer"]).strip():
                bad("malformed", where, "a CLOSED question with an empty answer cannot be scored")
                continue
            record = f"{split}/{row['qid']}"
            if record in seen:
                bad("duplicate_id", where, f"qid {row['qid']!r} occurs earlier in the file")
                continue
            ref = self.image_ref(f"img/{row['image_name']}", where, bad)
            if ref is None:
                continue
            seen.add(record)
            self.text_oddities(row, ("question", "answer"), where, record)
            for key in LABELS:
                if labels[key] != row.get(key):
                    self.oddities(f"padded_{key}", where, record)
            rows.append(
                {
                    **{k: row[k] for k in REQUIRED},
                    **{k: row.get(k) for k in METADATA},
                    **labels,
                    R.IMAGE: ref,
                    R.SOURCE_SPLIT: split,
                }
            )
        return pd.DataFrame(rows, columns=[*REQUIRED, *METADATA, R.IMAGE, R.SOURCE_SPLIT])

    def build(self, bad: BadRows, cleaning: CleaningLog) -> pd.DataFrame:
        native = self._native(bad)
        native = cleaning.apply(native, CLEANING if self.clean_closed else ())
        closed = native["answer_type"] == "CLOSED"
        questions = native["question"].astype(str).str.strip()
        # Closed answers are compared with candidates, so "Yes." must become "yes"; open
        # answers are kept as written (metrics normalise punctuation themselves).
        answers = native["answer"].map(answer_text).str.strip()
        answers = answers.where(~closed, native["answer"].map(normalise_answer))
        # OVQA has no patient ids; an image is the finest grouping it offers.
        image_ids = native["image_name"].astype(str)
        return pd.DataFrame(
            {
                R.ID: native[R.SOURCE_SPLIT] + "/" + native["qid"].astype(str),
                R.IMAGE: native[R.IMAGE],
                R.QUESTION: questions,
                R.ANSWER: answers,
                R.ANSWER_TYPE: closed.map({True: "closed", False: "open"}),
                R.QUESTION_TYPE: native["question_type"],
                R.CANDIDATES: [
                    closed_candidates(q, a) if c else None
                    for q, a, c in zip(questions, answers, closed, strict=True)
                ],
                R.CASE_ID: image_ids,
                R.IMAGE_ID: image_ids,
                R.SOURCE_SPLIT: native[R.SOURCE_SPLIT],
                **{k: native[k] for k in METADATA},
            }
        )
