"""medvqa-score: predictions made elsewhere, in each format, scored as a run scores them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from medvqa.evaluation.rescore import main, read
from tests.conftest import run_main
from tests.judge_server import JudgeServer, judge_overrides

# The same two splits' worth of scores a run records, compared key by key.
COMPARED = (
    "closed_acc",
    "open_f1",
    "open_exact_match",
    "open_bleu1",
    "open_recall",
    "n",
    "n_closed",
)


@pytest.fixture(scope="module")
def baseline_run(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """A real run's predictions and record (the most-frequent baseline: no model needed)."""
    run_dir = tmp_path_factory.mktemp("most_frequent")
    proc = run_main(["debug=smoke", "logger=csv", "baseline=most_frequent"], run_dir, cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def run_metrics(run_dir: Path) -> dict[str, float]:
    return json.loads((run_dir / "results.json").read_text())["metrics"]


def score(tmp_path: Path, predictions: Path, *args: str) -> dict:
    out = tmp_path / "scored"
    assert main([str(predictions), "--out", str(out), *args]) == 0
    return json.loads((out / "results.json").read_text())


def test_a_runs_own_predictions_score_to_its_numbers(baseline_run: Path, tmp_path: Path) -> None:
    record = score(tmp_path, baseline_run / "predictions.jsonl")
    assert record["status"] == "finished" and record["choices"] == {"format": "medvqa"}
    ours, theirs = record["metrics"], run_metrics(baseline_run)
    for split in ("test_iid", "test_ood"):
        for key in COMPARED:
            assert ours[f"{split}/{key}"] == pytest.approx(theirs[f"{split}/{key}"]), key
    assert ours["robustness/rr_closed"] == pytest.approx(theirs["robustness/rr_closed"])
    assert ours["test_iid/closed_acc_ci_lo"] == pytest.approx(theirs["test_iid/closed_acc_ci_lo"])
    scores = pd.read_parquet(tmp_path / "scored" / "scores.parquet")
    assert len(scores) == 24 and "closed_correct" in scores
    assert record["provenance"]["versions"]["torch"] and "commit" in record["provenance"]["git"]


def test_sure_format_gives_the_runs_traditional_metrics(baseline_run: Path, tmp_path: Path) -> None:
    """SURE-VQA's test_results.json (no split, no candidates, upper-case answer types)."""
    preds = pd.read_json(baseline_run / "predictions.jsonl", lines=True)
    iid = preds[preds["split"] == "test_iid"]
    sure = [
        {
            "qid": int(i),
            "question": q,
            "gt": a,
            "pred": p,
            "answer_type": t.upper(),
            "img_name": "xmlab1/source.jpg",
        }
        for i, (q, a, p, t) in enumerate(
            zip(iid["question"], iid["answer"], iid["prediction"], iid["answer_type"], strict=True)
        )
    ]
    path = tmp_path / "test_results.json"
    path.write_text(json.dumps(sure))
    record = score(tmp_path, path)
    assert record["choices"] == {"format": "sure"}
    ours, theirs = record["metrics"], run_metrics(baseline_run)
    for key in COMPARED:
        assert ours[f"all/{key}"] == pytest.approx(theirs[f"test_iid/{key}"]), key
    assert not any(k.startswith("robustness/") for k in ours)  # one split: no RR


def test_lmms_eval_samples(tmp_path: Path) -> None:
    samples = [
        {
            "doc_id": 0,
            "doc": {"question": "Is there a fracture?", "answer_type": "CLOSED", "modality": "x"},
            "target": "yes",
            "resps": [["Yes, there is."]],
            "filtered_resps": ["Yes, there is."],
        },
        {
            "doc_id": 1,
            "doc": {"question": "Which organ is shown?", "answer_type": "OPEN", "modality": "y"},
            "target": "liver",
            "resps": [["the liver"]],
            "filtered_resps": ["the liver"],
        },
    ]
    path = tmp_path / "samples_vqa_rad.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in samples))
    frame, fmt = read(path)
    assert fmt == "lmms-eval"
    assert frame[["id", "answer", "prediction", "answer_type"]].values.tolist() == [
        ["0", "yes", "Yes, there is.", "closed"],
        ["1", "liver", "the liver", "open"],
    ]
    assert frame["candidates"].iloc[0] == ["yes", "no"]
    metrics = score(tmp_path, path, "evaluation.breakdown=[modality]")["metrics"]
    assert metrics["all/closed_acc"] == 1.0 and metrics["all/open_recall"] == 1.0
    assert metrics["all/modality=x/n"] == 1.0


def test_a_table_with_aliases_infers_yes_no_as_closed(tmp_path: Path) -> None:
    path = tmp_path / "preds.csv"
    pd.DataFrame(
        {
            "question": ["Is it normal?", "Is this a CT or MRI?", "What is enlarged?"],
            "gt": ["no", "CT", "spleen"],
            "pred": ["no", "MRI", "the spleen"],
            "split": ["test_iid", "test_iid", "test_ood"],
        }
    ).to_csv(path, index=False)
    frame, fmt = read(path)
    assert fmt == "table"
    assert frame["answer_type"].tolist() == ["closed", "open", "open"]  # no answer_type column
    typed = tmp_path / "typed.csv"
    pd.read_csv(path).assign(answer_type=["CLOSED", "closed", "Open"]).to_csv(typed, index=False)
    metrics = score(tmp_path, typed)["metrics"]
    assert metrics["test_iid/closed_acc"] == 0.5  # "Is this a CT or MRI?" -> [CT, MRI]
    assert metrics["test_ood/open_recall"] == 1.0
    assert math.isnan(metrics.get("robustness/rr_closed") or math.nan)  # no OoD closed rows


def test_bad_rows_are_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "preds.jsonl"
    rows = [
        {"id": "a", "question": "Q?", "answer": "yes", "prediction": "no", "answer_type": "closed"},
        {"id": "b", "question": "Q?", "answer": "yes", "prediction": None, "answer_type": "closed"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main([str(path), "--out", str(tmp_path / "o")]) == 2
    assert "row 1 (id 'b') has no prediction" in caplog.text
    rows[1]["prediction"], rows[1]["answer_type"] = "yes", "boolean"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main([str(path), "--out", str(tmp_path / "o")]) == 2
    assert "row 1 (id 'b') has answer type 'boolean'" in caplog.text
    assert main([str(tmp_path / "missing.json"), "--out", str(tmp_path / "o")]) == 2


def test_the_judge_scores_a_file_and_a_dead_one_leaves_it_incomplete(tmp_path: Path) -> None:
    path = tmp_path / "preds.csv"
    pd.DataFrame(
        {
            "question": ["Is there a mass?", "Is it normal?", "Which organ?"],
            "answer": ["yes", "no", "liver"],
            "prediction": ["yes", "yes", "the liver"],
            "answer_type": ["closed", "closed", "open"],
        }
    ).to_csv(path, index=False)
    server = JudgeServer().start()
    judge = judge_overrides(server, tmp_path / "judgments", "judge.retries=0")
    try:
        server.fail_first = 10**9
        record = score(tmp_path, path, *judge)
        # "yes"/"yes" and "the liver"/"liver" are exact matches, judged without a call.
        assert record["status"] == "incomplete" and record["failed_items"] == 1
        assert record["metrics"]["all/judge_closed_acc"] is None  # one shortcut + one failure
        assert record["metrics"]["all/judge_open_score"] == 5.0
        assert record["provenance"]["metrics"]["judge"]["judge_id"] == "openai:scripted:generate"
        server.fail_first = 0
        record = score(tmp_path, path, *judge)
        assert record["status"] == "finished"
        assert record["metrics"]["all/judge_closed_acc"] == 0.5
        assert record["metrics"]["judge/calls"] == 1  # only the failed item
    finally:
        server.stop()
