"""The `subgroups` family: group scores and gaps by hand, a case-level permutation test, BH
q-values as scipy computes them, and the family through the scoring pipeline."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import false_discovery_control

from medvqa import plugins
from medvqa.scoring.metrics.subgroups import (
    SubgroupsMetric,
    bh_q_values,
    block_labels,
    permutation_p,
    permuted_block_labels,
)
from medvqa.statistics.bootstrap import Bootstrap, cluster_bootstrap

P = 200  # permutations: enough for the known answers below, fast
BOOT = Bootstrap(samples=200, seed=7, level=0.95)


def family(fields=("modality",), **options) -> SubgroupsMetric:
    return SubgroupsMetric(
        list(fields) if fields is not None else None,
        permutations=options.pop("permutations", P),
        bootstrap=options.pop("bootstrap", BOOT),
        **options,
    )


def table(groups: dict[str, list[float]], field: str = "modality", case_size: int = 1):
    """Rows of each group with the given correctness; `case_size` consecutive rows of a group
    share a case."""
    rows = []
    for value, correct in groups.items():
        for i, c in enumerate(correct):
            rows.append({field: value, "closed_correct": c, "case_id": f"{value}{i // case_size}"})
    return pd.DataFrame(rows)


def key(field: str, value: str, part: str) -> str:
    return f"subgroups_{field}={value}_{part}"


# ---- BH ----------------------------------------------------------------------------------


def test_bh_q_values_by_hand() -> None:
    # sorted p 0.01, 0.03, 0.04, 0.20 (m = 4): p*m/rank = 0.04, 0.06, 0.0533, 0.20, then the
    # running minimum from the largest rank down: 0.04, 0.0533, 0.0533, 0.20.
    q = bh_q_values([0.01, 0.04, 0.03, 0.20])
    assert q == pytest.approx([0.04, 0.16 / 3, 0.16 / 3, 0.20])
    assert bh_q_values([]).size == 0


def test_q_values_are_scipys_over_every_tested_group_of_every_field() -> None:
    rng = np.random.default_rng(3)
    frame = table(
        {"CT": list(rng.random(30) < 0.9), "MRI": list(rng.random(30) < 0.5), "US": [1.0] * 4}
    )
    frame["closed_correct"] = frame["closed_correct"].astype(float)
    frame["sex"] = np.where(np.arange(len(frame)) % 2, "F", "M")
    out = family(["modality", "sex"]).aggregate(frame)
    tested = [
        k.removesuffix("_p") for k, v in out.items() if k.endswith("_p") and not math.isnan(v)
    ]
    # US has 4 rows (< min_rows 10): no p-value, so not among BH's tests
    assert sorted(tested) == sorted(
        ["subgroups_modality=CT", "subgroups_modality=MRI", "subgroups_sex=F", "subgroups_sex=M"]
    )
    p = np.array([out[f"{t}_p"] for t in tested])
    q = np.array([out[f"{t}_q"] for t in tested])
    assert q == pytest.approx(false_discovery_control(p, method="bh"))
    assert out["subgroups_tested"] == 4
    assert out["subgroups_significant"] == np.count_nonzero(q < 0.05)
    assert out[key("modality", "CT", "p")] < 0.05  # 0.9 vs 0.5 over 30 rows each


# ---- scores and gaps ---------------------------------------------------------------------


def test_group_scores_and_gaps_by_hand() -> None:
    frame = table({"A": [1.0] * 10, "B": [1.0] * 5 + [0.0] * 5, "C": [1.0] * 2 + [0.0] * 8})
    out = family().aggregate(frame)
    assert out[key("modality", "A", "score")] == 1.0
    assert out[key("modality", "B", "score")] == 0.5
    assert out[key("modality", "C", "score")] == pytest.approx(0.2)
    # gap = group mean - mean of the other 20 rows: A 1 - 7/20, B 0.5 - 12/20, C 0.2 - 15/20
    assert out[key("modality", "A", "gap")] == pytest.approx(0.65)
    assert out[key("modality", "B", "gap")] == pytest.approx(-0.10)
    assert out[key("modality", "C", "gap")] == pytest.approx(-0.55)
    assert out["subgroups_modality_worst_gap"] == pytest.approx(-0.55)
    assert out["subgroups_modality_groups"] == 3
    assert all(out[key("modality", v, "n")] == 10 for v in "ABC")
    # the interval is the case-clustered bootstrap of the group's rows
    b = frame[frame["modality"] == "B"]
    ci = cluster_bootstrap(b["closed_correct"], b["case_id"], B=200, seed=7, level=0.95)
    assert out[key("modality", "B", "score_ci_lo")] == ci.lo
    assert out[key("modality", "B", "score_ci_hi")] == ci.hi
    assert ci.lo < 0.5 < ci.hi


def test_rows_without_a_score_do_not_count() -> None:
    frame = table({"A": [1.0] * 10, "B": [0.0] * 10})
    with_open = pd.concat(
        [frame, table({"A": [math.nan] * 5, "D": [math.nan] * 3}).assign(case_id="x")],
        ignore_index=True,
    )
    plain, mixed = family().aggregate(frame), family().aggregate(with_open)
    for part in ("score", "gap", "n", "p"):
        for value in "AB":
            assert mixed[key("modality", value, part)] == plain[key("modality", value, part)]
    assert mixed[key("modality", "D", "n")] == 0
    assert math.isnan(mixed[key("modality", "D", "score")])


def test_small_groups_get_nan_and_stay_out_of_bh() -> None:
    frame = table({"A": [1.0] * 12, "B": [0.0] * 12, "S": [0.0] * 3})
    out = family().aggregate(frame)
    for part in ("score", "score_ci_lo", "gap", "p", "q"):
        assert math.isnan(out[key("modality", "S", part)]), part
    assert out[key("modality", "S", "n")] == 3
    assert out["subgroups_tested"] == 2
    p = [out[key("modality", v, "p")] for v in "AB"]
    assert [out[key("modality", v, "q")] for v in "AB"] == pytest.approx(
        false_discovery_control(p, method="bh")
    )


def test_list_valued_field_puts_a_row_in_each_of_its_values() -> None:
    cells = [["a"]] * 12 + [["b"]] * 12 + [["a", "b"]] * 6
    correct = [1.0] * 12 + [0.0] * 12 + [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    frame = pd.DataFrame(
        {"question_class": cells, "closed_correct": correct, "case_id": range(len(cells))}
    )
    out = family(["question_class"]).aggregate(frame)
    assert out[key("question_class", "a", "n")] == 18
    assert out[key("question_class", "a", "score")] == pytest.approx(15 / 18)
    # the rest of "a" is the 12 rows with only "b": all wrong
    assert out[key("question_class", "a", "gap")] == pytest.approx(15 / 18)
    assert out[key("question_class", "b", "score")] == pytest.approx(3 / 18)
    assert out[key("question_class", "b", "gap")] == pytest.approx(3 / 18 - 1)
    # cells read back from Parquet are arrays: the same groups
    arrays = frame.assign(question_class=[np.array(c) for c in cells])
    assert family(["question_class"]).aggregate(arrays) == pytest.approx(out, nan_ok=True)


# ---- the permutation test ----------------------------------------------------------------


def test_p_value_of_a_clear_and_of_no_difference() -> None:
    # all-correct group vs all-wrong rest, 15 cases each: no permutation reaches |gap| = 1
    # (chance 2 / C(30, 15) ~ 1e-8), so p is its floor 1 / (1 + P)
    clear = table({"A": [1.0] * 15, "B": [0.0] * 15})
    assert family().aggregate(clear)[key("modality", "A", "p")] == 1 / (1 + P)
    # the same mean inside and outside: every permutation is at least as far, p = 1
    same = table({"A": [1.0, 0.0] * 5, "B": [1.0, 0.0] * 10})
    out = family().aggregate(same)
    assert out[key("modality", "A", "gap")] == 0.0
    assert out[key("modality", "A", "p")] == 1.0


def test_p_value_is_deterministic_given_the_seed() -> None:
    rng = np.random.default_rng(1)
    values = (rng.random(60) < 0.6).astype(float)
    group = np.arange(60) < 25
    cases = np.arange(60) // 2

    def p(seed: int) -> float:
        return permutation_p(values, group, cases, P, np.random.default_rng(seed))

    assert p(5) == p(5)
    assert 0.01 < p(5) < 1.0
    frame = table({"A": list(values[:25]), "B": list(values[25:])}, case_size=2)
    assert family().aggregate(frame) == pytest.approx(family().aggregate(frame), nan_ok=True)


def test_permuted_labels_are_constant_within_a_case() -> None:
    cases = np.array(["c1", "c1", "c2", "c2", "c2", "c3", "c4", "c4"])
    in_group = np.isin(cases, ["c1", "c3"])
    codes, labels = block_labels(in_group, cases)
    assert len(labels) == 4  # the field is constant within each case: the blocks are cases
    drawn = permuted_block_labels(labels, 50, np.random.default_rng(0))
    rows = drawn[:, codes]  # each permutation's label per row
    for case in set(cases):
        same_case = rows[:, cases == case]
        assert (same_case == same_case[:, :1]).all()
    assert (drawn.sum(axis=1) == labels.sum()).all()  # as many cases in the group as observed
    assert len({tuple(d) for d in drawn}) > 1


def test_case_level_and_row_level_tests_differ() -> None:
    # two cases of ten correct answers in the group, two of ten wrong ones outside it. Cases
    # permuted: 2 of the C(4, 2) = 6 assignments reach |gap| = 1, so p ~ 1/3. Rows permuted
    # (each row its own case) would call the same data certain: p = 1 / (1 + P).
    frame = table({"A": [1.0] * 20, "B": [0.0] * 20}, case_size=10)
    case_level = family().aggregate(frame)[key("modality", "A", "p")]
    assert 0.25 < case_level < 0.42
    rows = frame.assign(case_id=range(len(frame)))
    assert family().aggregate(rows)[key("modality", "A", "p")] == 1 / (1 + P)


def test_a_row_varying_field_keeps_each_case_part_whole() -> None:
    # question type varies within a case: blocks are (case, in group) parts
    cases = np.array([0, 0, 0, 1, 1, 2])
    in_group = np.array([True, False, False, True, True, False])
    codes, labels = block_labels(in_group, cases)
    assert list(codes) == [0, 1, 1, 2, 2, 3]
    assert list(labels) == [True, False, True, False]


# ---- subsets, errors, declarations -------------------------------------------------------


def test_a_subset_with_one_group_gives_nan_gaps() -> None:
    frame = table({"A": [1.0] * 10, "B": [0.0] * 10})
    out = family().aggregate(frame[frame["modality"] == "A"])
    assert out[key("modality", "A", "score")] == 1.0
    assert math.isnan(out[key("modality", "A", "gap")])
    assert math.isnan(out["subgroups_modality_worst_gap"])
    assert out["subgroups_tested"] == 0 and math.isnan(out["subgroups_significant"])


def test_missing_field_or_column_is_a_clear_error() -> None:
    frame = table({"A": [1.0] * 10})
    with pytest.raises(ValueError, match=r"\['organ'\].*metric\.subgroups\.fields"):
        family(["organ"]).aggregate(frame)
    with pytest.raises(ValueError, match=r"'judge_score'.*metric\.subgroups\.column"):
        family(column="judge_score").aggregate(frame)
    with pytest.raises(ValueError, match="case_id"):
        family().aggregate(frame.drop(columns="case_id"))
    with pytest.raises(ValueError, match="min_rows"):
        family(min_rows=0)


def test_default_fields_are_the_datasets_declared_ones() -> None:
    synthetic = plugins.get("dataset", "synthetic")
    metric = family(None, dataset=plugins.target_of(synthetic))
    assert metric.fields == list(synthetic.metadata_fields)
    with pytest.raises(ValueError, match=r"'synthetic' declares.*metric\.subgroups\.fields"):
        metric.aggregate(table({"A": [1.0] * 10}))
    # without a declaration: those of the documented list the table has
    undeclared = family(None).aggregate(table({"A": [1.0] * 10, "B": [0.0] * 10}))
    assert undeclared[key("modality", "A", "score")] == 1.0


def test_high_cardinality_field_is_skipped() -> None:
    frame = table({str(i): [1.0] for i in range(5)})
    out = family(max_groups=3).aggregate(frame)
    assert out["subgroups_modality_groups"] == 5
    assert not any("=" in k for k in out)


def test_which_scores_are_performances() -> None:
    cls = plugins.get("metric", "subgroups")
    info = cls.score_info("subgroups_sex=F_score")
    assert info.performance and info.higher_is_better
    for score in ("subgroups_sex=F_gap", "subgroups_sex_worst_gap"):  # signed: no RR
        info = cls.score_info(score)
        assert not info.performance and info.higher_is_better, score
    for part in ("p", "q", "n", "score_ci_lo", "score_ci_hi", "score_ci_half"):
        assert not cls.score_info(f"subgroups_sex=F_{part}").performance, part
    for score in ("subgroups_significant", "subgroups_tested", "subgroups_sex_groups"):
        assert not cls.score_info(score).performance, score


# ---- through the scoring pipeline --------------------------------------------------------


def _predictions(flip: int) -> pd.DataFrame:
    """12 closed CT rows answered right, 12 closed MRI rows answered right except the first
    `flip`, one case each, and 4 open rows."""
    rows = []
    for i in range(24):
        modality = "CT" if i < 12 else "MRI"
        wrong = modality == "MRI" and i - 12 < flip
        rows.append(
            ("Is there a lesion?", "yes", "no" if wrong else "yes", "closed", ["yes", "no"],
             f"c{i}", modality)
        )  # fmt: skip
    for i in range(4):
        rows.append(("Which organ?", "liver", "liver", "open", None, f"o{i}", "CT"))
    frame = pd.DataFrame(
        rows,
        columns=["question", "answer", "prediction", "answer_type", "candidates", "case_id",
                 "modality"],
    )  # fmt: skip
    frame["id"] = [f"r{i}" for i in range(len(frame))]
    frame["question_type"] = "presence"
    return frame


def test_scoring_pipeline_with_traditional_and_subgroups() -> None:
    from medvqa.scoring.pipeline import Scoring
    from tests.conftest import compose

    cfg = compose(
        [
            "metric=[traditional,subgroups]",
            "metric.subgroups.fields=[modality]",
            f"metric.subgroups.permutations={P}",
            "evaluation.bootstrap.samples=200",
            "evaluation.breakdown=[modality]",
        ]
    )
    predictions = {"test_iid": _predictions(flip=2), "test_ood": _predictions(flip=8)}
    with Scoring.from_config(cfg.metric, cfg.evaluation) as scoring:
        results, scored = scoring.score(predictions)
        assert [f.name for f in scoring.families] == ["traditional", "subgroups"]
        assert not scoring.is_performance("test_ood/subgroups_modality=MRI_p")
    # open rows have no closed_correct: 12 closed rows per modality
    assert results["test_ood/subgroups_modality=MRI_n"] == 12
    assert results["test_iid/subgroups_modality=MRI_score"] == pytest.approx(10 / 12)
    assert results["test_ood/subgroups_modality=MRI_score"] == pytest.approx(4 / 12)
    assert results["test_ood/subgroups_modality=MRI_gap"] == pytest.approx(4 / 12 - 1)
    assert results["test_ood/subgroups_modality_worst_gap"] == pytest.approx(4 / 12 - 1)
    assert results["test_ood/subgroups_modality=MRI_p"] < 0.05
    assert results["test_ood/subgroups_significant"] == 2  # CT and MRI: one gap, both signs
    # each breakdown subset holds one modality: a score, no gap
    assert results["test_ood/modality=MRI/subgroups_modality=MRI_score"] == pytest.approx(4 / 12)
    assert math.isnan(results["test_ood/modality=MRI/subgroups_modality=MRI_gap"])
    # RR for the performances only
    assert "robustness/rr_subgroups_modality=MRI_score" in results
    for part in ("gap", "p", "q", "n", "score_ci_lo"):
        assert f"robustness/rr_subgroups_modality=MRI_{part}" not in results
    assert "robustness/rr_subgroups_significant" not in results
    assert set(scored["split"]) == {"test_iid", "test_ood"}


def test_composed_default_reads_the_datasets_fields() -> None:
    from medvqa.scoring.pipeline import build_families
    from tests.conftest import compose

    _, metric = build_families(compose(["metric=[traditional,subgroups]"]).metric)
    assert metric.fields == list(plugins.get("dataset", "synthetic").metadata_fields)
    assert metric.bootstrap == Bootstrap()
