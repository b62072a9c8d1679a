"""Sanity baselines scored without a model (the model-based ones are run configurations)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from medvqa.data import records as R


def expected_chance_accuracy(candidates: Sequence[Sequence[str] | None]) -> float:
    """Expected accuracy of a uniform guess among each question's k candidates: mean of 1/k."""
    ks = [len(c) for c in candidates if c is not None and len(c) > 0]
    return float(np.mean([1.0 / k for k in ks])) if ks else float("nan")


def chance_scores(frames: Mapping[str, pd.DataFrame]) -> dict[str, dict[str, float]]:
    """Per split, the random baseline on closed questions (open questions have no chance level)."""
    out = {}
    for split, frame in frames.items():
        closed = frame.loc[frame[R.ANSWER_TYPE] == "closed", R.CANDIDATES]
        out[split] = {"closed_acc": expected_chance_accuracy(closed.tolist())}
    return out


def question_key(question: str) -> str:
    """Questions count as "the same" up to case and surrounding whitespace."""
    return " ".join(str(question).lower().split())


def most_frequent_answers(train: pd.DataFrame) -> dict[str, str]:
    """For each training question text, its most frequent answer.

    Ties are broken by the alphabetically first answer, so the baseline is deterministic.
    """
    counts = (
        train.assign(_q=train[R.QUESTION].map(question_key))
        .groupby(["_q", R.ANSWER])
        .size()
        .reset_index(name="n")
        .sort_values(["_q", "n", R.ANSWER], ascending=[True, False, True])
    )
    return dict(counts.drop_duplicates("_q")[["_q", R.ANSWER]].itertuples(index=False, name=None))


def most_frequent_predictions(
    train: pd.DataFrame, frame: pd.DataFrame
) -> tuple[pd.DataFrame, float]:
    """Predictions for `frame` (empty where the question never occurs in training), coverage."""
    table = most_frequent_answers(train)
    keys = frame[R.QUESTION].map(question_key)
    seen = keys.isin(table.keys())
    preds = frame.assign(prediction=keys.map(table).fillna(""))
    return preds, float(seen.mean()) if len(frame) else float("nan")
