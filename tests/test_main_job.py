"""The main job end to end, as a user runs it: `python run.py ...` in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
from importlib.metadata import version
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import ROOT, run_main, sampled
from tests.test_wandb_rows import check_rows_table


@pytest.fixture(scope="module")
def smoke_run(
    tmp_path_factory: pytest.TempPathFactory, cache_dir: Path, tiny_model_dir: Path
) -> Path:
    run_dir = tmp_path_factory.mktemp("smoke")
    staged = {"WANDB_DATA_DIR": str(run_dir.parent / f"{run_dir.name}-wandb-data")}
    proc = run_main(["debug=smoke", "logger=wandb"], run_dir, cache_dir, env=staged)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir.parent / f"{run_dir.name}.out").write_text(proc.stdout + proc.stderr)
    return run_dir


def test_results_record(smoke_run: Path) -> None:
    record = json.loads((smoke_run / "results.json").read_text())
    assert record["status"] == "finished"
    assert record["seed"] == 0
    assert record["config"]["peft"]["name"] == "lora"
    assert record["choices"]["peft"] == "lora" and record["choices"]["shift"] == "modality"
    assert record["choices"]["debug"] == "smoke"
    metrics = record["metrics"]
    for key in (
        "test_iid/closed_acc",
        "test_ood/closed_acc",
        "test_iid/open_f1",
        "test_ood/open_bleu1",
        "robustness/rr_closed",
        "robustness/rr_open",
        "zero_shot/test_iid/closed_acc",
        "chance/test_iid/closed_acc",
        # case-clustered bootstrap CIs beside the point estimates
        "test_iid/closed_acc_ci_lo",
        "test_ood/open_f1_ci_hi",
        "robustness/rr_closed_ci_half",
        "robustness/diff_open",
    ):
        assert key in metrics, key
    lo, hi = metrics["test_iid/closed_acc_ci_lo"], metrics["test_iid/closed_acc_ci_hi"]
    assert lo <= metrics["test_iid/closed_acc"] <= hi
    assert all(v is None or isinstance(v, float) for v in metrics.values())
    assert metrics["test_iid/n"] == 12 and metrics["test_ood/n"] == 12
    assert metrics["train/global_step"] == 3
    # the run's own measurements (medvqa.measure), apart from the scores the seed reproduces:
    # 3 steps x batch 4, 12 + 12 tuned answers
    perf = record["perf"]
    assert not any(k.startswith("perf/") for k in metrics)
    assert perf["perf/fit/samples"] == 12 and perf["perf/fit/samples_per_s"] > 0
    assert perf["perf/generate/predictions/rows"] == 24
    assert perf["perf/load/seconds"] > 0 and perf["perf/score/seconds"] > 0
    assert not any(k.endswith("peak_reserved_gib") for k in perf)  # no GPU here
    # tokens/s and FLOPs from the host-side batch counts; MFU needs a GPU's peak: NaN here
    assert perf["perf/fit/tokens_per_s"] > perf["perf/fit/samples_per_s"]
    assert perf["perf/fit/tflop_per_sample"] > 0 and perf["perf/fit/mfu"] is None


def test_the_per_phase_table_reads_the_record(smoke_run: Path) -> None:
    """benchmarks/gpu_check_table.py (make gpu-check) on a run's record: one row per phase in
    the order the job runs them, with the counts the run measured."""
    from tests.test_training_speed import _bench

    text = _bench("gpu_check_table").table(smoke_run / "results.json")
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ")][
        1:
    ]  # after the header
    phases = [row[0].lstrip("| ") for row in rows]
    # a CPU run has no plan phase (the memory check runs on GPUs): data, then load, first
    assert phases[:2] == ["data", "load"]
    assert phases.index("fit") < phases.index("generate/predictions")
    fit = rows[phases.index("fit")]
    assert fit[2] == "12 samples" and float(fit[3]) > 0


def test_record_says_where_the_numbers_came_from(smoke_run: Path) -> None:
    record = json.loads((smoke_run / "results.json").read_text())
    prov = record["provenance"]
    assert (
        prov["git"]["commit"]
        == subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    )
    assert isinstance(prov["git"]["dirty"], bool)
    assert prov["versions"]["torch"] == version("torch")
    assert {"python", "medvqa", "transformers", "peft", "lightning"} <= set(prov["versions"])
    assert prov["versions"]["medvqa"]  # found through the distribution that provides medvqa
    assert prov["device"].startswith("cpu")
    # the config's cuda_allocator, unless the environment had a setting of its own
    expected = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    assert prov["cuda_alloc_conf"] == expected
    cfg = record["config"]
    assert prov["data"]["dataset"] == "synthetic" and len(prov["data"]["fingerprint"]) >= 16
    assert prov["model"]["source"].startswith(cfg["paths"]["cache_dir"])
    assert prov["model"]["config_hash"] and prov["model"]["weights_fingerprint"]
    assert list(prov["metrics"]) == ["traditional"]
    assert prov["metrics"]["traditional"]["ci_columns"]["closed_acc"] == [
        "closed_correct",
        "closed",
    ]


def test_a_batch_log_shows_signs_of_life(smoke_run: Path) -> None:
    """stdout is a pipe here, as on a cluster: the fit and each generation log progress lines
    (step / total, loss, learning rate, rate, ETA) into run.log."""
    log = (smoke_run / "run.log").read_text()
    fit = [line for line in log.splitlines() if "fit: 3/3 steps (100%)" in line]
    assert fit and all(k in fit[0] for k in ("steps/s", "ETA", "train loss", "lr ", "epoch 1/1"))
    for split in ("test_iid", "test_ood"):
        assert f"generate {split} -> predictions: 12/12 rows (100%)" in log


def test_no_third_party_noise(smoke_run: Path) -> None:
    """The libraries' known deprecations and adverts are silenced (medvqa.quiet), and the
    loading bars of transformers stay out of a log file."""
    import re

    from medvqa.quiet import LIGHTNING_ADVERTS, WARNINGS

    out = (smoke_run.parent / f"{smoke_run.name}.out").read_text()
    for message in (*WARNINGS, *map(re.escape, LIGHTNING_ADVERTS)):
        assert not re.search(message, out), message
    for noise in ("anonymous setting", "Setting accelerator to CPU", "Loading weights:"):
        assert noise not in out


def test_splits_report(smoke_run: Path) -> None:
    report = json.loads((smoke_run / "splits.json").read_text())
    assert set(report["source"]) == {"train", "validate", "test"}
    assert set(report["splits"]) == {"train", "val", "test_iid", "test_ood"}
    for counts in report["splits"].values():
        assert counts["n"] == counts["open"] + counts["closed"] > 0


def test_predictions_and_summary(smoke_run: Path) -> None:
    lines = (smoke_run / "predictions.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(rows) == 24 and {r["split"] for r in rows} == {"test_iid", "test_ood"}
    assert all("prediction" in r and "answer" in r for r in rows)
    assert (smoke_run / "predictions_zero_shot.jsonl").is_file()
    scores = pd.read_parquet(smoke_run / "scores.parquet")
    assert len(scores) == 24 and {"closed_correct", "open_f1", "split"} <= set(scores.columns)
    assert (smoke_run / "scores_zero_shot.parquet").is_file()
    summary = pd.read_csv(smoke_run / "summary.csv")
    assert list(summary["method"]) == ["LoRA", "No Finetune", "Random (1/k)"]
    assert summary.loc[2, "closed i.i.d."] == pytest.approx(0.5)
    assert "closed RR" in (smoke_run / "summary.md").read_text()


def test_wandb_offline_run_holds_the_tables(smoke_run: Path) -> None:
    runs = list((smoke_run / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    tables = list((runs[0] / "files" / "media" / "table").rglob("*.table.json"))
    names = {p.name.split("_")[0] for p in tables}
    assert {"summary", "predictions"} <= names, tables
    predictions = next(p for p in tables if p.name.startswith("predictions"))
    data = json.loads(predictions.read_text())
    assert len(data["data"]) == 24 and "prediction" in data["columns"]
    # What `wandb sync` uploads: the rows with the images the model saw, each stored once.
    images = pd.read_parquet(smoke_run / "scores.parquet")["image"].nunique()
    check_rows_table(smoke_run, "predictions", n_rows=24, n_images=images)


def test_splits_task_needs_no_model(tmp_path: Path, cache_dir: Path) -> None:
    proc = run_main(["task=splits", "logger=csv", "shift=age"], tmp_path, cache_dir)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads((tmp_path / "results.json").read_text())
    assert record["status"] == "finished" and record["task"] == "splits"
    report = json.loads((tmp_path / "splits.json").read_text())
    assert record["metrics"]["splits/test_ood/n"] == report["splits"]["test_ood"]["n"]
    assert not (tmp_path / "predictions.jsonl").exists()


def test_bad_ood_value_fails_clearly_and_is_recorded(tmp_path: Path, cache_dir: Path) -> None:
    proc = run_main(["task=splits", "logger=csv", "shift.ood_values=[pet]"], tmp_path, cache_dir)
    assert proc.returncode != 0
    assert "pet" in proc.stderr and "x-ray" in proc.stderr  # lists the values that exist
    record = json.loads((tmp_path / "results.json").read_text())
    assert record["status"] == "failed" and "pet" in record["error"]


def test_unwritable_cache_dir_is_named(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    proc = run_main(["task=splits", "logger=csv"], tmp_path / "run", blocker / "cache")
    assert proc.returncode != 0
    assert "paths.cache_dir" in proc.stderr


def test_multirun_goes_on_after_a_failed_job(tmp_path: Path, cache_dir: Path) -> None:
    proc = run_main(
        [
            "-m",
            "task=splits",
            "logger=csv",
            "shift.ood_values=[pet],[x-ray]",
            f"hydra.sweep.dir={tmp_path}",
        ],
        tmp_path / "unused",
        cache_dir,
    )
    # every job ran; the sweep's exit status says one did not finish, and names it
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "the job is failed" in proc.stderr and "shift.ood_values=[pet]" in proc.stderr
    statuses = sorted(json.loads(p.read_text())["status"] for p in tmp_path.rglob("results.json"))
    assert statuses == ["failed", "finished"]


@pytest.mark.parametrize("method", sampled(["full", "prompt_tuning", "ia3", "none"], keep=1))
def test_every_method_runs(
    method: str, tmp_path: Path, cache_dir: Path, tiny_model_dir: Path
) -> None:
    proc = run_main(["debug=smoke", "logger=csv", f"peft={method}"], tmp_path, cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((tmp_path / "results.json").read_text())
    assert record["status"] == "finished"
    assert record["metrics"]["test_ood/n"] == 12
    if method == "none":  # zero-shot: nothing trained, and no duplicate zero-shot reference
        assert "train/global_step" not in record["metrics"]
        assert not any(k.startswith("zero_shot/") for k in record["metrics"])
    else:
        assert record["metrics"]["train/global_step"] == 3


@pytest.mark.slow
def test_finished_job_is_skipped_and_checkpoint_resumes(
    tmp_path: Path, cache_dir: Path, tiny_model_dir: Path
) -> None:
    import torch

    args = ["debug=smoke", "logger=csv", "task.references=[]"]
    first = run_main(args, tmp_path, cache_dir)
    assert first.returncode == 0, first.stderr[-2000:]
    record = json.loads((tmp_path / "results.json").read_text())
    trained = json.loads((tmp_path / "trained" / "trainable.json").read_text())
    # the Lightning checkpoint holds only the trained tensors, not the frozen base
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert len(ckpt["state_dict"]) == trained["n_tensors"]

    again = run_main(args, tmp_path, cache_dir)
    assert again.returncode == 0 and "already finished" in again.stderr + again.stdout
    assert json.loads((tmp_path / "results.json").read_text())["started_at"] == record["started_at"]

    resumed = run_main(
        [*args, "trainer.max_steps=5", "trainer.max_epochs=3", "ckpt_path=last"],
        tmp_path,
        cache_dir,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    metrics = json.loads((tmp_path / "results.json").read_text())["metrics"]
    assert metrics["train/global_step"] == 5  # continued from step 3, not from 0
    assert "Restoring states from the checkpoint" in resumed.stderr + resumed.stdout


@pytest.mark.parametrize(
    "baseline", sampled(["most_frequent", "blind", "random", "no_image", "zero_shot"], keep=1)
)
def test_baselines_write_the_same_schema(
    baseline: str, tmp_path: Path, cache_dir: Path, tiny_model_dir: Path
) -> None:
    proc = run_main(["debug=smoke", "logger=csv", f"baseline={baseline}"], tmp_path, cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((tmp_path / "results.json").read_text())
    metrics = record["metrics"]
    assert record["status"] == "finished"
    assert {"test_iid/closed_acc", "test_ood/closed_acc", "robustness/rr_closed"} <= set(metrics)
    if baseline == "most_frequent":
        assert 0.0 <= metrics["test_iid/coverage"] <= 1.0 and "test_ood/coverage" in metrics
        assert metrics["test_iid/n"] == 12  # debug limits apply to baselines too
    if baseline == "random":
        assert metrics["test_iid/closed_acc"] == pytest.approx(0.5)
    if baseline == "blind":
        delta = metrics["delta_blank/test_iid/closed_acc"]
        sighted, blind = metrics["test_iid/closed_acc"], metrics["blank/test_iid/closed_acc"]
        assert delta == pytest.approx(sighted - blind)
        # The paired CI of the blind Δ (same questions, cases resampled jointly).
        lo, hi = (metrics[f"delta_blank/test_iid/closed_acc_ci_{s}"] for s in ("lo", "hi"))
        assert lo <= delta <= hi
    if baseline == "no_image":
        assert record["config"]["data"]["train_image"] == "none"
        assert pd.read_csv(tmp_path / "summary.csv")["method"][0] == "No Image"
    if baseline == "zero_shot":
        assert record["config"]["peft"]["name"] == "none"


def test_deepspeed_without_cuda_fails_at_once(tmp_path: Path, cache_dir: Path) -> None:
    proc = run_main(["debug=smoke", "logger=csv", "trainer=deepspeed_zero2"], tmp_path, cache_dir)
    assert proc.returncode != 0
    assert "needs CUDA GPUs" in proc.stderr and "trainer=cpu" in proc.stderr
    record = json.loads((tmp_path / "results.json").read_text())
    assert record["status"] == "failed" and "HardwareError" in record["error"]
    assert not (tmp_path / "predictions_zero_shot.jsonl").exists()  # nothing ran before the check


@pytest.mark.slow
def test_diverged_job_is_recorded_and_the_sweep_goes_on(
    tmp_path: Path, cache_dir: Path, tiny_model_dir: Path
) -> None:
    proc = run_main(
        [
            "-m",
            "debug=smoke",
            "logger=csv",
            "peft=full",
            "task.references=[]",
            "peft.lr=1e12,1e-3",
            f"hydra.sweep.dir={tmp_path}",
        ],
        tmp_path / "unused",
        cache_dir,
    )
    assert proc.returncode == 1 and "the job is diverged" in proc.stderr, proc.stderr[-2000:]
    records = {
        json.loads(p.read_text())["config"]["peft"]["lr"]: json.loads(p.read_text())
        for p in tmp_path.rglob("results.json")
    }
    assert records[1e12]["status"] == "diverged" and records[1e12]["diverged_step"] >= 0
    assert "nan" in records[1e12]["error"] or "inf" in records[1e12]["error"]
    assert records[1e-3]["status"] == "finished"


@pytest.mark.slow
def test_multirun_folders_group_seeds_under_their_setting(tmp_path: Path, cache_dir: Path) -> None:
    proc = run_main(
        [
            "-m",
            "task=splits",
            "logger=csv",
            "seed=0,1",
            "peft=lora,ia3",
            f"hydra.sweep.dir={tmp_path}",
        ],
        tmp_path / "unused",
        cache_dir,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = sorted(str(p.parent.relative_to(tmp_path)) for p in tmp_path.rglob("results.json"))
    # The test's own size overrides (SMALL) are part of the names too; the seed is not.
    assert [f.split("peft=", 1)[1] for f in found] == [
        f"{peft},task=splits/seed={seed}" for peft in ("ia3", "lora") for seed in (0, 1)
    ]
