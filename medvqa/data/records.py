"""The normalised record schema every dataset adapter produces.

Every loader (synthetic, SLAKE, OVQA, ...) turns its native layout into one pandas table with
these columns, so shifts, data modules, baselines and metrics never look at a native format.
Dataset-specific metadata (modality, body part, sex, age, ...) are extra plain columns; a shift
names one of them as its `field`.
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

ID = "id"
IMAGE = "image"  # image reference relative to the dataset root
QUESTION = "question"
ANSWER = "answer"
ANSWER_TYPE = "answer_type"  # "open" | "closed"
QUESTION_TYPE = "question_type"  # content type, e.g. "modality", "size"
CANDIDATES = "candidates"  # list[str] for closed questions, None for open ones
# Of a closed question read from a peer's file: the letter each candidate had there (VLMEvalKit's
# option columns A-Z skip a missing option's letter); without it, A, B, C... by position.
OPTION_LETTERS = "option_letters"
CASE_ID = "case_id"
IMAGE_ID = "image_id"
SOURCE_SPLIT = "source_split"  # the dataset's own split: train | validate | test
# The splits a shift makes (medvqa.data.shifts.make_splits): i.i.d. train, validation and test,
# and the OoD test. Named here once; `shifts.SPLITS` lists them in order.
TRAIN, VAL, TEST_IID, TEST_OOD = "train", "val", "test_iid", "test_ood"
SPLIT = "split"  # of a prediction: the evaluation split it belongs to (test_iid, test_ood, ...)
# Rows that ask the same thing in other words share it (VQA-RAD's qid_linked_id; the synthetic
# data's paraphrases): paraphrase consistency, and splits that keep a group together.
PARAPHRASE_GROUP = "paraphrase_group"
PREDICTION = "prediction"  # of a prediction: the model's answer (scored, never rewritten)
# Of a generated prediction: how sure the model was (calibration). The log-probability of each
# generated token under the distribution greedy decoding chose it from, over the answer's tokens
# up to and including its end token: their mean, their minimum, and how many.
LOGPROB_MEAN = "answer_logprob_mean"
LOGPROB_MIN = "answer_logprob_min"
ANSWER_TOKENS = "answer_tokens"
# The answer's summed log-probability with the logits divided by each temperature of the grid
# (greedy's choice does not depend on it), {"<T>": sum}: a temperature fitted on the i.i.d.
# validation answers is applied to the test answers without generating again.
LOGPROB_BY_TEMPERATURE = "answer_logprob_by_temperature"
TEMPERATURES: tuple[float, ...] = (0.5, 0.7, 0.85, 1.0, 1.15, 1.3, 1.5, 1.75, 2.0, 2.5, 3.0)

CORE_COLUMNS: tuple[str, ...] = (
    ID,
    IMAGE,
    QUESTION,
    ANSWER,
    ANSWER_TYPE,
    QUESTION_TYPE,
    CANDIDATES,
    CASE_ID,
    IMAGE_ID,
    SOURCE_SPLIT,
)
ANSWER_TYPES = ("open", "closed")
SOURCE_SPLITS = ("train", "validate", "test")


class SchemaError(ValueError):
    """A table does not follow the normalised record schema."""


def metadata_columns(table: pd.DataFrame) -> list[str]:
    """Columns beyond the core schema: the fields a shift or a breakdown may use."""
    return [c for c in table.columns if c not in CORE_COLUMNS]


def validate_table(table: pd.DataFrame, source: str, required: Iterable[str] = ()) -> None:
    """Fail early, naming the dataset and the offending column or row, if the schema is broken."""
    missing = [c for c in (*CORE_COLUMNS, *required) if c not in table.columns]
    if missing:
        raise SchemaError(
            f"{source}: normalised table lacks column(s) {missing}; the loader must produce "
            f"{list(CORE_COLUMNS)} plus metadata columns."
        )
    if table[ID].duplicated().any():
        dup = table.loc[table[ID].duplicated(), ID].iloc[0]
        raise SchemaError(f"{source}: record id {dup!r} occurs more than once; ids must be unique.")
    for column, allowed in ((ANSWER_TYPE, ANSWER_TYPES), (SOURCE_SPLIT, SOURCE_SPLITS)):
        bad = ~table[column].isin(allowed)
        if bad.any():
            row = table.loc[bad].iloc[0]
            raise SchemaError(
                f"{source}: record {row[ID]!r} has {column} {row[column]!r}; "
                f"expected one of {allowed}."
            )
    closed = table.loc[table[ANSWER_TYPE] == "closed", [ID, ANSWER, CANDIDATES]]
    ok = [
        cands is not None and len(cands) >= 2 and answer in list(cands)
        for answer, cands in zip(closed[ANSWER], closed[CANDIDATES], strict=True)
    ]
    if not all(ok):
        row = closed.loc[[not k for k in ok]].iloc[0]
        raise SchemaError(
            f"{source}: closed record {row[ID]!r} needs >= 2 candidates containing its "
            f"answer {row[ANSWER]!r}; got {row[CANDIDATES]!r}."
        )


def prediction_index(frame: pd.DataFrame) -> pd.MultiIndex:
    """(split, id) of each row: what identifies an answer across a run's prediction files (an
    id alone repeats across splits); a table without a split column is one split, ""."""
    split = frame[SPLIT] if SPLIT in frame.columns else pd.Series("", index=frame.index)
    return pd.MultiIndex.from_arrays([split.astype(str), frame[ID].astype(str)])
