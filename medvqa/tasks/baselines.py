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

from medvqa.analysis.methods import method_name
from medvqa.generation.passes import RECORD_KEY, Main
from medvqa.provenance import add_metrics
from medvqa.scoring.baselines import chance_scores, most_frequent_predictions
from medvqa.scoring.pipeline import Scoring, scores_path, split_metrics
from medvqa.tasks.common import prepare_splits, report_run


def most_frequent(
    cfg: DictConfig,
    out_dir: Path,
    loggers: Sequence[Logger] = (),
    provenance: MutableMapping[str, Any] | None = None,
    *,
    eval_splits: Sequence[str],
    prior_splits: Sequence[str],
) -> dict[str, float]:
    """Answer each test question with its most frequent answer in `prior_splits` (the
    training split; RoboSurg-VQA's answer-frequency prior also counts validation); record
    coverage."""
    label = cfg.label or method_name("most_frequent")
    if provenance is not None:  # its answers are the main ones, from no model
        provenance[RECORD_KEY] = [Main(label=label, image_mode="none", tuned=False).record()]
    with Scoring.from_config(cfg.metric, cfg.evaluation) as scoring:
        add_metrics(provenance, scoring.families)
        _, splits = prepare_splits(cfg, out_dir, provenance=provenance)
        allowed = [s for s in splits.frames if s not in eval_splits]
        unknown = [s for s in prior_splits if s not in allowed]
        if unknown:
            raise ValueError(
                f"task.prior_splits: {unknown} are not splits the answers may come from (never "
                f"an evaluated split); choose among {allowed}."
            )
        prior = pd.concat([splits[s] for s in prior_splits], ignore_index=True)
        predictions, coverage = {}, {}
        for split in eval_splits:
            preds, share = most_frequent_predictions(prior, splits[split])
            predictions[split], coverage[split] = preds, {"coverage": share}
        out = out_dir / "predictions.jsonl"
        metrics, table = scoring.score(predictions, scores_path(out), extra=coverage)
        table.to_json(out, orient="records", lines=True)
    report_run(cfg, out_dir, loggers, metrics, [(label, "")])
    return metrics


def chance(
    cfg: DictConfig,
    out_dir: Path,
    loggers: Sequence[Logger] = (),
    provenance: MutableMapping[str, Any] | None = None,
    *,
    eval_splits: Sequence[str],
) -> dict[str, float]:
    """Expected accuracy of a uniform guess among each closed question's candidates."""
    if provenance is not None:
        provenance[RECORD_KEY] = []  # scored, never generated
    _, splits = prepare_splits(cfg, out_dir, provenance=provenance)
    metrics = split_metrics(chance_scores({s: splits[s] for s in eval_splits}), cfg.evaluation)
    report_run(cfg, out_dir, loggers, metrics, [(cfg.label or method_name("random"), "")])
    return metrics
