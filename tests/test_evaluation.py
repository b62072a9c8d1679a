"""Generation is incremental and resumable; the chance baseline and the summary are exact."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from medvqa.analysis.summary import summary_table
from medvqa.generation.files import read_predictions
from medvqa.generation.predict import generate_predictions
from medvqa.models.loading import load_vlm
from medvqa.record import RunRecord, read_record
from medvqa.scoring.baselines import chance_scores, expected_chance_accuracy
from medvqa.scoring.pipeline import split_metrics
from tests.conftest import SMALL, compose
from tests.generating import settings

METRIC = OmegaConf.create(
    {"primary_closed": "closed_acc", "primary_open": "open_f1"}
)  # evaluation node


def test_generation_resumes_without_repeating(
    tiny_model_dir: Path, cache_dir: Path, tmp_path: Path
) -> None:
    from hydra.utils import instantiate

    source = instantiate(compose(SMALL, cache_dir).dataset)
    frame = source.table().head(10)
    model, processor = load_vlm(
        OmegaConf.create({"name": "tiny", "pretrained": str(tiny_model_dir), "dtype": "float32"})
    )
    out = tmp_path / "predictions.jsonl"
    # a previous, interrupted run predicted the first 4 (and tore its last line)
    first = generate_predictions(
        model,
        processor,
        frame.head(4),
        source,
        out,
        "test_iid",
        settings(model, processor, batch_size=3, max_new_tokens=3),
    )
    with out.open("a") as fh:
        fh.write('{"id": "torn')
    calls = []
    original = model.generate
    model.generate = lambda **kw: calls.append(kw["input_ids"].shape[0]) or original(**kw)
    preds = generate_predictions(
        model,
        processor,
        frame,
        source,
        out,
        "test_iid",
        settings(model, processor, batch_size=3, max_new_tokens=3),
    )
    assert sum(calls) == 6  # only the 6 missing examples were generated
    assert len(preds) == 10 and preds["id"].is_unique
    assert set(first["id"]) <= set(preds["id"])
    assert len(read_predictions(out)) == 10  # the torn line is skipped, not fatal

    # other weights (e.g. a restarted job whose training re-ran): nothing is reused
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    calls.clear()
    again = generate_predictions(
        model,
        processor,
        frame,
        source,
        out,
        "test_iid",
        settings(model, processor, batch_size=5, max_new_tokens=3),
    )
    assert sum(calls) == 10 and len(again) == 10
    assert again["model"].nunique() == 1 and again["model"].iloc[0] != preds["model"].iloc[0]
    # the file holds one answer per row, of these weights; the old ones are set aside
    kept, stale = read_predictions(out), read_predictions(out.with_name(f"{out.name}.stale"))
    assert len(kept) == 10 and set(kept["model"]) == set(again["model"])
    assert len(stale) == 10 and set(stale["model"]) == set(preds["model"])


def test_chance_is_mean_inverse_option_count() -> None:
    assert expected_chance_accuracy([["yes", "no"], ["a", "b", "c", "d"]]) == pytest.approx(0.375)
    assert math.isnan(expected_chance_accuracy([]))
    frame = pd.DataFrame(
        {
            "answer_type": ["closed", "open", "closed"],
            "candidates": [["a", "b"], None, ["a", "b", "c"]],
        }
    )
    assert chance_scores({"test_iid": frame})["test_iid"]["closed_acc"] == pytest.approx(5 / 12)


def test_split_metrics_names_and_rr() -> None:
    scores = {
        "test_iid": {"closed_acc": 0.8, "open_f1": 0.5, "n": 10.0},
        "test_ood": {"closed_acc": 0.6, "open_f1": 0.25, "n": 5.0},
    }
    metrics = split_metrics(scores, METRIC)
    assert metrics["test_iid/closed_acc"] == 0.8
    assert metrics["robustness/rr_closed"] == pytest.approx(0.75)
    assert metrics["robustness/rr_open"] == pytest.approx(0.5)
    assert metrics["robustness/rr_closed_acc"] == pytest.approx(0.75)
    assert "robustness/rr_n" not in metrics


def test_summary_marks_missing_cells() -> None:
    metrics = {
        "test_iid/closed_acc": 0.8,
        "robustness/rr_closed": 0.75,
        "chance/test_iid/closed_acc": 0.5,
    }
    table = summary_table(metrics, [("lora", ""), ("Chance", "chance/")], "closed_acc", "open_f1")
    assert table.loc[0, "closed i.i.d."] == 0.8 and table.loc[0, "closed RR"] == 0.75
    assert math.isnan(table.loc[0, "open i.i.d."]) and math.isnan(table.loc[1, "closed OoD"])


def test_a_run_scored_on_validation_only_summarises_its_validation_scores(tmp_path: Path) -> None:
    """A grid job (task.eval_splits=[val]) has no test splits and no RR: its summary shows the
    validation scores instead of a row of dashes."""
    from medvqa.analysis.summary import write_summary

    metrics = {"val/closed_acc": 0.625, "val/open_f1": 0.4, "zero_shot/val/closed_acc": 0.5}
    rows = [("LoRA", ""), ("zero-shot base", "zero_shot/")]
    table = summary_table(metrics, rows, "closed_acc", "open_f1")
    assert list(table.columns[:3]) == ["method", "closed val", "open val"]
    assert table.loc[0, "closed val"] == 0.625 and table.loc[1, "closed val"] == 0.5
    assert math.isnan(table.loc[1, "open val"]) and "closed RR" not in table
    _, md = write_summary(table, tmp_path)
    assert "| LoRA " in md.read_text() and "0.625" in md.read_text()


def test_run_record_roundtrip(tmp_path: Path) -> None:
    cfg = OmegaConf.create({"seed": 3, "task": {"name": "train_eval"}})
    path = RunRecord(tmp_path, cfg).write(
        "finished", {"test_iid/closed_acc": 0.5, "x": float("nan")}
    )
    record = read_record(path)
    assert record["status"] == "finished" and record["seed"] == 3
    assert record["metrics"] == {"test_iid/closed_acc": 0.5, "x": None}
    assert record["config"] == {"seed": 3, "task": {"name": "train_eval"}}
    with pytest.raises(ValueError):
        RunRecord(tmp_path, cfg).write("done")
    (tmp_path / "bad.json").write_text(json.dumps({"a": 1}))
    with pytest.raises(ValueError, match=r"bad\.json"):
        read_record(tmp_path / "bad.json")


def test_most_frequent_with_ties_and_unseen_questions() -> None:
    from medvqa.scoring.baselines import most_frequent_answers, most_frequent_predictions

    train = pd.DataFrame(
        {
            "question": ["Is it CT?", "is it ct? ", "is it ct?", "what organ?", "what organ?"],
            "answer": ["yes", "no", "yes", "liver", "brain"],
        }
    )
    table = most_frequent_answers(train)
    assert table == {"is it ct?": "yes", "what organ?": "brain"}  # tie -> alphabetical
    test = pd.DataFrame({"question": ["IS IT CT?", "what organ?", "never seen?", "never?"]})
    preds, coverage = most_frequent_predictions(train, test)
    assert preds["prediction"].tolist() == ["yes", "brain", "", ""]
    assert coverage == 0.5


def test_deltas_are_sighted_minus_other() -> None:
    from medvqa.scoring.metrics.traditional import TraditionalMetric
    from medvqa.scoring.pipeline import Scoring

    deltas = Scoring([TraditionalMetric()], METRIC).deltas

    main = {
        "test_iid/closed_acc": 0.8,
        "test_ood/open_f1": 0.5,
        "test_iid/n": 10.0,
        "robustness/rr_closed": 0.9,
    }
    blank = {
        "test_iid/closed_acc": 0.6,
        "test_ood/open_f1": 0.5,
        "test_iid/n": 10.0,
        "robustness/rr_closed": 1.0,
    }
    assert deltas(main, blank, "delta_blank/") == {
        "delta_blank/test_iid/closed_acc": pytest.approx(0.2),
        "delta_blank/test_ood/open_f1": 0.0,
    }


def test_failed_items_counts_each_split_once_and_by_family() -> None:
    """Breakdown values and engine counters repeat the split counts: never counted twice."""
    from medvqa.scoring.pipeline import failed_items

    metrics = {
        "test_iid/judge_failures": 2.0,
        "test_ood/judge_failures": float("nan"),
        "test_iid/question_type=organ/judge_failures": 2.0,
        "judge/failures": 9.0,
        "zero_shot/test_iid/judge_failures": 1.0,
        "test_iid/aspect_failures": 4.0,
    }
    assert failed_items(metrics) == 7
    assert failed_items(metrics, "test_iid/") == 6
    assert failed_items(metrics, "test_iid/", score="judge_closed_acc") == 2
    assert failed_items(metrics, "test_iid/", score="closed_acc") == 0
    assert failed_items(metrics, "zero_shot/") == 1


def test_scores_parquet_keeps_every_column_even_ones_arrow_cannot_type(tmp_path: Path) -> None:
    from medvqa.scoring.pipeline import scores_path, write_scores

    scored = pd.DataFrame(
        {
            "id": ["a", "b"],
            "judge_score": [1.0, float("nan")],
            "candidates": [["yes", "no"], None],
            "mixed": [{"organ": 1.0}, "free text"],  # Arrow has no type for this column
        }
    )
    path = write_scores(scored, scores_path(tmp_path / "predictions_zero_shot.jsonl"))
    assert path.name == "scores_zero_shot.parquet"
    back = pd.read_parquet(path)
    assert back["judge_score"].iloc[0] == 1.0 and math.isnan(back["judge_score"].iloc[1])
    assert list(back["candidates"].iloc[0]) == ["yes", "no"]
    assert back["mixed"].tolist() == ['{"organ": 1.0}', '"free text"']


@pytest.mark.parametrize("closed_only", [False, True])
def test_a_headline_no_family_computes_is_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, closed_only: bool
) -> None:
    """headline=judge without the judge family: no RR and a warning naming the fix; the token
    headline on the same rows (also a split without open questions) raises none."""
    from medvqa.data.records import PREDICTION
    from medvqa.scoring.metrics.traditional import TraditionalMetric
    from medvqa.scoring.pipeline import Scoring

    def split(n: int) -> pd.DataFrame:
        types = ["closed"] * n if closed_only else ["closed", "open"] * (n // 2)
        return pd.DataFrame(
            {
                "id": [f"r{i}" for i in range(n)],
                "case_id": [f"c{i}" for i in range(n)],
                "question": ["is it?"] * n,
                "answer": ["yes"] * n,
                "answer_type": types,
                "candidates": [["yes", "no"] if t == "closed" else None for t in types],
                "question_type": ["x"] * n,
                PREDICTION: ["yes"] * n,
            }
        )

    preds = {"test_iid": split(4), "test_ood": split(4)}
    tokens = OmegaConf.create(
        {
            "primary_closed": "closed_acc",
            "primary_open": "open_f1",
            "breakdown": [],
            "bootstrap": {"samples": 0, "seed": 0, "level": 0.95},
        }
    )
    with caplog.at_level("WARNING", logger="medvqa.scoring.pipeline"):
        results, _ = Scoring([TraditionalMetric()], tokens).score(preds, tmp_path / "p.parquet")
    assert results["robustness/rr_closed"] == 1.0
    assert not [r for r in caplog.records if "primary_" in r.message]
    judge = OmegaConf.merge(tokens, {"primary_closed": "judge_closed_acc"})
    with caplog.at_level("WARNING", logger="medvqa.scoring.pipeline"):
        results, _ = Scoring([TraditionalMetric()], judge).score(preds, tmp_path / "q.parquet")
    assert "robustness/rr_closed" not in results
    (warning,) = [r.message for r in caplog.records if "primary_" in r.message]
    assert "primary_closed=judge_closed_acc" in warning and "headline=tokens" in warning


@pytest.mark.heavy
def test_the_answer_frequency_prior_may_count_validation_too(
    tmp_path: Path, cache_dir: Path
) -> None:
    """`task.prior_splits=[train,val]` (RoboSurg-VQA's answer-frequency prior) answers each test
    question with its most frequent answer over both splits; an evaluated split is refused."""
    from medvqa.runner import task_of
    from medvqa.scoring.baselines import most_frequent_predictions
    from medvqa.tasks.common import prepare_splits

    cfg = compose(["debug=smoke", "baseline=most_frequent", "logger=csv"], cache_dir)
    for folder in ("splits", "run", "bad"):
        (tmp_path / folder).mkdir()
    _, splits = prepare_splits(cfg, tmp_path / "splits")
    prior = pd.concat([splits["train"], splits["val"]], ignore_index=True)
    expected, coverage = most_frequent_predictions(prior, splits["test_iid"])
    train_only, _ = most_frequent_predictions(splits["train"], splits["test_iid"])
    assert not train_only["prediction"].equals(expected["prediction"])  # val changes answers
    metrics = task_of(cfg)(cfg=cfg, out_dir=tmp_path / "run", prior_splits=("train", "val"))
    assert metrics["test_iid/coverage"] == coverage
    written = read_predictions(tmp_path / "run" / "predictions.jsonl")
    iid = written[written["split"] == "test_iid"].set_index("id")["prediction"]
    assert iid.to_dict() == expected.set_index("id")["prediction"].to_dict()
    with pytest.raises(ValueError, match=r"prior_splits: \['test_iid'\]"):
        task_of(cfg)(cfg=cfg, out_dir=tmp_path / "bad", prior_splits=("train", "test_iid"))
