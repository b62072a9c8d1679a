"""Calibration: how sure the model was against whether it was right (ECE, Brier, AURC), which
the `calibration` metric family computes over a job's answers; this view only shows it."""

from __future__ import annotations

from medvqa.views.base import Presentation, View


class Calibration(View):
    name = "calibration"
    title = "Calibration"
    order = 40
    family = "calibration"
    presentation = Presentation(
        r"^(?P<split>SPLIT)/calibration_closed_(?P<what>)(?P<stat>ece|brier|aurc|acc_at_50)$",
        {"ece": "ECE", "brier": "Brier", "aurc": "AURC", "acc_at_50": "acc@50%"},
        "Closed questions; confidence: the probability of the generated answer. ECE over "
        "equal-mass bins, Brier score and area under the risk-coverage curve (lower is better); "
        "acc@50%: accuracy of the half the model is surest of.",
    )
