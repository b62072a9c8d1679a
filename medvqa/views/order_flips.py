"""Option-order flips: closed questions asked again with their options in other seeded orders
(`data.option_orders`), against the main answers (`medvqa.views.consistency`)."""

from __future__ import annotations

import pandas as pd

from medvqa.generation.passes import OptionOrder
from medvqa.views import consistency
from medvqa.views.base import JobRows, Presentation, View


class OrderFlips(View):
    name = "option-order flips"
    title = "Option-order invariance"
    order = 30
    columns = (consistency.CHOICE,)
    presentation = Presentation(
        r"^(?P<split>SPLIT)/consistency_order_(?P<what>closed)_(?P<stat>flip_rate)$",
        {"flip_rate": "flips"},
        "Closed questions asked again with their options in other seeded orders "
        "(data.option_orders): the mean share of reorderings that change the chosen answer "
        "(its meaning, not its position).",
    )

    def applies(self, rows: JobRows) -> bool:
        return bool(rows.of(OptionOrder))

    def apply(self, rows: JobRows) -> tuple[pd.DataFrame, dict[str, float]]:
        orders = {p.prefix: rows.others[p.prefix] for p in rows.of(OptionOrder)}
        main, _ = consistency.order_flips(rows.main, orders)
        return main, consistency.order_metrics(main, rows.bootstrap)
