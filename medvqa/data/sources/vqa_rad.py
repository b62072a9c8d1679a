"""VQA-RAD from its OSF release, with paraphrase groups kept so they never straddle a split.

Layout under `root`: `VQA_RAD Dataset Public.json` (a list of rows with the release's 14 fields:
`qid, phrase_type, qid_linked_id, image_case_url, image_name, image_organ, evaluation, question,
question_rephrase, question_relation, question_frame, question_type, answer, answer_type`) and
`VQA_RAD Image Folder/<image_name>` (315 images). The release's `.xlsx` copy is read instead when
`annotation_file` ends in `.xlsx` (openpyxl); the XML copy is not supported.

Source split: `phrase_type` `test_freeform`/`test_para` is the official test (451 questions),
everything else is train; there is no validate split (shifts carve it from train, grouped by
`paraphrase_group` = `qid_linked_id`, so a question and its paraphrase stay together).

Decisions (each counted in the report or visible in the table):
- `frame` rows are dropped (step `drop_frame_questions`): they are generated from templates,
  and SURE-style protocols and the Hub copy (1793 / 451) use free-form + paraphrased questions.
- train rows whose paraphrase group also has a test row are dropped
  (`drop_train_paraphrases_of_test`): a paraphrase seen in training leaks the test answer.
- CLOSED rows get candidates yes/no (yes/no answers) or the options the question names
  ("CT or MRI?"); a CLOSED row with no parsable option set becomes an open question rather than
  being dropped, so the official test keeps all 451 questions. `answer_type_native` keeps the
  release's label, so those rows can be counted or filtered.
- `question_type` may be comma-joined in the release ("PRES, POS"): `question_type` is the first
  type, `question_type_raw` the release's string.

The release's oddities are kept and counted in splits.json (`kept_oddities`), never dropped:
answers stored as JSON numbers (kept as their digits), tabs and blanks around or inside the
text (ends stripped, inner whitespace kept), `answer_type` "CLOSED " with a trailing blank,
question types in lower case ("Other"), misspelled ("ATRIB", "PRSE": read as ATTRIB, PRES) or
combined, and "NULL" in the optional fields. A blank question is a bad row.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

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
    read_json_rows,
)
from medvqa.data.cleaning import CleaningLog, Step
from medvqa.data.questions import YES_NO, is_yes_no, listed_options, or_options
from medvqa.errors import DataError

log = logging.getLogger(__name__)

PHRASE_TYPES = ("freeform", "para", "frame", "test_freeform", "test_para")
ORGANS = ("HEAD", "CHEST", "ABD")
ANSWER_TYPES = ("OPEN", "CLOSED")
# The 11 question types of the release's documentation, and the misspellings its rows contain.
QUESTION_TYPES = (
    "MODALITY",
    "PLANE",
    "ORGAN",
    "ABN",
    "PRES",
    "POS",
    "COLOR",
    "SIZE",
    "ATTRIB",
    "COUNT",
    "OTHER",
)
MISSPELLED_TYPES = {"ATRIB": "ATTRIB", "PRSE": "PRES"}
# Optional fields the loader reads; "NULL" there is counted (`null_<field>`) and means absent.
OPTIONAL = ("qid_linked_id", "image_case_url", "evaluation")
REQUIRED = (
    "qid",
    "phrase_type",
    "image_name",
    "image_organ",
    "question",
    "question_type",
    "answer",
    "answer_type",
)
# What each field read must hold (checked per row; a wrong type is a bad row).
FIELD_TYPES = {
    **dict.fromkeys(("qid", "qid_linked_id"), IDENTIFIER),
    **dict.fromkeys(("question", "answer"), TEXT_OR_NUMBER),
    **dict.fromkeys(
        (
            "phrase_type",
            "image_name",
            "image_organ",
            "question_type",
            "answer_type",
            "image_case_url",
            "evaluation",
        ),
        TEXT,
    ),
}
PARAPHRASE_GROUP = R.PARAPHRASE_GROUP
NATIVE_COLUMNS = (
    "qid",
    "phrase_type",
    "phrasing",
    PARAPHRASE_GROUP,
    "image_organ",
    "evaluation",
    "question",
    "question_type",
    "question_type_raw",
    "answer",
    "answer_type_native",
    R.IMAGE,
    R.IMAGE_ID,
    R.CASE_ID,
    R.SOURCE_SPLIT,
)
# Written as the string "NULL" in the release where a field does not apply.
_NULL = ("", "null", "none", "nan")


def _present(value: Any) -> bool:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return False
    return str(value).strip().lower() not in _NULL


def question_types(raw: str) -> tuple[list[str], list[str]]:
    """The release's `question_type` ("PRES, POS", "Other", "ATRIB") as canonical types, and
    the oddity kinds it shows (combined, lower_case, misspelled, unknown)."""
    parts = [p.strip() for p in raw.split(",") if p.strip()]
    kinds = ["combined_question_type"] if len(parts) > 1 else []
    types = []
    for part in parts:
        if part != part.upper():
            kinds.append("lower_case_question_type")
        upper = part.upper()
        if upper in MISSPELLED_TYPES:
            kinds.append("misspelled_question_type")
            upper = MISSPELLED_TYPES[upper]
        elif upper not in QUESTION_TYPES:
            kinds.append("unknown_question_type")
        types.append(upper)
    return types, list(dict.fromkeys(kinds))


def case_from_url(url: Any, fallback: str) -> str:
    """MedPix case id from `image_case_url` (`...case?id=<uuid>`), else the URL, else fallback."""
    if not _present(url):
        return fallback
    ids = parse_qs(urlparse(str(url).strip()).query).get("id")
    return ids[0] if ids else str(url).strip()


def closed_options(question: str, answer: str) -> list[str] | None:
    """The answer space of a closed question, or None if the question names none.

    yes/no answers -> [yes, no]; a comma list of three or more options that contains the answer
    ("Which organ, liver, kidney, or spleen?") -> those options; otherwise the words either side
    of " or " ("Is this a CT or MRI?", "left or right?") when the answer is one side.
    """
    if is_yes_no(answer):
        return list(YES_NO)
    answer = answer.strip()
    return listed_options(question, answer, min_options=3) or or_options(question, answer)


CLEANING = (
    Step(
        "drop_frame_questions",
        "frame questions are generated from templates; SURE-style protocols (and the Hub copy, "
        "1793 train / 451 test) use the free-form and paraphrased questions only.",
        lambda t: t["phrasing"] != "frame",
    ),
    Step(
        "drop_train_paraphrases_of_test",
        "a train question whose paraphrase group (qid_linked_id) also occurs in the official "
        "test would leak the test answer into training.",
        lambda t: (
            ~(
                (t[R.SOURCE_SPLIT] == "train")
                & t[PARAPHRASE_GROUP].isin(
                    set(t.loc[t[R.SOURCE_SPLIT] == "test", PARAPHRASE_GROUP])
                )
            )
        ),
    ),
)


class VqaRad(AnnotatedSource):
    """VQA-RAD from `root` (see the module docstring for layout and decisions)."""

    name = "vqa_rad"
    # 2: question types canonicalised, oddities counted, blank questions bad; 3: "A or B"
    # options keep multi-word sides and drop articles (more rows closed, other candidates)
    loader_version = 3
    metadata_fields = (
        "image_organ",
        "phrase_type",
        "phrasing",
        PARAPHRASE_GROUP,
        "question_type_raw",
        "answer_type_native",
        "evaluation",
        "qid",
    )
    field_types = FIELD_TYPES

    def __init__(
        self,
        root: str | Path,
        cache_dir: str | Path | None = None,
        on_bad_row: str = DEFAULT_ON_BAD_ROW,
        annotation_file: str = "VQA_RAD Dataset Public.json",
        image_dir: str = "VQA_RAD Image Folder",
    ) -> None:
        super().__init__(root, cache_dir, on_bad_row)
        self.annotation_file = annotation_file
        self.image_dir = image_dir

    def annotation_files(self) -> list[Path]:
        return [self.root / self.annotation_file]

    def _rows(self, path: Path) -> list[Any]:
        if path.suffix.lower() == ".json":
            return read_json_rows(path, self.name)
        if path.suffix.lower() == ".xlsx":
            frame = pd.read_excel(path, dtype=object)
            return frame.astype(object).where(frame.notna(), None).to_dict("records")
        raise DataError(
            f"{self.name}: annotation file {path} is neither .json nor .xlsx; set "
            "dataset.annotation_file to the release's 'VQA_RAD Dataset Public.json'."
        )

    def _native(self, bad: BadRows) -> pd.DataFrame:
        path = self.require(self.root / self.annotation_file, "VQA-RAD annotations")
        rows, seen = [], set()
        for _, where, row in self.valid_rows(self._rows(path), path, bad, REQUIRED):
            phrase = str(row["phrase_type"]).strip().lower()
            organ = str(row["image_organ"]).strip().upper()
            atype = str(row["answer_type"]).strip().upper()
            checks = (("phrase_type", phrase, PHRASE_TYPES), ("image_organ", organ, ORGANS))
            checks += (("answer_type", atype, ANSWER_TYPES),)
            wrong = [(k, v, ok) for k, v, ok in checks if v not in ok]
            if wrong:
                key, value, allowed = wrong[0]
                bad("malformed", where, f"field {key!r} is {value!r}; expected one of {allowed}")
                continue
            if not str(row["question"]).strip():
                bad("malformed", where, "field 'question' is blank")
                continue
            qid = str(row["qid"]).strip()
            if qid in seen:
                bad("duplicate_id", where, f"qid {qid!r} occurs more than once")
                continue
            ref = self.image_ref(f"{self.image_dir}/{str(row['image_name']).strip()}", where, bad)
            if ref is None:
                continue
            seen.add(qid)
            split = "test" if phrase.startswith("test_") else "train"
            self._count_oddities(row, where, f"{split}/{qid}")
            image_id = Path(ref).stem
            linked = row.get("qid_linked_id")
            types, _ = question_types(str(row["question_type"]))
            rows.append(
                {
                    "qid": qid,
                    "phrase_type": phrase,
                    "phrasing": phrase.removeprefix("test_"),
                    PARAPHRASE_GROUP: str(linked).strip() if _present(linked) else f"qid:{qid}",
                    "image_organ": organ,
                    "evaluation": row.get("evaluation")
                    if _present(row.get("evaluation"))
                    else None,
                    "question": str(row["question"]).strip(),
                    "question_type": types[0] if types else "OTHER",
                    "question_type_raw": str(row["question_type"]),
                    "answer": answer_text(row["answer"]).strip(),
                    "answer_type_native": atype,
                    R.IMAGE: ref,
                    R.IMAGE_ID: image_id,
                    R.CASE_ID: case_from_url(row.get("image_case_url"), image_id),
                    R.SOURCE_SPLIT: split,
                }
            )
        return pd.DataFrame(rows, columns=list(NATIVE_COLUMNS))

    def _count_oddities(self, row: dict[str, Any], where: str, record: str) -> None:
        """The release's quirks in one kept row (see the module docstring)."""
        self.text_oddities(row, ("question", "answer"), where, record)
        if str(row["answer_type"]) != str(row["answer_type"]).strip():
            self.oddities("padded_answer_type", where, record)
        for kind in question_types(str(row["question_type"]))[1]:
            self.oddities(kind, where, record)
        for key in OPTIONAL:
            value = row.get(key)
            if isinstance(value, str) and value.strip().upper() == "NULL":
                self.oddities(f"null_{key}", where, record)

    def build(self, bad: BadRows, cleaning: CleaningLog) -> pd.DataFrame:
        native = cleaning.apply(self._native(bad), CLEANING).reset_index(drop=True)
        answers = [a.lower() if is_yes_no(a) else a for a in native["answer"]]
        candidates = [
            closed_options(q, a) if t == "CLOSED" else None
            for q, a, t in zip(
                native["question"], answers, native["answer_type_native"], strict=True
            )
        ]
        closed = [c is not None for c in candidates]
        relabelled = int((native["answer_type_native"] == "CLOSED").sum()) - sum(closed)
        log.info(
            "%s: %d CLOSED rows name no answer options and are scored as open",
            self.name,
            relabelled,
        )
        return pd.DataFrame(
            {
                R.ID: native[R.SOURCE_SPLIT] + "/" + native["qid"],
                R.IMAGE: native[R.IMAGE],
                R.QUESTION: native["question"],
                R.ANSWER: answers,
                R.ANSWER_TYPE: ["closed" if c else "open" for c in closed],
                R.QUESTION_TYPE: native["question_type"],
                R.CANDIDATES: candidates,
                R.CASE_ID: native[R.CASE_ID],
                R.IMAGE_ID: native[R.IMAGE_ID],
                R.SOURCE_SPLIT: native[R.SOURCE_SPLIT],
                **{k: native[k] for k in self.metadata_fields},
            }
        )
