"""Readers for the prediction files two more peers write, as `medvqa-score` formats.

- `vlmevalkit`: VLMEvalKit's per-sample prediction file (`{model}_{dataset}.xlsx` by default,
  `.tsv` or `.json` with `PRED_FORMAT`): the dataset's TSV rows plus `prediction`. MCQ datasets
  have option columns `A`, `B`, ... (missing options empty or NaN) and `answer` the KEY letter;
  a row with options becomes a closed question whose candidates are its options in letter order
  (their letters kept as `option_letters`) and whose answer is the option the key names. An
  option is missing where VLMEvalKit's own loader reads it as missing: an option written
  "None" (or "NA", "N/A", "null") is empty to it, is never shown to the model, and a key naming
  it is scored as VLMEvalKit scores it, wrong whatever the reply. VQA datasets (no options) keep
  their answer and are closed when it is yes/no.
- `llava`: the answers JSONL of LLaVA's / LLaVA-Med's `llava/eval/model_vqa.py` (and
  `model_vqa_med.py`): `{question_id, prompt, text, answer_id, model_id, metadata}`. It holds the
  reply (`text`) but not the ground truth, which is in the question file the script was given:
  `--questions` joins the two on `question_id`.

Both writers are copied into tests/peers/ (vlmevalkit.py, llava.py) for the tests' fixtures.
"""

from __future__ import annotations

import logging
import string
from pathlib import Path
from typing import Any

import pandas as pd

from medvqa.data import records as R
from medvqa.data.answers import same_answer
from medvqa.data.questions import is_yes_no_answer
from medvqa.data.records import PREDICTION
from medvqa.data.shifts import SPLITS
from medvqa.peers.prediction_files import (
    ScoreInputError,
    check_readable,
    default_typed,
    is_table,
    json_rows,
    load_table,
    text_or_none,
)

log = logging.getLogger(__name__)

# -- VLMEvalKit ----------------------------------------------------------------------------------

OPTION_LETTERS = tuple(string.ascii_uppercase)  # VLMEvalKit's build_choices scans A-Z
VLMEVALKIT_INDEX = "index"
# Dropped: the base64 image (megabytes a row, only when a dataset TSV is passed) and the
# agent-eval records (nested, not question metadata).
VLMEVALKIT_DROPPED = ("image", "extra_records")


def is_vlmevalkit(columns: set[str] | list[str]) -> bool:
    """VLMEvalKit's columns: `index` and `prediction`, with option letters (MCQ) or a question
    and answer and none of medvqa's own columns (VQA)."""
    columns = set(columns)
    if not {VLMEVALKIT_INDEX, PREDICTION} <= columns:
        return False
    if {"A", "B"} <= columns:
        return True
    return {R.QUESTION, R.ANSWER} <= columns and not ({R.ID, R.ANSWER_TYPE} & columns)


def _split_as_source(frame: pd.DataFrame, path: Path, writer: str) -> pd.DataFrame:
    """A peer's `split` column is its dataset's split (MMBench's dev/test), not medvqa's
    evaluation split: kept as `source_split` unless every value is one of medvqa's splits."""
    if R.SPLIT not in frame:
        return frame
    values = {str(v).strip().lower() for v in frame[R.SPLIT]}
    if values <= set(SPLITS):
        return frame
    log.info(
        "%s: %s's `split` column (%s) is the dataset's own split, not one of %s: kept as `%s` "
        "(usable in evaluation.breakdown), and the file is scored as split 'all'",
        path,
        writer,
        ", ".join(sorted(values)[:5]),
        ", ".join(SPLITS),
        R.SOURCE_SPLIT,
    )
    return frame.rename(columns={R.SPLIT: R.SOURCE_SPLIT})


def _key_option(key: str, options: dict[str, str]) -> str | None:
    """The option text an answer key names: by its letter (so yes/no options and a missing
    letter in between are read right), else an option whose text it is."""
    if key.strip() in options:
        return options[key.strip()]
    return next((text for text in options.values() if same_answer(key, text)), None)


def read_vlmevalkit(path: Path) -> pd.DataFrame:
    """VLMEvalKit's prediction file: MCQ rows as closed questions over their options, the
    answer the option of the key letter; VQA rows as open, or closed when yes/no."""
    frame = load_table(path)
    letters = _vlmevalkit_letters(frame, path)
    # The options as VLMEvalKit's loader types them: what its prompt showed the model (it
    # read the dataset TSV so) and what its scorer compares.
    typed = default_typed(path, letters).to_dict("records") if letters else [{}] * len(frame)
    if len(typed) != len(frame):
        raise ScoreInputError(
            f"{path}: {len(frame)} rows read as text but {len(typed)} as pandas reads them; "
            "re-save the file from VLMEvalKit's own frame (its `dump`)"
        )
    rows, gaps, not_offered = [], 0, []
    for i, row in enumerate(frame.to_dict("records")):
        options = {
            letter: str(value)
            for letter, value in typed[i].items()
            if (text_or_none(value) or "").strip()
        }
        answer = row[R.ANSWER]
        out = {k: v for k, v in row.items() if k not in (*letters, *VLMEVALKIT_DROPPED, R.ANSWER)}
        out[R.ID] = text_or_none(row[VLMEVALKIT_INDEX])
        if options:
            fields, offered = _mcq_answer(path, i, out[R.ID], answer, options, letters)
            out.update(fields)
            gaps += list(options) != list(OPTION_LETTERS[: len(options)])
            if not offered:
                not_offered.append(out[R.ID])
        else:
            text = text_or_none(answer)
            closed = text is not None and is_yes_no_answer(text)
            out.update({R.ANSWER: answer, R.ANSWER_TYPE: "closed" if closed else "open"})
        rows.append(out)
    _warn_mcq_oddities(path, gaps, not_offered)
    out_frame = pd.DataFrame(rows)
    for listed in (R.CANDIDATES, R.OPTION_LETTERS):  # VQA rows have none (NaN here)
        if listed in out_frame:  # (normalise gives closed ones their candidates)
            out_frame[listed] = [c if isinstance(c, list) else None for c in out_frame[listed]]
    return _split_as_source(out_frame, path, "VLMEvalKit")


def _vlmevalkit_letters(frame: pd.DataFrame, path: Path) -> list[str]:
    """The file's option letters (none for a VQA dataset), once it has what scoring needs: a
    file without `index`/`prediction` is no VLMEvalKit file, and one without `answer` is a
    test split that ships without answers; both refused with the fix."""
    columns = {str(c) for c in frame.columns}
    missing = [c for c in (VLMEVALKIT_INDEX, PREDICTION) if c not in columns]
    if missing:
        raise ScoreInputError(
            f"{path}: no column {missing} (columns: {sorted(columns)}); a VLMEvalKit prediction "
            "file has `index` and `prediction`: pass the {model}_{dataset} file its inference "
            "wrote, or --format table for another table"
        )
    if R.ANSWER not in columns:
        raise ScoreInputError(
            f"{path}: no `answer` column, so nothing to score against; VLMEvalKit's test "
            "splits (e.g. MMBench_TEST_EN) ship without answers: score a split with answers "
            "(e.g. MMBench_DEV_EN), or add the answer column"
        )
    return [c for c in OPTION_LETTERS if c in columns]


def _mcq_answer(
    path: Path, i: int, qid: str | None, answer: Any, options: dict[str, str], letters: list[str]
) -> tuple[dict[str, Any], bool]:
    """An MCQ row's closed-question fields (the answer the option its key names, the options
    as candidates in letter order), and whether that option was offered: a key naming an
    option VLMEvalKit's loader left empty is kept, scored wrong as VLMEvalKit scores it."""
    key = (text_or_none(answer) or "").strip()
    if not key:
        raise ScoreInputError(
            f"{path}: row {i} (index {qid!r}) has options but no answer key; "
            "VLMEvalKit's test splits (e.g. MMBench_TEST_EN) ship without answers: "
            "score a split with answers, or drop the rows without one"
        )
    text, offered = _key_option(key, options), True
    if text is None and key in letters:
        text, offered = key, False  # an option VLMEvalKit's loader left empty: never offered
    if text is None:
        raise ScoreInputError(
            f"{path}: row {i} (index {qid!r}): answer key {key!r} names none of "
            f"its options {sorted(options)} (columns {', '.join(letters)}); write the "
            "key as one option letter (a multiple-answer key such as 'AB' cannot be "
            "scored as one choice)"
        )
    fields = {
        R.ANSWER: text,
        R.CANDIDATES: list(options.values()),
        R.OPTION_LETTERS: list(options),
        R.ANSWER_TYPE: "closed",
    }
    return fields, offered


def _warn_mcq_oddities(path: Path, gaps: int, not_offered: list[str]) -> None:
    """Say where medvqa's reading of an MCQ file may differ from VLMEvalKit's: skipped option
    letters (read by position), and keys naming an option the model was never shown."""
    if gaps:
        log.warning(
            "%s: %d MCQ row(s) skip an option letter (e.g. A, B, D): their candidates are the "
            "options in order, so medvqa's reading (metric.mcq.matching=medvqa) reads a reply's "
            "letter by position ('C' is the third option given, 'D' none); VLMEvalKit's "
            "(vlmevalkit_exact) keeps the file's letters",
            path,
            gaps,
        )
    if not_offered:
        log.warning(
            "%s: %s: the answer key names an option the file leaves empty. VLMEvalKit's loader "
            "reads an option written 'None', 'NA', 'N/A' or 'null' as missing, so the model was "
            "never shown it; such a row is scored as VLMEvalKit scores it, wrong whatever the "
            "reply. If the key is wrong instead, fix it",
            path,
            _ids(not_offered),
        )


# -- LLaVA / LLaVA-Med model_vqa.py --------------------------------------------------------------

LLAVA_KEYS = frozenset({"question_id", "text", "answer_id"})
# Where a question file holds the ground truth, as the peers' eval scripts read it, in the order
# tried: a plain `answer`; the gpt turn of LLaVA's conversation format (LLaVA-Med v1.0's VQA-RAD,
# SLAKE and PathVQA test.json, read by llava/eval/run_eval.py; "conversatons" is a typo in some
# of those files that the script tolerates); LLaVA-Med's `gpt4_answer` (its chat eval,
# eval_multimodal_chat_gpt_score.py, treats GPT-4's answer as the ground truth); POPE's `label`
# (LLaVA's eval_pope.py).
GROUND_TRUTH = ("answer", "conversations", "conversatons", "gpt4_answer", "label")
# LLaVA-Med v1.0's answer types (run_eval_pvqa.py scores "other" and "number" as open).
LLAVA_ANSWER_TYPES = {"open": "open", "other": "open", "number": "open"}
LLAVA_ANSWER_TYPES |= {"closed": "closed", "yes/no": "closed"}
IMAGE_TOKEN = "<image>"  # llava.constants.DEFAULT_IMAGE_TOKEN, stripped from the question


def is_llava(keys: set[str] | list[str]) -> bool:
    """The record keys of a model_vqa.py answer."""
    return set(keys) >= LLAVA_KEYS


def _conversation(record: dict[str, Any]) -> list[Any]:
    turns = record.get("conversations", record.get("conversatons"))
    return turns if isinstance(turns, list) else []


def _ground_truth(record: dict[str, Any]) -> Any:
    """The question's reference answer (GROUND_TRUTH), or None."""
    for key in GROUND_TRUTH:
        if key in ("conversations", "conversatons"):
            turns = _conversation(record)
            if len(turns) > 1 and isinstance(turns[1], dict) and "value" in turns[1]:
                return turns[1]["value"]
        elif record.get(key) is not None:
            return record[key]
    return None


def _question_text(record: dict[str, Any]) -> str | None:
    """The question as model_vqa.py read it: `text`, else the human turn of a conversation
    (LLaVA-Med v1.0), else `question`; the image token removed, as the scripts remove it."""
    turns = _conversation(record)
    text = record.get("text")
    if text is None and turns and isinstance(turns[0], dict):
        text = turns[0].get("value")
    if text is None:
        text = record.get("question")
    return None if text is None else str(text).replace(IMAGE_TOKEN, "").strip()


def _read_questions(questions: Path) -> dict[str, dict[str, Any]]:
    """The question file's records by id (`question_id`, or `id` in LLaVA-Med v1.0's files)."""
    if not questions.is_file():
        raise ScoreInputError(f"--questions {questions}: no such file")
    check_readable(questions)
    by_id: dict[str, dict[str, Any]] = {}
    lines: dict[str, int] = {}
    for number, record in enumerate(json_rows(questions), start=1):
        qid = record.get("question_id", record.get("id")) if isinstance(record, dict) else None
        if qid is None:
            raise ScoreInputError(
                f"{questions}: record {number} has no `question_id` (or `id`); the question "
                "file is the one model_vqa.py was given with --question-file"
            )
        qid = str(qid)
        if qid in by_id:
            raise ScoreInputError(
                f"{questions}: question id {qid!r} occurs in records {lines[qid]} and "
                f"{number}; give each question its own id"
            )
        by_id[qid], lines[qid] = record, number
    if not by_id:
        raise ScoreInputError(f"{questions}: no question records")
    return by_id


def _ids(ids: list[str]) -> str:
    shown = ", ".join(repr(i) for i in ids[:5])
    return f"{len(ids)} id(s): {shown}{', ...' if len(ids) > 5 else ''}"


def _check_join(
    answers: list[Any], by_id: dict[str, dict[str, Any]], path: Path, questions: Path
) -> None:
    """Every answer is a model_vqa.py answer of one question in the question file, and every
    question is answered once: a join that loses or doubles a question would score a subset
    (a chunk file missing) or count a question twice (chunk files overlapping)."""
    seen: dict[str, int] = {}
    for number, answer in enumerate(answers, start=1):
        if not isinstance(answer, dict) or "question_id" not in answer or "text" not in answer:
            raise ScoreInputError(
                f"{path}: line {number} is not a model_vqa.py answer (needs question_id and "
                "text); --questions joins LLaVA answer files only"
            )
        qid = str(answer["question_id"])
        if qid in seen:
            raise ScoreInputError(
                f"{path}: question_id {qid!r} is answered on lines {seen[qid]} and {number}; "
                "keep one answer per question (concatenated chunk files overlap?)"
            )
        seen[qid] = number
    extra = [qid for qid in seen if qid not in by_id]
    if extra:
        raise ScoreInputError(
            f"{path}: {_ids(extra)} answered but not in the question file {questions}; pass "
            "the question file model_vqa.py was given (--question-file)"
        )
    unanswered = [qid for qid in by_id if qid not in seen]
    if unanswered:
        raise ScoreInputError(
            f"{questions}: {_ids(unanswered)} have no answer in {path}; model_vqa.py "
            "--num-chunks writes one answers file per chunk: concatenate them "
            "(`cat chunk_*.jsonl > answers.jsonl`), or pass a question file of the answered "
            "questions only"
        )


def _llava_row(
    answer: dict[str, Any], record: dict[str, Any], questions: Path
) -> tuple[dict[str, Any], bool]:
    """One answer as medvqa's row, with its question record's text, ground truth, answer type
    and plain metadata; and whether the answer type was guessed (the record had none: yes/no
    answers closed, the rest open, as LLaVA-Med's scripts split them)."""
    qid = str(answer["question_id"])
    truth = _ground_truth(record)
    if truth is None:
        raise ScoreInputError(
            f"{questions}: question {qid!r} has no ground truth; a question record needs "
            f"one of {', '.join(GROUND_TRUTH)} (the gpt turn of a conversation)"
        )
    raw_type = str(record.get(R.ANSWER_TYPE) or "").strip()
    answer_type = LLAVA_ANSWER_TYPES.get(raw_type.lower(), raw_type)
    guessed = not answer_type
    if guessed:
        answer_type = "closed" if is_yes_no_answer(str(truth)) else "open"
    metadata = {
        k: v
        for k, v in record.items()
        if isinstance(v, str | int | float | bool) and k not in (*GROUND_TRUTH, "text", "id")
    }
    row = {
        **metadata,
        **({"model_id": answer["model_id"]} if "model_id" in answer else {}),
        R.ID: qid,
        R.QUESTION: _question_text(record) or str(answer.get("prompt") or ""),
        R.ANSWER: truth,
        PREDICTION: answer["text"],
        R.ANSWER_TYPE: answer_type,
    }
    return row, guessed


def read_llava(path: Path, questions: Path | None = None) -> pd.DataFrame:
    """model_vqa.py's answers joined on `question_id` with the question file's question, ground
    truth (GROUND_TRUTH), answer type and metadata; every id must be in both files."""
    if is_table(path):
        raise ScoreInputError(
            f"{path}: a model_vqa.py answers file is JSONL, this is a {path.suffix} table; "
            "pass the answers file, or the --format the table was written in without --questions"
        )
    answers = json_rows(path)
    if questions is None:
        raise ScoreInputError(
            f"{path}: a LLaVA/LLaVA-Med model_vqa.py answers file holds the replies (`text`) "
            "but not the ground truth, which is in the question file the script was given: "
            f"pass it, `medvqa-score {path} --questions QUESTIONS.jsonl --out DIR`"
        )
    by_id = _read_questions(Path(questions))
    _check_join(answers, by_id, path, Path(questions))
    rows, inferred = [], 0
    for answer in answers:
        row, guessed = _llava_row(answer, by_id[str(answer["question_id"])], Path(questions))
        rows.append(row)
        inferred += guessed
    rows_frame = pd.DataFrame(rows).drop(columns=["question_id"], errors="ignore")
    if inferred:
        log.warning(
            "%s: %d question(s) without an answer_type: yes/no answers scored as closed, the "
            "rest open",
            questions,
            inferred,
        )
    return _split_as_source(rows_frame, Path(questions), "the question file")
