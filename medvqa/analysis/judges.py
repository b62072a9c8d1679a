"""Do the study's conclusions survive a change of judge? (docs/judge.md#conclusions-under-each-
judge)

For the tables whose runs were graded by a jury (`judge.jury`: their scored tables keep each
juror's `judge_score@<juror>` beside the jury's `judge_score`), `medvqa-report` recomputes,
from the scored tables, under each juror and under the jury's verdict:

- the relative robustness of every method (RR = OoD / i.i.d. of the judge's closed accuracy and
  of its open 1-5 score, per seed), and the methods' ranking by it (mean RR over seeds, 1 =
  most robust);
- Kendall's tau between each two judges' rankings, per table and score;
- every pairwise conclusion "method A's RR is above B's" that one judge supports with a paired
  interval excluding zero (`statistics.paired_rr_diff`: both methods on the same questions,
  cases drawn once for both, the two splits independently, with the run's
  `evaluation.bootstrap`), and what becomes of it under every other judge: it `holds` (same
  sign, interval excluding zero), `loses significance` (same sign, interval holding zero),
  `flips` (the other sign) or is `unknown` (an item that judge could not score: no number).

Only fine-tuning methods are compared (baselines and test conditions are not contenders), over
the jurors every run of the table shares.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from medvqa.analysis.methods import method_sort_key
from medvqa.analysis.paired import recorded_bootstrap, same_questions, scored_table, split_rows
from medvqa.analysis.tables import USABLE, role
from medvqa.data import records as R
from medvqa.record import read_record
from medvqa.scoring.metrics.judge import JUDGE_SCORE, juror_column, jurors_of
from medvqa.scoring.robustness import relative_robustness
from medvqa.statistics.bootstrap import mean_or_nan, paired_rr_diff

log = logging.getLogger(__name__)

__all__ = ["JURY", "VERDICTS", "JudgeSensitivity", "judge_figure", "judge_sensitivity"]

JURY = "jury"  # the jury's verdict, beside the jurors
# The answer type whose judge scores an RR is taken of -> how the tables name that RR.
SCORES = {"closed": "closed RR", "open": "open RR"}
VERDICTS = ("holds", "loses significance", "flips", "unknown")
RR_COLUMNS = ["table", "seed", "score", "judge", "method", "method_id", "rr"]
RANK_COLUMNS = ["table", "score", "judge", "method", "rr", "rank"]
TAU_COLUMNS = ["table", "score", "judge_a", "judge_b", "tau", "n_methods"]
CONCLUSION_COLUMNS = [
    "table",
    "seed",
    "score",
    "higher",
    "lower",
    "judge",
    "diff",
    "ci_lo",
    "ci_hi",
    "under",
    "under_diff",
    "under_ci_lo",
    "under_ci_hi",
    "verdict",
]


@dataclass
class JudgeSensitivity:
    """The tables of the module docstring (empty where no table was graded by a jury)."""

    rr: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=RR_COLUMNS))
    ranks: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=RANK_COLUMNS))
    tau: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=TAU_COLUMNS))
    conclusions: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=CONCLUSION_COLUMNS)
    )

    @property
    def empty(self) -> bool:
        return self.rr.empty

    @property
    def flagged(self) -> pd.DataFrame:
        """The conclusions that do not hold under another judge."""
        return self.conclusions[self.conclusions["verdict"] != "holds"]

    def write(self, out_dir: Path) -> dict[str, Path]:
        """judge_rr.csv, judge_ranks.csv, judge_rank_tau.csv, judge_conclusions.csv."""
        files = {}
        for name, frame in (
            ("judge_rr", self.rr),
            ("judge_ranks", self.ranks),
            ("judge_rank_tau", self.tau),
            ("judge_conclusions", self.conclusions),
        ):
            path = Path(out_dir) / f"{name}.csv"
            frame.to_csv(path, index=False)
            files[f"{name}_csv"] = path
        return files


def _judges(tables: list[pd.DataFrame]) -> dict[str, str]:
    """judge -> its score column: the jury and the jurors every table has (none without two)."""
    common = [j for j in jurors_of(tables[0]) if all(j in jurors_of(t) for t in tables[1:])]
    if len(common) < 2 or not all(JUDGE_SCORE in t for t in tables):
        return {}
    return {JURY: JUDGE_SCORE, **{j: juror_column(JUDGE_SCORE, j) for j in common}}


def _verdict(direction: float, other: Any) -> str:
    """What becomes under another judge of a conclusion of sign `direction`."""
    if math.isnan(other.point):
        return "unknown"
    if np.sign(other.point) == -direction:
        return "flips"
    excludes = other.lo > 0 or other.hi < 0
    return "holds" if excludes and np.sign(other.point) == direction else "loses significance"


def _typed(rows: pd.DataFrame, answer_type: str) -> pd.DataFrame:
    return rows.loc[rows[R.ANSWER_TYPE] == answer_type].sort_values(R.ID, kind="stable")


def judge_sensitivity(placed: pd.DataFrame) -> JudgeSensitivity:
    """The judge-sensitivity tables of the runs the report placed (see the module docstring)."""
    if placed.empty:
        return JudgeSensitivity()
    runs = placed[(placed["kind"] == "run") & placed["status"].isin(USABLE)]
    runs = runs[[role(row) == "method" for _, row in runs.iterrows()]] if not runs.empty else runs
    rr_rows: list[dict[str, Any]] = []
    conclusions: list[dict[str, Any]] = []
    for (table, seed), group in runs.groupby(["table", "seed"], sort=True):
        loaded = {}
        for _, row in group.iterrows():
            scored = scored_table(str(row["source"]))
            if scored is not None:
                loaded[row["method_id"]] = (row, scored)
        if not loaded:
            continue
        judges = _judges([scored for _, scored in loaded.values()])
        if not judges:
            continue
        order = {m: i for i, m in enumerate(dict.fromkeys(group["method_id"]))}
        methods = sorted(loaded, key=lambda m: method_sort_key(m, order))
        for answer_type, score in SCORES.items():
            sides = {}
            for method in methods:
                row, scored = loaded[method]
                iid = _typed(split_rows(scored, R.TEST_IID), answer_type)
                ood = _typed(split_rows(scored, R.TEST_OOD), answer_type)
                if iid.empty or ood.empty:
                    continue
                sides[method] = (iid, ood)
                for judge, column in judges.items():
                    rr = relative_robustness(mean_or_nan(iid[column]), mean_or_nan(ood[column]))
                    rr_rows.append(
                        {
                            "table": table,
                            "seed": seed,
                            "score": score,
                            "judge": judge,
                            "method": row["method"],
                            "method_id": method,
                            "rr": rr,
                        }
                    )
            for a, b in itertools.combinations([m for m in methods if m in sides], 2):
                source = Path(str(loaded[a][0]["source"]))
                cis = _paired_cis(sides[a], sides[b], source, judges)
                if cis is None:
                    continue
                names = {m: loaded[m][0]["method"] for m in (a, b)}
                conclusions += _conclusions(table, seed, score, names[a], names[b], cis)
    if not rr_rows:
        return JudgeSensitivity()
    rr = pd.DataFrame(rr_rows, columns=RR_COLUMNS)
    ranks = _ranks(rr)
    return JudgeSensitivity(
        rr=rr,
        ranks=ranks,
        tau=_taus(ranks),
        conclusions=pd.DataFrame(conclusions, columns=CONCLUSION_COLUMNS),
    )


def _paired_cis(
    a: tuple[pd.DataFrame, pd.DataFrame],
    b: tuple[pd.DataFrame, pd.DataFrame],
    source: Path,
    judges: Mapping[str, str],
) -> dict[str, Any] | None:
    """Under each judge, the paired case-bootstrap interval of RR(a) - RR(b) from two runs'
    (i.i.d., OoD) rows, with the bootstrap settings recorded by the run at `source`; None where
    the runs did not answer the same questions (nothing to pair) or no settings were
    recorded."""
    (iid_a, ood_a), (iid_b, ood_b) = a, b
    if not (same_questions(iid_a, iid_b) and same_questions(ood_a, ood_b)):
        return None
    boot = recorded_bootstrap(read_record(source))
    if boot is None:
        return None
    return {
        judge: paired_rr_diff(
            iid_a[column].to_numpy(float),
            iid_b[column].to_numpy(float),
            iid_a[R.CASE_ID].to_numpy(object),
            ood_a[column].to_numpy(float),
            ood_b[column].to_numpy(float),
            ood_a[R.CASE_ID].to_numpy(object),
            **boot,
        )
        for judge, column in judges.items()
    }


def _conclusions(
    table: str, seed: Any, score: str, a: str, b: str, cis: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Each judge's significant conclusion about a and b, and its fate under the others."""
    out = []
    for judge, ci in cis.items():
        if math.isnan(ci.lo) or not (ci.lo > 0 or ci.hi < 0):
            continue  # no conclusion under this judge
        direction = float(np.sign(ci.point))
        higher, lower = (a, b) if direction > 0 else (b, a)
        for under, other in cis.items():
            if under == judge:
                continue
            out.append(
                {
                    "table": table,
                    "seed": seed,
                    "score": score,
                    "higher": higher,
                    "lower": lower,
                    "judge": judge,
                    "diff": direction * ci.point,
                    "ci_lo": direction * (ci.lo if direction > 0 else ci.hi),
                    "ci_hi": direction * (ci.hi if direction > 0 else ci.lo),
                    "under": under,
                    "under_diff": direction * other.point,
                    "under_ci_lo": direction * (other.lo if direction > 0 else other.hi),
                    "under_ci_hi": direction * (other.hi if direction > 0 else other.lo),
                    "verdict": _verdict(direction, other),
                }
            )
    return out


def _ranks(rr: pd.DataFrame) -> pd.DataFrame:
    """Mean RR over seeds per (table, score, judge, method) and the rank within each (table,
    score, judge): 1 = most robust, ties averaged; a mean over seeds one of which has no RR
    (an unscored item) has none, and no rank."""
    keys = ["table", "score", "judge", "method"]
    mean = rr.groupby(keys, sort=False)["rr"].agg(lambda v: mean_or_nan(v)).reset_index()
    mean["rank"] = mean.groupby(["table", "score", "judge"], sort=False)["rr"].rank(
        ascending=False, method="average"
    )
    return mean[RANK_COLUMNS]


def _taus(ranks: pd.DataFrame) -> pd.DataFrame:
    """Kendall's tau-b between each two judges' mean RRs over the methods both rank (NaN with
    fewer than two such methods or a constant side)."""
    from scipy import stats

    out = []
    for (table, score), part in ranks.groupby(["table", "score"], sort=False):
        wide = part.pivot(index="method", columns="judge", values="rr")
        judges = list(dict.fromkeys(part["judge"]))
        for ja, jb in itertools.combinations(judges, 2):
            both = wide[[ja, jb]].dropna()
            tau = math.nan
            if len(both) >= 2 and both[ja].nunique() > 1 and both[jb].nunique() > 1:
                tau = float(stats.kendalltau(both[ja], both[jb]).statistic)
            out.append(
                {
                    "table": table,
                    "score": score,
                    "judge_a": ja,
                    "judge_b": jb,
                    "tau": tau,
                    "n_methods": len(both),
                }
            )
    return pd.DataFrame(out, columns=TAU_COLUMNS)


def judge_figure(result: JudgeSensitivity, out_dir: Path) -> dict[str, Path]:
    """`rr_under_each_judge`: mean RR per method under each judge, one panel per (table,
    score); lines that cross are rankings that differ; each panel's title gives each juror's
    tau with the jury. None without a jury (a study graded by one judge has nothing to show)."""
    from medvqa.analysis.figures import palette, save

    if result.empty:
        return {}
    panels = list(result.ranks.groupby(["table", "score"], sort=False))
    fig = Figure(figsize=(6.0, 3.2 * len(panels)))
    for i, ((table, score), part) in enumerate(panels):
        ax = fig.add_subplot(len(panels), 1, i + 1)
        methods = list(dict.fromkeys(part["method"]))
        judges = list(dict.fromkeys(part["judge"]))
        for colour, judge in zip(palette(len(judges)), judges, strict=True):
            values = part[part["judge"] == judge].set_index("method")["rr"].reindex(methods)
            style = {"lw": 2.5, "marker": "s"} if judge == JURY else {"lw": 1.2, "marker": "o"}
            ax.plot(methods, values.to_numpy(float), label=judge, color=colour, **style)
        taus = result.tau[
            (result.tau["table"] == table)
            & (result.tau["score"] == score)
            & (result.tau["judge_a"] == JURY)
        ]
        shown = ", ".join(f"{r.judge_b} {r.tau:.2f}" for r in taus.itertuples())
        ax.set_title(f"{table}: {score} per judge (τ with the jury: {shown})", fontsize=9)
        ax.set_ylabel(score)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.legend(fontsize=7)
    return {"rr_under_each_judge": save(fig, out_dir, "rr_under_each_judge")}
