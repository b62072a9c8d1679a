"""The family of claims (medvqa.analysis.claims): every pairwise method comparison a report
shows, pooled over seeds with a bootstrap over cases and seeds, adjusted together by statsmodels'
multipletests (Holm; Benjamini-Hochberg as an option); and the bootstrap's draw contract
(`statistics.seed_case_replicates`) against a plain loop.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from statsmodels.stats.multitest import multipletests

from medvqa.analysis.aggregate import collect
from medvqa.analysis.claims import ADJUSTMENTS, COLUMNS, RR, adjust, family, study_sides
from medvqa.statistics.bootstrap import seed_case_replicates
from tests.planted import plant


@pytest.mark.parametrize("adjustment", sorted(ADJUSTMENTS))
def test_the_adjustment_is_statsmodels_multipletests(adjustment: str) -> None:
    """The same adjusted p-values as multipletests on the same p-values; a comparison without a
    number counts as p = 1 (it is in the family) and keeps no adjusted p; the verdicts."""
    rng = np.random.default_rng(0)
    p = np.concatenate([rng.uniform(0, 0.01, 5), rng.uniform(0, 1, 20), [0.03, math.nan]])
    frame = pd.DataFrame({c: None for c in COLUMNS}, index=range(p.size)).assign(p=p)
    adjusted = adjust(frame, adjustment)
    reject, expected, _, _ = multipletests(
        np.nan_to_num(p, nan=1.0), alpha=0.05, method=ADJUSTMENTS[adjustment]
    )
    known = ~np.isnan(p)
    assert adjusted["p_adjusted"].to_numpy()[known] == pytest.approx(expected[known])
    assert math.isnan(adjusted["p_adjusted"].iloc[-1])
    verdicts = adjusted["verdict"].to_numpy()
    assert (verdicts[known] == "holds").tolist() == reject[known].tolist()
    assert verdicts[-1] == "no number"
    assert verdicts[-2] in ("holds", "not after adjustment")  # raw 0.03 < 0.05
    assert set(verdicts[known & (p >= 0.05)]) == {"not significant"}
    with pytest.raises(ValueError, match="holm"):
        adjust(frame, "bonferroni")


def test_seed_case_replicates_follows_its_draw_contract() -> None:
    """Each replicate: one rng.random(n_total) over the blocks' cases then the sides' models;
    a model's mean over the cases drawn in its block, checked with a plain loop."""
    rng = np.random.default_rng(1)
    cases = [5, 3]
    sides = [
        [[(0, rng.random(5), np.full(5, 2.0)), (1, rng.random(3), np.ones(3))] for _ in range(k)]
        for k in (2, 3)
    ]
    reps, drawn, points = seed_case_replicates(cases, sides, B=40, seed=9)
    u = np.random.default_rng(9).random((40, sum(cases) + 5))
    for b in range(40):
        picks = [
            np.minimum((u[b, :5] * 5).astype(int), 4),
            np.minimum((u[b, 5:8] * 3).astype(int), 2),
        ]
        offsets = [8, 10]
        for s, models in enumerate(sides):
            n = len(models)
            seeds = np.minimum((u[b, offsets[s] : offsets[s] + n] * n).astype(int), n - 1)
            assert drawn[s][b].tolist() == seeds.tolist()
            for k, model in enumerate(models):
                for t, (block, sums, counts) in enumerate(model):
                    expected = sums[picks[block]].sum() / counts[picks[block]].sum()
                    assert reps[s][b, k, t] == pytest.approx(expected)
    assert points[1][2, 0] == pytest.approx(sides[1][2][0][1].sum() / 10.0)


@pytest.mark.heavy
def test_a_planted_study_claims_what_it_planted(tmp_path: Path) -> None:
    """LoRA far above (IA)³ i.i.d. holds after adjustment; (IA)³ and prompt tuning, planted
    equal, do not; each estimate is the mean over seeds of the accuracy difference."""
    plant(
        tmp_path,
        {
            "synthetic_modality": {
                "lora": (0.85, 0.6),
                "ia3": (0.55, 0.5),
                "prompt_tuning": (0.55, 0.5),
            }
        },
    )
    runs = collect([tmp_path])
    claims = family(study_sides(runs)).frame
    assert len(claims) == 3 * 2 * 3  # pairs x score kinds x (two splits and RR)
    pair = claims[(claims["id_a"] == "lora") & (claims["id_b"] == "ia3")]
    iid = pair[(pair["score"] == "closed_acc") & (pair["split"] == "test_iid")].iloc[0]
    assert iid["verdict"] == "holds" and iid["p_adjusted"] < 0.05
    assert iid["ci_lo"] <= iid["estimate"] <= iid["ci_hi"]
    expected = []
    for seed in (0, 1):
        means = [
            pd.read_parquet(next(tmp_path.rglob(f"*-{peft}-None-*/seed={seed}/scores.parquet")))
            .query("split == 'test_iid' and answer_type == 'closed'")["closed_correct"]
            .mean()
            for peft in ("lora", "ia3")
        ]
        expected.append(means[0] - means[1])
    assert iid["estimate"] == pytest.approx(np.mean(expected))
    assert iid["seeds_a"] == iid["seeds_b"] == 2 and iid["cases"] == 120
    null = claims[(claims["id_a"] == "prompt_tuning") & (claims["id_b"] == "ia3")]
    assert "holds" not in set(null["verdict"])
    assert set(claims["split"]) == {"test_iid", "test_ood", RR}


@pytest.mark.heavy
def test_an_unscored_item_leaves_its_comparisons_without_a_number(tmp_path: Path) -> None:
    """A judge that could not score one row: that method's comparisons on that split (and RR)
    have no number, say why, and stay in the family at p = 1."""
    plant(tmp_path, {"synthetic_modality": {"lora": (0.8, 0.6), "ia3": (0.6, 0.5)}}, seeds=(0,))
    path = next(tmp_path.rglob("*-ia3-None-*/seed=0/scores.parquet"))
    table = pd.read_parquet(path)
    table.loc[0, "closed_correct"] = np.nan  # a closed i.i.d. row
    table.to_parquet(path)
    claims = family(study_sides(collect([tmp_path]))).frame
    closed = claims[claims["score"].isin(["closed_acc", "closed RR"])].set_index("split")
    assert closed.loc["test_iid", "verdict"] == closed.loc[RR, "verdict"] == "no number"
    assert "without a score" in closed.loc["test_iid", "why"]
    assert closed.loc["test_ood", "verdict"] != "no number"
