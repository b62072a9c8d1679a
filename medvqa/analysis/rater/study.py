"""What every step of the rater study shares: the file names of an export, the rating sheet's
columns and score scale, the error for unusable input, and `Study` (items with ratings)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from medvqa.scoring.metrics.judge import JUDGE_SCORE, JUROR_SEP

__all__ = [
    "ITEMS",
    "JUDGES",
    "SCORE_RANGE",
    "SHEET_COLUMNS",
    "SHEET_CSV",
    "SHEET_HTML",
    "RatingError",
    "Study",
]

ITEMS = "items.jsonl"
# The key of an item in items.jsonl naming its metrics that are judges' scores: on the raters'
# 1-5 scale, so their chance-corrected agreement with the raters is reported too.
JUDGES = "judge_metrics"
SHEET_CSV = "rating_sheet.csv"
SHEET_HTML = "rating_sheet.html"
SHEET_COLUMNS = ("id", "question", "ground_truth", "prediction", "score")
SCORE_RANGE = (1, 5)


class RatingError(ValueError):
    """A ratings file or items file that cannot be used as it is."""


@dataclass
class Study:
    """Items with their metric scores and the validated ratings (one column per rater)."""

    items: pd.DataFrame
    ratings: pd.DataFrame

    @property
    def metrics(self) -> list[str]:
        return [c.removeprefix("metric:") for c in self.items.columns if c.startswith("metric:")]

    @property
    def judges(self) -> list[str]:
        """The metrics that are judges' scores (what the export named; for an export from
        before it did, `judge_score` and each juror's `judge_score@<juror>`)."""
        if JUDGES in self.items and len(self.items):
            named = self.items[JUDGES].iloc[0]
            return [m for m in named if m in self.metrics]
        return [m for m in self.metrics if m.split(JUROR_SEP, 1)[0] == JUDGE_SCORE]

    def metric(self, name: str) -> pd.Series:
        return pd.to_numeric(self.items[f"metric:{name}"], errors="coerce")

    @property
    def human(self) -> pd.Series:
        """Mean score over raters per item."""
        return self.ratings.mean(axis=1)
