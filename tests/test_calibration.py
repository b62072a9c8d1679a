"""metric=calibration: known answers for every statistic, and the family's contract."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from medvqa.data import records as R
from medvqa.scoring.metrics.calibration import (
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
            R.LOGPROB_BY_TEMPERATURE: [
                {"1.0": m * n} for m, n in zip(logprob_mean, tokens, strict=True)
            ],
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
    family = CalibrationMetric(bins=2, coverages=[0.5, 0.8], min_rows=1)
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
    family = CalibrationMetric(min_rows=1)
    scores = family.aggregate(preds.join(family.per_sample(preds)))
    assert math.isnan(scores["calibration_closed_ece"])
    assert math.isnan(scores["calibration_closed_acc_at_50"])
    assert scores["calibration_closed_n"] == 2
    old = preds.drop(
        columns=[R.LOGPROB_MEAN, R.LOGPROB_MIN, R.ANSWER_TOKENS, R.LOGPROB_BY_TEMPERATURE]
    )  # an older file
    assert family.per_sample(old)["calibration_confidence"].isna().all()


def test_bad_options_say_which_key_and_what_works() -> None:
    with pytest.raises(ValueError, match="confidence='max'"):
        CalibrationMetric(confidence="max")
    with pytest.raises(ValueError, match=r"coverages=\[0\.5, 1\.5\]"):
        CalibrationMetric(coverages=[0.5, 1.5])


def _two_token_answers(margins: list[float], right: list[int], split: str) -> pd.DataFrame:
    """One-token answers of a two-word vocabulary whose logits differ by `margin`: the chosen
    token's log-probability at temperature T is -log(1 + exp(-margin / T))."""
    grid = [{str(t): -math.log1p(math.exp(-m / t)) for t in R.TEMPERATURES} for m in margins]
    n = len(margins)
    return pd.DataFrame(
        {
            R.SPLIT: split,
            R.ID: [f"{split}{i}" for i in range(n)],
            R.CASE_ID: [f"{split}{i}" for i in range(n)],
            R.ANSWER_TYPE: "closed",
            R.CANDIDATES: [["yes", "no"]] * n,
            R.ANSWER: "yes",
            R.PREDICTION: ["yes" if r else "no" for r in right],
            R.LOGPROB_MEAN: [g["1.0"] for g in grid],
            R.LOGPROB_MIN: [g["1.0"] for g in grid],
            R.ANSWER_TOKENS: 1,
            R.LOGPROB_BY_TEMPERATURE: grid,
        }
    )


def test_a_temperature_fitted_on_validation_answers_tempers_an_overconfident_model() -> None:
    """Confident (margin 5: p = 0.993) but right half of the time: the fitted temperature is
    the grid's largest (the confidence nearest 0.5), it is applied to the test splits, and
    their ECE and Brier fall; the fit is the grid's least binary NLL, checked by hand."""
    from medvqa.scoring.metrics.calibration import (
        binary_nll,
        confidence_at,
        fit_temperature,
        temperature_metrics,
    )

    family = CalibrationMetric(bins=2, min_rows=1)
    val = _two_token_answers([5.0] * 8, [1, 0] * 4, "val")
    test = _two_token_answers([5.0] * 6 + [1.0] * 4, [1, 0, 1, 0, 1, 0, 1, 1, 0, 0], "test_ood")
    preds = pd.concat([val, test], ignore_index=True)
    scored = preds.join(family.per_sample(preds))
    right = scored["calibration_correct"].to_numpy(float)
    on_val = (scored[R.SPLIT] == "val").to_numpy()
    by_hand = min(
        R.TEMPERATURES,
        key=lambda t: binary_nll(
            confidence_at(scored[on_val], "sequence", t).to_numpy(), right[on_val]
        ),
    )
    assert fit_temperature(scored[on_val], right[on_val], "sequence") == by_hand == 3.0
    out, m = temperature_metrics(scored, family)
    assert m["val/calibration_closed_temperature"] == 3.0
    scaled = out.loc[~on_val, "calibration_confidence_scaled"].to_numpy()
    assert scaled == pytest.approx([1 / (1 + math.exp(-mg / 3)) for mg in [5.0] * 6 + [1.0] * 4])
    before = family.aggregate(scored[~on_val])
    assert m["test_ood/calibration_closed_ece_scaled"] < before["calibration_closed_ece"]
    assert m["test_ood/calibration_closed_brier_scaled"] < before["calibration_closed_brier"]
    # no validation answers: nothing fitted, nothing added
    assert temperature_metrics(scored[~on_val], family)[1] == {}
    # answers generated before the grid was recorded: no temperature, NaN not a guess
    old = scored.assign(**{R.LOGPROB_BY_TEMPERATURE: None})
    assert math.isnan(temperature_metrics(old, family)[1]["val/calibration_closed_temperature"])


def test_too_few_answers_give_nan_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """One closed answer used to give `ece 0.99`: its distance from 0 or 1. Below
    `min_rows` (10, as the subgroup family's) the figures are NaN and a warning says why; the
    count stays."""
    from medvqa.scoring.metrics.calibration import temperature_metrics

    preds = _preds([math.log(0.99)], [1], ["no"], ["yes"], ["closed"])
    family = CalibrationMetric()
    scored = preds.join(family.per_sample(preds))
    with caplog.at_level("WARNING"):
        scores = family.aggregate(scored)
    assert math.isnan(scores["calibration_closed_ece"]) and scores["calibration_closed_n"] == 1
    assert "fewer than metric.calibration.min_rows=10" in caplog.text
    assert CalibrationMetric(min_rows=1).aggregate(scored)["calibration_closed_ece"] > 0.9
    val = _two_token_answers([5.0] * 8, [1, 0] * 4, "val")  # 8 < 10: no temperature
    val = val.join(family.per_sample(val))
    assert math.isnan(temperature_metrics(val, family)[1]["val/calibration_closed_temperature"])
    with pytest.raises(ValueError, match="min_rows=0"):
        CalibrationMetric(min_rows=0)
