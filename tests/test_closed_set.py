"""Closed-set metrics with the RoboSurg release's fixed-label semantics: hand-computed scores,
the headline over primary tasks, the source-sequence bootstrap and paired deltas."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import balanced_accuracy_score, f1_score, recall_score

from medvqa.scoring.metrics.closed_set import (
    CS_CHOICE,
    ClosedSetMetric,
    balanced_accuracy,
    macro_f1,
)
from medvqa.statistics.bootstrap import Bootstrap, cluster_sum_replicates

Q5 = ["blurry", "clear", "mixed"]
YES_NO = ["no", "yes"]
# q5, 4 rows: truth, raw prediction. "mixed" occurs in neither truth nor prediction.
Q5_ROWS = [("clear", "clear"), ("clear", "blurry"), ("blurry", "Blurry."), ("clear", "sharp")]
# Per label (tp, fp, fn): blurry (1, 1, 0) F1 2/3, recall 1; clear (1, 0, 2) F1 1/2, recall 1/3;
# mixed (0, 0, 0) F1 0, recall 0; "sharp" is invalid: a miss of "clear", no fp anywhere.
Q5_MACRO_F1 = Fraction(2, 3) / 3 + Fraction(1, 2) / 3  # 7/18
Q5_BALANCED = (1 + Fraction(1, 3)) / 3  # 4/9
# q6, 4 rows: no (tp 1, fp 0, fn 1) F1 2/3; yes (tp 2, fp 1, fn 0) F1 4/5 -> 11/15.
Q6_ROWS = [("no", "no"), ("no", "Yes, there is glare"), ("yes", "yes"), ("yes", "yes")]
Q6_MACRO_F1 = (Fraction(2, 3) + Fraction(4, 5)) / 2


def _row(task: str, labels: list[str], answer: str, prediction: str, sequence: str, i: int):
    return {
        "id": f"{sequence}/{i}|{task}",
        "question": "q",
        "answer": answer,
        "prediction": prediction,
        "answer_type": "closed",
        "candidates": labels,
        "case_id": sequence,
        "question_id": task,
    }


def _table(sequence_of=lambda i: "test|site2/video1") -> pd.DataFrame:
    rows = [_row("q5", Q5, a, p, sequence_of(i), i) for i, (a, p) in enumerate(Q5_ROWS)]
    rows += [_row("q6", YES_NO, a, p, sequence_of(i), i) for i, (a, p) in enumerate(Q6_ROWS)]
    # A non-primary task the headline must ignore: all wrong.
    rows += [
        _row(
            "q9",
            ["near instrument jaws", "none"],
            "none",
            "near instrument jaws",
            sequence_of(0),
            9,
        )
    ]
    return pd.DataFrame(rows)


def _scored(metric: ClosedSetMetric, table: pd.DataFrame) -> pd.DataFrame:
    return table.join(metric.per_sample(table))


def test_fixed_label_scores_by_hand() -> None:
    gt = [a for a, _ in Q5_ROWS]
    pred = ["clear", "blurry", "blurry", None]
    assert macro_f1(gt, pred, Q5) == pytest.approx(float(Q5_MACRO_F1))
    assert balanced_accuracy(gt, pred, Q5) == pytest.approx(float(Q5_BALANCED))
    # Over the observed labels instead: blurry and clear only.
    assert macro_f1(gt, pred) == pytest.approx(7 / 12)
    assert balanced_accuracy(gt, pred) == pytest.approx(2 / 3)
    # The release's scikit-learn calls agree with the fixed list; balanced_accuracy_score does not.
    sk_pred = [p or "<invalid>" for p in pred]
    assert f1_score(gt, sk_pred, labels=Q5, average="macro", zero_division=0) == pytest.approx(
        7 / 18
    )
    assert recall_score(gt, sk_pred, labels=Q5, average="macro", zero_division=0) == pytest.approx(
        4 / 9
    )
    with pytest.warns(UserWarning):
        assert balanced_accuracy_score(gt, sk_pred) != pytest.approx(4 / 9)
    assert math.isnan(macro_f1([], [], Q5))


def test_aggregate_per_task_and_headline() -> None:
    metric = ClosedSetMetric(
        tasks=["q5", "q6", "q2"], primary=["q5", "q6"], bootstrap=Bootstrap(samples=50)
    )
    scored = _scored(metric, _table())
    assert scored[CS_CHOICE].tolist()[:8] == [
        "clear",
        "blurry",
        "blurry",
        None,
        "no",
        "yes",
        "yes",
        "yes",
    ]
    out = metric.aggregate(scored)
    assert out["cs_q5_macro_f1"] == pytest.approx(7 / 18)
    assert out["cs_q5_balanced_acc"] == pytest.approx(4 / 9)
    assert out["cs_q5_acc"] == pytest.approx(0.5)
    assert out["cs_q5_invalid_rate"] == pytest.approx(0.25)
    assert out["cs_q6_macro_f1"] == pytest.approx(11 / 15)
    assert out["cs_q6_balanced_acc"] == pytest.approx((0.5 + 1) / 2)
    assert out["cs_q9_macro_f1"] == 0.0
    assert out["cs_primary_macro_f1"] == pytest.approx(float((Q5_MACRO_F1 + Q6_MACRO_F1) / 2))
    assert out["cs_primary_invalid_rate"] == pytest.approx(0.125)
    assert out["cs_invalid_rate"] == pytest.approx(1 / 9)
    # A listed task without rows has NaN keys; one cluster gives no interval.
    assert math.isnan(out["cs_q2_macro_f1"]) and out["cs_q2_n"] == 0.0
    assert math.isnan(out["cs_primary_macro_f1_ci_lo"])
    # A primary task without rows makes the headline NaN, not a mean over the others.
    metric_q2 = ClosedSetMetric(primary=["q2", "q5", "q6"], bootstrap=Bootstrap())
    assert math.isnan(metric_q2.aggregate(_scored(metric_q2, _table()))["cs_primary_macro_f1"])
    # labels=observed: q5 over blurry and clear only.
    observed = ClosedSetMetric(primary=["q5"], labels="observed", bootstrap=Bootstrap())
    assert observed.aggregate(_scored(observed, _table()))["cs_q5_macro_f1"] == pytest.approx(
        7 / 12
    )


def _sequence(i: int) -> str:
    # (split, video_key): site2/video1 is two sequences, a training and a test one.
    return ("train|site2/video1", "test|site2/video1", "test|site2/video2")[i % 3]


def _brute_headline(rows: pd.DataFrame, labels: dict[str, list[str]]) -> float:
    return float(
        np.mean(
            [macro_f1(g["answer"], g[CS_CHOICE], labels[t]) for t, g in rows.groupby("question_id")]
        )
    )


@pytest.mark.heavy
def test_bootstrap_resamples_sequences_by_the_draw_contract() -> None:
    B, seed = 200, 7
    metric = ClosedSetMetric(primary=["q5", "q6"], bootstrap=Bootstrap(samples=B, seed=seed))
    scored = _scored(metric, _table(_sequence))
    scored = scored[scored["question_id"] != "q9"]
    clusters = sorted(set(scored["case_id"]))
    assert len(clusters) == 3  # the two site2/video1 sequences stay apart
    labels = {"q5": Q5, "q6": YES_NO}
    rng = np.random.default_rng(seed)
    reps = []
    for _ in range(B):
        drawn = [clusters[min(int(u * 3), 2)] for u in rng.random(3)]
        rows = pd.concat([scored[scored["case_id"] == c] for c in drawn])
        reps.append(
            _brute_headline(rows, labels) if set(rows["question_id"]) == {"q5", "q6"} else np.nan
        )
    reps = np.asarray(reps)
    lo, hi = np.quantile(reps[np.isfinite(reps)], [0.025, 0.975])
    out = metric.aggregate(scored)
    assert out["cs_primary_macro_f1"] == pytest.approx(_brute_headline(scored, labels))
    assert out["cs_primary_macro_f1_ci_lo"] == pytest.approx(lo)
    assert out["cs_primary_macro_f1_ci_hi"] == pytest.approx(hi)
    assert out["cs_primary_macro_f1_ci_half"] == pytest.approx((hi - lo) / 2)


@pytest.mark.heavy
def test_paired_delta_uses_the_same_draws() -> None:
    B, seed = 200, 3
    metric = ClosedSetMetric(primary=["q5", "q6"], bootstrap=Bootstrap(samples=B, seed=seed))
    a = _scored(metric, _table(_sequence))
    a = a[a["question_id"] != "q9"]
    b_table = a.drop(columns=[c for c in a.columns if c.startswith("cs_")])
    b_table = b_table.assign(prediction=np.where(b_table["question_id"] == "q5", "clear", "no"))
    b = _scored(metric, b_table)
    labels = {"q5": Q5, "q6": YES_NO}
    clusters = sorted(set(a["case_id"]))
    rng = np.random.default_rng(seed)
    deltas = []
    for _ in range(B):
        drawn = [clusters[min(int(u * 3), 2)] for u in rng.random(3)]
        pick = [pd.concat([s[s["case_id"] == c] for c in drawn]) for s in (a, b)]
        if set(pick[0]["question_id"]) == {"q5", "q6"}:
            deltas.append(_brute_headline(pick[0], labels) - _brute_headline(pick[1], labels))
    ci = metric.paired_delta(a, b)
    assert ci.point == pytest.approx(_brute_headline(a, labels) - _brute_headline(b, labels))
    assert (ci.lo, ci.hi) == pytest.approx(tuple(np.quantile(deltas, [0.025, 0.975])))
    # A condition against itself: every paired replicate is 0.
    same = metric.paired_delta(a, a)
    assert (same.point, same.lo, same.hi) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="same questions"):
        metric.paired_delta(a, b.iloc[1:])


def test_cluster_sum_replicates_follows_the_draw_contract() -> None:
    totals = np.array([[1.0, 0.0], [0.0, 2.0], [5.0, 1.0]])
    reps = cluster_sum_replicates(totals, B=4, seed=11)
    rng = np.random.default_rng(11)
    for b in range(4):
        idx = np.minimum((rng.random(3) * 3).astype(int), 2)
        assert np.array_equal(reps[b], totals[idx].sum(axis=0))
    with pytest.raises(ValueError, match="non-empty"):
        cluster_sum_replicates(np.zeros((0, 2)))


def test_errors_and_options() -> None:
    with pytest.raises(ValueError, match="labels must be one of"):
        ClosedSetMetric(labels="all", bootstrap=Bootstrap())
    table = _table()
    table.loc[5, "candidates"] = ["yes", "no"]  # another label list for q6
    metric = ClosedSetMetric(bootstrap=Bootstrap())
    with pytest.raises(ValueError, match="task 'q6' has rows with different label lists"):
        metric.aggregate(_scored(metric, table))
    with pytest.raises(ValueError, match="question_id"):
        metric.per_sample(table.drop(columns="question_id"))
    # An abstention label, where a data set defines one: coverage and committed accuracy.
    rows = [
        _row("q", ["yes", "no", "Unknown"], a, p, "s", i)
        for i, (a, p) in enumerate(
            [("yes", "yes"), ("no", "Unknown"), ("no", "yes"), ("Unknown", "Unknown")]
        )
    ]
    abstaining = ClosedSetMetric(abstain_label="Unknown", bootstrap=Bootstrap())
    out = abstaining.aggregate(_scored(abstaining, pd.DataFrame(rows)))
    assert out["cs_q_coverage"] == pytest.approx(0.5)
    assert out["cs_q_cond_acc"] == pytest.approx(0.5)


def test_config_scores_the_loader_records(tmp_path) -> None:
    """RoboSurg records from the release fixture, scored by the family `metric=closed_set`
    builds: predicting the truth gives accuracy 1, but macro-F1 only (labels seen) / (labels
    in the fixed list), since each label absent from truth and prediction counts 0."""
    from medvqa.data.sources.robosurg_vqa import RoboSurgVqa
    from medvqa.scoring.pipeline import build_families
    from tests.conftest import compose
    from tests.native.robosurg_vqa import write as write_robosurg

    table = RoboSurgVqa(write_robosurg(tmp_path / "robosurg").root).table()
    test = table[table["source_split"] == "test"]
    (metric,) = build_families(compose(["metric=closed_set"]).metric)
    assert isinstance(metric, ClosedSetMetric)
    out = metric.aggregate(_scored(metric, test.assign(prediction=test["answer"])))
    share = {}
    for task in metric.tasks:
        assert out[f"cs_{task}_acc"] == 1.0 and out[f"cs_{task}_invalid_rate"] == 0.0
        rows = test[test["question_id"] == task]
        share[task] = rows["answer"].nunique() / len(rows["candidates"].iloc[0])
        assert out[f"cs_{task}_macro_f1"] == pytest.approx(share[task])
    assert metric.primary == [
        "q2",
        "q4.bleeding",
        "q4.occlusion",
        "q5",
        "q6",
        "q7",
        "q8.mask_center_5pct_v1",
    ]
    assert out["cs_primary_macro_f1"] == pytest.approx(np.mean([share[t] for t in metric.primary]))
    assert min(share.values()) < 1.0  # the fixture leaves some labels unused
    assert out["cs_n"] == len(test)
