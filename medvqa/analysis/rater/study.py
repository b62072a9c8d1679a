"""What every step of the rater study shares: the file names of an export, the rating sheet's
columns and score scale, the error for unusable input, and `Study` (items with ratings)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

__all__ = [
    "ITEMS",
    "SCORE_RANGE",
    "SHEET_COLUMNS",
    "SHEET_CSV",
    "SHEET_HTML",
    "RatingError",
    "Study",
]

ITEMS = "items.jsonl"
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

    def metric(self, name: str) -> pd.Series:
        return pd.to_numeric(self.items[f"metric:{name}"], errors="coerce")

    @property
    def human(self) -> pd.Series:
        """Mean score over raters per item."""
        return self.ratings.mean(axis=1)
