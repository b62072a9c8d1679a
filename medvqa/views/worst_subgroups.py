"""Worst subgroups: per metadata field, the group whose closed accuracy falls furthest below
the rest of its split, which the `subgroups` metric family computes; this view only shows it."""

from __future__ import annotations

from medvqa.views.base import Presentation, View


class WorstSubgroups(View):
    name = "worst subgroups"
    title = "Worst subgroups"
    order = 50
    family = "subgroups"
    presentation = Presentation(
        r"^(?P<split>SPLIT)/subgroups_(?P<what>[^=/]+)_(?P<stat>worst_gap)$",
        {"worst_gap": "worst gap"},
        "Per metadata field, the most negative gap between a group's closed accuracy and the "
        "rest of the split (metric=subgroups; p- and q-values per group are in results.json). "
        "Compare a method's row with the zero-shot base's: a more negative gap means "
        "fine-tuning widened it.",
    )
