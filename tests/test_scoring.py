"""Several metric families at once, breakdowns by any field (list fields too), counters."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from omegaconf import OmegaConf

from medvqa.scoring.metrics.traditional import TraditionalMetric
from medvqa.scoring.pipeline import build_families, counters, score_frame
from tests.conftest import compose


class LengthMetric:
    """A second family for the test: prediction length in words, with a call counter."""

    name = "length"

    def __init__(self) -> None:
        self.calls = 0

    def per_sample(self, preds: pd.DataFrame) -> pd.DataFrame:
        self.calls += len(preds)
        return pd.DataFrame({"length": preds["prediction"].str.split().str.len()}, preds.index)

    def aggregate(self, scored: pd.DataFrame) -> dict[str, float]:
        return {"mean_length": float(scored["length"].mean()) if len(scored) else math.nan}

    def counters(self) -> dict[str, int]:
        return {"length/calls": self.calls}


def _preds() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "id": ["a", "b", "c", "d"],
            "question": ["q"] * 4,
            "answer": ["yes", "no", "left lung", "liver"],
            "prediction": ["yes", "yes", "left lung", "the spleen"],
            "answer_type": ["closed", "closed", "open", "open"],
            "candidates": [["yes", "no"], ["yes", "no"], None, None],
            "question_class": [["polyp"], ["polyp", "size"], ["size"], ["polyp"]],
            "complexity": [1, 2, 1, 2],
        }
    )


def test_two_families_and_breakdowns() -> None:
    length = LengthMetric()
    scored, scores = score_frame(
        _preds(), [TraditionalMetric(["f1"]), length], ["complexity", "question_class"]
    )
    assert {"open_f1", "closed_correct", "length"} <= set(scored.columns)
    assert scores["closed_acc"] == 0.5 and scores["open_f1"] == 0.5
    assert scores["mean_length"] == pytest.approx((1 + 1 + 2 + 2) / 4)
    assert scores["n"] == 4 and scores["n_open"] == 2 and scores["n_closed"] == 2
    # complexity=1: rows a (correct closed) and c (exact open)
    assert scores["complexity=1/closed_acc"] == 1.0 and scores["complexity=1/open_f1"] == 1.0
    assert scores["complexity=2/closed_acc"] == 0.0 and scores["complexity=2/open_f1"] == 0.0
    # list-valued field: row b counts for polyp and for size
    assert scores["question_class=polyp/n"] == 3 and scores["question_class=size/n"] == 2
    assert scores["question_class=size/closed_acc"] == 0.0
    assert scores["question_class=polyp/mean_length"] == pytest.approx((1 + 1 + 2) / 3)
    assert counters([TraditionalMetric(), length]) == {"length/calls": 4.0}


def test_unknown_breakdown_field_names_the_columns() -> None:
    with pytest.raises(ValueError, match=r"'modality' is not a column.*available"):
        score_frame(_preds(), [TraditionalMetric()], ["modality"])


def test_families_may_not_overwrite_each_other() -> None:
    with pytest.raises(ValueError, match="overwrite"):
        score_frame(_preds(), [TraditionalMetric(), TraditionalMetric()])


def test_build_from_config_and_errors() -> None:
    built = build_families(
        OmegaConf.create(
            {
                "traditional": {
                    "_target_": "medvqa.scoring.metrics.traditional.TraditionalMetric",
                    "open_metrics": ["f1"],
                }
            }
        )
    )
    assert isinstance(built[0], TraditionalMetric) and built[0].open_metrics == ["f1"]
    with pytest.raises(ValueError, match="no metric selected"):
        build_families(OmegaConf.create({}))
    with pytest.raises(ValueError, match=r"(?s)metric 'traditional'.*unknown open metric"):
        build_families(
            OmegaConf.create(
                {
                    "traditional": {
                        "_target_": "medvqa.scoring.metrics.traditional.TraditionalMetric",
                        "open_metrics": ["f2"],
                    }
                }
            )
        )


def test_metric_group_selects_several_families(tmp_path) -> None:
    cfg = compose(["metric=[traditional]", "evaluation.breakdown=[modality]"], tmp_path)
    assert list(cfg.metric) == ["traditional"]
    assert cfg.evaluation.breakdown == ["modality"]
    assert [type(m).__name__ for m in build_families(cfg.metric)] == ["TraditionalMetric"]


@pytest.mark.parametrize(
    ("family", "key", "performance"),
    [
        ("traditional", "closed_acc", True),
        ("traditional", "open_f1", True),
        ("traditional", "open_precision", True),
        ("judge", "judge_open_score_norm", True),
        ("closed_set", "cs_overall_macro_f1", True),
        ("mcq", "mcq_acc", True),
        ("closed_set", "cs_Q8_coverage", True),
        ("traditional", "n", False),
        ("traditional", "n_open", False),
        ("traditional", "open_empty_ref_n", False),
        ("closed_set", "cs_n", False),
        ("closed_set", "cs_Q3_n", False),
        ("mcq", "mcq_n_valid", False),
        ("traditional", "closed_invalid_rate", False),
        ("closed_set", "cs_invalid_rate", False),
        ("mcq", "mcq_acc_ci_lo", False),
        ("mcq", "mcq_acc_ci_half", False),
        ("mcq", "mcq_random_baseline", False),
        ("judge", "judge_failures", False),
        ("traditional", "question_type=size/n", False),
    ],
)
def test_each_family_says_which_of_its_scores_are_performances(
    family: str, key: str, performance: bool
) -> None:
    from medvqa import plugins

    assert plugins.get("metric", family).score_info(key).performance is performance


def test_robustness_ratios_only_for_what_the_families_call_performances() -> None:
    from medvqa.scoring.pipeline import Scoring

    evaluation = OmegaConf.create(
        {
            "primary_closed": "closed_acc",
            "primary_open": "open_f1",
            "breakdown": [],
            "bootstrap": {"samples": 0, "seed": 0, "level": 0.95},
        }
    )
    preds = _preds()
    with Scoring([TraditionalMetric()], evaluation) as scoring:
        results, scored = scoring.score(
            {"test_iid": preds, "test_ood": preds},
            extra={"test_iid": {"coverage": 0.5}, "test_ood": {"coverage": 0.25}},
        )
    assert "robustness/rr_closed_acc" in results and "robustness/rr_open_f1" in results
    for not_performance in ("n", "n_open", "closed_invalid_rate", "open_empty_ref_n", "coverage"):
        assert f"robustness/rr_{not_performance}" not in results
    assert results["test_iid/coverage"] == 0.5
    assert set(scored["split"]) == {"test_iid", "test_ood"}


def test_the_pipeline_closes_every_family_also_after_an_error() -> None:
    from medvqa.scoring.pipeline import Scoring

    closed = []

    class Closing(TraditionalMetric):
        def close(self) -> None:
            closed.append(self)

    families = [Closing(), Closing()]
    with pytest.raises(RuntimeError, match="boom"), Scoring(families, None):
        raise RuntimeError("boom")
    assert closed == families


def test_headline_intervals_resample_cases() -> None:
    from medvqa.scoring.pipeline import headline_intervals
    from medvqa.statistics.bootstrap import cluster_bootstrap, rr_ci

    rng = __import__("numpy").random.default_rng(0)

    def split(n: int, p: float) -> pd.DataFrame:
        correct = rng.random(n) < p
        return pd.DataFrame(
            {
                "answer_type": ["closed"] * n + ["open"],
                "case_id": [f"c{i // 3}" for i in range(n)] + ["c0"],
                "closed_correct": [*correct.astype(float), float("nan")],
                "open_f1": [float("nan")] * n + [0.5],
            }
        )

    frames = {"test_iid": split(90, 0.8), "test_ood": split(60, 0.5)}
    cfg = OmegaConf.create(
        {
            "primary_closed": "closed_acc",
            "primary_open": "open_f1",
            "bootstrap": {"samples": 500, "seed": 1, "level": 0.9},
        }
    )
    scores = {
        s: {"closed_acc": f["closed_correct"].mean(), "open_f1": f["open_f1"].mean()}
        for s, f in frames.items()
    }
    out = headline_intervals(frames, scores, [TraditionalMetric()], cfg)
    iid = frames["test_iid"].iloc[:90]
    expected = cluster_bootstrap(iid["closed_correct"], iid["case_id"], B=500, seed=1, level=0.9)
    assert out["test_iid/closed_acc_ci_lo"] == expected.lo
    assert out["test_iid/closed_acc_ci_lo"] < expected.point < out["test_iid/closed_acc_ci_hi"]
    ood = frames["test_ood"].iloc[:60]
    rr = rr_ci(
        iid["closed_correct"],
        iid["case_id"],
        ood["closed_correct"],
        ood["case_id"],
        B=500,
        seed=1,
        level=0.9,
    )
    assert out["robustness/rr_closed_ci_half"] == rr.half
    assert out["robustness/diff_closed"] == pytest.approx(
        ood["closed_correct"].mean() - iid["closed_correct"].mean()
    )
    # One open row per split (a single case): the interval is NaN, not a fake zero width.
    assert math.isnan(out["test_iid/open_f1_ci_half"])
    cfg.bootstrap.samples = 0
    assert headline_intervals(frames, scores, [TraditionalMetric()], cfg) == {}


def test_judge_headline_gets_intervals_unless_a_judgment_failed() -> None:
    """The judge's headline scores (raw 1-5 open score, closed accuracy) get case-clustered
    CIs and an RR interval; a split with a failed judgment has a NaN score and no interval,
    and RR/difference get none either (no interval around the survivors)."""
    from medvqa.scoring.metrics.judge import JUDGE_FAILED, JUDGE_SCORE, JudgeMetric
    from medvqa.scoring.pipeline import headline_intervals
    from medvqa.statistics.bootstrap import cluster_bootstrap, rr_ci

    def split(closed: list[float], open_: list[float]) -> pd.DataFrame:
        n = len(closed) + len(open_)
        return pd.DataFrame(
            {
                "answer_type": ["closed"] * len(closed) + ["open"] * len(open_),
                "case_id": [f"c{i // 2}" for i in range(n)],
                JUDGE_SCORE: [*closed, *open_],
                JUDGE_FAILED: [float(math.isnan(v)) for v in (*closed, *open_)],
            }
        )

    frames = {
        "test_iid": split([1, 1, 0, 1, 1, 0, 1, 1], [5, 4, 3, 5, 2, 5]),
        "test_ood": split([1, 0, 0, 1, 0, 1], [2, 3, 1, 4, 2, 5]),
    }
    cfg = OmegaConf.create(
        {
            "primary_closed": "judge_closed_acc",
            "primary_open": "judge_open_score",
            "bootstrap": {"samples": 400, "seed": 3, "level": 0.95},
        }
    )
    judge = JudgeMetric.__new__(JudgeMetric)  # aggregate/ci_columns need no backend
    scores = {s: judge.aggregate(f) for s, f in frames.items()}
    out = headline_intervals(frames, scores, [judge], cfg)
    iid_open = frames["test_iid"].query("answer_type == 'open'")
    expected = cluster_bootstrap(
        iid_open[JUDGE_SCORE], iid_open["case_id"], B=400, seed=3, level=0.95
    )
    assert expected.point == pytest.approx(24 / 6) == scores["test_iid"]["judge_open_score"]
    assert out["test_iid/judge_open_score_ci_lo"] == expected.lo
    assert out["test_iid/judge_open_score_ci_hi"] == expected.hi
    closed = {s: f.query("answer_type == 'closed'") for s, f in frames.items()}
    rr = rr_ci(
        closed["test_iid"][JUDGE_SCORE],
        closed["test_iid"]["case_id"],
        closed["test_ood"][JUDGE_SCORE],
        closed["test_ood"]["case_id"],
        B=400,
        seed=3,
    )
    assert rr.point == pytest.approx((3 / 6) / (6 / 8))
    assert out["robustness/rr_closed_ci_half"] == rr.half

    frames["test_ood"].loc[7, [JUDGE_SCORE, JUDGE_FAILED]] = [float("nan"), 1.0]  # open row
    scores = {s: judge.aggregate(f) for s, f in frames.items()}
    assert math.isnan(scores["test_ood"]["judge_open_score"])
    out = headline_intervals(frames, scores, [judge], cfg)
    assert "test_iid/judge_open_score_ci_lo" in out
    assert not any(k.startswith("test_ood/judge_open_score") for k in out)
    assert not any(k.startswith(("robustness/rr_open", "robustness/diff_open")) for k in out)
    assert "robustness/rr_closed_ci_half" in out


@pytest.mark.heavy
def test_one_bootstrap_setting_turns_every_interval_off() -> None:
    """`evaluation.bootstrap.samples=0`: no interval anywhere, the families' own included (the
    mcq and closed_set YAML take `bootstrap: ${evaluation.bootstrap}`)."""
    from medvqa.scoring.metrics.mcq import McqMetric

    for samples, has_ci in ((0, False), (50, True)):
        cfg = compose(["metric=[mcq,closed_set]", f"evaluation.bootstrap.samples={samples}"])
        families = build_families(cfg.metric)
        assert {f.bootstrap.samples for f in families} == {samples}
        (mcq,) = [f for f in families if isinstance(f, McqMetric)]
        table = pd.DataFrame(
            {
                "id": ["a", "b", "c", "d"],
                "case_id": ["c1", "c1", "c2", "c3"],
                "answer": ["liver", "lung", "liver", "bone"],
                "answer_type": ["closed"] * 4,
                "candidates": [["liver", "lung", "bone"]] * 4,
                "prediction": ["A", "B", "C", "C"],
            }
        )
        scores = mcq.aggregate(table.join(mcq.per_sample(table)))
        assert ("mcq_acc_ci_lo" in scores) is has_ci
        assert scores["mcq_acc"] == pytest.approx(3 / 4)


def test_a_breakdown_value_with_a_slash_keeps_the_key_readable() -> None:
    """MIMIC's ethnicity "HISPANIC/LATINO": "/" separates splits, breakdowns and scores, so a
    value's own "/" is written "_" (the report's breakdown figures parse these keys)."""
    from medvqa.scoring.metrics.base import breakdown_prefix

    preds = pd.DataFrame(
        {
            "id": ["a", "b"],
            "question": ["q", "q"],
            "answer": ["yes", "no"],
            "prediction": ["yes", "yes"],
            "answer_type": ["closed", "closed"],
            "candidates": [["yes", "no"], ["yes", "no"]],
            "ethnicity": ["HISPANIC/LATINO", "WHITE"],
        }
    )
    _, scores = score_frame(preds, [TraditionalMetric()], ["ethnicity"])
    assert breakdown_prefix("ethnicity", "HISPANIC/LATINO") == "ethnicity=HISPANIC_LATINO/"
    assert scores["ethnicity=HISPANIC_LATINO/closed_acc"] == 1.0
    assert scores["ethnicity=WHITE/closed_acc"] == 0.0
    assert not [k for k in scores if k.count("/") > 1]
