"""The power plan (medvqa.statistics.power): the minimum detectable difference (MDD) between two
methods, checked by simulation: clustered outcomes whose true difference is the stated MDD are
detected by the paired, case-clustered test in 80 % ± 3 % of draws (and the test keeps its level
at no difference). Every simulation is vectorised over draws (numpy), so each takes well under a
second.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from medvqa.statistics import power as P

DRAWS = 4000  # Monte-Carlo SE of a power of 0.8: 0.0063, so ±3 % is about 4.7 SE
Z = stats.norm.ppf(1 - P.ALPHA / 2)


def cluster_sizes(rng: np.random.Generator, k: int) -> np.ndarray:
    """Unequal cases: 1 to 20 questions each (the design effect needs Σ m² / n, not n / k)."""
    return rng.integers(1, 21, size=k)


def clustered_z(d: np.ndarray, codes: np.ndarray, k: int) -> np.ndarray:
    """Per draw (row of `d`): the mean difference over its cluster-robust standard error, the
    Wald form of the report's case-clustered bootstrap."""
    n = d.shape[1]
    mean = d.mean(axis=1)
    sums = d @ (codes[:, None] == np.arange(k)[None, :]).astype(float)
    sizes = np.bincount(codes, minlength=k)
    resid = sums - sizes[None, :] * mean[:, None]
    var = (resid**2).sum(axis=1) / n**2 * k / (k - 1)
    return mean / np.sqrt(var)


def test_the_multiplier_is_statsmodels_normal_power() -> None:
    """About z_0.975 + z_0.8 = 2.80 standard errors (less the far tail's negligible share)."""
    assert P.multiplier() == pytest.approx(Z + stats.norm.ppf(P.POWER), abs=1e-3)
    assert P.multiplier(0.05 / 10) > P.multiplier()  # a family's strictest step needs more


def test_icc_is_the_one_way_anova_estimate() -> None:
    """Balanced: (MSB − MSW) / (MSB + (m − 1) MSW), computed here by hand; no replication or one
    cluster: NaN; negative estimates are clipped at 0."""
    values = np.array([1.0, 2.0, 3.0, 2.0, 4.0, 6.0, 0.0, 1.0, 1.0])
    clusters = np.repeat(["a", "b", "c"], 3)
    groups = values.reshape(3, 3)
    msb = 3 * ((groups.mean(1) - values.mean()) ** 2).sum() / 2
    msw = ((groups - groups.mean(1, keepdims=True)) ** 2).sum() / 6
    assert P.icc(values, clusters) == pytest.approx((msb - msw) / (msb + 2 * msw))
    assert math.isnan(P.icc([1.0, 2.0], ["a", "b"]))
    assert math.isnan(P.icc([1.0, 2.0, 3.0], ["a", "a", "a"]))
    assert P.icc([0.0, 1.0, 0.0, 1.0], ["a", "a", "b", "b"]) == 0.0


def test_icc_recovers_a_planted_correlation() -> None:
    rng = np.random.default_rng(0)
    sizes = cluster_sizes(rng, 2000)
    codes = np.repeat(np.arange(sizes.size), sizes)
    values = rng.normal(0, math.sqrt(0.3), sizes.size)[codes] + rng.normal(
        0, math.sqrt(0.7), codes.size
    )
    assert P.icc(values, codes) == pytest.approx(0.3, abs=0.03)


@pytest.mark.heavy
@pytest.mark.parametrize("rho", [0.0, 0.5])
def test_gaussian_differences_at_the_mdd_are_found_in_80_percent(rho: float) -> None:
    """Paired differences with sd 0.4 and ICC ρ in 150 unequal cases: at the planned MDD the
    clustered test rejects in 80 % ± 3 % of draws; at no difference in 5 % ± 1.5 %."""
    rng = np.random.default_rng(1)
    sizes = cluster_sizes(rng, 150)
    codes = np.repeat(np.arange(sizes.size), sizes)
    k, size = P.weighted_size(codes)
    design = P.Design(int(sizes.sum()), k, size, "test")
    spread = P.Spread(0.5, 0.4, rho, "test")
    mdd = P.mdd(P.variance(design, spread))
    assert design.size > design.rows / design.clusters  # unequal cases weigh more

    def rejected(delta: float) -> float:
        u = rng.normal(0, 0.4 * math.sqrt(rho), (DRAWS, k))
        e = rng.normal(0, 0.4 * math.sqrt(1 - rho), (DRAWS, codes.size))
        return float((np.abs(clustered_z(delta + u[:, codes] + e, codes, k)) > Z).mean())

    assert rejected(mdd) == pytest.approx(P.POWER, abs=0.03)
    assert rejected(0.0) == pytest.approx(P.ALPHA, abs=0.015)


def _correct(
    rng: np.random.Generator, mu: np.ndarray, codes: np.ndarray, k: int, draws: int
) -> np.ndarray:
    """Two methods' 0/1 answers (draws x methods x rows) from a latent model: a case's shared
    difficulty, each method's own affinity to the case, a row's shared difficulty, noise."""
    n = codes.size
    case = rng.normal(0, 1.0, (draws, 1, k))[..., codes]
    affinity = rng.normal(0, 0.6, (draws, 2, k))[..., codes]
    row = rng.normal(0, 0.8, (draws, 1, n))
    noise = rng.normal(0, 1.0, (draws, 2, n))
    return (mu[None, :, None] + case + affinity + row + noise > 0).astype(float)


@pytest.mark.heavy
def test_closed_accuracy_at_the_mdd_planned_from_a_finished_run_is_found_in_80_percent() -> None:
    """Binary answers of two methods (correlated on a row, clustered in cases): the spread is
    measured from one finished pair of runs, as `+task.icc_from` does (`measured_spread`), and
    accuracy that far apart is detected in 80 % ± 3 % of studies of 200 cases."""
    rng = np.random.default_rng(2)
    scale = math.sqrt(1.0 + 0.6**2 + 0.8**2 + 1.0)  # the latent's sd
    p = 0.7
    pilot_sizes = cluster_sizes(rng, 3000)
    pilot_codes = np.repeat(np.arange(pilot_sizes.size), pilot_sizes)
    mu = np.full(2, scale * stats.norm.ppf(p))
    pilot = _correct(rng, mu, pilot_codes, pilot_sizes.size, 1)[0]
    runs = [
        (
            method,
            pd.DataFrame({"id": np.arange(pilot_codes.size), "case_id": pilot_codes, "value": v}),
        )
        for method, v in zip(("lora", "ia3"), pilot, strict=True)
    ]
    spread = P.measured_spread(runs, "pilot")
    assert spread is not None and "1 pair(s) of methods" in spread.source
    assert 0.0 < spread.icc < 1.0 and spread.level == pytest.approx(p, abs=0.02)

    sizes = cluster_sizes(rng, 200)
    codes = np.repeat(np.arange(sizes.size), sizes)
    k, size = P.weighted_size(codes)
    mdd = P.mdd(P.variance(P.Design(int(sizes.sum()), k, size, "test"), spread))
    mu = scale * stats.norm.ppf([p + mdd / 2, p - mdd / 2])
    answers = _correct(rng, mu, codes, k, 2000)
    found = np.abs(clustered_z(answers[:, 0] - answers[:, 1], codes, k)) > Z
    assert found.mean() == pytest.approx(P.POWER, abs=0.03)


def test_an_rr_difference_at_its_mdd_is_found_in_80_percent() -> None:
    """RR = OoD / i.i.d. of each method on two independent splits: a difference of RR at the
    delta method's MDD is detected in 80 % ± 3 % of draws (Wald test of the same delta method,
    with each split's clustered variance estimated from the draw)."""
    rng = np.random.default_rng(3)
    level = {"iid": 0.8, "ood": 0.5}
    sd, rho = 0.35, 0.2
    designs, codes, variances = {}, {}, {}
    for split, k in (("iid", 120), ("ood", 160)):
        sizes = cluster_sizes(rng, k)
        codes[split] = np.repeat(np.arange(k), sizes)
        designs[split] = P.Design(int(sizes.sum()), *P.weighted_size(codes[split]), "test")
        variances[split] = P.variance(designs[split], P.Spread(level[split], sd, rho, "test"))
    mdd = P.mdd(P.rr_variance(variances["iid"], variances["ood"], level["iid"], level["ood"]))
    # Method a's OoD mean is raised so that RR_a − RR_b = mdd; b sits at the levels.
    shift = {"iid": 0.0, "ood": mdd * level["iid"]}
    estimates, errors = {}, {}
    for split in ("iid", "ood"):
        c = codes[split]
        k = int(c.max()) + 1
        u = rng.normal(0, sd * math.sqrt(rho), (DRAWS, k))
        d = shift[split] + u[:, c] + rng.normal(0, sd * math.sqrt(1 - rho), (DRAWS, c.size))
        z = clustered_z(d, c, k)
        estimates[split], errors[split] = d.mean(1), d.mean(1) / z
    i, o = level["iid"], level["ood"]
    diff = estimates["ood"] / i - o / i**2 * estimates["iid"]
    se = np.sqrt(errors["ood"] ** 2 + (o / i) ** 2 * errors["iid"] ** 2) / i
    assert float((np.abs(diff / se) > Z).mean()) == pytest.approx(P.POWER, abs=0.03)


def test_the_power_table_of_a_shift() -> None:
    """Per split and answer type, then RR; the family's MDD is wider; the defaults say so."""
    designs = {
        (split, kind): d
        for split, rows in (("test_iid", 689), ("test_ood", 1779))
        for kind, d in P.assumed_designs(rows, "published").items()
    }
    spreads = {key: P.assumed_spread(key[1]) for key in designs}
    table = P.detectable(
        "slake_modality", designs, spreads, {"closed": "acc", "open": "score"}, family=12
    )
    assert [(r.split, r.score) for r in table] == [
        ("test_iid", "acc"),
        ("test_iid", "score"),
        ("test_ood", "acc"),
        ("test_ood", "score"),
        ("RR", "closed RR"),
        ("RR", "open RR"),
    ]
    iid = table[0]
    assert iid.rows == round(689 * P.DEFAULT_CLOSED_SHARE)
    assert iid.clusters == pytest.approx(68.9)
    expected = P.multiplier() * math.sqrt(
        0.25 * 2 * (1 - P.DEFAULT_CORRELATION) / iid.rows * iid.design_effect
    )
    assert iid.mdd == pytest.approx(expected) and iid.mdd_family > iid.mdd
    assert table[2].mdd < iid.mdd  # the OoD split has more rows
    assert table[1].unit == "sd" and "default" in table[1].basis
    assert not math.isnan(table[4].mdd) and math.isnan(table[5].mdd)  # open levels unknown


# -- task=plan: what it takes from a finished run (+task.icc_from) ---------------------------


def _finished_slake_runs(root: Path) -> Path:
    """Two methods' finished runs of slake_modality (planted scores) with the splits.json the
    tasks write: 60 cases of 6 rows per test split."""
    from tests.planted import plant

    plant(
        root,
        {"slake_modality": {"lora": (0.8, 0.6), "ia3": (0.7, 0.5)}},
        seeds=(0,),
        cases=60,
        per_case=6,
    )
    for record in root.rglob("results.json"):
        scored = pd.read_parquet(record.parent / "scores.parquet")
        splits = {
            split: {
                "n": len(rows),
                "closed": int((rows["answer_type"] == "closed").sum()),
                "open": int((rows["answer_type"] == "open").sum()),
            }
            for split, rows in scored.groupby("split")
        }
        report = {"dataset": "slake", "shift": "slake_modality", "splits": splits}
        (record.parent / "splits.json").write_text(json.dumps(report))
    return root


@pytest.mark.heavy  # imports the task stack (torch, transformers)
def test_the_plan_measures_cases_and_spread_from_a_finished_run(tmp_path: Path, caplog) -> None:
    """`+task.icc_from`: rows and closed share from the run's splits.json, cases from its
    scored rows, the spread from the two methods' paired differences; strangers' files that
    are not a run's are skipped with a warning naming them."""
    from medvqa.tasks.finished_runs import finished_runs
    from medvqa.tasks.plan import plan_power
    from tests.conftest import compose

    runs = _finished_slake_runs(tmp_path / "runs")
    hostile = tmp_path / "runs" / "hostile"
    for name, text in (("a", "null"), ("b", '{"status": "finished", "metrics": {}}')):
        (hostile / name).mkdir(parents=True)
        (hostile / name / "results.json").write_text(text)
    (hostile / "b" / "splits.json").write_text("[1, 2]")
    (hostile / "b" / "scores.parquet").write_bytes(b"not parquet")
    with caplog.at_level("WARNING"):
        found = finished_runs(runs)
    assert len(found) == 2 and "hostile/a/results.json" in caplog.text
    assert "hostile/b/splits.json: not a splits report" in caplog.text

    cfg = compose(["+experiment=slake_modality"])
    provenance: dict = {}
    metrics = plan_power(cfg, [], None, str(runs), provenance)
    key = "plan/power/test_iid/judge_closed_acc"
    assert metrics[f"{key}_cases"] == pytest.approx(60)
    rows = [
        (
            method,
            pd.read_parquet(next(runs.rglob(f"*-{method}-None-*/seed=0/scores.parquet")))
            .query("split == 'test_iid' and answer_type == 'closed'")
            .rename(columns={"closed_correct": "value"})[["id", "case_id", "value"]],
        )
        for method in ("lora", "ia3")
    ]
    spread = P.measured_spread(rows, "test")
    design = P.Design(180, 60, 3.0, "test")  # 180 closed rows, 3 per case
    assert metrics[f"{key}_mdd"] == pytest.approx(P.mdd(P.variance(design, spread)))
    row = next(r for r in provenance["power"]["rows"] if r["score"] == "judge_closed_acc")
    assert "1 pair(s) of methods" in row["basis"] and "splits.json" in row["basis"]


@pytest.mark.heavy
def test_the_plan_without_a_run_uses_the_published_rows_and_says_what_it_assumes() -> None:
    from medvqa.tasks.plan import plan_power
    from tests.conftest import compose

    cfg = compose(["+experiment=slake_modality"])
    provenance: dict = {}
    metrics = plan_power(cfg, [], None, None, provenance)
    rows = {(r["split"], r["score"]): r for r in provenance["power"]["rows"]}
    assert rows[("test_ood", "judge_closed_acc")]["rows"] == round(1779 * P.DEFAULT_CLOSED_SHARE)
    assert "published" in rows[("test_iid", "judge_closed_acc")]["basis"]
    assert "default (assumed)" in rows[("test_iid", "judge_open_score")]["basis"]
    assert metrics["plan/power/robustness/rr_closed_mdd"] > 0
    assert "plan/power/test_iid/judge_closed_acc_mdd_family" not in metrics  # one job: no family
