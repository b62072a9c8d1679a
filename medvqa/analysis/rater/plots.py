"""The rater study's figures: heatmaps of the correlations and, for the judges, the agreement
(mean human and each rater vs each metric, the raters' own agreement as the ceiling) and scatter
plots of the human score against each metric."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from medvqa.analysis.rater.study import SCORE_RANGE, Study

__all__ = ["figures"]


def figures(study: Study, table: pd.DataFrame, out: Path) -> list[Path]:
    """Heatmaps and scatter plots of `study` and its `correlation_table`, written to `out`
    (Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    human = table.loc[table["kind"] == "human_vs_metric"].set_index("b")
    return [
        _agreement_heatmap(plt, study, table, human, out),
        _rater_heatmap(plt, study, table, human, out),
        _scatter(plt, study, human, out),
    ]


def _agreement_heatmap(
    plt: Any, study: Study, table: pd.DataFrame, human: pd.DataFrame, out: Path
) -> Path:
    """The mean human score against each metric under four statistics. The judges' agreement
    with people is only defined on the raters' scale (n/a for the token metrics); the raters'
    own agreement, the last row, is the ceiling."""
    metrics = study.metrics
    stats = ["kendall_tau_b", "spearman_rho", "weighted_kappa", "alpha"]
    grid = human.loc[metrics, stats].to_numpy(float)
    rows = list(metrics)
    ceiling = table.loc[table["kind"] == "rater_pairs_mean"]
    if not ceiling.empty:
        grid = np.vstack([grid, ceiling[stats].to_numpy(float)[:1]])
        rows.append("raters (ceiling)")
    return _heatmap(
        plt,
        grid,
        rows,
        ["Kendall τ-b", "Spearman ρ", "weighted κ", "Krippendorff α"],
        "Mean human score vs metric",
        out / "heatmap.png",
    )


def _rater_heatmap(
    plt: Any, study: Study, table: pd.DataFrame, human: pd.DataFrame, out: Path
) -> Path:
    """Kendall's τ-b of each rater, and of their mean (the last row), against each metric:
    whether a metric follows every rater or only their average."""
    metrics = study.metrics
    per_rater = table.loc[table["kind"] == "rater_vs_metric"]
    raters = list(study.ratings.columns)
    grid = np.array(
        [
            [
                per_rater.loc[(per_rater["a"] == r) & (per_rater["b"] == m), "kendall_tau_b"].iloc[
                    0
                ]
                for m in metrics
            ]
            for r in raters
        ]
        + [list(human.loc[metrics, "kendall_tau_b"])],
        dtype=float,
    )
    return _heatmap(
        plt,
        grid,
        [*raters, "mean"],
        metrics,
        "Kendall τ-b: rater vs metric",
        out / "heatmap_raters.png",
    )


def _scatter(plt: Any, study: Study, human: pd.DataFrame, out: Path) -> Path:
    """The mean human score against each metric, one panel per metric, titled with its τ-b
    and ρ: what a correlation hides (ties, a floor) shows here."""
    metrics = study.metrics
    cols = min(3, len(metrics))
    rows = math.ceil(len(metrics) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.4 * rows), squeeze=False)
    for ax, metric in zip(axes.flat, metrics, strict=False):
        ax.scatter(study.metric(metric), study.human, alpha=0.6, s=18)
        stats_row = human.loc[metric]
        ax.set_title(
            f"{metric}\nτ-b {stats_row['kendall_tau_b']:.2f}, ρ {stats_row['spearman_rho']:.2f}",
            fontsize=9,
        )
        ax.set_xlabel(metric)
        ax.set_ylabel("mean human score")
        ax.set_ylim(SCORE_RANGE[0] - 0.3, SCORE_RANGE[1] + 0.3)
    for ax in list(axes.flat)[len(metrics) :]:
        ax.axis("off")
    fig.tight_layout()
    path = out / "scatter.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _heatmap(
    plt: Any, grid: np.ndarray, rows: list[str], cols: list[str], title: str, path: Path
) -> Path:
    fig, ax = plt.subplots(
        figsize=(1.2 + 1.1 * len(cols), 1.0 + 0.45 * len(rows)), constrained_layout=True
    )
    image = ax.imshow(np.ma.masked_invalid(grid), cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
    ax.set_xticks(range(len(cols)), cols, rotation=45, ha="right")
    ax.set_yticks(range(len(rows)), rows)
    for (i, j), value in np.ndenumerate(grid):
        ax.text(j, i, "n/a" if np.isnan(value) else f"{value:.2f}", ha="center", va="center")
    ax.set_title(title)
    fig.colorbar(image, ax=ax)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
