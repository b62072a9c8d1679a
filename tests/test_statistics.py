"""Case-clustered bootstrap: agreement with a plain-loop reference, exact resampling
distribution, coverage, NaN handling and the "a case counts once" property."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pandas as pd
import pytest

from medvqa.statistics import bootstrap as S
from medvqa.statistics.bootstrap import (
    BootstrapCI,
    ci_entries,
    cluster_bootstrap,
    cluster_bootstrap_replicates,
    paired_bootstrap_diff,
    rr_ci,
)

# --------------------------------------------------------------------------------------------
# Brute-force reference: one Python iteration per replicate, written from the module's draw
# contract (uniform doubles per replicate, clusters numbered by first appearance).
# --------------------------------------------------------------------------------------------


def _groups(values: np.ndarray, clusters: np.ndarray) -> dict[object, list[float]]:
    """Valid values per cluster, clusters in order of first appearance among valid rows."""
    out: dict[object, list[float]] = {}
    for v, c in zip(values, clusters, strict=True):
        if not math.isnan(v):
            out.setdefault(c, []).append(float(v))
    return out


def _stat(groups: list[list[float]], stat: str) -> float:
    if stat == "mean":
        flat = [v for g in groups for v in g]
        return sum(flat) / len(flat) if flat else math.nan
    means = [sum(g) / len(g) for g in groups if g]
    return sum(means) / len(means) if means else math.nan


def _draw(u: np.ndarray, n: int) -> list[int]:
    return [min(int(x * n), n - 1) for x in u]


def reference_replicates(values, clusters, B, seed, stat="mean"):
    groups = list(_groups(np.asarray(values, float), np.asarray(clusters, object)).values())
    rng = np.random.default_rng(seed)
    reps = []
    for _ in range(B):
        idx = _draw(rng.random(len(groups)), len(groups))
        reps.append(_stat([groups[j] for j in idx], stat))
    return np.array(reps)


def reference_two_sides(a, ca, b, cb, B, seed, paired):
    """Replicates (mean_a, mean_b) per the contract, for both designs."""
    rng = np.random.default_rng(seed)
    ga = _groups(np.asarray(a, float), np.asarray(ca, object))
    gb = _groups(np.asarray(b, float), np.asarray(cb, object))
    out = []
    if paired:
        labels = list(dict.fromkeys([*ga, *gb]))
        for _ in range(B):
            idx = _draw(rng.random(len(labels)), len(labels))
            drawn = [labels[j] for j in idx]
            out.append(
                (
                    _stat([ga.get(c, []) for c in drawn], "mean"),
                    _stat([gb.get(c, []) for c in drawn], "mean"),
                )
            )
    else:
        la, lb = list(ga.values()), list(gb.values())
        for _ in range(B):
            u = rng.random(len(la) + len(lb))
            ia, ib = _draw(u[: len(la)], len(la)), _draw(u[len(la) :], len(lb))
            out.append((_stat([la[j] for j in ia], "mean"), _stat([lb[j] for j in ib], "mean")))
    return np.array(out)


def _pct(reps: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    a = (1 - level) / 2
    lo, hi = np.quantile(reps, [a, 1 - a])
    return float(lo), float(hi)


def _clustered_data(rng: np.random.Generator, n_cases: int, sizes=(1, 8), nan_frac=0.0):
    """Binary scores with a strong case effect (every case has its own success rate)."""
    values, clusters = [], []
    for case in range(n_cases):
        p = rng.beta(1.0, 1.0)
        k = int(rng.integers(sizes[0], sizes[1] + 1))
        values += list((rng.random(k) < p).astype(float))
        clusters += [f"case{case}"] * k
    values = np.array(values)
    if nan_frac:
        values[rng.random(values.size) < nan_frac] = np.nan
    return values, np.array(clusters, dtype=object)


# --------------------------------------------------------------------------------------------
# Agreement with the reference
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stat", ["mean", "cluster_mean"])
def test_replicates_match_plain_loop_reference(stat: str) -> None:
    rng = np.random.default_rng(0)
    values, clusters = _clustered_data(rng, 37, nan_frac=0.1)
    reps = cluster_bootstrap_replicates(values, clusters, stat=stat, B=300, seed=7)
    ref = reference_replicates(values, clusters, 300, 7, stat)
    np.testing.assert_allclose(reps, ref, rtol=1e-12, atol=0)
    ci = cluster_bootstrap(values, clusters, stat=stat, B=300, seed=7)
    lo, hi = _pct(ref)
    assert ci.lo == pytest.approx(lo, rel=1e-12) and ci.hi == pytest.approx(hi, rel=1e-12)
    assert ci.half == pytest.approx((hi - lo) / 2, rel=1e-12)
    groups = list(_groups(values, clusters).values())
    assert ci.point == pytest.approx(_stat(groups, stat), rel=1e-12)


@pytest.mark.parametrize("paired", [False, True])
def test_diff_and_rr_match_reference(paired: bool) -> None:
    rng = np.random.default_rng(1)
    a, ca = _clustered_data(rng, 25, nan_frac=0.05)
    if paired:  # same cases, a correlated second score (another method on the same rows)
        b, cb = np.where(rng.random(a.size) < 0.8, a, 1 - a), ca
    else:
        b, cb = _clustered_data(rng, 18)
    ref = reference_two_sides(a, ca, b, cb, 250, 3, paired)

    diff = paired_bootstrap_diff(a, ca, b, cb, paired=paired, B=250, seed=3)
    lo, hi = _pct(ref[:, 0] - ref[:, 1])
    assert (diff.lo, diff.hi) == pytest.approx((lo, hi), rel=1e-12)
    assert diff.point == pytest.approx(np.nanmean(a) - np.nanmean(b), rel=1e-12)

    rr = rr_ci(a, ca, b, cb, paired=paired, B=250, seed=3)
    lo, hi = _pct(ref[:, 1] / ref[:, 0])
    assert (rr.lo, rr.hi) == pytest.approx((lo, hi), rel=1e-12)
    assert rr.point == pytest.approx(np.nanmean(b) / np.nanmean(a), rel=1e-12)
    assert rr.lo <= rr.point <= rr.hi


def test_chunking_does_not_change_the_draws(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(2)
    values, clusters = _clustered_data(rng, 51)
    whole = cluster_bootstrap_replicates(values, clusters, B=200, seed=11)
    monkeypatch.setattr(S, "_CHUNK_ELEMENTS", 7)  # one replicate per chunk
    np.testing.assert_array_equal(
        cluster_bootstrap_replicates(values, clusters, B=200, seed=11), whole
    )


# --------------------------------------------------------------------------------------------
# Exact resampling distribution on a tiny data set
# --------------------------------------------------------------------------------------------


def test_replicate_distribution_matches_exact_enumeration() -> None:
    """Three cases of different sizes: all 3^3 ordered draws are equally likely, so each
    distinct resample mean has a known probability; 60k replicates must reproduce it."""
    clusters = ["a", "b", "b", "c", "c", "c"]
    values = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]  # sums a=1, b=1, c=1; counts 1, 2, 3
    sums, counts = {"a": 1, "b": 1, "c": 1}, {"a": 1, "b": 2, "c": 3}
    exact: Counter[float] = Counter()
    for draw in itertools.product("abc", repeat=3):
        mean = sum(sums[c] for c in draw) / sum(counts[c] for c in draw)
        exact[round(mean, 12)] += 1 / 27
    reps = cluster_bootstrap_replicates(values, clusters, B=60_000, seed=5)
    seen = Counter(np.round(reps, 12).tolist())
    assert set(seen) == set(exact)
    for value, p in exact.items():
        assert seen[value] / reps.size == pytest.approx(p, abs=0.01), value
    # Expected replicate mean over the 27 draws (computed above) vs the simulated one.
    assert reps.mean() == pytest.approx(sum(v * p for v, p in exact.items()), abs=0.005)


# --------------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------------


def test_a_case_with_many_questions_counts_once() -> None:
    """Repeating every question of every case five times changes nothing when cases are
    resampled, but would shrink a question-level interval by about sqrt(5)."""
    rng = np.random.default_rng(3)
    values, clusters = _clustered_data(rng, 40)
    base = cluster_bootstrap(values, clusters, B=1000, seed=1)
    rep_v, rep_c = np.repeat(values, 5), np.repeat(clusters, 5)
    again = cluster_bootstrap(rep_v, rep_c, B=1000, seed=1)
    assert again == pytest.approx(base, rel=1e-12)
    per_question = cluster_bootstrap(rep_v, np.arange(rep_v.size), B=1000, seed=1)
    assert per_question.half < 0.6 * base.half


def test_nan_values_are_excluded_from_sums_and_counts() -> None:
    rng = np.random.default_rng(4)
    values, clusters = _clustered_data(rng, 30)
    base = cluster_bootstrap(values, clusters, B=500, seed=2)
    # NaN rows in existing cases and in a case that has only NaN values.
    v = np.concatenate([values, [np.nan, np.nan, np.nan]])
    c = np.concatenate([clusters, np.array([clusters[0], "only-nan", "only-nan"], object)])
    assert cluster_bootstrap(v, c, B=500, seed=2) == pytest.approx(base, rel=1e-12)
    # A NaN counted as 0 would lower the mean: it must not.
    assert cluster_bootstrap([1.0, np.nan, 1.0], ["x", "x", "y"], B=50).point == 1.0


def test_percentile_interval_covers_the_truth() -> None:
    """Clustered binary data with a known mean (0.5): the 95 % interval covers it in about
    95 % of data sets; a question-level bootstrap of the same data covers it far less often."""
    rng = np.random.default_rng(5)
    hits, naive_hits, trials = 0, 0, 200
    for t in range(trials):
        values, clusters = _clustered_data(rng, 40, sizes=(5, 15))
        ci = cluster_bootstrap(values, clusters, B=400, seed=t)
        hits += ci.lo <= 0.5 <= ci.hi
        naive = cluster_bootstrap(values, np.arange(values.size), B=400, seed=t)
        naive_hits += naive.lo <= 0.5 <= naive.hi
    assert 0.89 <= hits / trials <= 0.99
    assert naive_hits / trials < 0.8


def test_seed_and_b_are_configurable() -> None:
    rng = np.random.default_rng(6)
    values, clusters = _clustered_data(rng, 30)
    a = cluster_bootstrap(values, clusters, B=300, seed=1)
    assert cluster_bootstrap(values, clusters, B=300, seed=1) == a
    assert cluster_bootstrap(values, clusters, B=300, seed=2) != a
    assert cluster_bootstrap_replicates(values, clusters, B=123).shape == (123,)
    with pytest.raises(ValueError, match="B must be a positive integer"):
        cluster_bootstrap(values, clusters, B=0)
    with pytest.raises(ValueError, match="stat"):
        cluster_bootstrap(values, clusters, stat="median")


def test_paired_design_removes_case_difficulty() -> None:
    """Two methods on the same cases, differing on few questions: the paired interval of the
    difference is much narrower than the independent one and contains the true difference."""
    rng = np.random.default_rng(7)
    a, c = _clustered_data(rng, 60, sizes=(3, 10))
    b = a.copy()
    flip = rng.random(a.size) < 0.05
    b[flip] = 1 - b[flip]
    paired = paired_bootstrap_diff(a, c, b, c, paired=True, B=1000)
    independent = paired_bootstrap_diff(a, c, b, c, paired=False, B=1000)
    assert paired.point == pytest.approx(a.mean() - b.mean())
    assert paired.half < 0.5 * independent.half
    assert paired.lo <= paired.point <= paired.hi
    with pytest.raises(ValueError, match="share no case"):
        paired_bootstrap_diff(a, c, b, np.array(["other"] * b.size), paired=True)


def test_degenerate_inputs() -> None:
    empty = cluster_bootstrap([np.nan, np.nan], ["a", "b"])
    assert all(math.isnan(x) for x in empty)
    one = cluster_bootstrap([1.0, 0.0, 1.0], ["a", "a", "a"])
    assert one.point == pytest.approx(2 / 3) and math.isnan(one.lo) and math.isnan(one.half)
    rr = rr_ci([0.0, 0.0], ["a", "b"], [1.0, 0.0], ["c", "d"], B=50)
    assert math.isnan(rr.point)  # RR from a zero i.i.d. score is undefined
    with pytest.raises(ValueError, match="row 1 has no cluster label"):
        cluster_bootstrap([1.0, 0.0], ["a", None])
    with pytest.raises(ValueError, match="3 values but 2 cluster labels"):
        cluster_bootstrap([1.0, 0.0, 1.0], ["a", "b"])


def test_ci_entries_turn_score_columns_into_interval_keys() -> None:
    rng = np.random.default_rng(8)
    values, clusters = _clustered_data(rng, 20)
    scored = pd.DataFrame({"case_id": clusters, "open_f1": values, "acc": 1 - values})
    scored.loc[0, "acc"] = np.nan
    out = ci_entries(scored, {"open_f1": "open_f1", "closed_acc": "acc"}, B=200, seed=3)
    assert set(out) == {
        f"{m}_ci_{k}" for m in ("open_f1", "closed_acc") for k in ("lo", "hi", "half")
    }
    ci = cluster_bootstrap(scored["acc"], clusters, B=200, seed=3)
    assert (out["closed_acc_ci_lo"], out["closed_acc_ci_hi"]) == (ci.lo, ci.hi)
    assert out["open_f1_ci_half"] > 0
    assert set(ci_entries(scored, ["open_f1"], B=20)) == {
        "open_f1_ci_lo",
        "open_f1_ci_hi",
        "open_f1_ci_half",
    }
    with pytest.raises(ValueError, match="lacks column"):
        ci_entries(scored, ["bleu1"])


def test_result_is_a_named_tuple() -> None:
    point, lo, hi, half = cluster_bootstrap([1.0, 0.0, 1.0, 1.0], ["a", "b", "c", "d"], B=100)
    assert isinstance(cluster_bootstrap([1.0, 0.0], ["a", "b"], B=10), BootstrapCI)
    assert lo <= point <= hi and half == pytest.approx((hi - lo) / 2)
