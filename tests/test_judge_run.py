"""The judge inside a real run: `metric=[traditional,judge]` against a local OpenAI-compatible
server over HTTP; a re-run of the same job makes zero judge calls."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from medvqa.analysis.rater.analysis import read_items
from medvqa.cli.rater import main as rater_main
from medvqa.generation.files import read_predictions
from medvqa.judge.cache import JudgeCache
from tests.conftest import SMALL_MODEL, run_main
from tests.judge_server import JudgeServer, judge_overrides
from tests.native.slake import write as write_slake


@pytest.mark.slow
def test_run_with_the_judge_and_a_rerun_makes_no_calls(tmp_path: Path, cache_dir: Path) -> None:
    server = JudgeServer().start()
    try:
        args = [
            "debug=smoke",
            "logger=csv",
            "task.references=[]",
            *judge_overrides(server, tmp_path / "judgments"),
        ]
        first = run_main(args, tmp_path / "run1", cache_dir)
        assert first.returncode == 0, first.stderr[-3000:]
        metrics = json.loads((tmp_path / "run1" / "results.json").read_text())["metrics"]
        calls = server.count
        assert metrics["judge/calls"] == calls > 0
        assert metrics["judge/failures"] == 0
        for key in ("judge_closed_acc", "judge_open_score", "judge_open_score_norm"):
            assert key in {k.split("/", 1)[1] for k in metrics if k.startswith("test_iid/")}
        assert 0.0 <= metrics["test_iid/judge_closed_acc"] <= 1.0
        assert 1.0 <= metrics["test_ood/judge_open_score"] <= 5.0
        check_the_rater_study_reads_the_scored_table(tmp_path / "run1", tmp_path)

        again = run_main(args, tmp_path / "run2", cache_dir)
        assert again.returncode == 0, again.stderr[-3000:]
        rerun = json.loads((tmp_path / "run2" / "results.json").read_text())["metrics"]
        assert server.count == calls  # nothing reached the server
        assert rerun["judge/calls"] == 0 and rerun["judge/cache_hits"] > 0
        assert rerun["test_iid/judge_closed_acc"] == metrics["test_iid/judge_closed_acc"]
    finally:
        server.stop()


def check_the_rater_study_reads_the_scored_table(run_dir: Path, tmp_path: Path) -> None:
    """scores.parquet holds every prediction with the judge's score and reason, and the rater
    study correlates (made-up) human ratings with the judge on it."""
    scores = pd.read_parquet(run_dir / "scores.parquet")
    predictions = read_predictions(run_dir / "predictions.jsonl")
    assert len(scores) == len(predictions) and set(scores["split"]) == {"test_iid", "test_ood"}
    assert {"judge_score", "judge_reason", "judge_failed", "closed_correct"} <= set(scores)
    assert scores["judge_score"].notna().all()
    study = tmp_path / "study"
    assert rater_main(["export", str(run_dir), "--n", "50", "--out", str(study)]) == 0
    items = read_items(study)
    assert "metric:judge_score" in items and items["metric:judge_score"].notna().all()
    sheet = pd.read_csv(study / "rating_sheet.csv", keep_default_na=False)
    human = [round(s) for s in items["metric:judge_score"]]  # raters who agree with it
    sheet.assign(score=human).to_csv(tmp_path / "rater.csv", index=False)
    out = tmp_path / "correlations"
    assert (
        rater_main(
            ["analyze", str(study), "--ratings", str(tmp_path / "rater.csv"), "--out", str(out)]
        )
        == 0
    )
    table = pd.read_csv(out / "correlations.csv").set_index(["kind", "a", "b"])
    assert "judge_score" in set(table.index.get_level_values("b"))


@pytest.mark.slow
def test_a_dead_judge_leaves_the_run_incomplete_and_a_rerun_judges_only_those_items(
    tmp_path: Path, cache_dir: Path
) -> None:
    """No aggregate over the items a judge could not score: NaN, status `incomplete`, a marked
    summary cell; once the server answers, the same job judges only the failed items."""
    server = JudgeServer().start()
    server.fail_first = 10**9  # the server is up but every request fails, as a dead one would
    run_dir = tmp_path / "run"
    args = [
        "debug=smoke",
        "logger=csv",
        "task.references=[]",
        *judge_overrides(server, tmp_path / "judgments", "judge.retries=0"),
        "evaluation.primary_closed=judge_closed_acc",  # the judge's score is the headline
    ]
    try:
        first = run_main(args, run_dir, cache_dir)
        assert first.returncode == 3, first.stderr[-3000:]  # incomplete's exit code
        record = json.loads((run_dir / "results.json").read_text())
        metrics = record["metrics"]
        failed = metrics["test_iid/judge_failures"] + metrics["test_ood/judge_failures"]
        assert record["status"] == "incomplete" and record["failed_items"] == failed > 0
        for split in ("test_iid", "test_ood"):
            for key in ("judge_closed_acc", "judge_open_score", "judge_open_score_norm"):
                assert metrics[f"{split}/{key}"] is None, key  # null: not a number
            assert metrics[f"{split}/closed_acc"] is not None  # the token metrics are complete
        assert metrics["robustness/rr_judge_closed_acc"] is None
        assert metrics["robustness/rr_closed"] is None
        summary = (run_dir / "summary.md").read_text()
        assert summary.count(f"incomplete ({int(failed)})") == 1  # closed RR: both splits
        with JudgeCache(tmp_path / "judgments") as cache:
            stored = cache.counts()
        assert stored["ok"] == 0 and stored["failed"] > 0  # distinct items, failures kept
        requests = server.count

        server.fail_first = 0
        again = run_main(args, run_dir, cache_dir)
        assert again.returncode == 0, again.stderr[-3000:]
        # the weights the first attempt trained to the end are reused, not trained again
        assert "reusing the weights this run trained before" in again.stderr + again.stdout
        record = json.loads((run_dir / "results.json").read_text())
        assert record["status"] == "finished", record.get("error")
        # Only the failed items were sent again, each once (retries are off).
        assert server.count - requests == record["metrics"]["judge/calls"] == stored["failed"]
        assert record["metrics"]["test_iid/judge_failures"] == 0
        assert 0.0 <= record["metrics"]["test_iid/judge_closed_acc"] <= 1.0
    finally:
        server.stop()


@pytest.mark.slow
def test_a_sure_experiment_headlines_the_judge(tmp_path: Path, cache_dir: Path) -> None:
    """`+experiment=slake_modality` scores with the judge and takes RR from it (closed: judge
    accuracy, open: the raw 1-5 judge score), with case-clustered CIs; the token metrics are
    still reported beside it."""
    fixture = write_slake(tmp_path / "slake")
    server = JudgeServer(score_fn=_by_question_length).start()  # non-zero on both sides
    try:
        args = [
            "+experiment=slake_modality",
            f"dataset.root={fixture.root}",
            "debug=smoke",
            "logger=csv",
            "task.references=[]",
            *judge_overrides(server, tmp_path / "judgments")[1:],  # metric comes from headline
        ]
        run = run_main(args, tmp_path / "run", cache_dir, small=SMALL_MODEL)
        assert run.returncode == 0, run.stderr[-3000:]
    finally:
        server.stop()
    record = json.loads((tmp_path / "run" / "results.json").read_text())
    metrics = record["metrics"]
    assert record["config"]["evaluation"]["primary_open"] == "judge_open_score"
    for alias, key in (("closed", "judge_closed_acc"), ("open", "judge_open_score")):
        iid, ood = metrics[f"test_iid/{key}"], metrics[f"test_ood/{key}"]
        assert metrics[f"robustness/rr_{alias}"] == pytest.approx(ood / iid)
        lo, hi = metrics[f"test_iid/{key}_ci_lo"], metrics[f"test_iid/{key}_ci_hi"]
        assert lo <= iid <= hi
    assert 1.0 <= metrics["test_iid/judge_open_score"] <= 5.0
    assert "test_iid/closed_acc" in metrics and "test_iid/open_f1" in metrics


def _by_question_length(system: str, item: dict[str, str]) -> str:
    """A grader that ignores the prediction: a score fixed by the question's length."""
    k = len(item["question"])
    if '"score": <1, 2, 3, 4 or 5>' in system:
        return str(1 + k % 5)
    return str(k % 3) if '"score": <0, 1 or 2>' in system else str(k % 2)
