"""MIMIC-CXR-VQA as its own builder writes it, with MIMIC-IV demographics for the shifts.

Layout under `root` (each part configurable, see `conf/dataset/mimic_cxr_vqa.yaml`):

- `annotation_dir` (`mimic-cxr-vqa/mimiccxrvqa/dataset`): `train.json`, `valid.json`,
  `test.json` as produced by the dataset's builder, rows with `idx, image_id, subject_id,
  study_id, image_path, question, semantic_type (verify|choose|query), content_type, template,
  template_arguments, answer` (a list);
- `image_dir` (`physionet.org/files/mimic-cxr-jpg/2.0.0`): the JPGs; a row's `image_path`
  (`p10/p10000032/s5.../<dicom>.jpg`) lies under its `files/` folder (a path that already
  starts with `files/` is taken as is);
- `hosp_dir` (`physionet.org/files/mimic-iv/2.2/hosp`): `patients.csv` (gender, anchor_age)
  and `admissions.csv` (race), the demographics the gender/ethnicity/age shifts use.

Answers (docs/datasets.md): verify -> closed yes/no; choose -> closed (one element -> it, both options ->
"both", none -> "none") with candidates [A, B, none, both] for "A or B" questions (metadata
`closed_kind: multilabel`, scored with the multilabel judge prompt) and the two literal options
for the gender and AP/PA questions; query -> open, the list comma-joined ("none" if empty).
The builder lower-cases answers: gender answers f/m become female/male, views ap/pa AP/PA.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from medvqa.data import records as R
from medvqa.data.annotated import (
    DEFAULT_ON_BAD_ROW,
    IDENTIFIER,
    TEXT,
    AnnotatedSource,
    BadRows,
    read_json_rows,
    safe_relative,
)
from medvqa.data.cleaning import CleaningLog, Step
from medvqa.data.questions import YES_NO
from medvqa.errors import DataError

# The builder names the validation split "valid"; the normalised schema calls it "validate".
SPLIT_FILES = {"train": "train.json", "validate": "valid.json", "test": "test.json"}
REQUIRED = (
    "idx",
    "image_id",
    "subject_id",
    "image_path",
    "question",
    "semantic_type",
    "content_type",
)
# What each field read must hold (checked per row; a wrong type is a bad row). `answer` is a
# list, checked by `interpret`.
FIELD_TYPES = {
    **dict.fromkeys(("idx", "image_id", "subject_id", "study_id"), IDENTIFIER),
    **dict.fromkeys(("image_path", "question", "semantic_type", "content_type", "template"), TEXT),
}
SEMANTIC_TYPES = ("verify", "choose", "query")
GENDER_ANSWERS = {"f": "female", "m": "male", "female": "female", "male": "male"}
VIEW_ANSWERS = {"ap": "AP", "pa": "PA"}
LITERAL_OPTIONS = {"gender": ["male", "female"], "plane": ["AP", "PA"]}
NONE, BOTH = "none", "both"

UNKNOWN = "UNKNOWN/OTHER"
# Gender of a subject without (or with conflicting) MIMIC-IV records. A value rather than null:
# SURE-VQA's gender shift keeps these rows on the i.i.d. side (its rule is "gender != F"),
# and shifts exclude rows without a value.
UNKNOWN_GENDER = "UNKNOWN"
ETHNICITIES = ("WHITE", "BLACK", "ASIAN", "HISPANIC/LATINO", UNKNOWN)
# MIMIC-IV race strings by prefix ("WHITE - RUSSIAN", "BLACK/CAPE VERDEAN", "HISPANIC OR
# LATINO", "ASIAN - KOREAN", ...); PORTUGUESE is filed under WHITE as SURE-VQA does. Everything
# else (OTHER, UNKNOWN, declined, AMERICAN INDIAN, PACIFIC ISLANDER, MULTIPLE, SOUTH AMERICAN)
# is UNKNOWN/OTHER.
RACE_PREFIXES = (
    ("WHITE", "WHITE"),
    ("PORTUGUESE", "WHITE"),
    ("BLACK", "BLACK"),
    ("ASIAN", "ASIAN"),
    ("HISPANIC", "HISPANIC/LATINO"),
)

_PLACEHOLDER = re.compile(r"\$\{(\w+)\}")
# "... ${attribute_1} or ${attribute_2}?" / "${object_1} or the ${object_2}": an "A or B" question.
_PAIR = re.compile(r"\$\{(\w+)\}\s+or\s+(?:the\s+)?\$\{(\w+)\}")


def race_category(race: Any) -> str:
    """One of `ETHNICITIES` for a MIMIC-IV race string (missing -> UNKNOWN/OTHER)."""
    if not isinstance(race, str):
        return UNKNOWN
    text = race.strip().upper()
    return next((cat for prefix, cat in RACE_PREFIXES if text.startswith(prefix)), UNKNOWN)


def subject_ethnicity(races: Iterable[Any]) -> str:
    """A subject's category over all admissions; conflicting known categories -> unknown.

    Admissions recorded as unknown/other do not contradict a known category (a patient who
    once declined to answer is still WHITE if the other admissions say so).
    """
    known = {race_category(r) for r in races} - {UNKNOWN}
    return known.pop() if len(known) == 1 else UNKNOWN


def _subject_key(value: Any) -> str:
    """Subject ids are ints in the CSVs and strings in the builder's JSON: compare as text."""
    text = str(value).strip()
    try:
        return str(int(float(text)))
    except ValueError:
        return text


def _argument(arguments: Mapping[str, Any], name: str) -> str | None:
    """The value of template placeholder `name` (`attribute_2` -> arguments['attribute']['1'])."""
    kind, _, number = name.rpartition("_")
    if not kind or not number.isdigit():
        kind, number = name, "1"
    values = arguments.get(kind) if isinstance(arguments, Mapping) else None
    if not isinstance(values, Mapping):
        return None
    value = values.get(str(int(number) - 1))
    return str(value) if value is not None else None


def choose_options(template: str, question: str, arguments: Any = None) -> list[str] | None:
    """The two options of an "A or B" choose question, or None if the template has no such pair.

    The template is turned into a pattern (placeholders become groups) and matched against the
    question, so the options are read exactly as the question spells them; if the question does
    not follow its template, the template arguments are used.
    """
    pair = _PAIR.search(template)
    if pair is None:
        return None
    pieces, groups, last = [], [], 0
    for match in _PLACEHOLDER.finditer(template):
        pieces.append(re.escape(template[last : match.start()]))
        pieces.append("(.+?)")
        groups.append(match.start())
        last = match.end()
    pieces.append(re.escape(template[last:]))
    found = re.fullmatch("".join(pieces), question.strip(), flags=re.IGNORECASE | re.DOTALL)
    if found is not None:
        first = groups.index(pair.start(1) - 2)
        return [found.group(first + 1).strip(), found.group(first + 2).strip()]
    options = [_argument(arguments or {}, pair[1]), _argument(arguments or {}, pair[2])]
    return [str(o) for o in options] if all(options) else None


def _match_option(value: str, options: list[str]) -> str | None:
    """The option a (lower-cased) answer element names, in the question's spelling."""
    return next((o for o in options if o.lower() == value.lower()), None)


def _normalise(content_type: str, value: Any) -> str:
    """One answer element: gender f/m -> female/male, views ap/pa -> AP/PA, others as given."""
    text = str(value).strip()
    if content_type == "gender":
        return GENDER_ANSWERS.get(text.lower(), text)
    if content_type == "plane":
        return VIEW_ANSWERS.get(text.lower(), text)
    return text


def interpret(row: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """A native row's answer, answer type, candidates and closed kind, or (None, why not)."""
    answer, semantic, content = row["answer"], row["semantic_type"], row["content_type"]
    if not isinstance(answer, list):
        return None, f"answer should be a list, got {answer!r}"
    elements = [_normalise(content, a) for a in answer]
    if semantic == "verify":
        if len(elements) != 1 or elements[0].lower() not in YES_NO:
            return None, f"a verify question needs answer ['yes'] or ['no'], got {answer!r}"
        value = elements[0].lower()
        return {"answer": value, "closed": True, "candidates": list(YES_NO), "kind": "yes_no"}, ""
    if semantic == "query":
        return {"answer": ", ".join(elements) if elements else NONE, "closed": False}, ""
    template = row.get("template")
    if not isinstance(template, str) or not template:
        return None, "a choose question needs its 'template' to find its options"
    options = choose_options(template, str(row["question"]), row.get("template_arguments"))
    if options is not None:
        if len(elements) > 2:
            return None, f"an 'A or B' question has at most two answers, got {answer!r}"
        matched = [_match_option(e, options) for e in elements]
        if None in matched:
            return None, f"answer {answer!r} is not among the question's options {options}"
        value = matched[0] if len(matched) == 1 else (BOTH if matched else NONE)
        candidates = [*options, NONE, BOTH]
        return {"answer": value, "closed": True, "candidates": candidates, "kind": "multilabel"}, ""
    if content in LITERAL_OPTIONS:
        options = LITERAL_OPTIONS[content]
        if len(elements) != 1 or _match_option(elements[0], options) is None:
            return None, f"a {content} question needs one of {options}, got {answer!r}"
        value = _match_option(elements[0], options)
        return {"answer": value, "closed": True, "candidates": list(options), "kind": "binary"}, ""
    return None, f"cannot find the options of choose template {template!r}"


def _read_csv(path: Path, columns: tuple[str, ...], source: str) -> pd.DataFrame:
    """Selected columns of a MIMIC-IV table, with an error naming the file and column."""
    try:
        table = pd.read_csv(path, usecols=lambda c: c in columns, dtype=str)
    except (pd.errors.ParserError, UnicodeDecodeError) as err:
        raise DataError(f"{source}: cannot parse {path} ({err}); re-download the file.") from err
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise DataError(
            f"{source}: {path} lacks column(s) {missing}; expected the MIMIC-IV 2.2 hosp table."
        )
    return table


class MimicCxrVqa(AnnotatedSource):
    """MIMIC-CXR-VQA from `root`; `drop_content_types` removes questions about, e.g., gender.

    `drop_content_types` exists for shifts on a patient attribute: the gender shift must not ask
    the model the attribute that defines it, so `experiment=mimic_gender` sets it to [gender].
    """

    name = "mimic_cxr_vqa"
    loader_version = 2  # 2: unknown gender is the value UNKNOWN (i.i.d. in mimic_gender)
    metadata_fields = (
        "gender",
        "age",
        "ethnicity",
        "semantic_type",
        "content_type",
        "closed_kind",
        "study_id",
        "template",
    )
    field_types = FIELD_TYPES
    # Query answers are comma-joined finding lists; the reference code generated up to 100 new
    # tokens, and the models' 12-16 would cut the lists short.
    answer_tokens = 100

    def __init__(
        self,
        root: str | Path,
        cache_dir: str | Path | None = None,
        on_bad_row: str = DEFAULT_ON_BAD_ROW,
        annotation_dir: str = "mimic-cxr-vqa/mimiccxrvqa/dataset",
        image_dir: str = "physionet.org/files/mimic-cxr-jpg/2.0.0",
        hosp_dir: str = "physionet.org/files/mimic-iv/2.2/hosp",
        drop_content_types: tuple[str, ...] | list[str] = (),
    ) -> None:
        super().__init__(root, cache_dir, on_bad_row)
        self.annotation_dir = annotation_dir
        self.image_dir = image_dir.strip("/")
        self.hosp_dir = hosp_dir
        self.drop_content_types = list(drop_content_types)

    @property
    def patients_file(self) -> Path:
        return self.root / self.hosp_dir / "patients.csv"

    @property
    def admissions_file(self) -> Path:
        return self.root / self.hosp_dir / "admissions.csv"

    def annotation_files(self) -> list[Path]:
        splits = [self.root / self.annotation_dir / f for f in SPLIT_FILES.values()]
        return [*splits, self.patients_file, self.admissions_file]

    def _image(self, path: Any, where: str, bad: BadRows) -> str | None:
        """The image under `image_dir/files/`; a path escaping that folder is a bad row."""
        text = str(path).replace("\\", "/")
        if not safe_relative(text):
            bad("path_escape", where, f"image path {text!r} escapes {self.root / self.image_dir}")
            return None
        inner = text if text.startswith("files/") else f"files/{text}"
        return self.image_ref(f"{self.image_dir}/{inner}", where, bad)

    def _native(self, bad: BadRows) -> pd.DataFrame:
        rows = []
        for split, fname in SPLIT_FILES.items():
            path = self.require(
                self.root / self.annotation_dir / fname, f"MIMIC-CXR-VQA {split} annotations"
            )
            seen: set[str] = set()
            for _, where, row in self.valid_rows(
                read_json_rows(path, self.name), path, bad, REQUIRED
            ):
                if "answer" not in row:  # an empty list is a valid answer: not `self.field`
                    bad("malformed", where, "missing field 'answer'")
                    continue
                if self.field(row, "semantic_type", where, bad, SEMANTIC_TYPES) is None:
                    continue
                rid = f"{split}/{row['idx']}"
                if rid in seen:
                    bad("duplicate_id", where, f"idx {row['idx']!r} occurs earlier in the file")
                    continue
                parsed, why = interpret(row)
                if parsed is None:
                    bad("malformed", where, why)
                    continue
                ref = self._image(row["image_path"], where, bad)
                if ref is None:
                    continue
                seen.add(rid)
                rows.append(
                    {
                        R.ID: rid,
                        R.IMAGE: ref,
                        R.QUESTION: str(row["question"]).strip(),
                        R.ANSWER: parsed["answer"],
                        R.ANSWER_TYPE: "closed" if parsed["closed"] else "open",
                        R.QUESTION_TYPE: row["content_type"],
                        R.CANDIDATES: parsed.get("candidates"),
                        R.CASE_ID: _subject_key(row["subject_id"]),
                        R.IMAGE_ID: str(row["image_id"]),
                        R.SOURCE_SPLIT: split,
                        "semantic_type": row["semantic_type"],
                        "content_type": row["content_type"],
                        "closed_kind": parsed.get("kind"),
                        "study_id": None if row.get("study_id") is None else str(row["study_id"]),
                        "template": row.get("template"),
                    }
                )
        columns = [*R.CORE_COLUMNS, "semantic_type", "content_type", "closed_kind", "study_id"]
        return pd.DataFrame(rows, columns=[*columns, "template"])

    def _demographics(self) -> pd.DataFrame:
        """gender, age, ethnicity per subject (index: subject id as text)."""
        patients = _read_csv(
            self.require(self.patients_file, "MIMIC-IV patients table (hosp/patients.csv)"),
            ("subject_id", "gender", "anchor_age"),
            self.name,
        )
        admissions = _read_csv(
            self.require(self.admissions_file, "MIMIC-IV admissions table (hosp/admissions.csv)"),
            ("subject_id", "race"),
            self.name,
        )
        patients["subject_id"] = patients["subject_id"].map(_subject_key)
        patients["anchor_age"] = pd.to_numeric(patients["anchor_age"], errors="coerce")
        # One row per subject in MIMIC-IV; should a subject repeat with other values, its
        # demographics are unknown rather than an arbitrary pick.
        per_subject = patients.groupby("subject_id").agg(
            gender=("gender", lambda v: v.iloc[0] if v.nunique(dropna=False) == 1 else None),
            age=("anchor_age", lambda v: v.iloc[0] if v.nunique(dropna=False) == 1 else None),
        )
        admissions["subject_id"] = admissions["subject_id"].map(_subject_key)
        ethnicity = admissions.groupby("subject_id")["race"].agg(subject_ethnicity)
        return per_subject.join(ethnicity.rename("ethnicity"), how="outer")

    def build(self, bad: BadRows, cleaning: CleaningLog) -> pd.DataFrame:
        native = self._native(bad)
        demo = self._demographics()
        subjects = native[R.CASE_ID]
        gender = subjects.map(demo["gender"])
        known = gender.map(lambda g: isinstance(g, str))
        native["gender"] = [
            g if ok else UNKNOWN_GENDER for g, ok in zip(gender, known, strict=True)
        ]
        # float, NaN if unknown: pd.NA (nullable Int64) would not survive JSON prediction records.
        native["age"] = pd.to_numeric(subjects.map(demo["age"]), errors="coerce").astype(float)
        native["ethnicity"] = subjects.map(demo["ethnicity"]).fillna(UNKNOWN)
        steps = []
        if self.drop_content_types:
            steps.append(
                Step(
                    "drop_content_types",
                    f"Questions about {self.drop_content_types} are removed: a shift on a "
                    "patient attribute must not ask for the attribute that defines it.",
                    lambda t: ~t["content_type"].isin(self.drop_content_types),
                )
            )
        native = cleaning.apply(native, steps)
        missing = native["gender"] == UNKNOWN_GENDER
        cleaning.note(
            "missing_demographics",
            "Subjects absent from hosp/patients.csv (or with conflicting entries) keep their "
            f"rows with gender {UNKNOWN_GENDER} and age null, as SURE-VQA's preprocessing "
            "leaves them: its gender shift keeps them i.i.d. (gender != F), its age shift "
            "excludes them on both sides.",
            native,
            missing,
            subjects=int(native.loc[missing, R.CASE_ID].nunique()),
        )
        return native.loc[
            :,
            [*R.CORE_COLUMNS, *self.metadata_fields],
        ]
