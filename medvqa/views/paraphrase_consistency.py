"""Paraphrase consistency: whether questions that ask the same in other words (rows sharing a
`paraphrase_group`) get answers that agree (`medvqa.views.consistency`,
docs/metrics.md)."""

from __future__ import annotations

import pandas as pd

from medvqa.data import records as R
from medvqa.views import consistency
from medvqa.views.base import CORRECT, JobRows, Presentation, View


class ParaphraseConsistency(View):
    name = "paraphrase consistency"
    title = "Paraphrase consistency"
    order = 20
    columns = CORRECT
    presentation = Presentation(
        r"^(?P<split>SPLIT)/consistency_paraphrase_(?P<what>closed|open)_"
        r"(?P<stat>flip_rate|both_correct)$",
        {"flip_rate": "flips", "both_correct": "both right"},
        "Pairs of questions that ask the same in other words (a paraphrase group). flips: the "
        "share of pairs whose answers differ in meaning (closed: the chosen candidate); both "
        "right: the share right both times. i.i.d.~OoD: pairs with one question in each split.",
    )

    def applies(self, rows: JobRows) -> bool:
        group = rows.main.get(R.PARAPHRASE_GROUP)
        return group is not None and bool(group.notna().any())

    def apply(self, rows: JobRows) -> tuple[pd.DataFrame, dict[str, float]]:
        main = consistency.add_agreement(rows.main)
        splits = list(dict.fromkeys(main[R.SPLIT])) if R.SPLIT in main.columns else []
        return main, consistency.consistency_metrics(main, splits, rows.bootstrap)
