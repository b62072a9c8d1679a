"""A jury's verdict on each item from its jurors' scores (`judge.jury`, docs/judge.md).

Every rule here keeps the house rule for failed judgments: an item one juror could not judge
has no verdict (NaN), never the verdict of the jurors who did answer, since a dead juror would
otherwise hand the jury to the survivors without anyone noticing.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from medvqa.judge.config import JURY_VERDICTS

__all__ = ["VERDICTS", "jury_verdict"]


def _majority(scores: np.ndarray) -> np.ndarray:
    """The score more than half the jurors gave; where none did (an even jury split in two,
    three different multilabel grades) the median, so a tie is the midpoint, not a coin."""
    out = np.median(scores, axis=1)
    for i, row in enumerate(scores):
        values, counts = np.unique(row, return_counts=True)
        top = counts.argmax()
        if counts[top] * 2 > len(row):
            out[i] = values[top]
    return out


VERDICTS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "majority": _majority,
    "median": lambda scores: np.median(scores, axis=1),
    "mean": lambda scores: scores.mean(axis=1),
}
if set(VERDICTS) != set(JURY_VERDICTS):  # the names are declared once, in config.py
    raise RuntimeError(f"jury verdicts {sorted(VERDICTS)} differ from {JURY_VERDICTS}")


def jury_verdict(scores: np.ndarray, rule: str) -> np.ndarray:
    """The verdict per row of `scores` (items x jurors) under `rule` (one of `VERDICTS`); NaN
    for a row where any juror's score is NaN (that juror failed the item)."""
    scores = np.asarray(scores, dtype=float)
    if scores.ndim != 2:
        raise ValueError(f"jury scores must be items x jurors, got shape {scores.shape}")
    out = np.full(scores.shape[0], np.nan)
    complete = ~np.isnan(scores).any(axis=1)
    if complete.any():
        out[complete] = VERDICTS[rule](scores[complete])
    return out
