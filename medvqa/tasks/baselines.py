"""Baselines that need no model: most frequent answer and random guessing.

They write the same results.json schema as a model run (`test_iid/closed_acc`, ...,
`robustness/rr_*`), so tables put them in the same rows and columns.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig

from medvqa.data import records as R
from medvqa.evaluation.baselines import chance_scores, most_frequent_predictions
from medvqa.evaluation.evaluate import split_metrics
from medvqa.evaluation.scoring import (
    build_metrics,
    counters,
    headline_intervals,
    score_frame,
    scores_path,
    write_scores,
)
from medvqa.provenance import add_metrics
from medvqa.tasks.common import prepare_splits, report_run


def most_frequent(
    cfg: DictConfig,
    out_dir: Path,
    loggers: Sequence[Logger] = (),
    eval_splits: Sequence[str] = ("test_iid", "test_ood"),
    provenance: MutableMapping[str, Any] | None = None,
    prior_splits: Sequence[str] = ("train",),
) -> dict[str, float]:
    """Answer each test question with its most frequent answer in `prior_splits` (the
    training split; RoboSurg-VQA's answer-frequency prior also counts validation); record
    coverage."""
    metrics_ = build_metrics(cfg.metric)
    add_metrics(provenance, metrics_)
    _, splits = prepare_splits(cfg, out_dir, provenance=provenance)
    allowed = [s for s in splits.frames if s not in eval_splits]
    unknown = [s for s in prior_splits if s not in allowed]
    if unknown:
        raise ValueError(
            f"task.prior_splits: {unknown} are not splits the answers may come from (never an "
            f"evaluated split); choose among {allowed}."
        )
    prior = pd.concat([splits[s] for s in prior_splits], ignore_index=True)
    scores, coverage, scored_by_split = {}, {}, {}
    for split in eval_splits:
        preds, coverage[split] = most_frequent_predictions(prior, splits[split])
        scored, scores[split] = score_frame(preds, metrics_, list(cfg.evaluation.breakdown))
        scored_by_split[split] = scored.assign(**{R.SPLIT: split})
        scores[split]["coverage"] = coverage[split]
    predictions = out_dir / "predictions.jsonl"
    table = pd.concat(scored_by_split.values(), ignore_index=True)
    table.to_json(predictions, orient="records", lines=True)
    write_scores(table, scores_path(predictions))
    metrics = {
        **split_metrics(scores, cfg.evaluation),
        **headline_intervals(scored_by_split, scores, metrics_, cfg.evaluation),
        **counters(metrics_),
    }
    report_run(cfg, out_dir, loggers, metrics, [(cfg.label or "most frequent answer", "")])
    return metrics


def chance(
    cfg: DictConfig,
    out_dir: Path,
    loggers: Sequence[Logger] = (),
    eval_splits: Sequence[str] = ("test_iid", "test_ood"),
    provenance: MutableMapping[str, Any] | None = None,
) -> dict[str, float]:
    """Expected accuracy of a uniform guess among each closed question's candidates."""
    _, splits = prepare_splits(cfg, out_dir, provenance=provenance)
    metrics = split_metrics(chance_scores({s: splits[s] for s in eval_splits}), cfg.evaluation)
    report_run(cfg, out_dir, loggers, metrics, [(cfg.label or "random (1/k)", "")])
    return metrics
