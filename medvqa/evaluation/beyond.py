"""The views beyond accuracy that compare a run's answers with each other, row by row
(docs/metrics.md#image-reliance and the sections after it): image reliance (against the
counterfactual image modes' answers), paraphrase consistency (rows that share a paraphrase
group), option-order flips (against the reordered options' answers) and temperature scaling
(fitted on the validation answers, where the run has them). The metric families score one
predictions file at a time; these need several, or several splits, at once.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from medvqa.data import records as R
from medvqa.evaluation.consistency import (
    add_agreement,
    consistency_metrics,
    order_flips,
    order_metrics,
)
from medvqa.evaluation.families.calibration import CalibrationMetric, temperature_metrics
from medvqa.evaluation.reliance import add_reliance, reliance_metrics
from medvqa.evaluation.scoring import scores_path, write_scores


def beyond_accuracy(
    scored: MutableMapping[str, pd.DataFrame],
    predictions: Path,
    extra_images: Sequence[str] = (),
    breakdown: Sequence[str] = (),
    bootstrap: Mapping[str, Any] | None = None,
    families: Sequence[Any] = (),
) -> dict[str, float]:
    """The figures of every view the run's answers allow. `scored`: metric prefix -> scored
    table ("" the main answers, `<mode>/` an extra image mode's, `order<k>/` a reordering's);
    the views' per-sample columns join `scored[""]`, which is written again to the scores file
    of `predictions`. `bootstrap`: `cluster_bootstrap`'s options, None for no intervals."""
    main = scored[""]
    main, modes = add_reliance(main, {m: scored[f"{m}/"] for m in extra_images})
    out = reliance_metrics(main, modes, list(breakdown), bootstrap)
    main = add_agreement(main)
    splits = list(dict.fromkeys(main[R.SPLIT])) if R.SPLIT in main.columns else []
    out.update(consistency_metrics(main, splits, bootstrap))
    main, _ = order_flips(main, scored)
    out.update(order_metrics(main, bootstrap))
    for family in families:
        if isinstance(family, CalibrationMetric):
            main, fitted = temperature_metrics(main, family)
            out.update(fitted)
    if main is not scored[""]:
        scored[""] = main
        write_scores(main, scores_path(predictions))
    return out
