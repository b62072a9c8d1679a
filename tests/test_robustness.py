"""Tests for the SURE-VQA relative-robustness metric."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from medvqa.scoring.robustness import relative_robustness, robustness_metrics


def test_rr_known_values() -> None:
    assert relative_robustness(0.8, 0.6) == pytest.approx(0.75)
    assert relative_robustness(0.5, 0.5) == 1.0
    assert relative_robustness(0.5, 0.75) == pytest.approx(1.5)
    assert math.isnan(relative_robustness(0.0, 0.3))
    assert math.isnan(relative_robustness(0.0, 0.0))
    assert math.isnan(relative_robustness(float("nan"), 0.3))
    assert math.isnan(relative_robustness(0.3, float("nan")))


unit = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@given(unit.filter(lambda x: x > 0), unit)
def test_rr_formulas_agree(p_iid: float, p_ood: float) -> None:
    paper = 1 - (p_iid - p_ood) / p_iid
    assert relative_robustness(p_iid, p_ood) == pytest.approx(paper, rel=1e-9, abs=1e-9)


@given(unit.filter(lambda x: x > 0))
def test_rr_equal_scores_is_one(p: float) -> None:
    assert relative_robustness(p, p) == pytest.approx(1.0)


def test_robustness_metrics_keys_and_primary() -> None:
    iid = {"closed_acc": 0.8, "open_f1": 0.5, "modality=CT/closed_acc": 0.9, "n": 10.0}
    ood = {"closed_acc": 0.6, "open_f1": 0.5, "n": 7.0}
    out = robustness_metrics(
        iid,
        ood,
        keys=["closed_acc", "open_f1", "modality=CT/closed_acc"],
        primary={"closed": "closed_acc", "open": "open_f1"},
    )
    assert out == {
        "rr_closed_acc": pytest.approx(0.75),
        "rr_open_f1": 1.0,
        "rr_closed": pytest.approx(0.75),
        "rr_open": 1.0,
    }


def test_robustness_metrics_nan_propagates() -> None:
    out = robustness_metrics(
        {"closed_acc": float("nan")}, {"closed_acc": 0.5}, ["closed_acc"], {"closed": "closed_acc"}
    )
    assert math.isnan(out["rr_closed_acc"]) and math.isnan(out["rr_closed"])


def test_robustness_metrics_missing_primary_raises() -> None:
    with pytest.raises(KeyError, match="open_f1"):
        robustness_metrics({"closed_acc": 0.5}, {"closed_acc": 0.5}, [], {"open": "open_f1"})
