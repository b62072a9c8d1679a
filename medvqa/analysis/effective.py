"""Robustness that a weak model cannot win: effective robustness (docs/metrics.md#effective-
robustness).

RR = OoD / i.i.d. rewards a low i.i.d. score: a model that learned little loses little (the
synthetic demo's untuned base ranks most robust with a closed i.i.d. accuracy of 0.27; SURE-VQA
warns about this for population shifts). Effective robustness (Taori et al. 2020, "Measuring
robustness to natural distribution shifts in image classification"; Miller et al. 2021,
"Accuracy on the line") asks instead how far a model's OoD score lies above what its i.i.d.
score predicts: per table (shift) and score kind, a line is fitted through every run's (i.i.d.,
OoD) point, on logit axes for scores in [0, 1] as Taori et al. do (values clipped to
[`CLIP`, 1 − `CLIP`]) and on the scores' own axes otherwise; a method's effective robustness is
its mean OoD score minus the line's value at its mean i.i.d. score, with the interval of the
fitted line there (statsmodels OLS, `get_prediction`). A method on the line is exactly as robust
as its i.i.d. score predicts; above it, more.

Beside every ranking by RR the report notes where the most robust method is also the weakest
i.i.d. (`weak_but_robust`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from medvqa.analysis.tables import USABLE, role

# (score kind, its i.i.d., OoD and RR columns of the tidy run table)
KINDS = {
    "closed": ("closed i.i.d.", "closed OoD", "closed RR"),
    "open": ("open i.i.d.", "open OoD", "open RR"),
}
CLIP = 1e-3  # logit axes: a score of 0 or 1 is drawn at this distance from the edge
LEVEL = 0.95
COLUMNS = [
    "table",
    "score",
    "method",
    "role",
    "seeds",
    "iid",
    "ood",
    "rr",
    "line_ood",
    "line_lo",
    "line_hi",
    "effective_robustness",
    "er_lo",
    "er_hi",
    "axes",
    "points",
]


@dataclass
class Line:
    """A fitted line of one table and score kind: OoD = f⁻¹(a + b f(i.i.d.))."""

    table: str
    kind: str
    logit: bool
    fit: Any  # statsmodels RegressionResults
    points: pd.DataFrame  # the runs' iid, ood, method

    def at(self, iid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The line and its confidence band at i.i.d. scores `iid`, on the scores' axes."""
        import statsmodels.api as sm

        x = sm.add_constant(_axis(np.asarray(iid, dtype=float), self.logit), has_constant="add")
        band = self.fit.get_prediction(x).summary_frame(alpha=1 - LEVEL)
        return tuple(  # type: ignore[return-value]
            _inverse(band[c].to_numpy(float), self.logit)
            for c in ("mean", "mean_ci_lower", "mean_ci_upper")
        )


@dataclass
class Effective:
    """Effective robustness per method, the lines, and notes on rankings a weak model wins."""

    frame: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=COLUMNS))
    lines: list[Line] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _axis(values: np.ndarray, logit: bool) -> np.ndarray:
    if not logit:
        return values
    p = np.clip(values, CLIP, 1 - CLIP)
    return np.log(p / (1 - p))


def _inverse(values: np.ndarray, logit: bool) -> np.ndarray:
    return 1 / (1 + np.exp(-values)) if logit else values


def points(placed: pd.DataFrame) -> pd.DataFrame:
    """Every usable run's (i.i.d., OoD) point per score kind: methods and baselines, not test
    conditions nor extra evaluations."""
    cols = ["table", "kind", "method", "role", "seed", "iid", "ood", "rr"]
    if placed.empty:
        return pd.DataFrame(columns=cols)
    runs = placed[(placed["kind"] == "run") & placed["status"].isin(USABLE)]
    rows = []
    for _, run in runs.iterrows():
        what = role(run)
        if what == "condition":
            continue
        for kind, (iid, ood, rr) in KINDS.items():
            rows.append(
                {
                    "table": run["table"],
                    "kind": kind,
                    "method": run["method"],
                    "role": what,
                    "seed": run["seed"],
                    "iid": pd.to_numeric(run.get(iid), errors="coerce"),
                    "ood": pd.to_numeric(run.get(ood), errors="coerce"),
                    "rr": pd.to_numeric(run.get(rr), errors="coerce"),
                }
            )
    frame = pd.DataFrame(rows, columns=cols)
    return frame.dropna(subset=["iid", "ood"])


def fit_line(table: str, kind: str, part: pd.DataFrame) -> Line | None:
    """The OLS line through the points (None with fewer than three, or one i.i.d. value)."""
    import statsmodels.api as sm

    if len(part) < 3 or part["iid"].nunique() < 2:
        return None
    values = part[["iid", "ood"]].to_numpy(float)
    logit = bool(((values >= 0) & (values <= 1)).all())
    x = sm.add_constant(_axis(values[:, 0], logit), has_constant="add")
    return Line(table, kind, logit, sm.OLS(_axis(values[:, 1], logit), x).fit(), part)


def effective_robustness(placed: pd.DataFrame) -> Effective:
    """Per table and score kind, each method's effective robustness (see the module docstring)."""
    found = points(placed)
    out = Effective()
    rows = []
    for (table, kind), part in found.groupby(["table", "kind"], sort=True):
        line = fit_line(str(table), str(kind), part)
        if line is None:
            continue
        out.lines.append(line)
        means = part.groupby(["method", "role"], sort=False).agg(
            iid=("iid", "mean"), ood=("ood", "mean"), rr=("rr", "mean"), seeds=("seed", "size")
        )
        mean, lo, hi = line.at(means["iid"].to_numpy(float))
        for (method, what), m, at, low, high in zip(
            means.index, means.itertuples(), mean, lo, hi, strict=True
        ):
            rows.append(
                {
                    "table": table,
                    "score": f"{kind} OoD",
                    "method": method,
                    "role": what,
                    "seeds": int(m.seeds),
                    "iid": m.iid,
                    "ood": m.ood,
                    "rr": m.rr,
                    "line_ood": at,
                    "line_lo": low,
                    "line_hi": high,
                    "effective_robustness": m.ood - at,
                    "er_lo": m.ood - high,
                    "er_hi": m.ood - low,
                    "axes": "logit" if line.logit else "linear",
                    "points": len(part),
                }
            )
    out.frame = pd.DataFrame(rows, columns=COLUMNS)
    out.notes = weak_but_robust(found)
    return out


def weak_but_robust(found: pd.DataFrame) -> list[str]:
    """A note per table and score kind (and over all tables, by mean RR) where the method that
    ranks most robust by RR also has the lowest i.i.d. score among the fine-tuning methods."""
    methods = found[found["role"] == "method"]
    if methods.empty:
        return []
    groups = [
        (f"{table}: ", kind, part.droplevel([0, 1]))
        for (table, kind), part in methods.groupby(["table", "kind", "method"], sort=True)[
            ["iid", "rr"]
        ]
        .mean()
        .groupby(level=[0, 1], sort=True)
    ]
    if found["table"].nunique() > 1:
        overall = methods.groupby(["kind", "method"], sort=True)[["iid", "rr"]].mean()
        groups += [
            ("over all shifts (mean over shifts): ", kind, part.droplevel(0))
            for kind, part in overall.groupby(level=0, sort=True)
        ]
    notes = []
    for where, kind, part in groups:
        part = part.dropna()
        if len(part) < 2 or part["rr"].idxmax() != part["iid"].idxmin():
            continue
        method = part["rr"].idxmax()
        notes.append(
            f"{where}{method} ranks most robust by {kind} RR ({part.loc[method, 'rr']:.2f}) and is "
            f"the weakest i.i.d. ({kind} i.i.d. {part.loc[method, 'iid']:.2f}): RR rewards a low "
            "i.i.d. score; see its effective robustness"
        )
    return notes


def scatter_figure(result: Effective, out_dir: Path) -> dict[str, Path]:
    """`iid_vs_ood`: per table (rows) and score kind (columns), every run's (i.i.d., OoD)
    point coloured by method, the fitted line with its 95 % band, and OoD = i.i.d. dashed
    (RR = 1); none without a line."""
    from medvqa.analysis.figures import palette, save

    if not result.lines:
        return {}
    tables = list(dict.fromkeys(line.table for line in result.lines))
    kinds = list(KINDS)
    methods = list(dict.fromkeys(m for line in result.lines for m in line.points["method"]))
    colours = dict(zip(methods, palette(len(methods)), strict=True))
    fig = Figure(figsize=(5.0 * len(kinds), 4.0 * len(tables)), layout="constrained")
    for line in result.lines:
        ax = fig.add_subplot(
            len(tables),
            len(kinds),
            tables.index(line.table) * len(kinds) + kinds.index(line.kind) + 1,
        )
        for method, part in line.points.groupby("method", sort=False):
            ax.scatter(part["iid"], part["ood"], color=colours[method], label=method, s=18)
        low, high = float(line.points["iid"].min()), float(line.points["iid"].max())
        grid = np.linspace(low, high, 50)
        mean, lo, hi = line.at(grid)
        ax.plot(grid, mean, color="k", lw=1)
        ax.fill_between(grid, lo, hi, color="k", alpha=0.15, lw=0)
        edge = [
            min(low, float(line.points["ood"].min())),
            max(high, float(line.points["ood"].max())),
        ]
        ax.plot(edge, edge, color="grey", ls="--", lw=0.8)
        ax.set_xlabel(f"{line.kind} i.i.d.")
        ax.set_ylabel(f"{line.kind} OoD")
        axes = "logit fit" if line.logit else "linear fit"
        ax.set_title(f"{line.table} ({axes}, {len(line.points)} runs)", fontsize=9)
    handles, labels = fig.axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle("i.i.d. vs OoD per shift: the line through all runs, 95 % band; dashed: RR = 1")
    return {"iid_vs_ood": save(fig, out_dir, "iid_vs_ood")}
