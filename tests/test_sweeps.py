"""Sweeps are config files: each composes, names real choices, and launches its grid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import CONF, compose, run_main

SWEEPS = sorted(p.stem for p in (CONF / "sweep").glob("*.yaml"))
PAPER_EXPERIMENTS = {
    "slake_modality",
    "slake_question_type",
    "ovqa_body_part",
    "ovqa_question_type",
    "mimic_gender",
    "mimic_ethnicity",
    "mimic_age",
}


def _grid(sweep: str) -> dict[str, list[str]]:
    cfg = compose([f"sweep={sweep}"], Path("/tmp/medvqa-sweep-compose"))
    return {k: str(v).split(",") for k, v in cfg.hydra.sweeper.params.items()}


@pytest.mark.parametrize("sweep", SWEEPS)
def test_every_sweep_names_existing_choices(sweep: str) -> None:
    grid = _grid(sweep)
    assert grid, f"sweep {sweep} defines no parameters"
    groups = {"+experiment": "experiment", "peft": "peft", "baseline": "baseline"}
    for key, values in grid.items():
        if key in groups:
            existing = {p.stem for p in (CONF / groups[key]).glob("*.yaml")}
            assert set(values) <= existing, (sweep, key, set(values) - existing)


@pytest.mark.heavy
def test_the_sure_grid_is_the_papers() -> None:
    """Two sweeps, one GPU size each: full fine-tuning needs ZeRO-2 on four (test_plan.py)."""
    grid, full = _grid("sure_study"), _grid("sure_study_full")
    assert set(grid["+experiment"]) == set(full["+experiment"]) == PAPER_EXPERIMENTS
    assert set(grid["peft"]) | set(full["peft"]) == {"none", "full", "prompt_tuning", "lora", "ia3"}
    assert full["peft"] == ["full"]
    assert grid["seed"] == full["seed"] == ["123", "124", "125"]
    assert set(_grid("sure_baselines")["+experiment"]) == PAPER_EXPERIMENTS
    assert compose(["sweep=sure_study"], Path("/tmp/medvqa-sweep-compose")).trainer.max_epochs == 3


def test_the_sure_study_validates_on_a_sample_and_tests_on_everything() -> None:
    limit = compose(["sweep=sure_study"], Path("/tmp/medvqa-sweep-compose")).data.limit
    assert dict(limit) == {"train": None, "val": 2000, "test_iid": None, "test_ood": None}


@pytest.mark.heavy
def test_lora_grid_keeps_alpha_at_twice_the_rank() -> None:
    assert _grid("lora_grid")["peft.adapter.r"] == ["16", "32", "64", "128", "256"]
    cfg = compose(["sweep=lora_grid", "peft.adapter.r=128"], Path("/tmp/medvqa-sweep-compose"))
    assert cfg.peft.name == "lora" and cfg.peft.adapter.lora_alpha == 256


@pytest.mark.slow
def test_a_sweep_file_launches_its_grid(tmp_path: Path, cache_dir: Path) -> None:
    """The synthetic study's grid (seed pinned on the command line to keep it short)."""
    proc = run_main(
        [
            "-m",
            "sweep=synthetic_study",
            "task=splits",
            "logger=csv",
            "seed=7",
            "hydra.sweep.dir=" + str(tmp_path),
        ],
        tmp_path / "unused",
        cache_dir,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(p.read_text()) for p in tmp_path.rglob("results.json")]
    combos = {(r["choices"]["experiment"], r["choices"]["peft"], r["seed"]) for r in records}
    assert combos == {
        (e, m, 7)
        for e in ("synthetic_modality", "synthetic_question_type")
        for m in ("full", "lora", "ia3", "prompt_tuning")
    }
    assert all(r["status"] == "finished" for r in records)


def test_a_sweep_job_the_config_check_refuses_is_recorded_failed(
    tmp_path: Path, cache_dir: Path
) -> None:
    """Refused before any work, as a single run is, but with a `failed` record naming the
    problem: a report over the sweep and a relaunch see the job (the sweep still exits 1). A
    `model.random_weights` the record writer cannot read is refused and recorded too."""
    args = [
        "-m",
        "task=splits",
        "logger=csv",
        "data.batch_size=0,4",
        "model.random_weights=false,huge",
        f"hydra.sweep.dir={tmp_path}",
    ]
    proc = run_main(args, tmp_path / "unused", cache_dir)
    assert proc.returncode == 1, proc.stderr[-2000:]
    records = {
        (r["config"]["data"]["batch_size"], r["config"]["model"]["random_weights"]): r
        for r in map(json.loads, map(Path.read_text, tmp_path.rglob("results.json")))
    }
    assert set(records) == {(0, False), (4, False), (0, "huge"), (4, "huge")}
    assert records[4, False]["status"] == "finished"
    assert {r["status"] for k, r in records.items() if k != (4, False)} == {"failed"}
    assert "data.batch_size=0: needs a whole number >= 1" in records[0, False]["error"]
    assert "model.random_weights='huge'" in records[4, "huge"]["error"]


def test_long_override_lists_get_a_short_hashed_folder_name() -> None:
    from medvqa.config import MAX_DIRNAME, job_dirname

    assert job_dirname("", "defaults") == "defaults"
    assert job_dirname("peft=lora", "defaults") == "peft=lora"
    long = ",".join(f"key{i}.option=value{i}" for i in range(30))
    name = job_dirname(long, "defaults")
    assert len(name.encode()) <= MAX_DIRNAME and name.startswith("key0.option=value0")
    assert name != job_dirname(long + ",x=1", "defaults")  # distinct settings, distinct folders


@pytest.mark.slow
def test_relaunching_a_sweep_skips_finished_jobs_and_redoes_failed_ones(
    tmp_path: Path, cache_dir: Path
) -> None:
    args = [
        "-m",
        "task=splits",
        "logger=csv",
        "shift.ood_values=[pet],[x-ray]",  # the first job fails (no such modality)
        f"hydra.sweep.dir={tmp_path}",
    ]
    assert run_main(args, tmp_path / "unused", cache_dir).returncode == 1  # a job failed

    def records() -> dict[str, dict]:
        out = {}
        for path in tmp_path.rglob("results.json"):
            record = json.loads(path.read_text())
            out[str(record["config"]["shift"]["ood_values"])] = record
        return out

    first = records()
    assert {k: r["status"] for k, r in first.items()} == {
        "['pet']": "failed",
        "['x-ray']": "finished",
    }
    again = run_main(args, tmp_path / "unused", cache_dir)
    assert again.returncode == 1  # the failed job failed again
    second = records()
    # The finished job was skipped (its record untouched); the failed one ran again.
    assert second["['x-ray']"]["started_at"] == first["['x-ray']"]["started_at"]
    assert second["['x-ray']"]["duration_s"] == first["['x-ray']"]["duration_s"]
    assert second["['pet']"]["status"] == "failed"
    assert second["['pet']"]["started_at"] != first["['pet']"]["started_at"]  # ran again
    assert "already finished" in again.stderr + again.stdout


# --- the paper's settings: fixed (conf/study/sure_vqa.yaml) and chosen (conf/hparams/sure_vqa/) --

EXPERIMENT_DATASET = {
    "slake_modality": "slake",
    "slake_question_type": "slake",
    "ovqa_body_part": "ovqa",
    "ovqa_question_type": "ovqa",
    "mimic_gender": "mimic_cxr_vqa",
    "mimic_ethnicity": "mimic_cxr_vqa",
    "mimic_age": "mimic_cxr_vqa",
}
# SURE-VQA's chosen settings (its appendix C.1 grids) and the reference code's full-FT rate,
# written out here independently of the YAML files they are checked against.
PAPER_SETTINGS = {
    ("slake", "ia3"): {"lr": 3e-2},
    ("ovqa", "ia3"): {"lr": 3e-2},
    ("mimic_cxr_vqa", "ia3"): {"lr": 3e-2},
    ("slake", "lora"): {"lr": 3e-5, "r": 128},
    ("ovqa", "lora"): {"lr": 3e-5, "r": 64},
    ("mimic_cxr_vqa", "lora"): {"lr": 3e-5, "r": 128},
    ("slake", "prompt_tuning"): {"lr": 3e-1, "virtual_tokens": 80},
    ("ovqa", "prompt_tuning"): {"lr": 3e-1, "virtual_tokens": 100},
    ("mimic_cxr_vqa", "prompt_tuning"): {"lr": 3e-1, "virtual_tokens": 60},
    ("slake", "full"): {"lr": 2e-5},
    ("ovqa", "full"): {"lr": 2e-5},
    ("mimic_cxr_vqa", "full"): {"lr": 2e-5},
}
GRIDS = ("lora_grid", "ia3_grid", "prompt_tuning_grid")


def test_the_study_has_settings_for_every_paper_dataset_and_training_method() -> None:
    shipped = {p.stem for p in (CONF / "hparams" / "sure_vqa").glob("*.yaml")}
    assert shipped == {f"{d}_{m}" for d, m in PAPER_SETTINGS}
    assert set(EXPERIMENT_DATASET) == PAPER_EXPERIMENTS


def _study_cases() -> list[object]:
    """Every (experiment, method); `make test` runs each dataset's settings file once (through
    its first experiment), the other experiments on the same files are slow."""
    first = {}
    for experiment in sorted(PAPER_EXPERIMENTS):
        first.setdefault(EXPERIMENT_DATASET[experiment], experiment)
    return [
        pytest.param(e, m, marks=() if e in first.values() else (pytest.mark.slow,))
        for e in sorted(PAPER_EXPERIMENTS)
        for m in ("full", "lora", "ia3", "prompt_tuning")
    ]


@pytest.mark.parametrize(("experiment", "method"), _study_cases())
@pytest.mark.heavy
def test_the_sure_study_composes_the_papers_settings(experiment: str, method: str) -> None:
    cfg = compose(
        ["sweep=sure_study", f"+experiment={experiment}", f"peft={method}"],
        Path("/tmp/medvqa-sweep-compose"),
    )
    dataset = EXPERIMENT_DATASET[experiment]
    chosen = PAPER_SETTINGS[(dataset, method)]
    peft = cfg.peft
    assert peft.name == method and peft.lr == pytest.approx(chosen["lr"])
    if method == "lora":
        assert peft.adapter.r == chosen["r"]
        assert peft.adapter.lora_alpha == 2 * chosen["r"]
        assert peft.adapter.lora_dropout == 0.05
    if method == "prompt_tuning":
        assert peft.virtual_tokens == chosen["virtual_tokens"]
    # the fixed settings: 3 epochs, batch 32, cosine warmup 0.03, projector at 2e-5
    assert cfg.trainer.max_epochs == 3 and cfg.data.batch_size == 32
    assert cfg.trainer.accumulate_grad_batches == 1
    assert peft.warmup_ratio == 0.03 and peft.projector_lr == 2e-5
    assert cfg.hydra.runtime.choices["hparams"] == f"sure_vqa/{dataset}_{method}"


def test_the_paper_settings_stay_in_the_study() -> None:
    """Without `study=sure_vqa` the method files' (tiny CPU model) defaults apply, even on SLAKE;
    a command-line override still beats the chosen settings."""
    plain = compose(["+experiment=slake_modality", "peft=lora"], Path("/tmp/medvqa-sweep-compose"))
    assert plain.peft.lr == 3e-3 and plain.peft.adapter.r == 16 and plain.data.batch_size == 16
    override = compose(
        ["sweep=sure_study", "+experiment=slake_modality", "peft=lora", "peft.lr=1e-4"],
        Path("/tmp/medvqa-sweep-compose"),
    )
    assert override.peft.lr == 1e-4 and override.peft.adapter.r == 128


def test_the_no_image_baseline_trains_lora_with_the_studys_settings() -> None:
    cfg = compose(
        ["sweep=sure_baselines", "+experiment=ovqa_body_part", "baseline=no_image"],
        Path("/tmp/medvqa-sweep-compose"),
    )
    assert cfg.peft.name == "lora" and cfg.peft.adapter.r == 64 and cfg.peft.lr == 3e-5
    assert cfg.data.train_image == "none" and cfg.data.batch_size == 32


STUDY_SWEEPS = ("sure_study", "sure_study_full", "sure_baselines", *GRIDS)


@pytest.mark.heavy
@pytest.mark.parametrize("sweep", STUDY_SWEEPS)
def test_the_study_trains_llava_med_unless_told_otherwise(sweep: str) -> None:
    """The README's recipe named no model: 105 jobs of the tiny CPU model on the real data."""
    assert compose([f"sweep={sweep}"], Path("/tmp/medvqa-sweep-compose")).model.name == "llava_med"
    other = compose([f"sweep={sweep}", "model=qwen2_vl"], Path("/tmp/medvqa-sweep-compose"))
    assert other.model.name == "qwen2_vl"


def test_full_fine_tuning_in_the_study_keeps_the_papers_batch_on_four_gpus() -> None:
    cfg = compose(
        ["sweep=sure_study_full", "+experiment=slake_modality", "peft=full"],
        Path("/tmp/medvqa-sweep-compose"),
    )
    assert cfg.trainer.devices * cfg.data.batch_size * cfg.trainer.accumulate_grad_batches == 32
    assert cfg.trainer.strategy.stage == 2 and cfg.peft.lr == pytest.approx(2e-5)


@pytest.mark.heavy
@pytest.mark.parametrize("sweep", STUDY_SWEEPS)
def test_the_study_resumes_and_checkpoints_inside_epochs(sweep: str) -> None:
    """A requeued job goes on from last.ckpt (none yet: Lightning starts fresh), written every
    250 optimiser steps and once more when training ends, with no second copy kept."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from medvqa.tracking import instantiate_group

    cfg = compose(
        [f"sweep={sweep}", "+experiment=mimic_age", "paths.output_dir=/tmp/run"],
        Path("/tmp/medvqa-sweep-compose"),
    )
    assert cfg.ckpt_path == "last"
    checkpoints = [c for c in instantiate_group(cfg.callbacks) if isinstance(c, ModelCheckpoint)]
    assert {c.dirpath for c in checkpoints} == {"/tmp/run/checkpoints"}
    assert all(c.save_last and c.save_top_k == 0 for c in checkpoints)
    steps, end = sorted(checkpoints, key=lambda c: c._every_n_train_steps, reverse=True)
    assert steps._every_n_train_steps == 250 and steps._every_n_epochs == 0
    assert (end._every_n_train_steps, end._every_n_epochs) == (0, 0)  # only on_train_end
    # outside the study: no resume unless asked, a checkpoint every epoch
    plain = compose(["+experiment=mimic_age"], Path("/tmp/medvqa-sweep-compose"))
    assert plain.ckpt_path is None and plain.callbacks.model_checkpoint.every_n_train_steps is None
    assert "final_checkpoint" not in plain.callbacks


@pytest.mark.heavy
@pytest.mark.parametrize("sweep", GRIDS)
def test_grids_score_on_validation_with_the_fixed_settings_only(sweep: str) -> None:
    cfg = compose([f"sweep={sweep}", "+experiment=slake_modality"], Path("/tmp/medvqa-sweep"))
    assert list(cfg.task.eval_splits) == ["val"]
    assert list(cfg.task.references) == []  # selection compares the grid's own runs
    assert cfg.trainer.max_epochs == 3 and cfg.data.batch_size == 32
    # no chosen settings leak into a grid: the method file's own values, then the grid's
    method = compose([f"peft={cfg.peft.name}"], Path("/tmp/medvqa-sweep")).peft
    assert cfg.peft.lr == method.lr and cfg.peft.virtual_tokens == method.virtual_tokens


def test_a_grid_job_records_validation_scores_and_no_test_scores(
    tmp_path: Path, cache_dir: Path
) -> None:
    """One point of the (IA)³ grid on the built-in data, end to end."""
    proc = run_main(
        [
            "-m",
            "sweep=ia3_grid",
            "model=tiny",  # the study trains LLaVA-Med; the pipeline check, the tiny one
            "peft.lr=3e-2",  # narrows the grid to one job
            "debug=smoke",
            "logger=csv",
            f"hydra.sweep.dir={tmp_path}",
        ],
        tmp_path / "unused",
        cache_dir,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = tmp_path.rglob("results.json")
    record = json.loads(path.read_text())
    assert record["status"] == "finished", record.get("error")
    assert record["config"]["task"]["eval_splits"] == ["val"]
    metrics = record["metrics"]
    assert metrics["val/n"] == 8  # debug=smoke's val cap
    assert 0.0 <= metrics["val/closed_acc"] <= 1.0 and "val/open_f1" in metrics
    assert not [k for k in metrics if "test_" in k or k.startswith("robustness/")]
    assert not [k for k in metrics if k.startswith(("zero_shot/", "chance/"))]
    rows = [json.loads(line) for line in (path.parent / "predictions.jsonl").open()]
    assert len(rows) == 8 and {r["split"] for r in rows} == {"val"}
