"""The export half of the rater study: sample open, non-exact predictions from a run's scored
table and write them as a rating sheet (CSV and HTML page) plus ``items.jsonl`` with their
metric scores, which raters never see."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from medvqa.analysis.rater.page import rating_page
from medvqa.analysis.rater.study import (
    ITEMS,
    JUDGES,
    SHEET_COLUMNS,
    SHEET_CSV,
    SHEET_HTML,
    RatingError,
)
from medvqa.atomic import staged_dir
from medvqa.data import records as R
from medvqa.data.records import SPLIT
from medvqa.generation.files import read_predictions
from medvqa.scoring.metrics import traditional as M
from medvqa.scoring.metrics.judge import (  # 1–5 open, 0/0.5/1 closed
    JUDGE_SCORE,
    juror_column,
    jurors_of,
)
from medvqa.scoring.pipeline import SCORES_FILE

log = logging.getLogger(__name__)

__all__ = ["TOKEN_METRICS", "export", "read_scored"]

#: Token metrics of the rater study (docs/rater_study.md) (``ref_word_precision`` is the paper's "EM").
TOKEN_METRICS: tuple[str, ...] = ("bleu1", "ref_word_precision", "f1", "precision", "recall")


def _judge_columns(preds: pd.DataFrame, explicit: Sequence[str] | None) -> list[str]:
    """Judge score fields: the ones named, else ``judge_score`` (medvqa.judge) if
    present, and each juror's ``judge_score@<juror>`` when a jury graded the run.

    Not every ``judge*`` field: ``judge_failed`` is numeric too but is not a score.
    """
    if explicit:
        missing = [c for c in explicit if c not in preds.columns]
        if missing:
            raise RatingError(
                f"--judge-column {missing} not in the predictions file; columns: "
                f"{sorted(preds.columns)}"
            )
        return list(explicit)
    jurors = [juror_column(JUDGE_SCORE, j) for j in jurors_of(preds)]
    return [c for c in (JUDGE_SCORE, *jurors) if c in preds.columns]


def _metric_scores(
    sample: pd.DataFrame, judge: Sequence[str], text: bool, embedding: bool
) -> pd.DataFrame:
    """Score columns of the sampled items (index as `sample`)."""
    scores = pd.DataFrame(index=sample.index)
    for name in TOKEN_METRICS:
        fn = M.OPEN_METRICS[name]
        scores[name] = [
            fn(p, a) for p, a in zip(sample[M.PREDICTION], sample[R.ANSWER], strict=True)
        ]
    if text:
        from medvqa.scoring.metrics.text import TextMetric

        scores = scores.join(TextMetric().per_sample(sample))
    if embedding:
        from medvqa.scoring.metrics.embedding import EmbeddingMetric

        scores = scores.join(EmbeddingMetric().per_sample(sample))
    for column in judge:
        scores[column] = pd.to_numeric(sample[column], errors="coerce")
    return scores


def read_scored(path: Path) -> pd.DataFrame:
    """A run's scored table: `scores.parquet` of a run directory, a `.parquet` file, or a
    predictions JSONL (raw predictions; judge scores only if the file has them)."""
    if path.is_dir():
        path = path / SCORES_FILE
    if path.suffix == ".parquet":
        if not path.is_file():
            raise RatingError(f"{path}: no such file; pass a run directory or its {SCORES_FILE}")
        return pd.read_parquet(path)
    return read_predictions(path)


def _one_split(preds: pd.DataFrame, predictions: Path, split: str | None) -> pd.DataFrame:
    """The records of `split` (all where None), each id once: a resumed run may hold a record
    twice (the last written is current), and an id in several splits is refused, since a
    rater's score could not be placed."""
    if preds.empty:
        raise RatingError(f"{predictions}: no prediction records (missing or empty file)")
    required = [R.ID, R.QUESTION, R.ANSWER, R.ANSWER_TYPE, M.PREDICTION]
    missing = [c for c in required if c not in preds.columns]
    if missing:
        raise RatingError(
            f"{predictions}: records lack field(s) {missing}; expected the JSONL written by "
            "medvqa.generation"
        )
    if SPLIT not in preds.columns:
        preds[SPLIT] = None
    if split is not None:
        available = sorted(str(s) for s in preds[SPLIT].dropna().unique())
        preds = preds.loc[preds[SPLIT] == split]
        if preds.empty:
            raise RatingError(f"{predictions}: no records of split {split!r}; splits: {available}")
    preds = preds.drop_duplicates(subset=[SPLIT, R.ID], keep="last")
    repeated = preds.loc[preds[R.ID].duplicated(), R.ID]
    if not repeated.empty:
        raise RatingError(
            f"{predictions}: id {repeated.iloc[0]!r} occurs in several splits "
            f"({sorted(preds[SPLIT].dropna().unique())}); pass --split to rate one of them"
        )
    return preds


def _candidates(preds: pd.DataFrame, predictions: Path) -> pd.DataFrame:
    """The open rows whose prediction is not an exact match (nothing for a rater to judge
    there), sorted by id so that the seeded draw depends on the file's content only."""
    open_rows = preds.loc[preds[R.ANSWER_TYPE] == "open"]
    exact = np.array(
        [
            M.exact_match(p, a)
            for p, a in zip(open_rows[M.PREDICTION], open_rows[R.ANSWER], strict=True)
        ],
        dtype=bool,
    )
    pool = open_rows.loc[~exact].sort_values(R.ID, kind="stable")
    log.info(
        "%s: %d open record(s), %d exact match(es) excluded, %d candidate(s)",
        predictions,
        len(open_rows),
        int(exact.sum()),
        len(pool),
    )
    if pool.empty:
        raise RatingError(f"{predictions}: no open question with a non-exact prediction to rate")
    return pool


def _write_study(out: Path, items: pd.DataFrame, scores: pd.DataFrame, judges: list[str]) -> None:
    """The rating sheet (CSV and HTML, no scores) and items.jsonl (the scores the raters never
    see), swapped in whole: raters never get a sheet whose items.jsonl is from another draw."""
    sheet = items.rename(columns={"answer": "ground_truth"})[list(SHEET_COLUMNS[:-1])]
    with staged_dir(out, "medvqa-rater export") as staging:
        with (staging / ITEMS).open("w") as fh:
            for i, item in enumerate(items.to_dict("records")):
                item["scores"] = {
                    k: (None if pd.isna(v) else float(v)) for k, v in scores.iloc[i].items()
                }
                item[JUDGES] = judges  # on the raters' 1-5 scale: their kappa and alpha too
                fh.write(json.dumps(item) + "\n")
        sheet.assign(score="").to_csv(staging / SHEET_CSV, index=False)
        (staging / SHEET_HTML).write_text(rating_page(sheet))


def export(
    predictions: Path,
    out: Path,
    n: int = 50,
    seed: int = 0,
    split: str | None = None,
    judge_columns: Sequence[str] | None = None,
    text_metrics: bool = True,
    embedding: bool = False,
) -> pd.DataFrame:
    """Sample the items, write the sheet (CSV + HTML) and ``items.jsonl``; return the items.

    Candidates are the open rows (of `split`, if given) whose prediction is not an exact match
    after normalisation; they are sorted by id before the seeded draw, so the sample depends on
    the file's content, not on the order a resumed generation appended it in.
    """
    pool = _candidates(_one_split(read_scored(Path(predictions)), predictions, split), predictions)
    if n < 1:
        raise RatingError(f"--n must be at least 1, got {n}")
    if n > len(pool):
        log.warning("only %d candidate(s) for --n %d: rating all of them", len(pool), n)
    rng = np.random.default_rng(seed)
    picked = rng.permutation(len(pool))[: min(n, len(pool))]
    sample = pool.iloc[picked].reset_index(drop=True)
    judges = _judge_columns(sample, judge_columns)
    scores = _metric_scores(sample, judges, text_metrics, embedding)

    items = pd.DataFrame(
        {
            "id": sample[R.ID].astype(str),
            "split": sample[SPLIT],
            "question": sample[R.QUESTION].astype(str),
            "answer": sample[R.ANSWER].astype(str),
            "prediction": sample[M.PREDICTION].fillna("").astype(str),
        }
    )
    _write_study(Path(out), items, scores, judges)
    log.info("wrote %d item(s) to %s", len(items), out)
    return items.join(scores)
