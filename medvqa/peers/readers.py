"""`medvqa-score`: score predictions made elsewhere (or by an earlier run) with medvqa's metrics.

    medvqa-score PREDICTIONS --out DIR [--format FORMAT] [--questions QUESTIONS] [overrides]

The overrides are the run's own config overrides (`'metric=[traditional,judge]'`,
`evaluation.breakdown=[modality]`, `judge.backend=openai ...`), composed from conf/ as
`run.py` composes them, so the scores, breakdowns, CIs and judge are exactly a run's. It writes
`results.json` (the same flat keys as a run: `<split>/<score>`, `robustness/rr_*` when the file
has both test splits; the split is `all` when the file has none), `scores.parquet` and a summary.

FORMAT (default `auto`: detected; docs/metrics.md#scoring-existing-predictions):
- `medvqa`: a run's `predictions.jsonl` (split, case, candidates and metadata included);
- `sure`: the SURE-VQA reference code's `test_results.json`, a JSON list of
  `{qid, question, gt, pred, answer_type: OPEN|CLOSED, img_name}`;
- `lmms-eval`: the per-sample JSONL of `--log_samples` (`doc_id`, `target`,
  `filtered_resps`/`resps`, and `doc` up to v0.3 or `input` and the task's metric dicts since);
- `vlmevalkit`: VLMEvalKit's prediction file (.xlsx by default, .tsv, .json): `index`,
  `prediction`, `answer` and, for MCQ datasets, option columns `A`, `B`, ... with `answer` the
  key letter (read as a closed question over the options; `peer_readers`);
- `llava`: the answers JSONL of LLaVA's / LLaVA-Med's `model_vqa.py` (`question_id`, `text`,
  `answer_id`), joined on `question_id` with the question file given as `--questions`, which
  holds the ground truth (`peer_readers`);
- `table`: CSV, TSV, Excel (.xlsx), Parquet or JSON(L) with `question`, `answer` (or `gt`),
  `prediction` (or `pred`) and optionally `answer_type`, `id`, `split`, `case_id`, `candidates`
  and any metadata column.

The container (text that must be UTF-8, or binary .xlsx/.parquet; any other binary file is
refused as an unsupported format) is checked and loaded by `prediction_files`, before and
independently of the format. A closed question without candidates gets the binary answer space
its text names (yes/no, or "A or B"), as the loaders build it; a file without answer types marks
yes/no answers closed.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from medvqa.data import records as R
from medvqa.data.answers import key_option, same_answer
from medvqa.data.questions import closed_candidates, is_yes_no, is_yes_no_answer
from medvqa.data.records import PREDICTION, SPLIT
from medvqa.data.shifts import SPLITS
from medvqa.generation.files import read_predictions
from medvqa.peers.peer_readers import is_llava, is_vlmevalkit, read_llava, read_vlmevalkit
from medvqa.peers.prediction_files import (
    ReadLimits,
    ScoreInputError,
    check_frame,
    check_readable,
    is_table,
    json_rows,
    load_table,
    table_columns,
)
from medvqa.peers.prediction_files import text_or_none as _text

__all__ = ["READERS", "ReadLimits", "ScoreInputError", "detect_format", "normalise", "read"]

log = logging.getLogger(__name__)

ALL_SPLIT = "all"  # the split of a file that names none
ANSWER_TYPES = ("open", "closed")
# Other names the `table` format accepts for the canonical columns.
ALIASES = {
    "gt": R.ANSWER,
    "ground_truth": R.ANSWER,
    "target": R.ANSWER,
    "pred": PREDICTION,
    "response": PREDICTION,
    "qid": R.ID,
    "question_id": R.ID,
}


# -- readers: each returns rows with the canonical column names ---------------------------------


def read_medvqa(path: Path) -> pd.DataFrame:
    """A run's predictions.jsonl; the last record of a resumed id counts."""
    frame = read_predictions(path)
    if frame.empty:
        raise ScoreInputError(f"{path}: no prediction records")
    keys = [c for c in (SPLIT, R.ID) if c in frame]
    return frame.drop_duplicates(subset=keys, keep="last").reset_index(drop=True)


def read_sure(path: Path) -> pd.DataFrame:
    """SURE-VQA's test_results.json: qid, question, gt, pred, answer_type (OPEN/CLOSED)."""
    rows = json_rows(path)
    for i, row in enumerate(rows):
        missing = [k for k in ("qid", "gt", "pred", "answer_type") if k not in row]
        if missing:
            raise ScoreInputError(f"{path}: record {i} (qid {row.get('qid')!r}) lacks {missing}")
    return pd.DataFrame(
        {
            R.ID: [str(r["qid"]) for r in rows],
            R.QUESTION: [r.get("question", "") for r in rows],
            R.ANSWER: [r["gt"] for r in rows],
            PREDICTION: [r["pred"] for r in rows],
            R.ANSWER_TYPE: [r["answer_type"] for r in rows],
            R.IMAGE: [r.get("img_name") for r in rows],
        }
    )


def _response(row: dict[str, Any]) -> Any:
    """The filtered response of an lmms-eval sample (first of a list, however nested)."""
    value = row.get("filtered_resps", row.get("resps"))
    while isinstance(value, list):
        value = value[0] if value else None
    return value


# Keys lmms-eval's own writer puts in a sample (evaluator.py, loggers/evaluation_tracker.py, v0.3
# to HEAD); any other dict-valued key is a per-sample record from the task's process_results.
LMMS_WRITER_KEYS = frozenset(
    {"doc_id", "doc", "target", "arguments", "resps", "filtered_resps", "input"}
    | {"doc_hash", "prompt_hash", "target_hash", "token_counts", "input_media"}
)
# Fields of such a record that are results or the canonical columns, not question metadata.
LMMS_RESULT_FIELDS = frozenset(
    {"id", "question", "answer", "prediction", "pred", "target", "gt", "answer_type"}
)
# Post prompts of lmms-eval's medical VQA tasks, stripped from a one-row file's `input` (with
# more rows, whatever whole lines every prompt shares is stripped instead).
LMMS_POST_PROMPTS = ("\nAnswer the question using a single word or phrase.",)


def _metric_record(row: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """The sample's per-sample metric dict (its key and value), preferring one with an answer
    type: since v0.4 it is the only place the question's metadata survives."""
    records = [(k, v) for k, v in row.items() if k not in LMMS_WRITER_KEYS and isinstance(v, dict)]
    for key, record in records:
        if str(record.get(R.ANSWER_TYPE) or "").strip():
            return key, record
    return records[0] if records else (None, {})


def _prompt_frame(prompts: list[str]) -> tuple[str, str]:
    """The pre and post prompt a task wraps every question in: the whole lines all prompts
    share at the start and end (a shared first word of two questions is not a prompt)."""
    if len(prompts) < 2:
        post = next((p for p in LMMS_POST_PROMPTS if prompts and prompts[0].endswith(p)), "")
        return "", post
    prefix = os.path.commonprefix(prompts)  # noqa: RUF071 (text, not paths)
    suffix = os.path.commonprefix([p[::-1] for p in prompts])[::-1]  # noqa: RUF071
    pre = prefix[: prefix.rfind("\n") + 1]
    post = suffix[suffix.find("\n") :] if "\n" in suffix else ""
    if any(len(pre) + len(post) >= len(p) for p in prompts):
        return "", ""  # the prompts are all the same text: nothing is recognisably a question
    return pre, post


def read_lmms_eval(path: Path) -> pd.DataFrame:
    """lmms-eval's `--log_samples` JSONL: the answer from `target`, the prediction from
    `filtered_resps` (a list up to v0.6.1, a string from v0.7), the question and answer type from
    `doc` (v0.3.x) or, as v0.4+ drops `doc`, from the task's per-sample metric dict and `input`
    (the prompt, less the pre/post prompt every row shares); the warning says which."""
    rows = json_rows(path)
    docs = _lmms_docs(rows, path)
    prompts = [
        row["input"]
        for row, doc in zip(rows, docs, strict=True)
        if "question" not in (doc or {})
        and "question" not in _metric_record(row)[1]
        and isinstance(row.get("input"), str)
    ]
    pre, post = _prompt_frame(prompts)
    from_input, typed_by, inferred = 0, set(), 0
    out = []
    for i, (row, doc) in enumerate(zip(rows, docs, strict=True)):
        doc = doc or {}
        key, record = _metric_record(row)
        question, stripped = _lmms_question(row, doc, record, (pre, post), f"{path}: line {i + 1}")
        from_input += stripped
        target = row.get("target", doc.get("answer", record.get("target")))
        answer_type = doc.get(R.ANSWER_TYPE) or str(record.get(R.ANSWER_TYPE) or "").strip()
        if not doc.get(R.ANSWER_TYPE) and answer_type:
            typed_by.add(key)
        elif not answer_type:
            answer_type = "closed" if is_yes_no_answer(_text(target) or "") else "open"
            inferred += 1
        metadata = {
            k: v
            for k, v in record.items()
            if isinstance(v, str) and k not in LMMS_RESULT_FIELDS and not k.endswith("_normalized")
        }
        out.append(
            {
                **metadata,
                **{k: v for k, v in doc.items() if isinstance(v, str | int | float | bool)},
                R.ID: str(row["doc_id"]),
                R.QUESTION: str(question).strip(),
                R.ANSWER: target,
                PREDICTION: _response(row),
                R.ANSWER_TYPE: answer_type,
            }
        )
    lacking = _lmms_gaps(docs, from_input, (pre, post), typed_by, inferred)
    if lacking:
        log.warning("%s: %s", path, "; ".join(lacking))
    return pd.DataFrame(out)


def _lmms_docs(rows: list[Any], path: Path) -> list[dict[str, Any] | None]:
    """Each sample's `doc` (None where lmms-eval >= 0.4 dropped it), once every line is known
    to be an lmms-eval sample."""
    docs: list[dict[str, Any] | None] = []
    for i, row in enumerate(rows):
        if "doc_id" not in row or ("filtered_resps" not in row and "resps" not in row):
            raise ScoreInputError(
                f"{path}: line {i + 1} is not an lmms-eval sample (needs doc_id and "
                "filtered_resps or resps); pass --format table for other JSONL files"
            )
        docs.append(row["doc"] if isinstance(row.get("doc"), dict) else None)
    return docs


def _lmms_gaps(
    docs: list[dict[str, Any] | None],
    from_input: int,
    frame: tuple[str, str],
    typed_by: set[str | None],
    inferred: int,
) -> list[str]:
    """What the file lacked and where the reader took it from instead (no `doc`, questions
    from the prompt, answer types from a metric dict or guessed): the reader's one warning,
    so that a score over guessed fields is never taken for one over the task's own."""
    lacking = []
    if missing := sum(doc is None for doc in docs):
        lacking.append(f"no `doc` in {missing} of {len(docs)} row(s) (lmms-eval >= 0.4 drops it)")
    if from_input:
        pre, post = frame
        stripped = f", less the prompt lines {pre!r} ... {post!r}" if pre or post else ""
        lacking.append(
            f"question taken from `input` for {from_input} row(s) (the full prompt{stripped})"
        )
    if typed_by:
        lacking.append(
            f"answer type from the per-sample metric dict `{'`, `'.join(sorted(typed_by))}`"
        )
    if inferred:
        lacking.append(
            f"answer type inferred for {inferred} row(s) (yes/no target -> closed): neither "
            "`doc` nor a per-sample metric dict names it"
        )
    return lacking


def _lmms_question(
    row: dict[str, Any],
    doc: dict[str, Any],
    record: dict[str, Any],
    frame: tuple[str, str],
    where: str,
) -> tuple[Any, bool]:
    """A sample's question, and whether it came from the prompt: `doc`'s or the metric dict's
    where one has it, else `input` less the pre/post prompt `frame` every row shares (v0.4+
    keeps nothing else of the question)."""
    question = doc.get("question", record.get("question"))
    if question is not None:
        return question, False
    prompt = row.get("input")
    if not isinstance(prompt, str):
        raise ScoreInputError(
            f"{where} (doc_id {row['doc_id']!r}) has neither `doc` nor "
            "`input`, so no question; keep the file lmms-eval's --log_samples wrote, "
            "or pass --format table with a question column"
        )
    pre, post = frame
    body = prompt[len(pre) : len(prompt) - len(post)]
    return (body if prompt.startswith(pre) and prompt.endswith(post) else prompt), True


def read_table(path: Path) -> pd.DataFrame:
    """CSV/TSV, Excel, Parquet or JSON(L) with the canonical columns (or their ALIASES); CSV
    and Excel cells are read as the text they hold (`prediction_files.load_table`)."""
    frame = load_table(path)
    renamed = {a: c for a, c in ALIASES.items() if a in frame and c not in frame}
    return frame.rename(columns=renamed)


READERS: dict[str, Callable[..., pd.DataFrame]] = {
    "medvqa": read_medvqa,
    "sure": read_sure,
    "lmms-eval": read_lmms_eval,
    "vlmevalkit": read_vlmevalkit,
    "llava": read_llava,  # also takes the question file (--questions)
    "table": read_table,
}


def detect_format(path: Path) -> str:
    """The format a file is in: a table's (CSV, TSV, Excel, Parquet) from its columns, JSON's
    from its first record."""
    if is_table(path):
        return "vlmevalkit" if is_vlmevalkit(table_columns(path)) else "table"
    rows = json_rows(path)
    first = rows[0] if rows and isinstance(rows[0], dict) else {}
    if {"qid", "gt", "pred"} <= set(first):
        return "sure"
    if "doc_id" in first and ("filtered_resps" in first or "resps" in first):
        return "lmms-eval"
    if is_llava(first):
        return "llava"
    if {SPLIT, PREDICTION, R.ANSWER_TYPE, R.ID} <= set(first):
        return "medvqa"
    if is_vlmevalkit(first):
        return "vlmevalkit"
    return "table"


# -- normalisation -------------------------------------------------------------------------------


def _accepted_names(column: str) -> list[str]:
    return [column, *(alias for alias, canonical in ALIASES.items() if canonical == column)]


def _lower_checked(frame: pd.DataFrame, column: str, accepted: Sequence[str], path: Path) -> None:
    """Lower-case a column in place, naming the first row whose value is not accepted."""
    values = [str(v).strip().lower() for v in frame[column]]
    bad = [i for i, v in enumerate(values) if v not in accepted]
    if bad:
        i = bad[0]
        raise ScoreInputError(
            f"{path}: row {i} (id {frame[R.ID].iloc[i]!r}) has {column.replace('_', ' ')} "
            f"{frame[column].iloc[i]!r} ({len(bad)} such row(s)); use one of "
            f"{', '.join(accepted)} (any case)"
        )
    frame[column] = values


def normalise(frame: pd.DataFrame, path: Path) -> pd.DataFrame:
    """Canonical, validated rows: every row has question, answer, prediction, an answer type
    of open/closed, an id, a split, a case and (closed rows) candidates."""
    _check_scoreable(frame, path)
    frame = frame.copy()
    if R.QUESTION not in frame:
        log.warning(
            "%s: no question column: scored with empty questions, so a closed question's "
            "options cannot be read from it ('A or B', a listed set: give a candidates column), "
            "and a judge sees no question",
            path,
        )
        frame[R.QUESTION] = ""
    if R.ID not in frame:
        frame[R.ID] = [str(i) for i in range(len(frame))]
    for column in (R.ANSWER, PREDICTION):
        texts = [_text(v) for v in frame[column]]
        bad = [i for i, t in enumerate(texts) if t is None]
        if bad:
            i = bad[0]
            raise ScoreInputError(
                f"{path}: row {i} (id {frame[R.ID].iloc[i]!r}) has no {column} ({len(bad)} such "
                f"row(s)); an empty answer is '' , a missing one cannot be scored"
            )
        frame[column] = texts
    frame[R.QUESTION] = [_text(v) or "" for v in frame[R.QUESTION]]
    frame[R.ID] = frame[R.ID].astype(str)
    if R.ANSWER_TYPE in frame:
        _lower_checked(frame, R.ANSWER_TYPE, ANSWER_TYPES, path)
    else:
        log.warning("%s: no answer_type column; yes/no answers are scored as closed", path)
        frame[R.ANSWER_TYPE] = [
            "closed" if is_yes_no_answer(a) else "open" for a in frame[R.ANSWER]
        ]
    if SPLIT in frame:
        _lower_checked(frame, SPLIT, SPLITS, path)
    else:
        frame[SPLIT] = ALL_SPLIT
    if R.CASE_ID not in frame:
        log.info("%s: no case_id column; CIs resample single questions", path)
        frame[R.CASE_ID] = frame[R.ID]
    _close_over_candidates(frame, path)
    _check_unique_ids(frame, path)
    return frame.reset_index(drop=True)


def _check_scoreable(frame: pd.DataFrame, path: Path) -> None:
    """A file with rows, each with an answer and a prediction (the least a score needs); the
    refusal names the accepted column names, so a renamed column is one edit away."""
    if frame.empty:
        raise ScoreInputError(
            f"{path}: no prediction rows (columns: {list(frame.columns)}); add one row per "
            "question below the header, or one record per question"
        )
    required = [R.ANSWER, PREDICTION]
    missing = [c for c in required if c not in frame]
    if missing:
        accepted = "; ".join(f"{c}: {' or '.join(_accepted_names(c))}" for c in missing)
        raise ScoreInputError(
            f"{path}: no column for {missing}; columns are {sorted(map(str, frame.columns))}. "
            f"Rename a column to an accepted name ({accepted}), or pass the --format the file "
            "was written in; see docs/metrics.md#scoring-existing-predictions"
        )


def _close_over_candidates(frame: pd.DataFrame, path: Path) -> None:
    """Give closed rows their candidates (the file's, else read from the question) and their
    answer as the candidate a key names, in place; open rows have none."""
    candidates = (
        [_candidate_list(c, i, path) for i, c in enumerate(frame[R.CANDIDATES])]
        if R.CANDIDATES in frame
        else [None] * len(frame)
    )
    frame[R.CANDIDATES] = [
        (list(c) if isinstance(c, list | tuple) else closed_candidates(q, a))
        if t == "closed"
        else None
        for c, q, a, t in zip(
            candidates, frame[R.QUESTION], frame[R.ANSWER], frame[R.ANSWER_TYPE], strict=True
        )
    ]
    # A row that keeps its file's option letters had its key resolved by its reader (a letter
    # there may name an option the row leaves empty: not the option at that position).
    lettered = frame[R.OPTION_LETTERS] if R.OPTION_LETTERS in frame else [None] * len(frame)
    frame[R.ANSWER] = [
        a if isinstance(letters, list | tuple | np.ndarray) else _option_of_key(a, c)
        for a, c, letters in zip(frame[R.ANSWER], frame[R.CANDIDATES], lettered, strict=True)
    ]


def _check_unique_ids(frame: pd.DataFrame, path: Path) -> None:
    """Each id once per split: a repeated row would be scored twice, and paired differences
    join on the id."""
    repeated = frame.duplicated([SPLIT, R.ID])
    if repeated.any():
        i = int(repeated.to_numpy().argmax())
        rid, split = frame[R.ID].iloc[i], frame[SPLIT].iloc[i]
        first = int(((frame[R.ID] == rid) & (frame[SPLIT] == split)).to_numpy().argmax())
        raise ScoreInputError(
            f"{path}: id {rid!r} occurs in rows {first} and {i} of split {split!r} "
            f"({int(repeated.sum())} repeated row(s)); ids must be unique within a split: drop "
            "the repeated row, or give each question its own id"
        )


def read(
    path: Path,
    fmt: str = "auto",
    questions: Path | None = None,
    limits: ReadLimits | None = None,
) -> tuple[pd.DataFrame, str]:
    """The file's rows, normalised, and the format they were read as; `questions` is the
    question file a `llava` answers file is joined with (it holds their ground truth);
    `limits`: how much of it is read, in rows, cells, one cell's size and bytes (default
    `ReadLimits()`), measured before the parse where the format allows."""
    path = Path(path)
    if not path.is_file():
        raise ScoreInputError(f"{path}: no such file")
    check_readable(path, limits)
    if fmt not in ("auto", *READERS):
        raise ScoreInputError(f"--format {fmt!r}: choose from {['auto', *READERS]}")
    if fmt == "auto":
        fmt = detect_format(path)
        # A JSONL of question_id + text without answer_id is a LLaVA answers file too.
        if questions is not None and fmt == "table" and not is_table(path):
            fmt = "llava"
    if questions is not None and fmt != "llava":
        raise ScoreInputError(
            f"--questions {questions}: only a LLaVA/LLaVA-Med model_vqa.py answers file is "
            f"joined with a question file, and {path} is read as {fmt!r} (its answers are in "
            "it): drop --questions, or pass --format llava if it is such an answers file"
        )
    frame = READERS[fmt](path, questions) if fmt == "llava" else READERS[fmt](path)
    check_frame(frame, path, limits)  # what the format let be measured only once read
    return normalise(frame, path), fmt


# -- scoring -------------------------------------------------------------------------------------


def _candidate_list(value: Any, row: int, path: Path) -> list[str] | None:
    """A row's candidates: a list, or a CSV cell holding a JSON list (`["CT", "MRI"]`); an
    empty cell has none (the question's own options are used)."""
    if hasattr(value, "tolist") and not isinstance(value, float):  # a numpy array
        value = value.tolist()
    if isinstance(value, list | tuple):
        return [str(v) for v in value]
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None  # a JSON row without the key
    if isinstance(value, str) and not value.strip():
        return None
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = None
        if isinstance(parsed, list) and parsed:
            return [str(v) for v in parsed]
    raise ScoreInputError(
        f"{path}: row {row}: candidates {value!r} is not a list; write a JSON list in the cell, "
        'e.g. ["CT", "MRI"], or leave it empty to read the options from the question'
    )


def _option_of_key(answer: Any, candidates: list[str] | None) -> Any:
    """A letter key ("B") as the text of the option it names, as the mcq family resolves a
    reply; a key that is an option's text already, or a yes/no question's, is kept."""
    if not candidates or all(map(is_yes_no, candidates)) or not isinstance(answer, str):
        return answer
    if any(same_answer(answer, c) for c in candidates):
        return answer
    return key_option(answer, candidates) or answer
