"""Closed-set (RoboSurg) metrics: a hand-computed example with Unknowns, invalid outputs and
the Q4 tuple, plus parsing and agreement with scikit-learn's definitions."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from medvqa.data.sources.robosurg_vqa import ARTEFACT_SPACE, QUESTIONS
from medvqa.evaluation.families.closed_set import (
    CS_CHOICE,
    ROBOSURG_QUESTIONS,
    ROBOSURG_UNKNOWN_QUESTIONS,
    ClosedSetMetric,
    balanced_accuracy,
    macro_f1,
    parse_label,
)

Q8_SPACE = list(QUESTIONS["Q8"][1])  # yes, no, Unknown
Q6_SPACE = list(QUESTIONS["Q6"][1])  # yes, no
Q4_SPACE = list(ARTEFACT_SPACE)


def _row(qid: str, space: list[str], answer: str, prediction: str, case: str) -> dict:
    return {
        "id": f"{case}/{qid}",
        "question": "q",
        "answer": answer,
        "prediction": prediction,
        "answer_type": "closed",
        "candidates": space,
        "case_id": case,
        "question_id": qid,
        "site": "A",
    }


def _bits(b: str, s: str, o: str) -> str:
    return f"bleeding={b}, smoke={s}, occlusion={o}"


# Q8 (yes / no / Unknown), 7 rows: gt, prediction -> parsed label
Q8_ROWS = [
    ("yes", "Yes", "yes"),  # 1 correct
    ("yes", "unknown", "Unknown"),  # 2 abstains (whole words: "unknown" does not contain "no")
    ("no", "No.", "no"),  # 3 correct
    ("no", "yes", "yes"),  # 4 wrong
    ("Unknown", "Unknown", "Unknown"),  # 5 correct
    ("no", "maybe", None),  # 6 invalid: no label
    ("yes", "yes or no", None),  # 7 invalid: two labels
]
# Q6 (yes / no), 3 rows
Q6_ROWS = [
    ("yes", "yes", "yes"),  # correct
    ("no", "Yes, there is glare", "yes"),  # wrong (containment selects yes)
    ("no", "", None),  # invalid: empty output
]
# Q4 (artefact tuple), 4 rows
Q4_ROWS = [
    (_bits("no", "yes", "no"), "bleeding=no, smoke=yes, occlusion=no", _bits("no", "yes", "no")),
    # key=value in another order with ';' -> parsed, occlusion bit wrong
    (_bits("yes", "no", "no"), "smoke=no; bleeding=yes; occlusion=yes", _bits("yes", "no", "yes")),
    (_bits("no", "no", "yes"), "Occlusion only", None),  # invalid: no bits at all
    # prose around the tuple -> containment of exactly one tuple label
    (
        _bits("yes", "yes", "no"),
        "The artefacts: bleeding=yes, smoke=yes, occlusion=no.",
        _bits("yes", "yes", "no"),
    ),
]


@pytest.fixture
def table() -> pd.DataFrame:
    rows = []
    for i, (gt, pred, _) in enumerate(Q8_ROWS):
        rows.append(_row("Q8", Q8_SPACE, gt, pred, f"f{i}"))
    for i, (gt, pred, _) in enumerate(Q6_ROWS):
        rows.append(_row("Q6", Q6_SPACE, gt, pred, f"f{i}"))
    for i, (gt, pred, _) in enumerate(Q4_ROWS):
        rows.append(_row("Q4", Q4_SPACE, gt, pred, f"f{i}"))
    return pd.DataFrame(rows, index=pd.RangeIndex(100, 100 + len(rows)))


def _score(metric: ClosedSetMetric, table: pd.DataFrame) -> pd.DataFrame:
    return table.join(metric.per_sample(table))


def test_parsed_labels(table: pd.DataFrame) -> None:
    per = ClosedSetMetric().per_sample(table)
    assert per.index.equals(table.index)
    expected = [r[2] for r in (*Q8_ROWS, *Q6_ROWS, *Q4_ROWS)]
    assert per[CS_CHOICE].tolist() == expected
    assert per["cs_invalid"].tolist() == [float(e is None) for e in expected]
    # Unknown flag only where the space has Unknown (Q8); NaN for Q6 and Q4.
    assert per["cs_unknown"].iloc[:7].tolist() == [0, 1, 0, 0, 1, 0, 0]
    assert per["cs_unknown"].iloc[7:].isna().all()


def test_known_answer_example(table: pd.DataFrame) -> None:
    out = ClosedSetMetric().aggregate(_score(ClosedSetMetric(), table))
    expected = {
        # Q8: correct rows 1, 3, 5 -> acc 3/7.
        # F1 yes: tp 1 (r1), fp 1 (r4), fn 2 (r2, r7) -> 2/5
        # F1 no: tp 1 (r3), fp 0, fn 2 (r4, r6) -> 2/4
        # F1 Unknown: tp 1 (r5), fp 1 (r2), fn 0 -> 2/3
        # macro-F1 = (2/5 + 1/2 + 2/3) / 3 = 47/90
        "cs_Q8_macro_f1": 47 / 90,
        "cs_Q8_acc": 3 / 7,
        # recall yes 1/3 (r1 of r1,r2,r7), no 1/3 (r3 of r3,r4,r6), Unknown 1/1 -> 5/9
        "cs_Q8_balanced_acc": 5 / 9,
        # Unknown predicted on r2, r5 -> coverage 1 - 2/7
        "cs_Q8_coverage": 5 / 7,
        # committed rows r1, r3, r4, r6 (invalid), r7 (invalid) -> correct r1, r3 -> 2/5
        "cs_Q8_cond_acc": 2 / 5,
        "cs_Q8_invalid_rate": 2 / 7,
        "cs_Q8_n": 7.0,
        # Q6: F1 yes tp 1 fp 1 fn 0 -> 2/3; F1 no tp 0 fn 2 -> 0; macro 1/3
        "cs_Q6_macro_f1": 1 / 3,
        "cs_Q6_acc": 1 / 3,
        "cs_Q6_balanced_acc": 1 / 2,  # recall yes 1, no 0
        "cs_Q6_invalid_rate": 1 / 3,
        "cs_Q6_n": 3.0,
        # Q4 tuples: rows 1 and 4 exact -> 2/4
        "cs_Q4_tuple_em": 0.5,
        # bleeding gt [no, yes, no, yes] pred [no, yes, -, yes]: yes 2tp -> 1; no tp1 fn1 -> 2/3
        "cs_Q4_bleeding_macro_f1": 5 / 6,
        # smoke gt [yes, no, no, yes] pred [yes, no, -, yes]: same pattern -> 5/6
        "cs_Q4_smoke_macro_f1": 5 / 6,
        # occlusion gt [no, no, yes, no] pred [no, yes, -, no]:
        # no tp 2 fn 1 -> 4/5; yes tp 0 fp 1 fn 1 -> 0; macro 2/5
        "cs_Q4_occlusion_macro_f1": 2 / 5,
        "cs_Q4_bit_macro_f1": (5 / 6 + 5 / 6 + 2 / 5) / 3,  # 31/45
        "cs_Q4_invalid_rate": 1 / 4,
        "cs_Q4_n": 4.0,
        # overall = mean(Q8 47/90, Q6 30/90, Q4 62/90) = 139/270
        "cs_overall_macro_f1": 139 / 270,
        "cs_invalid_rate": 4 / 14,  # 2 + 1 + 1 invalid of 14 rows
        "cs_n": 14.0,
    }
    assert set(out) == set(expected)
    for key, value in expected.items():
        assert out[key] == pytest.approx(value, abs=1e-12), key
    assert all("/" not in k for k in out)


def test_aggregate_on_subsets_and_fixed_questions(table: pd.DataFrame) -> None:
    metric = ClosedSetMetric(
        questions=ROBOSURG_QUESTIONS, unknown_questions=ROBOSURG_UNKNOWN_QUESTIONS
    )
    assert ROBOSURG_UNKNOWN_QUESTIONS == ("Q3", "Q5", "Q8")
    scored = _score(metric, table)
    q6 = metric.aggregate(scored[scored["question_id"] == "Q6"])
    assert q6["cs_overall_macro_f1"] == pytest.approx(1 / 3)
    assert math.isnan(q6["cs_Q8_macro_f1"]) and q6["cs_Q8_n"] == 0.0
    assert math.isnan(q6["cs_Q4_tuple_em"]) and math.isnan(q6["cs_Q8_coverage"])
    assert "cs_Q6_coverage" not in q6
    full = metric.aggregate(scored)
    assert set(full) == set(metric.aggregate(scored.iloc[:0]))  # same keys for any subset
    assert math.isnan(metric.aggregate(scored.iloc[:0])["cs_overall_macro_f1"])
    # Per-site breakdown works on groups (one site here).
    for _, group in scored.groupby("site"):
        assert metric.aggregate(group)["cs_n"] == 14.0


def test_invalid_counts_as_wrong_never_dropped() -> None:
    """All predictions invalid: every score is 0 (not NaN, not 'perfect on zero rows').
    ("no idea" would not do: it selects "no" as a whole word, as a model's "no" would.)"""
    rows = [_row("Q6", Q6_SPACE, gt, "cannot tell", f"f{i}") for i, gt in enumerate(["yes", "no"])]
    table = pd.DataFrame(rows)
    metric = ClosedSetMetric()
    out = metric.aggregate(_score(metric, table))
    assert out["cs_Q6_macro_f1"] == 0.0 and out["cs_Q6_acc"] == 0.0
    assert out["cs_Q6_balanced_acc"] == 0.0 and out["cs_invalid_rate"] == 1.0


def test_parse_label_rules() -> None:
    assert parse_label("ROBOTIC CAMERA", QUESTIONS["Q3"][1]) == "robotic camera"
    assert parse_label("It looks robotic_camera to me", QUESTIONS["Q3"][1]) == "robotic camera"
    assert parse_label("unknown", Q8_SPACE) == "Unknown"
    assert parse_label("not known", Q8_SPACE) is None
    assert parse_label(None, Q8_SPACE) is None
    assert parse_label("Smoke: left and right", QUESTIONS["Q9"][1]) is None  # two labels
    assert parse_label("OCCLUSION=NO, SMOKE=NO, BLEEDING=YES", Q4_SPACE, True) == _bits(
        "yes", "no", "no"
    )
    assert parse_label("bleeding=yes, smoke=no", Q4_SPACE, True) is None  # a bit missing


def test_macro_f1_and_balanced_accuracy_match_sklearn() -> None:
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    labels = ["a", "b", "c", "d"]
    for _ in range(20):
        gt = rng.choice(labels[:3], size=30).tolist()
        pred = [None if rng.random() < 0.15 else str(x) for x in rng.choice(labels, size=30)]
        present = sorted(set(gt) | {p for p in pred if p is not None})
        sk_pred = ["<invalid>" if p is None else p for p in pred]
        want = metrics.f1_score(gt, sk_pred, labels=present, average="macro", zero_division=0)
        assert macro_f1(gt, pred) == pytest.approx(want, abs=1e-12)
        # sklearn's balanced accuracy averages recall over the classes of y_true.
        recalls = metrics.recall_score(
            gt, sk_pred, labels=sorted(set(gt)), average=None, zero_division=0
        )
        assert balanced_accuracy(gt, pred) == pytest.approx(float(np.mean(recalls)), abs=1e-12)


def test_missing_question_id_names_the_fix(table: pd.DataFrame) -> None:
    with pytest.raises(ValueError, match="question_id"):
        ClosedSetMetric().per_sample(table.drop(columns="question_id"))


def test_open_rows_are_not_scored(table: pd.DataFrame) -> None:
    extra = pd.DataFrame([{**_row("Q6", Q6_SPACE, "x", "x", "z"), "answer_type": "open"}])
    extra["candidates"] = [None]
    both = pd.concat([table, extra], ignore_index=True)
    metric = ClosedSetMetric()
    per = metric.per_sample(both)
    assert per.iloc[-1][["cs_correct", "cs_invalid"]].isna().all()
    assert metric.aggregate(both.join(per))["cs_n"] == 14.0


def test_real_records_through_the_configured_family(tmp_path) -> None:
    """RoboSurg records from the native fixture, scored by the family that `metric=closed_set`
    builds, with the scoring layer's per-site breakdown: an oracle scores 1 everywhere and
    its coverage is the share of non-Unknown ground truth."""
    from medvqa.data.sources.robosurg_vqa import RoboSurgVqa
    from medvqa.evaluation.scoring import build_metrics, score_frame
    from tests.conftest import compose
    from tests.native.robosurg_vqa import write as write_robosurg

    table = RoboSurgVqa(write_robosurg(tmp_path / "robosurg").root).table()
    (metric,) = build_metrics(compose(["metric=closed_set"]).metric)
    assert isinstance(metric, ClosedSetMetric)
    preds = table.assign(prediction=table["answer"].str.upper())
    _, scores = score_frame(preds, [metric], ["site"])
    assert scores["cs_overall_macro_f1"] == 1.0 and scores["cs_invalid_rate"] == 0.0
    assert scores["cs_Q4_tuple_em"] == 1.0 and scores["cs_Q4_bit_macro_f1"] == 1.0
    q8 = table[table["question_id"] == "Q8"]
    assert scores["cs_Q8_coverage"] == pytest.approx((q8["answer"] != "Unknown").mean())
    sites = sorted(table["site"].unique())
    assert all(scores[f"site={s}/cs_overall_macro_f1"] == 1.0 for s in sites)
