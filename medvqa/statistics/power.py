"""What a study can detect before it runs: the smallest difference between two methods that a
test split decides at 80 % power (`task=plan`, docs/protocols.md#how-to-size-a-study).

The design is the report's: two methods answer the same rows of a test split, and the
difference of their mean scores is tested paired over rows, with the rows' cases (images,
patients: `case_id`, what the report's bootstrap resamples) as clusters. For one score on one
split, with `n` rows in clusters of sizes m_j, the paired per-row differences d = y_a − y_b
having standard deviation σ_d and intra-cluster correlation ρ:

    Var(mean d) = σ_d² / n · DE,      DE = 1 + (m_w − 1) ρ,      m_w = Σ m_j² / n

(the design effect of a row-weighted mean under exchangeable correlation; m_w is the mean
cluster size when all are equal). The minimum detectable difference (MDD) at two-sided level α
and power 1 − β is z-multiplier × sqrt(Var(mean d)), the multiplier from statsmodels' power of a
one-sample normal test (`NormalIndPower`, ratio 0), about 2.80 at α = 0.05 and 80 %. σ_d² =
2 σ² (1 − r) for a score of per-row standard deviation σ whose two methods' values on one row
correlate r. RR = OoD / i.i.d.: a difference of two methods' RR, by the delta method, has
variance (Var(Δ OoD) + (o / i)² Var(Δ i.i.d.)) / i² at i.i.d. level i and OoD level o (the two
splits are different rows, independent).

Where no finished run gives the spread, the stated defaults below stand in (each table row says
which); the normal approximation is optimistic below about 30 clusters (`FEW_CLUSTERS`).
`tests/test_power.py` checks the MDD by simulation: clustered outcomes at the stated MDD are
detected in 80 % ± 3 % of draws.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

ALPHA = 0.05  # two-sided
POWER = 0.80
# Stated defaults where no finished run of the dataset says otherwise (`+task.icc_from`).
DEFAULT_ICC = 0.2  # of the paired per-row differences within a case; an assumption
DEFAULT_CORRELATION = 0.0  # of two methods' scores on one row: the pairing gains nothing yet
DEFAULT_ROWS_PER_CLUSTER = 10.0  # questions per case (SLAKE asks about 11 per image)
DEFAULT_CLOSED_SHARE = 0.5  # of a split's rows that are closed questions
DEFAULT_CLOSED_LEVEL = 0.5  # accuracy; p (1 − p) is largest there, so the MDD is the widest
# Below this many clusters the normal approximation's MDD is optimistic (t with few df).
FEW_CLUSTERS = 30
DEFAULT = "default (assumed)"


@functools.cache
def multiplier(alpha: float = ALPHA, power: float = POWER) -> float:
    """The MDD in standard errors: the effect size statsmodels' one-sample normal power solves
    for at one observation (z_{1−α/2} + z_{power}, less the far tail's share)."""
    from statsmodels.stats.power import NormalIndPower

    return float(
        NormalIndPower().solve_power(
            effect_size=None, nobs1=1, alpha=alpha, power=power, ratio=0, alternative="two-sided"
        )
    )


def weighted_size(clusters: Sequence[object] | np.ndarray) -> tuple[int, float]:
    """(number of clusters, Σ m_j² / Σ m_j) of the rows' cluster labels."""
    _, sizes = np.unique(np.asarray(clusters, dtype=str), return_counts=True)
    return len(sizes), float((sizes.astype(float) ** 2).sum() / sizes.sum()) if sizes.size else 1.0


def design_effect(size: float, icc: float) -> float:
    """1 + (m_w − 1) ρ: the variance of a clustered mean over that of independent rows."""
    return 1.0 + max(size - 1.0, 0.0) * icc


def icc(values: Sequence[float] | np.ndarray, clusters: Sequence[object] | np.ndarray) -> float:
    """The one-way ANOVA estimate of the intra-cluster correlation (unequal cluster sizes:
    n0 = (N − Σ m_j² / N) / (k − 1)), clipped at 0; NaN with fewer than two clusters, no
    within-cluster replication or no variance. NaN values are left out (a score that does not
    apply to the row)."""
    v = np.asarray(values, dtype=float)
    c = np.asarray(clusters, dtype=str)
    keep = ~np.isnan(v)
    v, c = v[keep], c[keep]
    codes, sizes = np.unique(c, return_inverse=True, return_counts=True)[1:]
    k, n = sizes.size, v.size
    if k < 2 or n <= k:
        return math.nan
    means = np.bincount(codes, weights=v, minlength=k) / sizes
    between = float((sizes * (means - v.mean()) ** 2).sum()) / (k - 1)
    within = float(((v - means[codes]) ** 2).sum()) / (n - k)
    n0 = (n - float((sizes.astype(float) ** 2).sum()) / n) / (k - 1)
    denominator = between + (n0 - 1.0) * within
    if denominator <= 0:
        return math.nan
    return float(min(max((between - within) / denominator, 0.0), 1.0))


@dataclass(frozen=True)
class Design:
    """The rows of one answer type on one test split and their clustering, and where the
    figures come from."""

    rows: int
    clusters: float
    size: float  # Σ m_j² / Σ m_j over the rows' cases (m_w; rows / clusters if all equal)
    source: str

    @classmethod
    def even(cls, rows: int, clusters: float, source: str) -> Design:
        """`rows` spread evenly over `clusters` cases."""
        clusters = min(float(clusters), float(rows)) if rows else 0.0
        return cls(int(rows), clusters, rows / clusters if clusters else 1.0, source)


def assumed_designs(rows: int, source: str) -> dict[str, Design]:
    """Answer type -> Design of a split of `rows` rows in the default clustering and closed
    share (`DEFAULT_*`): every case holds both kinds of question."""
    closed = round(rows * DEFAULT_CLOSED_SHARE)
    cases = max(rows / DEFAULT_ROWS_PER_CLUSTER, 1.0)
    where = f"{source}; cases and closed share {DEFAULT}"
    return {
        "closed": Design.even(closed, cases, where),
        "open": Design.even(rows - closed, cases, where),
    }


@dataclass(frozen=True)
class Spread:
    """One score on one split: its mean, the standard deviation of two methods' paired per-row
    difference and its ICC. `unit` is "" for the score's own units, "sd" where no run gives its
    spread (the MDD is then in standard deviations of the score)."""

    level: float
    sd_diff: float
    icc: float
    source: str
    unit: str = ""


def assumed_spread(answer_type: str) -> Spread:
    """The stated defaults: closed accuracy at `DEFAULT_CLOSED_LEVEL`; an open score of unknown
    scale in standard deviations."""
    pairing = math.sqrt(2.0 * (1.0 - DEFAULT_CORRELATION))
    if answer_type == "closed":
        p = DEFAULT_CLOSED_LEVEL
        return Spread(p, math.sqrt(p * (1 - p)) * pairing, DEFAULT_ICC, DEFAULT)
    return Spread(math.nan, pairing, DEFAULT_ICC, f"{DEFAULT}; scale unknown", unit="sd")


def measured_spread(runs: Sequence[tuple[str, pd.DataFrame]], source: str) -> Spread | None:
    """The spread of one score on one split from finished runs' scored rows: (method, frame of
    `id`, `case_id`, `value`) each. Where runs of two methods answered the same questions, the
    paired differences' standard deviation and ICC, averaged over those pairs; otherwise the
    scores' own spread and ICC, with two methods' correlation on a row `DEFAULT_CORRELATION`.
    An ICC needs `FEW_CLUSTERS` cases (else `DEFAULT_ICC`, said so). None without two scored
    rows in two cases, or where the scores do not vary (a spread of 0 would promise that any
    difference is found)."""
    runs = [(m, r.dropna(subset=["value"])) for m, r in runs]
    runs = [(m, r) for m, r in runs if len(r) >= 2 and r["case_id"].nunique() >= 2]
    if not runs:
        return None
    level = float(np.mean([r["value"].mean() for _, r in runs]))
    pairs = []
    for i, (method_a, a) in enumerate(runs):
        for method_b, b in runs[i + 1 :]:
            both = a.merge(b, on="id", suffixes=("_a", "_b"))
            if method_a == method_b or len(both) < 2 or both["case_id_a"].nunique() < 2:
                continue
            d = (both["value_a"] - both["value_b"]).to_numpy(float)
            pairs.append((float(d.var(ddof=1)), _icc(d, both["case_id_a"].to_numpy(str))))
    if pairs:
        sd = math.sqrt(float(np.mean([v for v, _ in pairs])))
        iccs = [r for _, r in pairs]
        what = f"{len(pairs)} pair(s) of methods on the same rows"
    else:
        var = float(np.mean([r["value"].var(ddof=1) for _, r in runs]))
        sd = math.sqrt(var * 2.0 * (1.0 - DEFAULT_CORRELATION))
        iccs = [_icc(r["value"].to_numpy(float), r["case_id"].to_numpy(str)) for _, r in runs]
        what = f"the scores of {len(runs)} run(s); two methods' correlation {DEFAULT}"
    if not sd > 0:
        return None
    known = [x for x in iccs if not math.isnan(x)]
    if not known:
        what += f"; ICC {DEFAULT} (under {FEW_CLUSTERS} cases)"
    return Spread(level, sd, float(np.mean(known)) if known else DEFAULT_ICC, f"{source}: {what}")


def _icc(values: np.ndarray, clusters: np.ndarray) -> float:
    """`icc`, NaN under `FEW_CLUSTERS` cases (an estimate of noise more than of the data)."""
    return icc(values, clusters) if len(set(clusters)) >= FEW_CLUSTERS else math.nan


def variance(design: Design, spread: Spread) -> float:
    """Var(mean of the paired differences) of one score on one split (NaN under two rows)."""
    if design.rows < 2:
        return math.nan
    return spread.sd_diff**2 / design.rows * design_effect(design.size, spread.icc)


def mdd(var: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest difference detected at `power` for an estimate of variance `var`."""
    return multiplier(alpha, power) * math.sqrt(var) if var >= 0 else math.nan


def rr_variance(var_iid: float, var_ood: float, level_iid: float, level_ood: float) -> float:
    """Var(RR_a − RR_b) by the delta method: (Var Δo + (o / i)² Var Δi) / i²."""
    if not level_iid or math.isnan(level_iid) or math.isnan(level_ood):
        return math.nan
    return (var_ood + (level_ood / level_iid) ** 2 * var_iid) / level_iid**2


@dataclass(frozen=True)
class Detectable:
    """One row of the power table: what one split (or RR) can decide between two methods."""

    shift: str
    split: str  # test_iid, test_ood, or "RR" (both)
    score: str
    answer_type: str
    rows: int
    clusters: float
    design_effect: float
    icc: float
    mdd: float
    mdd_family: float  # at α / family: Holm's first step over the study's comparisons
    unit: str
    basis: str

    @property
    def few_clusters(self) -> bool:
        return self.clusters < FEW_CLUSTERS


def detectable(
    shift: str,
    designs: Mapping[tuple[str, str], Design],
    spreads: Mapping[tuple[str, str], Spread],
    scores: Mapping[str, str],
    family: int = 1,
) -> list[Detectable]:
    """The power table of one shift: per test split and answer type (`scores`: answer type ->
    the score's name), then RR per answer type where there are two splits (i.i.d., OoD).
    `designs` and `spreads` are keyed by (split, answer type); `family`: the comparisons the
    study will make, whose strictest Holm step tests at α / family."""
    out: list[Detectable] = []
    variances: dict[tuple[str, str], float] = {}
    strict = ALPHA / max(family, 1)
    splits = list(dict.fromkeys(split for split, _ in designs))
    for split in splits:
        for answer_type, score in scores.items():
            design, spread = designs[(split, answer_type)], spreads[(split, answer_type)]
            var = variance(design, spread)
            variances[(split, answer_type)] = var
            out.append(
                Detectable(
                    shift,
                    split,
                    score,
                    answer_type,
                    design.rows,
                    design.clusters,
                    design_effect(design.size, spread.icc),
                    spread.icc,
                    mdd(var),
                    mdd(var, strict),
                    spread.unit,
                    f"rows: {design.source}; spread: {spread.source}",
                )
            )
    if len(splits) != 2:
        return out
    iid, ood = splits
    for answer_type in scores:
        a, b = spreads[(iid, answer_type)], spreads[(ood, answer_type)]
        var = rr_variance(
            variances[(iid, answer_type)], variances[(ood, answer_type)], a.level, b.level
        )
        levels = (
            f"i.i.d. {a.level:.3g} ({a.source}), OoD {b.level:.3g}"
            if a.unit == "" and b.unit == ""
            else "levels unknown without a finished run (+task.icc_from)"
        )
        out.append(
            Detectable(
                shift,
                "RR",
                f"{answer_type} RR",
                answer_type,
                designs[(iid, answer_type)].rows + designs[(ood, answer_type)].rows,
                designs[(iid, answer_type)].clusters + designs[(ood, answer_type)].clusters,
                math.nan,
                math.nan,
                mdd(var),
                mdd(var, strict),
                "",
                f"delta method at the scores' {levels}",
            )
        )
    return out
