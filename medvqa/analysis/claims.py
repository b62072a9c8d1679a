"""The family of claims a report makes, controlled for multiplicity (docs/metrics.md#the-family-of-
claims).

A study of methods × shifts × metrics × seeds prints dozens of pairwise comparisons; read one by
one at α = 0.05, some "hold" by chance. `medvqa-report` gathers every pairwise comparison of two
fine-tuning methods it shows into one family, per table (shift) and headline score (closed,
open): the difference of their i.i.d. scores, of their OoD scores and of their RR (OoD /
i.i.d.), each pooled over the methods' seeds. Each gets

- an estimate: the mean over seeds of each method's score (RR: per seed, then the mean, as the
  tables), a minus b;
- a percentile interval from a bootstrap over cases and seeds (`statistics.
  seed_case_replicates`: the test split's cases drawn once for both methods, so they pair; each
  method's seeds drawn with replacement, so training noise counts), with the runs'
  `evaluation.bootstrap` samples, seed and level;
- a two-sided p-value from the bootstrap standard error (z = estimate / SE: a percentile p-value
  could not go below 1 / B, which a family of 50 claims needs);
- the p-value adjusted over the whole family by statsmodels' `multipletests`: Holm (the
  family-wise error, default) or Benjamini-Hochberg (`--adjust bh`, the false discovery rate);
- a verdict: `holds` (adjusted p < α), `not after adjustment` (raw p < α only), `not
  significant`, or `no number` (with why: not the same questions, an item without a score, a
  score that is no per-row mean). A comparison without a number stays in the family at p = 1:
  the family is what the report shows, not what could be computed.

The scored tables (`scores.parquet` beside each run's results.json) are what this reads; runs
without one (W&B) make no claim.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from medvqa.analysis.methods import method_sort_key
from medvqa.analysis.paired import recorded_bootstrap, scored_table, split_rows
from medvqa.analysis.tables import USABLE, role, with_role
from medvqa.data import records as R
from medvqa.record import read_record
from medvqa.statistics.bootstrap import percentile_ci, seed_case_replicates
from medvqa.statistics.power import ALPHA

log = logging.getLogger(__name__)

# --adjust: the report's name -> statsmodels' multipletests method.
ADJUSTMENTS = {"holm": "holm", "bh": "fdr_bh"}
DEFAULT_ADJUSTMENT = "holm"
VERDICTS = ("holds", "not after adjustment", "not significant", "no number")
SCORE_KINDS = ("closed", "open")
SPLITS = (R.TEST_IID, R.TEST_OOD)
RR = "robustness"  # the split column of an RR comparison
# Comparisons of one pair of methods on one shift: each score kind on each split, and its RR
# (task=plan sizes the family with it).
PER_PAIR = len(SCORE_KINDS) * (len(SPLITS) + 1)
COLUMNS = [
    "table",
    "score",
    "split",
    "method_a",
    "method_b",
    "seeds_a",
    "seeds_b",
    "n",
    "cases",
    "estimate",
    "ci_lo",
    "ci_hi",
    "p",
    "p_adjusted",
    "verdict",
    "why",
    "id_a",
    "id_b",
]


@dataclass
class Sides:
    """Every method and baseline of one table, for one score kind: each one's models (seeds)
    scored on both test splits, bootstrapped together over cases and seeds (models on the same
    questions share a block of cases, drawn once for all of them). `excluded` says why a run
    of the table is not among them."""

    table: str
    kind: str
    score: str
    ids: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)
    seeds: list[list[Any]] = field(default_factory=list)
    # per side and split: the blocks (sets of questions) its models answered
    blocks: list[dict[str, set[int]]] = field(default_factory=list)
    block_rows: list[int] = field(default_factory=list)
    block_cases: list[int] = field(default_factory=list)
    level: float = 0.95
    replicates: list[np.ndarray] = field(default_factory=list)  # (B, models, splits)
    drawn: list[np.ndarray] = field(default_factory=list)  # (B, models)
    points: list[np.ndarray] = field(default_factory=list)  # (models, splits)
    excluded: dict[str, str] = field(default_factory=dict)

    @property
    def bootstrapped(self) -> bool:
        return bool(self.drawn)

    def index(self, method_id: str) -> int:
        return self.ids.index(method_id)

    def size(self, sides: Sequence[int], split: str) -> tuple[int, int]:
        """(rows, cases) of the questions the sides' models answered on `split` (RR: both)."""
        splits = SPLITS if split == RR else (split,)
        used = {b for s in sides for sp in splits for b in self.blocks[s][sp]}
        used = {b for b in used if self.block_rows[b]}  # an empty block has no case
        return sum(self.block_rows[b] for b in used), sum(self.block_cases[b] for b in used)

    def mean(self, side: int, split: str) -> tuple[float, np.ndarray]:
        """A side's score on `split`: the mean over its models, and per replicate over the
        models it draws."""
        t = SPLITS.index(split)
        reps = np.take_along_axis(self.replicates[side][..., t], self.drawn[side], 1)
        return float(np.mean(self.points[side][:, t])), reps.mean(1)

    def rr(self, side: int) -> tuple[float, np.ndarray]:
        """A side's RR: OoD / i.i.d. per model, then the mean (as the tables' cells)."""
        point = _ratio(self.points[side][:, 1], self.points[side][:, 0])
        ratio = _ratio(self.replicates[side][..., 1], self.replicates[side][..., 0])
        return float(np.mean(point)), np.take_along_axis(ratio, self.drawn[side], 1).mean(1)

    def statistic(self, side: int, split: str) -> tuple[float, np.ndarray]:
        """`mean` of a test split, `rr` for RR."""
        return self.rr(side) if split == RR else self.mean(side, split)

    def missing(self, side: int, split: str) -> str | None:
        """Why a side has no number on `split` (RR: on either), None where it has one."""
        for t, one in enumerate(SPLITS):
            if split not in (one, RR):
                continue
            if not any(self.block_rows[b] for b in self.blocks[side][one]):
                return f"no {one} rows of {self.score}"
            if self.bootstrapped and np.isnan(self.points[side][:, t]).any():
                return f"an item without a score on {one} (no number of the survivors)"
        if split == RR and self.bootstrapped and not (self.points[side][:, 0] > 0).all():
            return "RR undefined: an i.i.d. score of 0"
        return None


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den, NaN where den is not above 0 (RR of a zero i.i.d. score)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def study_sides(placed: pd.DataFrame) -> dict[tuple[str, str], Sides]:
    """(table, score kind) -> Sides of every table whose runs have scored tables."""
    if placed.empty:
        return {}
    runs = placed[(placed["kind"] == "run") & placed["status"].isin(USABLE)]
    runs = with_role(runs, "method", "baseline")
    out: dict[tuple[str, str], Sides] = {}
    for offset, (table, group) in enumerate(runs.groupby("table", sort=True)):
        order = {m: i for i, m in enumerate(dict.fromkeys(group["method_id"]))}
        loaded: dict[str, list[tuple[pd.Series, pd.DataFrame]]] = {}
        for method_id in sorted(order, key=lambda m: method_sort_key(m, order)):
            for _, row in group[group["method_id"] == method_id].sort_values("seed").iterrows():
                scored = scored_table(str(row["source"]))
                if scored is not None:
                    loaded.setdefault(method_id, []).append((row, scored))
        if not loaded:
            continue
        first = next(iter(loaded.values()))[0][0]
        boot = recorded_bootstrap(read_record(Path(str(first["source"]))))
        for kind in SCORE_KINDS:
            sides = _sides(str(table), kind, str(first[f"primary_{kind}"]), loaded, boot, offset)
            out[(str(table), kind)] = sides
    return out


def _column(row: pd.Series, score: str) -> tuple[str, str] | None:
    columns = row.get("score_columns")
    entry = columns.get(score) if isinstance(columns, Mapping) else None
    return (str(entry[0]), str(entry[1])) if entry is not None and len(entry) == 2 else None


def _sides(
    table: str,
    kind: str,
    score: str,
    loaded: Mapping[str, list[tuple[pd.Series, pd.DataFrame]]],
    boot: Mapping[str, Any] | None,
    offset: int,
) -> Sides:
    """The table's methods and baselines with per-row values of `score` on both test splits
    in every seed, and (with `boot`) their replicates; each table draws from its own seed
    (`offset` added), so tables are independent."""
    sides = Sides(table, kind, score)
    keys: dict[tuple[str, tuple[str, ...]], int] = {}
    codes: list[np.ndarray] = []
    models: list[list[list[tuple[int, np.ndarray, np.ndarray]]]] = []
    for method_id, seeds in loaded.items():
        why, built, used = None, [], {split: set() for split in SPLITS}
        for row, scored in seeds:
            entry = _column(row, score)
            if entry is None:
                why = f"{score} is not a per-row mean of the run (no paired claim)"
                break
            column, answer_type = entry
            model = []
            for split in SPLITS:
                rows = split_rows(scored, split)
                rows = rows.loc[rows[R.ANSWER_TYPE] == answer_type].sort_values(R.ID, kind="stable")
                ids = tuple(rows[R.ID].astype(str))
                if column not in rows or len(set(ids)) != len(ids):
                    why = f"{row['source']}: no column {column} or a question twice on {split}"
                    break
                if (split, ids) not in keys:
                    keys[(split, ids)] = len(codes)
                    found, labels = pd.factorize(rows[R.CASE_ID].astype(str), sort=False)
                    codes.append(found)
                    sides.block_rows.append(len(ids))
                    sides.block_cases.append(max(len(labels), 1))  # none: a mean of nothing
                block = keys[(split, ids)]
                used[split].add(block)
                values = pd.to_numeric(rows[column], errors="coerce").to_numpy(float)
                k = sides.block_cases[block]
                model.append(
                    (
                        block,
                        np.bincount(codes[block], weights=values, minlength=k),
                        np.bincount(codes[block], minlength=k).astype(float),
                    )
                )
            if why:
                break
            built.append(model)
        if why:
            sides.excluded[method_id] = why
            continue
        sides.ids.append(method_id)
        sides.names.append(str(seeds[0][0]["method"]))
        sides.roles.append(role(seeds[0][0]))
        sides.seeds.append([r["seed"] for r, _ in seeds])
        sides.blocks.append(used)
        models.append(built)
    if boot is not None and models:
        sides.replicates, sides.drawn, sides.points = seed_case_replicates(
            sides.block_cases, models, B=boot["B"], seed=boot["seed"] + offset
        )
        sides.level = float(boot["level"])
    return sides


@dataclass(frozen=True)
class Estimate:
    """A statistic with its bootstrap interval and two-sided p-value (against 0)."""

    point: float
    lo: float
    hi: float
    p: float


def estimate(point: float, replicates: np.ndarray, level: float, what: str = "") -> Estimate:
    """`point` with the percentile interval of `replicates` and the p-value of z = point / SE
    (SE: the replicates' standard deviation); NaN where the point or most replicates are."""
    finite = replicates[np.isfinite(replicates)]
    if math.isnan(point) or finite.size < max(2, replicates.size // 2):
        return Estimate(point, math.nan, math.nan, math.nan)
    ci = percentile_ci(point, finite, level, what)
    se = float(finite.std(ddof=1))
    # Every replicate the same: no difference is no evidence, any other is beyond doubt.
    z = abs(point) / se if se > 0 else (0.0 if point == 0 else math.inf)
    return Estimate(point, ci.lo, ci.hi, float(2 * stats.norm.sf(z)))


def difference(sides: Sides, a: int, b: int, split: str) -> Estimate:
    """a − b of a split's score (or of RR), over cases and seeds."""
    pa, ra = sides.statistic(a, split)
    pb, rb = sides.statistic(b, split)
    return estimate(pa - pb, ra - rb, sides.level, f"{sides.table} {sides.score} {split}")


def claims(
    sides: Mapping[tuple[str, str], Sides], adjustment: str = DEFAULT_ADJUSTMENT
) -> pd.DataFrame:
    """The family: every pair of fine-tuning methods of each table, per score kind, on each test
    split and on RR; adjusted together (`adjust`)."""
    rows: list[dict[str, Any]] = []
    for (table, kind), side in sides.items():
        methods = [i for i, r in enumerate(side.roles) if r == "method"]
        for a, b in itertools.combinations(methods, 2):
            for split in (*SPLITS, RR):
                score = f"{kind} RR" if split == RR else side.score
                base = {
                    "table": table,
                    "score": score,
                    "split": split,
                    "method_a": side.names[a],
                    "method_b": side.names[b],
                    "seeds_a": len(side.seeds[a]),
                    "seeds_b": len(side.seeds[b]),
                    "id_a": side.ids[a],
                    "id_b": side.ids[b],
                }
                base["n"], base["cases"] = side.size((a, b), split)
                if any(
                    side.size((a, b), one)[0] == 0 for one in (SPLITS if split == RR else (split,))
                ):
                    continue  # no rows of this score there: a comparison no table shows
                why = next(
                    (f"{side.names[i]}: {w}" for i in (a, b) if (w := side.missing(i, split))),
                    None if side.bootstrapped else "evaluation.bootstrap.samples=0: no interval",
                )
                est = difference(side, a, b, split) if why is None else None
                if est is None or math.isnan(est.p):
                    rows.append(_no_number(base, why or "too few defined bootstrap replicates"))
                    continue
                rows.append(
                    {**base, "estimate": est.point, "ci_lo": est.lo, "ci_hi": est.hi, "p": est.p}
                )
    frame = pd.DataFrame(rows, columns=COLUMNS)
    return adjust(frame, adjustment)


def _no_number(base: dict[str, Any], why: str) -> dict[str, Any]:
    return {
        **base,
        "estimate": math.nan,
        "ci_lo": math.nan,
        "ci_hi": math.nan,
        "p": math.nan,
        "why": why,
    }


def adjust(
    frame: pd.DataFrame, adjustment: str = DEFAULT_ADJUSTMENT, alpha: float = ALPHA
) -> pd.DataFrame:
    """`p_adjusted` and `verdict` of the family `frame` (its `p` column; a missing p counts as
    1): statsmodels' `multipletests` with the method `ADJUSTMENTS[adjustment]`."""
    from statsmodels.stats.multitest import multipletests

    if adjustment not in ADJUSTMENTS:
        raise ValueError(
            f"adjustment {adjustment!r} is not one of {sorted(ADJUSTMENTS)} (holm: family-wise "
            "error; bh: Benjamini-Hochberg false discovery rate)"
        )
    frame = frame.copy()
    if frame.empty:
        return frame
    p = frame["p"].astype(float).fillna(1.0).to_numpy()
    _, adjusted, _, _ = multipletests(p, alpha=alpha, method=ADJUSTMENTS[adjustment])
    frame["p_adjusted"] = np.where(frame["p"].isna(), np.nan, adjusted)
    raw = frame["p"].astype(float)
    frame["verdict"] = np.select(
        [raw.isna(), frame["p_adjusted"] < alpha, raw < alpha],
        [VERDICTS[3], VERDICTS[0], VERDICTS[1]],
        VERDICTS[2],
    )
    return frame


@dataclass(frozen=True)
class Family:
    """The claims of a report, their adjustment and what they say."""

    frame: pd.DataFrame
    adjustment: str = DEFAULT_ADJUSTMENT
    excluded: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def summary(self) -> str:
        counts = self.frame["verdict"].value_counts()
        parts = [f"{int(counts.get(v, 0))} {v}" for v in VERDICTS if counts.get(v, 0)]
        method = {
            "holm": "Holm (family-wise error)",
            "bh": "Benjamini-Hochberg (false discovery rate)",
        }
        return (
            f"{len(self.frame)} comparison(s) in one family, adjusted by "
            f"{method[self.adjustment]} at α = {ALPHA}: {', '.join(parts) or 'none'}"
        )


def family(sides: Mapping[tuple[str, str], Sides], adjustment: str = DEFAULT_ADJUSTMENT) -> Family:
    """The report's family of claims, and the runs left out of it with why."""
    excluded = {
        f"{table} · {kind} · {method_id}": why
        for (table, kind), side in sides.items()
        for method_id, why in side.excluded.items()
    }
    return Family(claims(sides, adjustment), adjustment, excluded)
