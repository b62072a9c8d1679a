"""Score the evaluation splits' predictions and compute relative robustness."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from medvqa.data.records import SPLIT
from medvqa.evaluation.robustness import robustness_metrics
from medvqa.evaluation.scoring import (
    Metric,
    counters,
    headline_intervals,
    score_frame,
    scores_path,
    write_scores,
)

log = logging.getLogger(__name__)

IID, OOD = "test_iid", "test_ood"
# Counts, error rates, interval bounds and reference levels are not performances: no
# robustness ratio or delta for them.
_NOT_PERFORMANCE_SUFFIXES = (
    "_n",
    "n_open",
    "n_closed",
    "_n_valid",
    "invalid_rate",
    "_failures",
    "_ci_lo",
    "_ci_hi",
    "_ci_half",
    "random_baseline",
)


def is_performance(key: str) -> bool:
    """Whether a score (last path part of a metric name) is a performance that RR applies to."""
    name = key.rsplit("/", 1)[-1]
    return not (name == "n" or name.endswith(_NOT_PERFORMANCE_SUFFIXES))


def prefixed(prefix: str, scores: Mapping[str, float]) -> dict[str, float]:
    return {f"{prefix}{k}": v for k, v in scores.items()}


def split_metrics(
    scores_by_split: Mapping[str, Mapping[str, float]], evaluation_cfg: Any
) -> dict[str, float]:
    """`split/metric` names plus `robustness/rr_*` when both test splits are present."""
    metrics: dict[str, float] = {}
    for split, scores in scores_by_split.items():
        metrics.update(prefixed(f"{split}/", scores))
    if IID in scores_by_split and OOD in scores_by_split:
        iid, ood = scores_by_split[IID], scores_by_split[OOD]
        keys = [k for k in iid if "/" not in k and is_performance(k)]
        primary = {
            name: key
            for name, key in (
                ("closed", evaluation_cfg.primary_closed),
                ("open", evaluation_cfg.primary_open),
            )
            if key in iid and key in ood
        }
        metrics.update(prefixed("robustness/", robustness_metrics(iid, ood, keys, primary)))
    return metrics


def score_splits(
    predictions: Mapping[str, pd.DataFrame],
    metrics: Sequence[Metric],
    evaluation_cfg: Any,
    out_path: Path,
) -> tuple[dict[str, float], pd.DataFrame]:
    """Scores and RR of every split's predictions (generated into the JSONL `out_path`).

    Scores come from every selected metric family; their counters (e.g. `judge/calls`) are
    added once, after all splits. The scored table goes next to the predictions
    (`scores.parquet` for `predictions.jsonl`).
    """
    scores: dict[str, dict[str, float]] = {}
    scored_by_split = {}
    for split, preds in predictions.items():
        scored, scores[split] = score_frame(preds, metrics, list(evaluation_cfg.breakdown))
        scored_by_split[split] = scored.assign(**{SPLIT: split})
    results = {
        **split_metrics(scores, evaluation_cfg),
        **headline_intervals(scored_by_split, scores, metrics, evaluation_cfg),
        **counters(metrics),
    }
    for name in ("closed", "open"):
        key = evaluation_cfg[f"primary_{name}"]
        if not any(key in split_scores for split_scores in scores.values()):
            log.warning(
                "evaluation.primary_%s=%s is not a score of the selected metric families, so "
                "there is no headline %s score or RR: add the family that computes it to "
                "`metric` (e.g. judge for judge_* scores) or pick another headline "
                "(headline=tokens).",
                name,
                key,
                name,
            )
    scored = pd.concat(scored_by_split.values(), ignore_index=True)
    write_scores(scored, scores_path(out_path))
    return results, scored


def deltas(main: Mapping[str, float], other: Mapping[str, float], prefix: str) -> dict[str, float]:
    """`prefix + key` = main - other for the per-split performance numbers both runs have."""
    return {
        f"{prefix}{key}": main[key] - other[key]
        for key in main
        if key in other and key.split("/", 1)[0] in (IID, OOD) and is_performance(key)
    }


def finite(metrics: Mapping[str, float]) -> dict[str, float]:
    """Drop NaN/inf (loggers reject them; results.json keeps them as null)."""
    return {
        k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)
    }
