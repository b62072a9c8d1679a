"""Image reliance: the main answers against the same questions answered under a counterfactual
image (blank, shuffled, mismatched; `data.extra_eval_images`), closed questions
(`medvqa.views.reliance`, docs/metrics.md#image-reliance)."""

from __future__ import annotations

import pandas as pd

from medvqa.generation.passes import ImageMode
from medvqa.views import reliance
from medvqa.views.base import CORRECT, JobRows, Presentation, View


class ImageReliance(View):
    name = "image reliance"
    title = "Image reliance"
    order = 10
    columns = CORRECT
    presentation = Presentation(
        r"^(?P<split>SPLIT)/reliance_(?P<what>[a-z]+)_closed_(?P<stat>survive|correct_independent)$",
        {"survive": "survive", "correct_independent": "right w/o image"},
        "Closed questions (medvqa.views.reliance). survive <mode>: of the answers right "
        "with the real image, the share still right when the image is <mode> (blank: black; "
        "shuffled: another case's; mismatched: another modality's). right w/o image: the share "
        "of all answers that are right and do not change under <mode> (the 'correct but "
        "image-independent' quadrant). Lower survival means more reliance on the image.",
    )

    def applies(self, rows: JobRows) -> bool:
        return bool(rows.of(ImageMode))

    def apply(self, rows: JobRows) -> tuple[pd.DataFrame, dict[str, float]]:
        main, modes = reliance.add_reliance(
            rows.main, {p.image_mode: rows.others[p.prefix] for p in rows.of(ImageMode)}
        )
        return main, reliance.reliance_metrics(main, modes, rows.breakdown, rows.bootstrap)
