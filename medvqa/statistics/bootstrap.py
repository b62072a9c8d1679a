"""Case-clustered bootstrap confidence intervals (docs/metrics.md: statistics, robustness).

Questions about the same case (patient, frame) are not independent: a model that misreads one
image tends to miss all of its questions. Resampling questions would treat a case with twenty
questions as twenty independent observations and give intervals that are too narrow, so every
interval here resamples **clusters** (cases) with replacement and keeps each drawn cluster's
questions together.

The statistic is the question-weighted mean over the resampled clusters (``stat="mean"``: sum
of the drawn clusters' values / number of their values), or the mean of per-cluster means
(``stat="cluster_mean"``, each case weighted equally). Both only need per-cluster sums and
counts, which is what makes the bootstrap vectorised: one replicate is a row of cluster indices,
and its statistic is a gather-and-sum over that row (no Python loop over replicates).

NaN values mean "this score does not apply to this row" (e.g. an open-question score on a closed
row). They are dropped before anything else, so they count neither in sums nor in counts, and a
cluster with no valid value is not a cluster of this statistic at all.

Draw contract (what makes results reproducible and lets tests check against a plain loop):
``rng = numpy.random.default_rng(seed)``; for each of the ``B`` replicates, in order, one call's
worth of ``rng.random(n_total)`` doubles is consumed, where ``n_total`` is the number of clusters
of all independently resampled sides together (side a's clusters first, then side b's); cluster
``j`` of a side with ``n`` clusters is chosen by ``min(floor(u * n), n - 1)``. Clusters are
numbered in order of first appearance among the rows with a valid value (a's rows, then b's,
for the jointly resampled paired design). Uniform doubles rather than ``rng.integers`` are used
because their stream does not depend on how the replicates are chunked in memory.

Intervals are percentile intervals of the replicates; ``half`` is half their width, so a
result reads ``point ± half`` as the papers report it (the interval need not be symmetric about
the point; ``lo``/``hi`` are the exact bounds).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from medvqa.data.records import CASE_ID


def mean_or_nan(values: Any, skipna: bool = False) -> float:
    """The mean of `values`; NaN (not 0, not a warning) when there is nothing to average.

    A NaN value propagates unless `skipna`: a mean over items some of which failed is not a
    number. Pass `skipna=True` only where NaN means "does not apply to this row".
    """
    arr = np.asarray(values, dtype=np.float64).ravel()
    if skipna:
        arr = arr[~np.isnan(arr)]
    return float(arr.mean()) if arr.size else math.nan


log = logging.getLogger(__name__)

__all__ = [
    "STATS",
    "BootstrapCI",
    "ci_entries",
    "cluster_bootstrap",
    "cluster_bootstrap_replicates",
    "cluster_statistic_ci",
    "cluster_sum_replicates",
    "paired_bootstrap_diff",
    "paired_rr_diff",
    "percentile_ci",
    "rr_ci",
    "seed_case_replicates",
]

STATS = ("mean", "cluster_mean")
# Elements of the (replicates x clusters) index matrix held in memory at once (~32 MiB of
# doubles); bounds memory for 20k-cluster tables without a Python loop over replicates.
_CHUNK_ELEMENTS = 1 << 22


@dataclass
class Bootstrap:
    """Every interval a run reports: the headline scores', RR's and OoD − i.i.d.'s, and those a
    family computes itself (`mcq_acc_ci_*`, `cs_primary_macro_f1_ci_*`). One setting, the
    config's `evaluation.bootstrap`, which the families' YAML interpolates; 0 samples: none."""

    samples: int = 2000  # resamples of the cases (clusters)
    seed: int = 42
    level: float = 0.95

    @classmethod
    def of(cls, value: Bootstrap | Mapping[str, Any]) -> Bootstrap:
        """The settings from a config node (`${evaluation.bootstrap}`) or as they are."""
        if isinstance(value, Bootstrap):
            return value
        return cls(int(value["samples"]), int(value["seed"]), float(value["level"]))

    def options(self) -> dict[str, Any] | None:
        """As the keywords of this module's functions (`B`, `seed`, `level`); None when off."""
        if not self.samples:
            return None
        return {"B": self.samples, "seed": self.seed, "level": self.level}


class BootstrapCI(NamedTuple):
    """A point estimate and its bootstrap percentile interval; ``half`` = (hi - lo) / 2."""

    point: float
    lo: float
    hi: float
    half: float

    def entries(self, name: str) -> dict[str, float]:
        """The interval under the project's metric names: `<name>_ci_lo/_ci_hi/_ci_half`."""
        return dict(zip((f"{name}{s}" for s in CI_SUFFIXES), self[1:], strict=True))


CI_SUFFIXES = ("_ci_lo", "_ci_hi", "_ci_half")  # the names `BootstrapCI.entries` writes


def is_interval(score: str) -> bool:
    """Whether `score` is an interval bound or half-width (`BootstrapCI.entries`)."""
    return score.endswith(CI_SUFFIXES)


_NAN_CI = (math.nan, math.nan, math.nan)


# --------------------------------------------------------------------------------------------
# Per-cluster totals
# --------------------------------------------------------------------------------------------


def _valid_rows(values: Any, clusters: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Values (float) and cluster labels of the rows whose value is not NaN."""
    v = np.asarray(values, dtype=float).ravel()
    c = np.asarray(clusters, dtype=object).ravel()
    if v.shape != c.shape:
        raise ValueError(
            f"{name}: {v.size} values but {c.size} cluster labels; pass one cluster label "
            "(the case id) per value."
        )
    missing = pd.isna(c)
    if missing.any():
        row = int(np.flatnonzero(missing)[0])
        raise ValueError(
            f"{name}: row {row} has no cluster label (case id is missing); fill the case_id "
            "column (e.g. with the image id) so every question belongs to a case."
        )
    keep = ~np.isnan(v)
    return v[keep], c[keep]


def _totals(
    values: np.ndarray, codes: np.ndarray, n_clusters: int, stat: str
) -> tuple[np.ndarray, np.ndarray]:
    """Per-cluster (sum, count) such that sum(sums) / sum(counts) is the statistic."""
    sums = np.bincount(codes, weights=values, minlength=n_clusters)
    counts = np.bincount(codes, minlength=n_clusters).astype(float)
    if stat == "cluster_mean":
        # Each cluster's mean with weight 1; clusters without values here (only possible on
        # one side of a joint design) keep weight 0.
        present = counts > 0
        sums = np.where(present, sums / np.where(present, counts, 1.0), 0.0)
        counts = present.astype(float)
    return sums, counts


def _check(stat: str, B: int, level: float) -> None:
    if stat not in STATS:
        raise ValueError(f"bootstrap stat {stat!r} is not supported; use one of {STATS}.")
    if int(B) != B or B < 1:
        raise ValueError(f"bootstrap B must be a positive integer, got {B!r}.")
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence level must be in (0, 1), got {level!r} (0.95 for 95 %).")


# --------------------------------------------------------------------------------------------
# Resampling engine
# --------------------------------------------------------------------------------------------


class _Side(NamedTuple):
    """Independently resampled block: per-cluster sums/counts, shape (n_clusters, k)."""

    sums: np.ndarray
    counts: np.ndarray


def _uniforms(n_total: int, B: int, seed: int) -> Iterator[tuple[int, int, np.ndarray]]:
    """The draw contract's uniform doubles, (start, stop, u) with u of shape
    (stop - start, n_total) for replicates start..stop-1, in chunks that bound memory."""
    rng = np.random.default_rng(seed)
    rows = max(1, _CHUNK_ELEMENTS // max(n_total, 1))
    for start in range(0, B, rows):
        stop = min(B, start + rows)
        yield start, stop, rng.random((stop - start, n_total))


def _resample(sides: Sequence[_Side], B: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Resampled (sums, counts), each (B, k), per side, following the module's draw contract."""
    sizes = [s.sums.shape[0] for s in sides]
    n_total = sum(sizes)
    out = [(np.empty((B, s.sums.shape[1])), np.empty((B, s.sums.shape[1]))) for s in sides]
    for start, stop, u in _uniforms(n_total, B, seed):
        offset = 0
        for side, n, (sums, counts) in zip(sides, sizes, out, strict=True):
            idx = np.minimum((u[:, offset : offset + n] * n).astype(np.intp), n - 1)
            # (m, n, k) gather then a sum over the drawn clusters: sum of the resample.
            sums[start:stop] = side.sums[idx].sum(axis=1)
            counts[start:stop] = side.counts[idx].sum(axis=1)
            offset += n
    return out


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den with NaN where den is 0 (a replicate without any value of that statistic)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def _interval(point: float, reps: np.ndarray, level: float, what: str) -> BootstrapCI:
    """Percentile interval of the finite replicates (NaN interval if none)."""
    finite = np.isfinite(reps)
    if not finite.all():
        dropped = int((~finite).sum())
        log.warning(
            "%s: %d of %d bootstrap replicates are undefined (a resample without values or "
            "with a zero denominator) and are left out of the interval",
            what,
            dropped,
            reps.size,
        )
        reps = reps[finite]
    if reps.size == 0:
        return BootstrapCI(point, *_NAN_CI)
    alpha = (1.0 - level) / 2.0
    lo, hi = (float(x) for x in np.quantile(reps, [alpha, 1.0 - alpha]))
    return BootstrapCI(point, lo, hi, (hi - lo) / 2.0)


def _point(sums: np.ndarray, counts: np.ndarray) -> float:
    total = counts.sum()
    return float(sums.sum() / total) if total > 0 else math.nan


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def cluster_bootstrap_replicates(
    values: Any,
    clusters: Any,
    stat: str = "mean",
    B: int = Bootstrap.samples,
    seed: int = Bootstrap.seed,
) -> np.ndarray:
    """The ``B`` bootstrap replicates of the statistic (cases resampled with replacement).

    Exposed for plots and for checking the resampling distribution; see the module docstring
    for the draw contract. Empty (no valid value) gives ``B`` NaNs.
    """
    _check(stat, B, 0.95)
    v, c = _valid_rows(values, clusters, "cluster_bootstrap")
    if v.size == 0:
        return np.full(int(B), np.nan)
    codes, labels = pd.factorize(c, sort=False)
    sums, counts = _totals(v, codes, len(labels), stat)
    ((rs, rc),) = _resample([_Side(sums[:, None], counts[:, None])], int(B), seed)
    return _ratio(rs[:, 0], rc[:, 0])


def cluster_bootstrap(
    values: Any,
    clusters: Any,
    stat: str = "mean",
    B: int = Bootstrap.samples,
    seed: int = Bootstrap.seed,
    level: float = Bootstrap.level,
) -> BootstrapCI:
    """Point estimate and case-clustered bootstrap CI of the mean of ``values``.

    ``clusters`` holds one case label per value; NaN values are ignored. With no valid value
    everything is NaN; with a single case the interval is NaN (resampling one case always
    returns that case, which would be a zero-width interval that only looks certain).
    """
    _check(stat, B, level)
    v, c = _valid_rows(values, clusters, "cluster_bootstrap")
    if v.size == 0:
        return BootstrapCI(math.nan, *_NAN_CI)
    codes, labels = pd.factorize(c, sort=False)
    sums, counts = _totals(v, codes, len(labels), stat)
    point = _point(sums, counts)
    if len(labels) < 2:
        log.warning("cluster_bootstrap: only one case; no confidence interval")
        return BootstrapCI(point, *_NAN_CI)
    ((rs, rc),) = _resample([_Side(sums[:, None], counts[:, None])], int(B), seed)
    return _interval(point, _ratio(rs[:, 0], rc[:, 0]), level, "cluster_bootstrap")


def _two_sides(
    a_values: Any,
    a_clusters: Any,
    b_values: Any,
    b_clusters: Any,
    paired: bool,
    stat: str,
    B: int,
    seed: int,
    what: str,
) -> tuple[float, float, np.ndarray, np.ndarray] | None:
    """Points and replicates of the two means (None if one side has no value or < 2 cases).

    ``paired=False``: the two sides are different rows (e.g. i.i.d. vs OoD test split) and are
    resampled independently. ``paired=True``: both sides are scores on the same cases (e.g. two
    methods on one split) and one draw of cases is shared, so case difficulty cancels out in
    the difference instead of widening its interval.
    """
    va, ca = _valid_rows(a_values, a_clusters, f"{what} (a)")
    vb, cb = _valid_rows(b_values, b_clusters, f"{what} (b)")
    if va.size == 0 or vb.size == 0:
        return None
    if paired:
        codes, labels = pd.factorize(np.concatenate([ca, cb]), sort=False)
        n = len(labels)
        if not set(codes[: va.size]) & set(codes[va.size :]):
            raise ValueError(
                f"{what}: paired=True but the two sides share no case; a paired bootstrap needs "
                "scores on the same cases (use paired=False for different rows/splits)."
            )
        sa, na = _totals(va, codes[: va.size], n, stat)
        sb, nb = _totals(vb, codes[va.size :], n, stat)
        points = _point(sa, na), _point(sb, nb)
        if n < 2:
            return None
        ((rs, rc),) = _resample(
            [_Side(np.stack([sa, sb], axis=1), np.stack([na, nb], axis=1))], int(B), seed
        )
        return *points, _ratio(rs[:, 0], rc[:, 0]), _ratio(rs[:, 1], rc[:, 1])
    sides = []
    for v, c in ((va, ca), (vb, cb)):
        codes, labels = pd.factorize(c, sort=False)
        if len(labels) < 2:
            return None
        s, k = _totals(v, codes, len(labels), stat)
        sides.append(_Side(s[:, None], k[:, None]))
    points = _point(sides[0].sums, sides[0].counts), _point(sides[1].sums, sides[1].counts)
    (ras, rac), (rbs, rbc) = _resample(sides, int(B), seed)
    return *points, _ratio(ras[:, 0], rac[:, 0]), _ratio(rbs[:, 0], rbc[:, 0])


def _point_only(
    a_values: Any, a_clusters: Any, b_values: Any, b_clusters: Any
) -> tuple[float, float]:
    """Question-weighted means of both sides, ignoring NaN (for the no-interval fallbacks)."""
    a, _ = _valid_rows(a_values, a_clusters, "a")
    b, _ = _valid_rows(b_values, b_clusters, "b")
    return (
        float(a.mean()) if a.size else math.nan,
        float(b.mean()) if b.size else math.nan,
    )


def _two_sample_ci(
    a_values: Any,
    a_clusters: Any,
    b_values: Any,
    b_clusters: Any,
    combine: Any,
    *,
    paired: bool,
    stat: str,
    B: int,
    seed: int,
    level: float,
    what: str,
) -> BootstrapCI:
    """CI of `combine(mean_a, mean_b)`: the point, and the same function of the replicates.

    Without an interval (a side empty or with < 2 cases) the point is still given, from the
    question-weighted means (NaN for the cluster-mean statistic).
    """
    _check(stat, B, level)
    res = _two_sides(a_values, a_clusters, b_values, b_clusters, paired, stat, B, seed, what)
    if res is None:
        if stat == "cluster_mean":
            return BootstrapCI(math.nan, *_NAN_CI)
        pa, pb = _point_only(a_values, a_clusters, b_values, b_clusters)
        return BootstrapCI(float(combine(np.float64(pa), np.float64(pb))), *_NAN_CI)
    pa, pb, ra, rb = res
    point = float(combine(np.float64(pa), np.float64(pb)))
    return _interval(point, combine(ra, rb), level, what)


def paired_bootstrap_diff(
    a_values: Any,
    a_clusters: Any,
    b_values: Any,
    b_clusters: Any,
    *,
    paired: bool = True,
    stat: str = "mean",
    B: int = Bootstrap.samples,
    seed: int = Bootstrap.seed,
    level: float = Bootstrap.level,
) -> BootstrapCI:
    """CI of mean(a) - mean(b), resampling cases.

    ``paired=False`` resamples each side's cases independently (i.i.d. vs OoD: different
    rows); ``paired=True`` draws one set of cases for both (two methods on the same rows), so
    only the disagreement between them varies. The interval is NaN when a side has no valid
    value or fewer than two cases (paired: fewer than two cases in all).
    """
    return _two_sample_ci(
        a_values,
        a_clusters,
        b_values,
        b_clusters,
        np.subtract,
        paired=paired,
        stat=stat,
        B=B,
        seed=seed,
        level=level,
        what="bootstrap_diff",
    )


def rr_ci(
    iid_values: Any,
    iid_clusters: Any,
    ood_values: Any,
    ood_clusters: Any,
    *,
    paired: bool = False,
    stat: str = "mean",
    B: int = Bootstrap.samples,
    seed: int = Bootstrap.seed,
    level: float = Bootstrap.level,
) -> BootstrapCI:
    """CI of the relative robustness RR = mean_OoD / mean_iid (docs/metrics.md), resampling cases.

    The i.i.d. and OoD test splits are different rows, hence independent resampling by
    default. RR is NaN when the i.i.d. mean is 0 (as in
    :func:`medvqa.scoring.robustness.relative_robustness`); replicates whose i.i.d. mean is 0
    are left out of the interval, with a warning saying how many.
    """
    return _two_sample_ci(
        iid_values,
        iid_clusters,
        ood_values,
        ood_clusters,
        lambda i, o: _ratio(o, i),
        paired=paired,
        stat=stat,
        B=B,
        seed=seed,
        level=level,
        what="rr_ci",
    )


def paired_rr_diff(
    iid_a: Any,
    iid_b: Any,
    iid_clusters: Any,
    ood_a: Any,
    ood_b: Any,
    ood_clusters: Any,
    *,
    stat: str = "mean",
    B: int = Bootstrap.samples,
    seed: int = Bootstrap.seed,
    level: float = Bootstrap.level,
) -> BootstrapCI:
    """CI of RR_a - RR_b: two methods (or one method under two judges) scored on the same
    questions of both test splits, RR = mean_OoD / mean_iid. The i.i.d. and OoD splits are
    different cases, resampled independently (as `rr_ci`); within a split one draw of cases
    serves both a and b (as `paired_bootstrap_diff`), so what the two share cancels out. NaN
    (point and interval) if a value is NaN (an item that could not be scored: no difference
    of the survivors'); NaN interval with fewer than two cases in a split."""
    _check(stat, B, level)
    sides, points = [], []
    for a, b, clusters, what in (
        (iid_a, iid_b, iid_clusters, "i.i.d."),
        (ood_a, ood_b, ood_clusters, "OoD"),
    ):
        va, vb = np.asarray(a, dtype=float).ravel(), np.asarray(b, dtype=float).ravel()
        c = np.asarray(clusters, dtype=object).ravel()
        if not va.size == vb.size == c.size:
            raise ValueError(
                f"paired_rr_diff ({what}): {va.size} and {vb.size} values for {c.size} cluster "
                "labels; pass both sides' scores of the same rows, one case id per row."
            )
        if va.size == 0 or np.isnan(va).any() or np.isnan(vb).any():
            return BootstrapCI(math.nan, *_NAN_CI)
        _valid_rows(va, c, f"paired_rr_diff ({what})")  # a missing case id is refused
        codes, labels = pd.factorize(c, sort=False)
        sa, na = _totals(va, codes, len(labels), stat)
        sb, nb = _totals(vb, codes, len(labels), stat)
        sides.append(_Side(np.stack([sa, sb], axis=1), np.stack([na, nb], axis=1)))
        points.append((_point(sa, na), _point(sb, nb)))
    (iid_pa, iid_pb), (ood_pa, ood_pb) = points
    point = float(_ratio(np.float64(ood_pa), np.float64(iid_pa))) - float(
        _ratio(np.float64(ood_pb), np.float64(iid_pb))
    )
    if math.isnan(point) or min(side.sums.shape[0] for side in sides) < 2:
        return BootstrapCI(point, *_NAN_CI)
    (i_s, i_c), (o_s, o_c) = _resample(sides, int(B), seed)
    iid, ood = _ratio(i_s, i_c), _ratio(o_s, o_c)
    reps = _ratio(ood[:, 0], iid[:, 0]) - _ratio(ood[:, 1], iid[:, 1])
    return _interval(point, reps, level, "paired_rr_diff")


def ci_entries(
    scored: pd.DataFrame,
    columns: Mapping[str, str] | Sequence[str],
    cluster_field: str = CASE_ID,
    *,
    stat: str = "mean",
    B: int = Bootstrap.samples,
    seed: int = Bootstrap.seed,
    level: float = Bootstrap.level,
) -> dict[str, float]:
    """``{"<metric>_ci_lo", "<metric>_ci_hi", "<metric>_ci_half"}`` for per-sample columns.

    ``columns`` maps a metric name to its per-sample score column of ``scored`` (a plain list
    uses each column's name as the metric name). NaN scores (rows the metric does not apply to)
    are ignored; each column is resampled with the same seed, so intervals of different metrics
    use the same draws when they cover the same cases.
    """
    mapping = dict(columns) if isinstance(columns, Mapping) else {c: c for c in columns}
    missing = [c for c in (*mapping.values(), cluster_field) if c not in scored.columns]
    if missing:
        raise ValueError(
            f"ci_entries: scored table lacks column(s) {missing}; per-sample score columns "
            f"come from the metric's per_sample, the cluster field from the records "
            f"(available: {list(scored.columns)})."
        )
    clusters = scored[cluster_field].to_numpy()
    out: dict[str, float] = {}
    for name, column in mapping.items():
        ci = cluster_bootstrap(
            scored[column].to_numpy(dtype=float), clusters, stat=stat, B=B, seed=seed, level=level
        )
        out.update(ci.entries(name))
    return out


# --------------------------------------------------------------------------------------------
# Over cases and seeds: several trained models (seeds) of each side on the same questions
# --------------------------------------------------------------------------------------------


def seed_case_replicates(
    cases: Sequence[int],
    sides: Sequence[Sequence[Sequence[tuple[int, Any, Any]]]],
    B: int = Bootstrap.samples,
    seed: int = Bootstrap.seed,
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """A bootstrap over cases and over seeds: each replicate draws every block's cases (the
    cases of one set of test questions) and every side's seeds (a method's trained models)
    with replacement.

    ``cases[b]``: the number of cases of block b. ``sides[s][k][t] = (block, sums, counts)``:
    side s's model (seed) k, its statistic t (a test split's mean score) from the per-case
    sums and counts (length ``cases[block]``) of the block its rows belong to. Models whose
    rows are the same questions share a block, so one draw of cases pairs them (two methods,
    or two seeds, on the same test split). Returns ``(replicates, seeds, points)``, per side:
    ``replicates[s]`` (B, models, statistics) each model's means over the replicate's cases,
    ``seeds[s]`` (B, models) the models the replicate draws, ``points[s]`` (models,
    statistics) each model's means over all cases. A statistic of the sides is computed per
    replicate from ``numpy.take_along_axis(replicates[s], seeds[s][..., None], 1)`` (e.g. its
    mean over the drawn models).

    Draw contract: per replicate, ``rng.random(n_total)`` with ``n_total`` the cases of every
    block, then the models of every side, in order; index ``min(floor(u * n), n - 1)``."""
    _check("mean", B, 0.95)
    if not sides or any(not models for models in sides) or min(cases, default=0) < 1:
        raise ValueError("seed_case_replicates: every side needs a model, every block cases")
    stats = len(sides[0][0])
    # Per block, every (side, model, statistic) that uses it, as the columns of one matrix.
    columns: list[list[tuple[int, int, int]]] = [[] for _ in cases]
    sums: list[list[np.ndarray]] = [[] for _ in cases]
    counts: list[list[np.ndarray]] = [[] for _ in cases]
    points = [np.empty((len(models), stats)) for models in sides]
    for s, models in enumerate(sides):
        for k, model in enumerate(models):
            for t, (block, a, c) in enumerate(model):
                a, c = np.asarray(a, dtype=float), np.asarray(c, dtype=float)
                if a.shape != (cases[block],) or c.shape != a.shape:
                    raise ValueError(
                        f"seed_case_replicates: side {s}, model {k}, statistic {t}: totals of "
                        f"shape {a.shape}, {c.shape} for block {block} of {cases[block]} cases"
                    )
                columns[block].append((s, k, t))
                sums[block].append(a)
                counts[block].append(c)
                points[s][k, t] = _point(a, c)
    matrices = [
        (np.stack(a, axis=1), np.stack(c, axis=1)) if a else None
        for a, c in zip(sums, counts, strict=True)
    ]
    out = [np.empty((int(B), len(models), stats)) for models in sides]
    drawn = [np.empty((int(B), len(models)), dtype=np.intp) for models in sides]
    n_models = [len(models) for models in sides]
    for start, stop, u in _uniforms(sum(cases) + sum(n_models), int(B), seed):
        m, offset = stop - start, 0
        for block, k in enumerate(cases):
            idx = np.minimum((u[:, offset : offset + k] * k).astype(np.intp), k - 1)
            offset += k
            if matrices[block] is None:
                continue
            flat = (idx + (np.arange(m) * k)[:, None]).ravel()
            weights = np.bincount(flat, minlength=m * k).reshape(m, k).astype(float)
            a, c = matrices[block]
            means = _ratio(weights @ a, weights @ c)
            for j, (s, model, t) in enumerate(columns[block]):
                out[s][start:stop, model, t] = means[:, j]
        for s, n in enumerate(n_models):
            drawn[s][start:stop] = np.minimum(
                (u[:, offset : offset + n] * n).astype(np.intp), n - 1
            )
            offset += n
    return out, drawn, points


# --------------------------------------------------------------------------------------------
# Statistics that are not means (e.g. macro-F1): resample per-cluster additive totals
# --------------------------------------------------------------------------------------------


def cluster_sum_replicates(
    totals: Any, B: int = Bootstrap.samples, seed: int = Bootstrap.seed
) -> np.ndarray:
    """Bootstrap replicates of the column sums of per-cluster ``totals`` (clusters x k): (B, k).

    Any statistic computed from sums over rows (macro-F1 and balanced accuracy from per-label
    tp/fp/fn counts) is then that function of each replicate's row. Clusters (rows of
    ``totals``) are drawn by the module's draw contract, so two calls with the same seed and
    the same number of clusters draw the same clusters: give every condition its totals in the
    same cluster order and their replicates are paired (their differences are paired deltas).
    """
    _check("mean", B, 0.95)
    table = np.asarray(totals, dtype=float)
    if table.ndim != 2 or table.shape[0] == 0:
        raise ValueError(
            f"cluster_sum_replicates: totals must be a non-empty (clusters x k) array, got "
            f"shape {table.shape}."
        )
    ((sums, _),) = _resample([_Side(table, np.zeros_like(table))], int(B), seed)
    return sums


def percentile_ci(
    point: float, replicates: Any, level: float = Bootstrap.level, what: str = ""
) -> BootstrapCI:
    """The percentile interval of bootstrap ``replicates`` around ``point`` (undefined
    replicates are left out with a warning, as for every interval here)."""
    _check("mean", 1, level)
    return _interval(point, np.asarray(replicates, dtype=float), level, what or "percentile_ci")


# --------------------------------------------------------------------------------------------
# Any statistic of the rows (agreement coefficients): recomputed on each resample of cases
# --------------------------------------------------------------------------------------------


def cluster_statistic_ci(
    statistic: Callable[[np.ndarray], float],
    clusters: Any,
    B: int = Bootstrap.samples,
    seed: int = Bootstrap.seed,
    level: float = Bootstrap.level,
    what: str = "cluster_statistic_ci",
) -> BootstrapCI:
    """Point and case-clustered bootstrap CI of a statistic that is no sum of per-row values
    (Cohen's kappa, Krippendorff's alpha): `statistic(weights)` computes it with each row
    counted `weights[i]` times. The point is `statistic` of all ones; each replicate draws
    cases by the module's draw contract and counts each row as often as its case was drawn.
    NaN interval for a NaN point or fewer than two cases (as `cluster_bootstrap`)."""
    _check("mean", B, level)
    c = np.asarray(clusters, dtype=object).ravel()
    if pd.isna(c).any():
        row = int(np.flatnonzero(pd.isna(c))[0])
        raise ValueError(
            f"{what}: row {row} has no cluster label (case id is missing); fill the case_id "
            "column (e.g. with the image id) so every question belongs to a case."
        )
    point = float(statistic(np.ones(c.size)))
    codes, labels = pd.factorize(c, sort=False)
    n = len(labels)
    if math.isnan(point) or n < 2:
        return BootstrapCI(point, *_NAN_CI)
    reps = np.empty(int(B))
    for start, _, u in _uniforms(n, int(B), seed):
        idx = np.minimum((u * n).astype(np.intp), n - 1)
        for r, drawn in enumerate(idx, start):
            reps[r] = statistic(np.bincount(drawn, minlength=n)[codes].astype(float))
    return _interval(point, reps, level, what)
