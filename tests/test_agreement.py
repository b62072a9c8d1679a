"""Issue #48, items 2 and 6: agreement between raters (medvqa.statistics.agreement) on the
published worked examples, on planted disagreements computed by hand here, and between the
jurors of a jury in a scored run (the `judge agreement` view)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from medvqa.cli.score import main as score_main
from medvqa.statistics.agreement import (
    CLOSED_LEVELS,
    OPEN_LEVELS,
    agreement,
    cohen_kappa,
    fleiss_kappa,
    kendall_tau,
    krippendorff_alpha,
)
from medvqa.statistics.bootstrap import cluster_bootstrap, cluster_statistic_ci
from medvqa.views import presented
from medvqa.views.judge_agreement import judge_agreement
from tests import test_jury
from tests.judge_server import JudgeServer
from tests.test_jury import GRADERS, jury_args, predictions

NAN = math.nan
servers = test_jury.servers  # the scripted jurors' servers: the jury tests' fixture

# -- published worked examples ----------------------------------------------------------------

# Fleiss (1971), as in Wikipedia's "Fleiss' kappa": 10 subjects, 14 raters, 5 categories;
# each row: how many raters put the subject in each category. kappa = 0.210.
FLEISS_1971 = [
    [0, 0, 0, 0, 14],
    [0, 2, 6, 4, 2],
    [0, 0, 3, 5, 6],
    [0, 3, 9, 2, 0],
    [2, 2, 8, 1, 1],
    [7, 7, 0, 0, 0],
    [3, 2, 6, 3, 0],
    [2, 5, 3, 2, 2],
    [6, 5, 2, 1, 0],
    [0, 2, 2, 3, 7],
]
# Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", section C: 4 coders
# (rows) x 12 units, values 1-5, NaN where a coder did not code the unit. alpha: nominal
# 0.743, ordinal 0.815, interval 0.849.
KRIPPENDORFF_2011 = [
    [1, 2, 3, 3, 2, 1, 4, 1, 2, NAN, NAN, NAN],
    [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, NAN, 3],
    [NAN, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, NAN],
    [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, NAN],
]


def test_fleiss_kappa_of_fleiss_1971() -> None:
    ratings = np.array([np.repeat(OPEN_LEVELS, row) for row in FLEISS_1971])  # 10 x 14
    assert fleiss_kappa(ratings, OPEN_LEVELS) == pytest.approx(0.210, abs=5e-4)


@pytest.mark.parametrize(
    ("level", "alpha"), [("nominal", 0.743), ("ordinal", 0.815), ("interval", 0.849)]
)
def test_krippendorff_alpha_of_krippendorff_2011(level: str, alpha: float) -> None:
    units = np.array(KRIPPENDORFF_2011).T
    assert krippendorff_alpha(units, OPEN_LEVELS, level, missing=True) == pytest.approx(
        alpha, abs=5e-4
    )
    # a missing rating is a failed judgment unless the caller says otherwise: no number
    assert math.isnan(krippendorff_alpha(units, OPEN_LEVELS, level))


def test_cohen_kappa_of_the_wikipedia_example() -> None:
    """Wikipedia's "Cohen's kappa": 50 proposals, yes/yes 20, yes/no 5, no/yes 10, no/no 15."""
    a = [1] * 25 + [0] * 25
    b = [1] * 20 + [0] * 5 + [1] * 10 + [0] * 15
    assert cohen_kappa(a, b, CLOSED_LEVELS) == pytest.approx(0.4)


# -- planted disagreements, computed by hand ---------------------------------------------------


def test_a_planted_closed_disagreement_gives_the_kappa_computed_by_hand() -> None:
    truth = [1, 1, 1, 1, 1, 1, 0, 0, 0, 0]
    flipped = [0, 1, 1, 1, 1, 1, 1, 0, 0, 0]  # items 0 and 6 flipped
    observed = 8 / 10
    expected = 0.6 * 0.6 + 0.4 * 0.4  # both say 1 on 6 of 10 items
    by_hand = (observed - expected) / (1 - expected)  # 7/12
    assert by_hand == pytest.approx(7 / 12)
    assert cohen_kappa(truth, flipped, CLOSED_LEVELS) == pytest.approx(by_hand)
    assert cohen_kappa(truth, truth, CLOSED_LEVELS) == 1.0


def test_a_planted_open_disagreement_gives_the_weighted_kappa_computed_by_hand() -> None:
    """Quadratic weights (i - j)^2 / 16 on the 1-5 scale: a 1-vs-5 disagreement costs 1."""
    a, b = [1, 1, 5, 5], [1, 5, 5, 5]
    observed_cost = (0 + 1 + 0 + 0) / 4
    expected_cost = 0.5 * 0.75 * 1 + 0.5 * 0.25 * 1  # P(a=1)P(b=5) + P(a=5)P(b=1)
    by_hand = 1 - observed_cost / expected_cost  # 0.5
    assert cohen_kappa(a, b, OPEN_LEVELS, quadratic=True) == pytest.approx(by_hand)
    # the scale's spacing counts: 4-vs-5 costs 1/16 of 1-vs-5
    assert cohen_kappa([1, 1, 5, 5], [1, 4, 5, 5], OPEN_LEVELS, quadratic=True) > by_hand
    # an expected value between grades (logits mode) is rated at the nearest grade
    assert cohen_kappa([1.2, 1, 4.6, 5], b, OPEN_LEVELS, quadratic=True) == pytest.approx(by_hand)


def test_a_failed_item_makes_agreement_nan_and_undefined_is_nan() -> None:
    assert math.isnan(cohen_kappa([1, 0, NAN], [1, 0, 1], CLOSED_LEVELS))
    assert math.isnan(fleiss_kappa([[1, 0, 1], [0, NAN, 0]], CLOSED_LEVELS))
    assert math.isnan(krippendorff_alpha([[1, 2], [3, NAN]], OPEN_LEVELS))
    assert math.isnan(kendall_tau([1, 2, NAN], [1, 2, 3]))
    assert math.isnan(cohen_kappa([1, 1], [1, 1], CLOSED_LEVELS))  # one level: 0 / 0
    assert math.isnan(krippendorff_alpha([[3, 3], [3, 3]], OPEN_LEVELS))
    with pytest.raises(ValueError, match="not one of"):
        agreement("kapa", np.ones((2, 2)), [0, 1], CLOSED_LEVELS)
    with pytest.raises(ValueError, match="2 for a pair"):
        agreement("kappa", np.ones((2, 3)), [0, 1], CLOSED_LEVELS)


# -- the case-clustered bootstrap ------------------------------------------------------------


def test_the_statistic_bootstrap_draws_cases_as_the_mean_bootstrap_does() -> None:
    """A weighted mean through `cluster_statistic_ci` is `cluster_bootstrap`'s, draw for draw:
    the one draw contract, so agreement intervals resample cases like every other interval."""
    rng = np.random.default_rng(0)
    values = rng.random(40)
    clusters = np.repeat(np.arange(13), 4)[:40]
    mean = cluster_statistic_ci(lambda w: float(w @ values / w.sum()), clusters, B=300, seed=7)
    assert mean == pytest.approx(cluster_bootstrap(values, clusters, B=300, seed=7))


def test_agreement_intervals_resample_cases_not_items() -> None:
    """Disagreements that come in cases (all six in the first two cases of three questions)
    are less certain than six scattered ones: the case bootstrap's interval is wider."""
    truth = np.array([1, 0, 1] * 10, dtype=float)
    flipped = truth.copy()
    flipped[:6] = 1 - flipped[:6]
    ratings = np.column_stack([truth, flipped])
    boot = {"B": 400, "seed": 3, "level": 0.95}
    by_item = agreement("kappa", ratings, np.arange(30), CLOSED_LEVELS, boot)
    by_case = agreement("kappa", ratings, np.arange(30) // 3, CLOSED_LEVELS, boot)
    point = cohen_kappa(truth, flipped, CLOSED_LEVELS)
    assert by_item.point == by_case.point == pytest.approx(point)
    assert by_item.lo <= point <= by_item.hi and by_case.lo <= point <= by_case.hi
    assert by_case.half > by_item.half
    one_case = agreement("kappa", ratings, np.zeros(30), CLOSED_LEVELS, boot)
    assert math.isnan(one_case.lo) and not math.isnan(one_case.point)


# -- between the jurors of a run -------------------------------------------------------------


@pytest.mark.heavy
def test_a_jury_run_records_the_jurors_agreement_with_intervals(
    servers: dict[str, JudgeServer], tmp_path: Path
) -> None:
    """Per split the closed verdicts are truth [1, 0, 1], lenient [1, 1, 1], strict [0, 0, 0]:
    Fleiss' kappa of the three, by hand: each item has two raters of one level and one of the
    other, P_i = 1/3; level 1 takes 5 of 9 ratings, so P_e = (25 + 16) / 81 and kappa =
    (1/3 - 41/81) / (1 - 41/81) = -0.35. A constant rater (lenient, strict) agrees with the
    truthful one no better than chance: kappa 0."""
    preds = predictions(tmp_path / "preds.csv")
    assert (
        score_main(
            [str(preds), "--out", str(tmp_path / "out"), *jury_args(servers, tmp_path / "j")]
        )
        == 0
    )
    metrics = json.loads((tmp_path / "out" / "results.json").read_text())["metrics"]
    for split in ("test_iid", "test_ood"):
        base = f"judge/agreement/{split}"
        assert metrics[f"{base}/jury/closed_fleiss_kappa"] == pytest.approx(-0.35)
        assert metrics[f"{base}/lenient~truth/closed_kappa"] == pytest.approx(0.0)
        assert metrics[f"{base}/strict~truth/closed_kappa"] == pytest.approx(0.0)
        assert metrics[f"{base}/lenient~strict/open_wkappa"] == pytest.approx(0.0)
        for stat in ("jury/closed_fleiss_kappa", "jury/open_alpha", "lenient~truth/open_wkappa"):
            assert f"{base}/{stat}_ci_lo" in metrics and f"{base}/{stat}_ci_half" in metrics
        assert metrics[f"{base}/n_closed"] == metrics[f"{base}/n_open"] == 3
        # per question type too
        assert f"{base}/question_type=presence/jury/closed_fleiss_kappa" in metrics
    # the report shows the overall figures (the view's presentation matches their keys)
    view = presented()["Agreement between judges"]
    import pandas as pd

    labels = view.columns(pd.DataFrame(columns=list(metrics)))
    assert "closed Fleiss κ jury i.i.d." in labels.values()


def test_agreement_needs_two_jurors_and_skips_absent_answer_types() -> None:
    import pandas as pd

    frame = pd.DataFrame(
        {
            "split": ["test_iid"] * 4,
            "case_id": ["a", "a", "b", "b"],
            "answer_type": ["closed"] * 4,
            "judge_score@x": [1.0, 0.0, 1.0, 1.0],
            "judge_score@y": [1.0, 0.0, 0.0, 1.0],
        }
    )
    figures = judge_agreement(frame)
    assert figures["judge/agreement/test_iid/x~y/closed_kappa"] == pytest.approx(0.5)
    assert not any("open" in key for key in figures)
    assert judge_agreement(frame.drop(columns="judge_score@y")) == {}


def test_rows_no_judge_read_add_no_agreement() -> None:
    """Exact matches get the maximum from every juror without a call (the shortcut): the
    agreement is over the rows the judges read."""
    import pandas as pd

    from medvqa.judge.engine import SHORTCUT_REASON

    read = pd.DataFrame(
        {
            "split": ["test_iid"] * 4,
            "case_id": ["a", "a", "b", "b"],
            "answer_type": ["closed"] * 4,
            "judge_score@x": [1.0, 0.0, 1.0, 1.0],
            "judge_score@y": [1.0, 0.0, 0.0, 1.0],
            "judge_reason@x": "scripted",
            "judge_reason@y": "scripted",
        }
    )
    exact = read.iloc[[0] * 6].assign(
        **{"judge_reason@x": SHORTCUT_REASON, "judge_reason@y": SHORTCUT_REASON}
    )
    both = judge_agreement(pd.concat([read, exact], ignore_index=True))
    assert both == judge_agreement(read)
    assert both["judge/agreement/test_iid/n_closed"] == 4
    assert both["judge/agreement/test_iid/x~y/closed_kappa"] == pytest.approx(0.5)


# -- with people (the rater study) -----------------------------------------------------------


@pytest.mark.heavy
def test_raters_who_rate_as_one_juror_give_that_juror_kappa_one(
    servers: dict[str, JudgeServer], tmp_path: Path
) -> None:
    """`medvqa-rater` on a jury's run: the sheet carries each juror's score; a rater whose
    ratings equal the truthful juror's gives it weighted kappa, alpha and tau 1; a second rater
    who differs on one item sets the raters' ceiling below 1."""
    import pandas as pd

    from medvqa.analysis.rater.analysis import read_items
    from medvqa.cli.rater import main as rater_main

    preds = predictions(tmp_path / "preds.csv")
    run = tmp_path / "out"
    assert score_main([str(preds), "--out", str(run), *jury_args(servers, tmp_path / "j")]) == 0
    study = tmp_path / "study"
    assert (
        rater_main(["export", str(run), "--n", "50", "--out", str(study), "--no-text-metrics"]) == 0
    )
    items = read_items(study)
    for juror in GRADERS:
        assert f"metric:judge_score@{juror}" in items
    sheet = pd.read_csv(study / "rating_sheet.csv", keep_default_na=False)
    truth = items.loc[sheet["id"].astype(str), "metric:judge_score@truth"].to_numpy()
    assert set(truth) == {1.0, 5.0}  # the truthful juror's open grades vary
    sheet.assign(score=truth.astype(int)).to_csv(tmp_path / "as_truth.csv", index=False)
    other = truth.astype(int).copy()
    other[0] = 3
    sheet.assign(score=other).to_csv(tmp_path / "other.csv", index=False)
    out = tmp_path / "analysis"
    ratings = [str(tmp_path / "as_truth.csv"), str(tmp_path / "other.csv")]
    assert rater_main(["analyze", str(study), "--ratings", *ratings, "--out", str(out)]) == 0
    table = pd.read_csv(out / "correlations.csv").set_index(["kind", "a", "b"])
    row = table.loc[("rater_vs_metric", "as_truth", "judge_score@truth")]
    assert row["weighted_kappa"] == pytest.approx(1.0)
    assert row["alpha"] == pytest.approx(1.0)
    assert row["kendall_tau_b"] == pytest.approx(1.0)
    # a constant juror agrees with the raters no better than chance
    assert table.loc[("rater_vs_metric", "as_truth", "judge_score@lenient"), "weighted_kappa"] == 0
    assert np.isnan(table.loc[("rater_vs_metric", "as_truth", "bleu1"), "weighted_kappa"])
    ceiling = table.loc[("rater_vs_rater", "as_truth", "other")]
    assert 0 < ceiling["weighted_kappa"] < 1
    pairs = table.xs("rater_pairs_mean", level="kind")
    assert pairs["weighted_kappa"].iloc[0] == pytest.approx(ceiling["weighted_kappa"])
    assert (out / "heatmap.png").is_file()


# -- against another implementation, and properties ------------------------------------------


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("sklearn") is None, reason="scikit-learn not installed"
)
@pytest.mark.parametrize("quadratic", [False, True])
def test_cohen_kappa_equals_scikit_learns(quadratic: bool) -> None:
    """scikit-learn's `cohen_kappa_score` (installed with a dependency, not one of medvqa's) as
    a second implementation, on random 1-5 ratings."""
    from sklearn.metrics import cohen_kappa_score

    rng = np.random.default_rng(11)
    for _ in range(20):
        a = rng.integers(1, 6, 40).astype(float)
        b = np.clip(a + rng.integers(-2, 3, 40), 1, 5)
        theirs = cohen_kappa_score(
            a, b, labels=OPEN_LEVELS, weights="quadratic" if quadratic else None
        )
        assert cohen_kappa(a, b, OPEN_LEVELS, quadratic) == pytest.approx(theirs)


@given(
    st.lists(
        st.lists(st.sampled_from([0.0, 0.5, 1.0, NAN]), min_size=3, max_size=3),
        min_size=1,
        max_size=20,
    )
)
def test_a_verdict_exists_exactly_where_every_juror_answered(rows: list[list[float]]) -> None:
    from medvqa.judge.jury import jury_verdict

    scores = np.array(rows)
    for rule in ("majority", "median", "mean"):
        verdict = jury_verdict(scores, rule)
        np.testing.assert_array_equal(np.isnan(verdict), np.isnan(scores).any(axis=1))
        done = ~np.isnan(verdict)
        assert (verdict[done] >= scores[done].min(axis=1)).all()
        assert (verdict[done] <= scores[done].max(axis=1)).all()
    binary = scores[~np.isnan(scores).any(axis=1) & np.isin(scores, [0.0, 1.0]).all(axis=1)]
    if len(binary):  # a jury of three on 0/1 verdicts: the majority is the median
        assert (jury_verdict(binary, "majority") == np.median(binary, axis=1)).all()


def test_the_mean_verdict_is_medhelms_jury_where_every_juror_answered() -> None:
    """MedHELM's `LLMJuryMetric` (tests/peers/medhelm_jury.py) averages its jurors' scores;
    `judge.jury_open=mean` gives the same number row for row where every juror answered. Where
    one did not, MedHELM averages the others (and scores 0 when none answered): medvqa gives
    no verdict, since the survivors' mean is not the jury's."""
    from medvqa.judge.jury import jury_verdict
    from tests.peers.medhelm_jury import LLMJuryMetric

    jurors = ("gpt", "claude", "llama")
    peer = LLMJuryMetric("jury_score", "vqa", dict.fromkeys(jurors))
    rng = np.random.default_rng(2)
    rows = rng.integers(1, 6, (30, 3)).astype(float)
    rows[[4, 9], 1] = NAN  # a juror that did not answer
    rows[12] = NAN  # nobody answered
    theirs = [
        peer.evaluate_generation(
            {
                "vqa": {
                    j: None if math.isnan(v) else {"accuracy": {"score": int(v)}}
                    for j, v in zip(jurors, row, strict=True)
                }
            }
        )
        for row in rows
    ]
    ours = jury_verdict(rows, "mean")
    complete = ~np.isnan(rows).any(axis=1)
    np.testing.assert_allclose(ours[complete], np.array(theirs)[complete])
    assert np.isnan(ours[~complete]).all()
    assert theirs[4] == np.nanmean(rows[4]) and theirs[12] == 0.0  # the survivors' mean; 0
