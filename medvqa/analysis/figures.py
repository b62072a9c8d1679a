"""The study's figures (docs/metrics.md): RR per method and shift, method rank by RR, std between
shifts vs std between methods, corruption vs realistic shifts, and per-category heatmaps.

Built with matplotlib's object API (`Figure`, Agg canvas): no pyplot state and no display, so
the report renders the same on a headless cluster node. Each figure is saved as PNG (for the
HTML report and W&B) and PDF (for a paper); figures whose data do not exist (one shift only,
no corruption shift, no breakdown) are skipped and the reason is returned instead.
"""

from __future__ import annotations

import logging
import math
import re
import textwrap
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from medvqa.analysis.methods import method_sort_key
from medvqa.analysis.paired import scored_table
from medvqa.analysis.tables import select_rows, slug
from medvqa.data import records as R
from medvqa.generation.passes.base import prediction_path
from medvqa.generation.passes.zero_shot import ZERO_SHOT
from medvqa.scoring.metrics.calibration import CalibrationMetric, risk_coverage
from medvqa.scoring.pipeline import SCORES_FILE, scores_path
from medvqa.views import SPLIT_LABELS
from medvqa.views.reliance import QUADRANTS

log = logging.getLogger(__name__)

RR_COLUMNS = {"closed": "closed RR", "open": "open RR"}
# `<split>/<field>=<value>/<score>`: the breakdown metric names of medvqa.scoring.
_BREAKDOWN = re.compile(r"^(test_iid|test_ood)/([^/=]+)=([^/]+)/([^/]+)$")


def save(fig: Figure, out_dir: Path, name: str) -> Path:
    """PNG and PDF side by side; returns the PNG path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    png = out_dir / f"{slug(name)}.png"
    fig.savefig(png, dpi=120, bbox_inches="tight")
    fig.savefig(png.with_suffix(".pdf"), bbox_inches="tight")
    return png


def wrapped(labels: Iterable[object], width: int = 36) -> list[str]:
    """Tick labels on lines of at most `width` characters: a variant's label on one line
    (`LoRA [data.limit.train=32, peft.lr=0.0001, peft.target_modules=...]`) is wider than a
    panel, and constrained layout then shrinks the panel's axes to nothing."""
    return ["\n".join(textwrap.wrap(str(label), width)) or str(label) for label in labels]


def _ordered(frame: pd.DataFrame, methods: Sequence[str] | None = None) -> list[str]:
    """Display names of the frame's methods (or of `methods` among them) in the paper's order,
    sorted by their ids."""
    ids = dict(zip(frame["method"], frame["method_id"], strict=True))
    first = {m: i for i, m in enumerate(dict.fromkeys(frame["method_id"]))}
    names = dict.fromkeys(frame["method"] if methods is None else methods)
    return sorted(names, key=lambda m: method_sort_key(ids[m], first))


def error_bar(cells: pd.DataFrame) -> np.ndarray:
    """std over seeds where there are several, else the single seed's CI half-width, else 0."""
    err = np.where(cells["n"] > 1, cells["std"], cells["ci_half"])
    return np.nan_to_num(err.astype(float), nan=0.0)


def rr_matrix(long: pd.DataFrame, column: str, role: str | None = "method") -> pd.DataFrame:
    """Mean RR, method × table (methods in the paper's order)."""
    part = long[long["column"] == column]
    if role is not None:
        part = part[part["role"] == role]
    matrix = part.pivot_table(index="method", columns="table", values="mean", aggfunc="first")
    return matrix.loc[_ordered(part, list(matrix.index))] if not matrix.empty else matrix


def palette(n: int) -> list[tuple[float, ...]]:
    """n distinct colours: tab10, then tab20, then evenly spaced hues (never a repeat)."""
    if n <= 10:
        return [matplotlib.colormaps["tab10"](i) for i in range(n)]
    if n <= 20:
        return [matplotlib.colormaps["tab20"](i) for i in range(n)]
    return [matplotlib.colormaps["hsv"](i / n) for i in range(n)]


def methods_with_rr(long: pd.DataFrame) -> list[str]:
    """Methods with at least one RR value, in the paper's order. Rows without any (a Δ row)
    get no bar and no legend entry, so the legend lists only what is drawn."""
    with_rr = long[long["column"].isin(RR_COLUMNS.values()) & long["mean"].notna()]
    return _ordered(with_rr)


def rr_bars(long: pd.DataFrame, out_dir: Path) -> Path | str:
    """Grouped bars: one group per shift, one bar per method, whiskers as in the tables."""
    tables = sorted(long["table"].unique())
    methods = methods_with_rr(long)
    if not tables or not methods:
        return "no RR values"
    colours = palette(len(methods))
    fig = Figure(figsize=(max(6.0, 1.2 * len(tables) * max(1, len(methods)) / 3), 6.5))
    width = 0.8 / len(methods)
    x = np.arange(len(tables))
    for i, (kind, column) in enumerate(RR_COLUMNS.items()):
        ax = fig.add_subplot(2, 1, i + 1)
        for j, method in enumerate(methods):
            cells = (
                long[(long["column"] == column) & (long["method"] == method)]
                .set_index("table")
                .reindex(tables)
            )
            ax.bar(
                x + (j - (len(methods) - 1) / 2) * width,
                cells["mean"].to_numpy(dtype=float),
                width,
                yerr=error_bar(cells.fillna({"n": 0})),
                capsize=2,
                label=method,
                color=colours[j],
            )
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_ylabel(f"{kind} RR")
        ax.set_xticks(x, tables if i == 1 else [""] * len(tables), rotation=20, ha="right")
    handles, labels = fig.axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle("Relative robustness (OoD / i.i.d.) per method and shift")
    return save(fig, out_dir, "rr_per_method_and_shift")


def ranks(long: pd.DataFrame) -> pd.DataFrame:
    """Rank of each method by mean RR within each shift (1 = most robust), and the mean rank
    across shifts; fine-tuning methods only (baselines are sanity checks, not contenders)."""
    frames = []
    for kind, column in RR_COLUMNS.items():
        matrix = rr_matrix(long, column)
        if matrix.empty:
            continue
        rank = matrix.rank(axis=0, ascending=False, method="average")
        rank["mean rank"] = rank.mean(axis=1, skipna=True)
        frames.append(rank.reset_index().assign(score=kind))
    if not frames:
        return pd.DataFrame(columns=["score", "method", "mean rank"])
    out = pd.concat(frames, ignore_index=True)
    return out[["score", "method", *[c for c in out.columns if c not in ("score", "method")]]]


def text_colour(rgba: Sequence[float]) -> str:
    """Black or white, whichever contrasts more with a cell of colour `rgba` (WCAG 2's relative
    luminance and contrast ratio): a heatmap's numbers stay readable on every colour of its
    map, light or dark."""

    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(float(c)) for c in rgba[:3])
    lum = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return "black" if (lum + 0.05) / 0.05 >= 1.05 / (lum + 0.05) else "white"


def annotate_cells(ax: Any, im: Any, data: np.ndarray, fmt: str, fontsize: float = 8) -> None:
    """Each cell's value (`fmt`) at its centre, coloured for its cell (`text_colour`)."""
    for (r, c), v in np.ndenumerate(data):
        if not math.isnan(v):
            colour = text_colour(im.cmap(im.norm(v)))
            ax.text(c, r, format(v, fmt), ha="center", va="center", color=colour, size=fontsize)


def rank_figure(rank: pd.DataFrame, out_dir: Path) -> Path | str:
    """Heatmap of ranks (method × shift, plus the mean rank), closed and open side by side.
    Constrained layout keeps the rotated shift names and the colour bars inside the figure and
    clear of each other."""
    if rank.empty:
        return "no RR values to rank"
    scores = list(dict.fromkeys(rank["score"]))
    fig = Figure(
        figsize=(5.5 * len(scores), 0.5 * rank["method"].nunique() + 2.5), layout="constrained"
    )
    for i, score in enumerate(scores):
        part = rank[rank["score"] == score].set_index("method").drop(columns="score")
        part = part.dropna(axis=1, how="all")
        ax = fig.add_subplot(1, len(scores), i + 1)
        data = part.to_numpy(dtype=float)
        im = ax.imshow(data, cmap="viridis_r", aspect="auto")
        annotate_cells(ax, im, data, ".1f")
        ax.set_xticks(range(part.shape[1]), part.columns, rotation=30, ha="right", fontsize=8)
        ax.set_yticks(range(part.shape[0]), wrapped(part.index), fontsize=8)
        ax.set_title(f"{score} RR rank (1 = most robust)")
        fig.colorbar(im, ax=ax, shrink=0.7)
    return save(fig, out_dir, "method_rank_by_rr")


def variance_split(long: pd.DataFrame) -> pd.DataFrame:
    """SURE-VQA's question: does RR vary more between shifts or between methods?

    `between shifts`: for each method, the std (ddof 1) of its mean RR over shifts;
    `between methods`: for each shift, the std of the methods' mean RR. Needs ≥ 2 of each.
    """
    rows = []
    for kind, column in RR_COLUMNS.items():
        matrix = rr_matrix(long, column)
        if matrix.shape[0] < 2 or matrix.shape[1] < 2:
            continue
        for method, std in matrix.std(axis=1, ddof=1).items():
            rows.append({"score": kind, "std of": "between shifts", "over": method, "std": std})
        for table, std in matrix.std(axis=0, ddof=1).items():
            rows.append({"score": kind, "std of": "between methods", "over": table, "std": std})
    return pd.DataFrame(rows, columns=["score", "std of", "over", "std"])


def variance_figure(split: pd.DataFrame, out_dir: Path) -> Path | str:
    if split.empty:
        return "needs at least two shifts and two methods with RR values"
    scores = list(dict.fromkeys(split["score"]))
    fig = Figure(figsize=(4.5 * len(scores), 4))
    for i, score in enumerate(scores):
        ax = fig.add_subplot(1, len(scores), i + 1)
        part = split[split["score"] == score]
        for x, what in enumerate(("between shifts", "between methods")):
            vals = part.loc[part["std of"] == what, "std"].dropna().to_numpy(dtype=float)
            jitter = np.linspace(-0.12, 0.12, len(vals)) if len(vals) > 1 else np.zeros(len(vals))
            ax.scatter(np.full(len(vals), x) + jitter, vals, alpha=0.7)
            if len(vals):
                ax.hlines(vals.mean(), x - 0.25, x + 0.25, color="k")
        ax.set_xticks([0, 1], ["between shifts\n(per method)", "between methods\n(per shift)"])
        ax.set_ylabel(f"std of {score} RR")
        ax.set_xlim(-0.6, 1.6)
    fig.suptitle("Which varies more: shifts or methods? (bar = mean)")
    return save(fig, out_dir, "std_shifts_vs_methods")


def corruption_vs_realistic(long: pd.DataFrame, out_dir: Path) -> Path | str:
    """Mean RR per method over corruption shifts vs over realistic ones (SURE-VQA's contrast)."""
    kinds = long.drop_duplicates("table").set_index("table")["shift_kind"]
    if "corruption" not in set(kinds) or "realistic" not in set(kinds):
        return "needs both corruption (shift name `corruption*`) and realistic shifts"
    fig = Figure(figsize=(9, 4))
    for i, (kind, column) in enumerate(RR_COLUMNS.items()):
        matrix = rr_matrix(long, column)
        ax = fig.add_subplot(1, 2, i + 1)
        if matrix.empty:
            continue
        x = np.arange(len(matrix.index))
        for j, group in enumerate(("realistic", "corruption")):
            cols = [t for t in matrix.columns if kinds.get(t) == group]
            part = matrix[cols]
            ax.bar(
                x + (j - 0.5) * 0.4,
                part.mean(axis=1).to_numpy(dtype=float),
                0.4,
                yerr=np.nan_to_num(part.std(axis=1, ddof=1).to_numpy(dtype=float)),
                capsize=2,
                label=f"{group} ({len(cols)} shifts)",
            )
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xticks(x, matrix.index, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(f"{kind} RR (mean ± std over shifts)")
        ax.legend(fontsize=7)
    return save(fig, out_dir, "corruption_vs_realistic")


def breakdown_cells(frame: pd.DataFrame) -> pd.DataFrame:
    """Per table, field, value, method and score: mean over seeds of the OoD score and of its
    RR (per seed OoD / i.i.d., where the value occurs in both test splits)."""
    rows = select_rows(frame, warn=False)
    if rows.empty:
        return pd.DataFrame()
    rows = rows[rows["status"] == "finished"]
    out = []
    for _, run in rows.iterrows():
        scores = {run["primary_closed"]: "closed", run["primary_open"]: "open"}
        for key in run.index:
            m = _BREAKDOWN.match(str(key))
            if not m or m.group(1) != R.TEST_OOD or m.group(4) not in scores:
                continue
            ood = float(run[key]) if pd.notna(run[key]) else math.nan
            iid_key = f"test_iid/{m.group(2)}={m.group(3)}/{m.group(4)}"
            iid = float(run[iid_key]) if iid_key in run and pd.notna(run[iid_key]) else math.nan
            rr = ood / iid if iid and not math.isnan(iid) and not math.isnan(ood) else math.nan
            out.append(
                {
                    "table": run["table"],
                    "method": run["method"],
                    "method_id": run["method_id"],
                    "field": m.group(2),
                    "value": m.group(3),
                    "score": scores[m.group(4)],
                    "ood": ood,
                    "rr": rr,
                }
            )
    if not out:
        return pd.DataFrame()
    cells = pd.DataFrame(out)
    return cells.groupby(
        ["table", "field", "value", "score", "method_id", "method"], as_index=False
    )[["ood", "rr"]].mean()


def breakdown_heatmaps(frame: pd.DataFrame, out_dir: Path) -> dict[str, Path]:
    """One figure per (table, breakdown field): value × method heatmaps of the OoD score and
    its RR, for the closed and open headline scores (panels without values are left out)."""
    cells = breakdown_cells(frame)
    figures: dict[str, Path] = {}
    if cells.empty:
        return figures
    for (table, field), part in cells.groupby(["table", "field"]):
        panels = []
        for score in ("closed", "open"):
            for what, label in (("ood", "OoD"), ("rr", "RR")):
                mat = part[part["score"] == score].pivot_table(
                    index="value", columns="method", values=what, aggfunc="first"
                )
                if not mat.empty and mat.notna().any().any():
                    mat = mat[_ordered(part, list(mat.columns))]
                    panels.append((f"{score} {label}", mat))
        if not panels:
            continue
        n_values = max(m.shape[0] for _, m in panels)
        # Two panels a row (closed above open): a page shows the figure near its own size, so
        # the cell values stay legible. Constrained layout gives each panel's colour bar and the
        # next panel's value names their own room (never drawn over each other), and keeps the
        # method names whole.
        n_cols, n_rows = min(2, len(panels)), math.ceil(len(panels) / 2)
        fig = Figure(
            figsize=(4.8 * n_cols, (0.45 * n_values + 2.2) * n_rows + 0.4), layout="constrained"
        )
        for i, (title, mat) in enumerate(panels):
            ax = fig.add_subplot(n_rows, n_cols, i + 1)
            data = mat.to_numpy(dtype=float)
            im = ax.imshow(data, cmap="magma", aspect="auto", vmin=0)
            annotate_cells(ax, im, data, ".2f")
            ax.set_xticks(
                range(mat.shape[1]), wrapped(mat.columns), rotation=30, ha="right", fontsize=8
            )
            ax.set_yticks(range(mat.shape[0]), mat.index, fontsize=8)
            ax.set_title(title, fontsize=9)
            fig.colorbar(im, ax=ax, shrink=0.7)
        fig.suptitle(f"{table}: by {field}")
        name = f"breakdown_{table}_{field}"
        figures[name] = save(fig, out_dir, name)
    return figures


# --- beyond accuracy ---------------------------------------------------------------------------

_QUADRANT = re.compile(
    r"^(test_iid|test_ood)/reliance_([a-z]+)_closed_(" + "|".join(QUADRANTS) + ")$"
)
_GROUP_SCORE = re.compile(r"^(test_iid|test_ood)/subgroups_([^=/]+)=([^/]+)_score$")


def _usable(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows the tables show, of finished (or incomplete) runs and references."""
    rows = select_rows(frame, warn=False)
    return rows[rows["status"].isin(("finished", "incomplete"))] if not rows.empty else rows


def reliance_quadrants(frame: pd.DataFrame, out_dir: Path) -> dict[str, Path]:
    """Per table and counterfactual image mode: each method's closed answers split into the
    four quadrants (right/wrong with the real image × the answer changes under the mode or
    not), i.i.d. and OoD side by side, means over seeds (docs/metrics.md#image-reliance)."""
    found = [(c, *m.groups()) for c in frame.columns if (m := _QUADRANT.match(str(c)))]
    figures: dict[str, Path] = {}
    rows = _usable(frame)
    if not found or rows.empty:
        return figures
    colours = ("#1b7837", "#a6dba0", "#c2a5cf", "#762a83")
    for mode in dict.fromkeys(m for _, _, m, _ in found):
        for table, part in rows.groupby("table", sort=True):
            bars = []
            for method in _ordered(part):
                mine = part[part["method"] == method]
                for split in (R.TEST_IID, R.TEST_OOD):
                    cols = [f"{split}/reliance_{mode}_closed_{q}" for q in QUADRANTS]
                    if all(c in mine for c in cols):
                        shares = mine[cols].apply(pd.to_numeric, errors="coerce").mean()
                        if shares.notna().all():
                            bars.append((f"{method} ({SPLIT_LABELS[split]})", shares.to_numpy()))
            if not bars:
                continue
            fig = Figure(figsize=(7.5, 0.45 * len(bars) + 1.6))
            ax = fig.add_subplot(1, 1, 1)
            left = np.zeros(len(bars))
            for i, (quadrant, colour) in enumerate(zip(QUADRANTS, colours, strict=True)):
                widths = np.array([b[1][i] for b in bars])
                ax.barh(range(len(bars)), widths, left=left, color=colour,
                        label=quadrant.replace("_", ", image-"))  # fmt: skip
                left += widths
            ax.set_yticks(range(len(bars)), wrapped(b[0] for b in bars), fontsize=8)
            ax.invert_yaxis()
            ax.set_xlim(0, 1)
            ax.set_xlabel(f"share of closed answers (right/wrong × changes under {mode} image)")
            ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.25))
            ax.set_title(f"{table}: image reliance ({mode})", fontsize=10)
            name = f"reliance_{table}_{mode}"
            figures[name] = save(fig, out_dir, name)
    return figures


# The region-occlusion figures' panels (`medvqa.views.region_occlusion`) and bars.
_OCCLUSION_STATS = {"changed": "share of answers that change", "acc_drop": "accuracy drop"}
_OCCLUDED = {
    "region": ("#b2182b", "region hidden"),
    "elsewhere": ("#67a9cf", "equal area elsewhere"),
}


def _occlusion_bars(
    part: pd.DataFrame,
) -> list[tuple[str, dict[tuple[str, str], tuple[float, float]]]]:
    """(method (split), {(where, stat): (mean over seeds, its error bar)}) of each method and
    test split that recorded every region-occlusion figure."""
    bars = []
    for method in _ordered(part):
        mine = part[part["method"] == method]
        for split in (R.TEST_IID, R.TEST_OOD):
            cells = {}
            for key in ((w, s) for w in _OCCLUDED for s in _OCCLUSION_STATS):
                column = f"{split}/occlusion_{key[0]}_{key[1]}"
                values = pd.to_numeric(mine.get(column), errors="coerce").dropna()
                if values.empty:
                    break
                half = pd.to_numeric(mine.get(f"{column}_ci_half"), errors="coerce").dropna()
                spread = values.std(ddof=1) if len(values) > 1 else half.mean() if len(half) else 0
                cells[key] = (float(values.mean()), float(spread))
            if len(cells) == len(_OCCLUDED) * len(_OCCLUSION_STATS):
                bars.append((f"{method} ({SPLIT_LABELS[split]})", cells))
    return bars


def region_occlusion(frame: pd.DataFrame, out_dir: Path) -> dict[str, Path]:
    """Per table: each method's answers that change, and its accuracy drop, with the
    question's region hidden and with an equal area elsewhere hidden, i.i.d. and OoD side by
    side; means over seeds ± their std (one seed: its case-bootstrap half-width)
    (docs/metrics.md#region-occlusion)."""
    rows = _usable(frame)
    figures: dict[str, Path] = {}
    if rows.empty or not any(str(c).endswith("/occlusion_region_changed") for c in rows):
        return figures
    for table, part in rows.groupby("table", sort=True):
        bars = _occlusion_bars(part)
        if not bars:
            continue
        fig = Figure(figsize=(9.0, 0.55 * len(bars) + 1.9))
        for k, (stat, label) in enumerate(_OCCLUSION_STATS.items()):
            ax = fig.add_subplot(1, 2, k + 1)
            for j, (where, (colour, name)) in enumerate(_OCCLUDED.items()):
                y = np.arange(len(bars)) + (j - 0.5) * 0.38
                cells = [b[1][(where, stat)] for b in bars]
                ax.barh(y, [c[0] for c in cells], height=0.38, xerr=[c[1] for c in cells],
                        color=colour, label=name, error_kw={"lw": 0.8})  # fmt: skip
            ax.set_yticks(
                range(len(bars)), wrapped(b[0] for b in bars) if k == 0 else [], fontsize=8
            )
            ax.axvline(0, color="grey", lw=0.6)
            if stat == "changed":
                ax.set_xlim(0, 1)
            ax.invert_yaxis()
            ax.set_xlabel(label, fontsize=9)
        fig.axes[0].legend(fontsize=7, loc="upper center", bbox_to_anchor=(1.1, -0.3), ncol=2)
        fig.suptitle(f"{table}: region occlusion", fontsize=10)
        name = f"region_occlusion_{table}"
        figures[name] = save(fig, out_dir, name)
    return figures


def subgroup_forest(frame: pd.DataFrame, out_dir: Path) -> dict[str, Path]:
    """Per table and split: every group's closed accuracy per method (the zero-shot base
    among them), a point per method with its interval (one seed: its case-bootstrap CI; several:
    ± std over seeds), groups of all fields down the page (docs/metrics.md#worst-subgroups)."""
    found = [(c, *m.groups()) for c in frame.columns if (m := _GROUP_SCORE.match(str(c)))]
    figures: dict[str, Path] = {}
    rows = _usable(frame)
    if not rows.empty:  # methods and the zero-shot base, not the extra evaluations and deltas
        rows = rows[rows["kind"].isin(("run", "reference"))]
    if not found or rows.empty:
        return figures
    for split in (R.TEST_IID, R.TEST_OOD):
        groups = [(c, f"{f}={v}") for c, s, f, v in found if s == split]
        if not groups:
            continue
        for table, part in rows.groupby("table", sort=True):
            methods = _ordered(part)
            points = []
            for m, method in enumerate(methods):
                mine = part[part["method"] == method]
                for g, (column, _) in enumerate(groups):
                    values = pd.to_numeric(mine.get(column), errors="coerce").dropna()
                    if values.empty:
                        continue
                    if len(values) > 1:
                        err = float(values.std(ddof=1))
                    else:
                        half = pd.to_numeric(mine.get(f"{column}_ci_half"), errors="coerce")
                        err = float(half.dropna().iloc[0]) if half.notna().any() else 0.0
                    points.append((g, m, float(values.mean()), err))
            if not points:
                continue
            fig = Figure(figsize=(7.0, 0.32 * len(groups) * max(1, len(methods)) ** 0.5 + 1.8))
            ax = fig.add_subplot(1, 1, 1)
            colours = palette(len(methods))
            step = 0.8 / max(1, len(methods))
            for m, method in enumerate(methods):
                mine = [p for p in points if p[1] == m]
                if mine:
                    ys = [p[0] + (m - (len(methods) - 1) / 2) * step for p in mine]
                    ax.errorbar([p[2] for p in mine], ys, xerr=[p[3] for p in mine], fmt="o",
                                ms=3, color=colours[m], label=method, capsize=2)  # fmt: skip
            ax.set_yticks(range(len(groups)), [label for _, label in groups], fontsize=7)
            ax.invert_yaxis()
            ax.set_xlabel(f"closed accuracy of the group ({SPLIT_LABELS[split]})")
            ax.legend(fontsize=7, loc="lower right")
            ax.set_title(f"{table}: subgroups ({SPLIT_LABELS[split]})", fontsize=10)
            name = f"subgroups_{table}_{split}"
            figures[name] = save(fig, out_dir, name)
    return figures


# The zero-shot base's scored table beside a tuned run's (scores_zero_shot.parquet).
ZERO_SHOT_SCORES = scores_path(prediction_path(Path(), ZERO_SHOT)).name


def calibration_curves(frame: pd.DataFrame, out_dir: Path, bins: int = 10) -> dict[str, Path]:
    """Per table: a reliability diagram (accuracy against mean confidence in equal-mass bins)
    and the risk-coverage curve of each method's closed answers, i.i.d. solid and OoD dashed,
    from the runs' scored tables (`metric=calibration`'s per-sample columns; seeds pooled);
    the zero-shot base's from its own scored table (docs/metrics.md#calibration)."""
    conf, right = CalibrationMetric.column("confidence"), CalibrationMetric.column("correct")
    figures: dict[str, Path] = {}
    runs = frame[(frame["kind"] == "run") & frame["status"].isin(("finished", "incomplete"))]
    for table, part in runs.groupby("table", sort=True):
        curves: dict[str, list[pd.DataFrame]] = {}
        for _, row in part.iterrows():
            for name, file in ((row["method"], SCORES_FILE), ("zero-shot base", ZERO_SHOT_SCORES)):
                scored = scored_table(str(row["source"]), file)
                if scored is not None and conf in scored and right in scored:
                    closed = scored[(scored[R.ANSWER_TYPE] == "closed") & scored[right].notna()]
                    curves.setdefault(name, []).append(closed)
        if not curves:
            continue
        fig = Figure(figsize=(10, 4.2))
        reliability, coverage = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
        reliability.plot([0, 1], [0, 1], color="grey", lw=0.8)
        colours = dict(zip(curves, palette(len(curves)), strict=True))
        for name, parts in curves.items():
            rows = pd.concat(parts, ignore_index=True)
            for split, style in ((R.TEST_IID, "-"), (R.TEST_OOD, "--")):
                mine = rows[rows[R.SPLIT] == split]
                c, y = mine[conf].to_numpy(float), mine[right].to_numpy(float)
                if not len(c) or np.isnan(c).any():
                    continue  # a row without a confidence: no curve from the others
                order = np.argsort(c, kind="mergesort")
                cuts = np.array_split(order, min(bins, len(order)))
                label = f"{name} ({SPLIT_LABELS[split]})"
                reliability.plot([c[b].mean() for b in cuts], [y[b].mean() for b in cuts],
                                 style, marker="o", ms=3, color=colours[name], label=label)  # fmt: skip
                risk = risk_coverage(c, y)
                coverage.plot(np.arange(1, len(risk) + 1) / len(risk), risk, style,
                              color=colours[name], label=label)  # fmt: skip
        reliability.set(xlabel="mean confidence (equal-mass bins)", ylabel="accuracy",
                        xlim=(0, 1), ylim=(0, 1), title="reliability")  # fmt: skip
        coverage.set(xlabel="coverage (most confident first)", ylabel="error rate",
                     xlim=(0, 1), title="risk-coverage")  # fmt: skip
        coverage.legend(fontsize=7)
        fig.suptitle(f"{table}: calibration of closed answers")
        name = f"calibration_{table}"
        figures[name] = save(fig, out_dir, name)
    return figures
