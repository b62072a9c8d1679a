"""Generation on the strategy's devices, sharded across ranks; rank-aware runs; task=eval;
the untuned base's answers generated once per sweep."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from medvqa.generation import predict as generation
from medvqa.generation.files import read_predictions
from medvqa.generation.predict import generate_predictions
from medvqa.models.loading import load_vlm
from medvqa.record import read_record
from medvqa.runner import task_of
from tests.conftest import ROOT, SMALL, compose, run_main
from tests.generating import settings

SMOKE = ["debug=smoke", "logger=csv"]


def _job(overrides: list[str], cache_dir: Path, out_dir: Path):
    """A composed config to call a task in-process (no Hydra run: paths set by hand)."""
    cfg = compose([*SMALL, *SMOKE, "callbacks=none", *overrides], cache_dir)
    cfg.paths.root_dir = str(ROOT)
    cfg.paths.output_dir = str(out_dir)
    return cfg


def _tiny(tiny_model_dir: Path):
    return load_vlm(
        OmegaConf.create({"name": "tiny", "pretrained": str(tiny_model_dir), "dtype": "float32"})
    )


def test_batch_size_does_not_change_predictions(
    tiny_model_dir: Path, cache_dir: Path, tmp_path: Path
) -> None:
    from hydra.utils import instantiate

    source = instantiate(compose(SMALL, cache_dir).dataset)
    frame = source.table().head(9)
    model, processor = _tiny(tiny_model_dir)
    answers = {}
    for batch in (1, 4, 9):
        preds = generate_predictions(
            model,
            processor,
            frame,
            source,
            tmp_path / f"b{batch}.jsonl",
            "test_iid",
            settings(model, processor, batch_size=batch, max_new_tokens=5),
        )
        answers[batch] = preds.set_index("id")["prediction"].sort_index()
    assert answers[1].to_dict() == answers[4].to_dict() == answers[9].to_dict()


def test_evaluation_runs_in_the_predict_loop_on_the_strategy_device(
    cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Zero-shot and post-fit answers are generated inside Trainer.predict, with the model on
    the strategy's root device (Lightning's teardown after fit moves it to the CPU; a GPU run
    that generated outside the trainer would generate there)."""
    seen = []
    original = generation.GenerationModule.predict_step

    def spy(self, batch, batch_idx):
        root = self.trainer.strategy.root_device
        seen.append(
            (
                self.trainer.predicting,
                next(self.model.parameters()).device == root,
                batch["input_ids"].device == root,
                len(batch["input_ids"]),
            )
        )
        return original(self, batch, batch_idx)

    monkeypatch.setattr(generation.GenerationModule, "predict_step", spy)
    cfg = _job([], cache_dir, tmp_path)
    metrics = task_of(cfg)(cfg=cfg, out_dir=tmp_path)
    assert seen and all(p and m and b for p, m, b, _ in seen)
    assert sum(n for *_, n in seen) == 2 * (12 + 12)  # zero-shot and tuned, both test splits
    assert metrics["test_iid/n"] == 12 and "zero_shot/test_iid/n" in metrics


@pytest.mark.heavy
def test_two_methods_generate_the_zero_shot_answers_once(
    cache_dir: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared_cache = tmp_path_factory.mktemp("shared")
    rows = []
    original = generation.GenerationModule.predict_step
    monkeypatch.setattr(
        generation.GenerationModule,
        "predict_step",
        lambda self, batch, i: rows.append(len(batch["input_ids"])) or original(self, batch, i),
    )
    runs = {}
    for method in ("lora", "ia3"):
        out = tmp_path_factory.mktemp(method)
        cfg = _job([f"peft={method}"], cache_dir, out)
        cfg.paths.cache_dir = str(shared_cache)  # the sweep's shared answers live here
        cfg.model.builder.cache_dir = str(cache_dir)  # the tiny model is built once per session
        runs[method] = (out, task_of(cfg)(cfg=cfg, out_dir=out))
    assert sum(rows) == 3 * 24  # base answers once, then each method's own
    (lora_dir, lora), (ia3_dir, ia3) = runs["lora"], runs["ia3"]
    zs = {k: v for k, v in lora.items() if k.startswith("zero_shot/")}
    assert zs and all(ia3[k] == v or (v != v and ia3[k] != ia3[k]) for k, v in zs.items())
    a, b = (read_predictions(d / "predictions_zero_shot.jsonl") for d in (lora_dir, ia3_dir))
    assert a.equals(b) and len(a) == 24


@pytest.mark.slow
def test_ddp_multirun_runs_each_job_once_with_sharded_generation(
    cache_dir: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Two CPU processes (gloo) per job, two jobs under one `-m`: each job runs once, with ranks
    of its own (the second job used to find the first job's launcher variables and process group
    and wait on its dead peers); rank 0 writes one record and complete predictions without
    duplicates; the untuned base scores exactly as in one process."""
    sweep = tmp_path / "sweep"
    proc = run_main(
        [
            "-m",
            *SMOKE,
            "trainer.devices=2",
            "trainer.strategy=ddp",
            "seed=0,1",
            f"hydra.sweep.dir={sweep}",
        ],
        tmp_path / "unused",
        cache_dir,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = {read_record(p)["seed"]: p for p in sweep.rglob("results.json")}
    assert sorted(records) == [0, 1], records  # children did not start the sweep again
    for seed, path in records.items():
        job = path.parent
        assert read_record(path)["status"] == "finished", seed
        assert (job / "run_rank1.log").is_file()  # rank 1 ran the same job, logging apart
        assert not list(job.glob("*.rank*"))  # shards merged
        for name in ("predictions.jsonl", "predictions_zero_shot.jsonl"):
            preds = read_predictions(job / name)
            assert len(preds) == 24 and not preds.duplicated(["split", "id"]).any(), (seed, name)
    record = read_record(records[0])
    # The generation settings, decided once for the job and recorded (the static decode).
    generation = record["provenance"]["generation"]
    assert generation["decode"] == "static" and generation["share_image_prefix"] is True
    single = tmp_path / "single"
    proc = run_main([*SMOKE], single, cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = read_record(single / "results.json")["metrics"]
    two = record["metrics"]
    zero_shot = [k for k in one if k.startswith("zero_shot/") and one[k] is not None]
    assert zero_shot and all(two[k] == pytest.approx(one[k]) for k in zero_shot)
    # the tuned model saw the same rows in a different order (two shards); close, not equal
    for key in ("test_iid/closed_acc", "test_ood/closed_acc"):
        assert two[key] == pytest.approx(one[key], abs=0.35), key


@pytest.mark.slow
def test_task_eval_reproduces_a_finished_run(
    cache_dir: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    proc = run_main([*SMOKE, "peft=ia3", "seed=3"], run, cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = tmp_path / "eval"
    # composed with another method and seed: both come from the run
    proc = run_main([*SMOKE, "task=eval", f"eval.from_run={run}"], again, cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, after = read_record(run / "results.json"), read_record(again / "results.json")
    assert after["status"] == "finished" and after["task"] == "eval"
    assert after["seed"] == 3 and after["choices"]["peft"] == "ia3"
    assert "train/global_step" not in after["metrics"]
    expected = {k: v for k, v in before["metrics"].items() if k != "train/global_step"}
    assert after["metrics"] == expected
    assert pd.read_json(run / "predictions.jsonl", lines=True)["prediction"].tolist() == (
        pd.read_json(again / "predictions.jsonl", lines=True)["prediction"].tolist()
    )
    assert after["provenance"]["from_run"]["splits"] == "the run's"
    # Another shift's OoD test holds rows these weights trained on (merged from train): refused
    # before the model loads, naming the count and the override; evaluated only when asked.
    unlimited = [f"data.limit.{s}=null" for s in ("train", "test_iid", "test_ood")]
    other = [*SMOKE, "task=eval", f"eval.from_run={run}", "shift=body_part", *unlimited]
    proc = run_main(other, tmp_path / "leak", cache_dir)
    assert proc.returncode == 1 and "generate" not in proc.stderr, proc.stderr[-3000:]
    assert "shift=body_part" in proc.stderr and "rows trained on" in proc.stderr
    proc = run_main([*other, "eval.allow_seen_rows=true"], tmp_path / "allowed", cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    allowed = read_record(tmp_path / "allowed" / "results.json")
    assert allowed["config"]["eval"]["allow_seen_rows"] is True
    seen = allowed["provenance"]["from_run"]["seen"]["test_ood"]
    assert seen["rows"] > 0 and "shift=body_part" in allowed["config"]["eval"]["split_overrides"]
    # The record keeps the manifest of the weights it trained: what task=eval checks them by.
    manifest = before["provenance"]["trained"]
    assert manifest["method"] == "ia3"
    assert manifest["global_step"] == before["metrics"]["train/global_step"]
    # Refused before any data or model work: weights gone, replaced by another training's, or
    # a run that trained none.
    import shutil

    gone, replaced = tmp_path / "gone", tmp_path / "replaced"
    shutil.copytree(run, gone)
    shutil.rmtree(gone / "trained")
    shutil.copytree(run, replaced)
    other = {**manifest, "trained_for": "another config", "global_step": 7}
    (replaced / "trained" / "trainable.json").write_text(json.dumps(other))
    splits = tmp_path / "splits"
    assert run_main([*SMOKE, "task=splits"], splits, cache_dir).returncode == 0
    for source, said in (
        (gone, "its trained weights are not there"),
        (replaced, "differ in ['global_step', 'trained_for']"),
        (splits, "task=splits run"),
    ):
        proc = run_main([*SMOKE, "task=eval", f"eval.from_run={source}"], tmp_path / "x", cache_dir)
        assert proc.returncode != 0 and said in proc.stderr, proc.stderr[-2000:]
        assert "generate" not in proc.stderr and not (tmp_path / "x" / "splits.json").exists()


@pytest.mark.slow
def test_task_eval_needs_a_finished_run(cache_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "crashed").mkdir()
    (tmp_path / "crashed" / "results.json").write_text(
        json.dumps({"status": "failed", "metrics": {}, "config": {}})
    )
    proc = run_main(
        [*SMOKE, "task=eval", f"eval.from_run={tmp_path / 'crashed'}"], tmp_path / "e", cache_dir
    )
    assert proc.returncode != 0 and "only a run that finished training" in proc.stderr


@pytest.mark.slow
def test_blind_script_evaluates_lora_runs_with_black_images(
    cache_dir: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """experiments/sure_vqa/blind.sh: the blind Δ from a LoRA run's own weights, no training."""
    import os
    import subprocess
    import sys

    study = tmp_path / "study"
    proc = run_main([*SMOKE, "+experiment=synthetic_modality"], study / "lora", cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    env = {**os.environ, "PYTHON": sys.executable, "MEDVQA_CACHE": str(cache_dir),
           "WANDB_MODE": "offline"}  # fmt: skip
    script = ROOT / "experiments" / "sure_vqa" / "blind.sh"
    proc = subprocess.run(
        ["bash", str(script), str(study), *SMOKE, *SMALL],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    blind = read_record(study / "lora" / "blind" / "results.json")
    assert blind["status"] == "finished" and blind["choices"]["baseline"] == "blind"
    assert blind["choices"]["peft"] == "lora" and "train/global_step" not in blind["metrics"]
    own = read_record(study / "lora" / "results.json")["metrics"]
    assert blind["metrics"]["test_iid/closed_acc"] == own["test_iid/closed_acc"]  # same weights
    assert "delta_blank/test_iid/closed_acc" in blind["metrics"]
