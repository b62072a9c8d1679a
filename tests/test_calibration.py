"""metric=calibration: known answers for every statistic, and the family's contract."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from medvqa.data import records as R
from medvqa.evaluation.families.calibration import (
    CalibrationMetric,
    accuracy_at_coverage,
    adaptive_ece,
    risk_coverage,
)

CONF = np.array([0.1, 0.2, 0.8, 0.9])
RIGHT = np.array([0.0, 1.0, 1.0, 1.0])


def test_statistics_by_hand() -> None:
    # two equal-mass bins: {0.1, 0.2} accuracy 0.5 vs confidence 0.15; {0.8, 0.9} 1 vs 0.85
    assert adaptive_ece(CONF, RIGHT, bins=2) == pytest.approx(0.5 * 0.35 + 0.5 * 0.15)
    # one bin: |accuracy - mean confidence| = |0.75 - 0.5|
    assert adaptive_ece(CONF, RIGHT, bins=1) == pytest.approx(0.25)
    # as many bins as rows: mean |right - confidence|
    assert adaptive_ece(CONF, RIGHT, bins=10) == pytest.approx(np.mean([0.1, 0.8, 0.2, 0.1]))
    # most confident first: .9 ok, .8 ok, .2 ok, .1 wrong -> risks 0, 0, 0, 1/4
    assert risk_coverage(CONF, RIGHT).tolist() == [0, 0, 0, 0.25]
    assert accuracy_at_coverage(CONF, RIGHT, 0.5) == 1.0
    assert accuracy_at_coverage(CONF, RIGHT, 0.8) == 0.75  # ceil(3.2) = 4 rows
    assert accuracy_at_coverage(CONF, RIGHT, 0.75) == 1.0  # exactly 3 rows
    assert math.isnan(adaptive_ece(np.array([]), np.array([]), 10))


def _preds(logprob_mean, tokens, predictions, answers, types) -> pd.DataFrame:
    n = len(predictions)
    return pd.DataFrame(
        {
            R.ID: [f"q{i}" for i in range(n)],
            R.CASE_ID: [f"c{i}" for i in range(n)],
            R.PREDICTION: predictions,
            R.ANSWER: answers,
            R.ANSWER_TYPE: types,
            R.CANDIDATES: [["yes", "no"] if t == "closed" else None for t in types],
            R.LOGPROB_MEAN: logprob_mean,
            R.LOGPROB_MIN: [v - 1 for v in logprob_mean],
            R.ANSWER_TOKENS: tokens,
        }
    )


def test_the_family_scores_confidence_against_right_and_wrong_per_answer_type() -> None:
    # closed: the four rows above (confidence = exp(mean log-prob x tokens), two tokens each)
    lp = [math.log(c) / 2 for c in CONF]
    preds = _preds(
        [*lp, math.log(0.5), math.log(0.9)],
        [2, 2, 2, 2, 1, 1],
        ["yes", "yes", "no", "Yes", "left lung", "liver"],
        ["no", "yes", "no", "yes", "left lung", "heart"],
        ["closed"] * 4 + ["open"] * 2,
    )
    family = CalibrationMetric(bins=2, coverages=[0.5, 0.8])
    columns = family.per_sample(preds)
    assert columns["calibration_confidence"].tolist() == pytest.approx([*CONF, 0.5, 0.9])
    assert columns["calibration_correct"].tolist() == [*RIGHT, 1, 0]
    scores = family.aggregate(preds.join(columns))
    assert scores["calibration_closed_ece"] == pytest.approx(0.25)
    assert scores["calibration_closed_brier"] == pytest.approx(np.mean((CONF - RIGHT) ** 2))
    assert scores["calibration_closed_aurc"] == pytest.approx(0.0625)
    assert scores["calibration_closed_acc_at_50"] == 1.0
    assert scores["calibration_closed_acc_at_80"] == 0.75
    assert scores["calibration_closed_accuracy"] == 0.75
    assert scores["calibration_closed_confidence"] == pytest.approx(0.5)
    assert scores["calibration_open_brier"] == pytest.approx((0.25 + 0.81) / 2)
    assert scores["calibration_open_n"] == 2
    mean = CalibrationMetric(confidence="mean").per_sample(preds)["calibration_confidence"]
    assert mean.tolist() == pytest.approx([*np.sqrt(CONF), 0.5, 0.9])
    low = CalibrationMetric(confidence="min").per_sample(preds)["calibration_confidence"]
    assert low.tolist() == pytest.approx(np.exp(np.array(preds[R.LOGPROB_MIN])))
    assert CalibrationMetric.score_info("calibration_closed_ece").performance is False
    assert CalibrationMetric.score_info("calibration_closed_acc_at_50").performance is True


def test_a_row_without_a_confidence_makes_the_figures_nan_not_those_of_the_rest() -> None:
    preds = _preds([math.log(0.9), float("nan")], [1, 1], ["yes", "no"], ["yes", "yes"],
                   ["closed", "closed"])  # fmt: skip
    family = CalibrationMetric()
    scores = family.aggregate(preds.join(family.per_sample(preds)))
    assert math.isnan(scores["calibration_closed_ece"])
    assert math.isnan(scores["calibration_closed_acc_at_50"])
    assert scores["calibration_closed_n"] == 2
    old = preds.drop(columns=[R.LOGPROB_MEAN, R.LOGPROB_MIN, R.ANSWER_TOKENS])  # an older file
    assert family.per_sample(old)["calibration_confidence"].isna().all()


def test_bad_options_say_which_key_and_what_works() -> None:
    with pytest.raises(ValueError, match="confidence='max'"):
        CalibrationMetric(confidence="max")
    with pytest.raises(ValueError, match=r"coverages=\[0\.5, 1\.5\]"):
        CalibrationMetric(coverages=[0.5, 1.5])
