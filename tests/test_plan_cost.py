"""task=plan's GPU-hours: the measured rates x the documented sizes x what a job runs, for one job
and for every job of a sweep file, labelled with the GPU and date of the measurement.

The jobs' memory plans are stubbed (`planner`: a layout given by hand) so that no decoder layer
is measured here; tests/test_plan.py checks the plans themselves.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from medvqa.planning import cost, job_rates, rates
from medvqa.planning.activations import LayerActivations
from medvqa.planning.memory import Setup, step_time
from medvqa.planning.phases import READ_GIB_PER_S, WRITE_GIB_PER_S
from medvqa.planning.phases import label as estimate_label
from medvqa.planning.sizes import Sizes, known_sizes
from medvqa.planning.sweep import (
    describe_sweep,
    job_overrides,
    sweep_cost,
    sweep_jobs,
    sweep_metrics,
)
from medvqa.record import read_record
from tests.conftest import compose, run_main

LABEL = "estimate, from NVIDIA H100 80GB HBM3 measured 2026-11-26, 2026-11-28"
# SURE-VQA's slake_modality: 3448 / 689 / 1779 rows; SLAKE's validate split 1043 of 4866 train.
TRAIN, TEST = 3448, 689 + 1779
VAL = round(1043 * 3448 / 4866)  # 739: the validate rows the shift keeps (an estimate)
# The shipped H100 rows (medvqa/planning/measured_rates.jsonl, from benchmarks/results/): LLaVA-Med
# LoRA r16, eager, micro-batch 8 without checkpointing (2026-11-26); generation at batch 64,
# unmerged and merged (the newest: 2026-11-28).
TRAIN_RATE, UNMERGED, MERGED = (pytest.approx(x, rel=1e-3) for x in (14.474, 24.903, 38.253))
# LLaVA-Med's bf16 weights; LoRA r16's trained weights (float32) and AdamW's moments
WEIGHTS_GIB, TRAINED_GIB = 7_608_686_592 * 2 / 2**30, 62_922_752 * 4 / 2**30
CHECKPOINT_GIB = 62_922_752 * (4 + 8) / 2**30


def setup(micro_batch: int = 8, checkpoint_every: int = 0, strategy: str = "single") -> Setup:
    """LLaVA-Med's shape in a layout given by hand (the plan's own is tests/test_plan.py's)."""
    return Setup(
        model="llava_med", params=7_608_686_592, trainable=62_922_752, dtype_bytes=2,
        trainable_bytes=4, layers=32, hidden=4096, vocab=32064, kv_width=1024,
        intermediate=14336, layer=LayerActivations(365 * 1024, 0.0, 8192.0), image_tokens=576,
        text_tokens=64, micro_batch=micro_batch, accumulate=32 // micro_batch, eval_batch=64,
        max_new_tokens=16, checkpoint_every=checkpoint_every, strategy=strategy, devices=1,
    )  # fmt: skip


def planner(s: Setup, fits: bool = True) -> cost.Planner:
    return lambda job: (s, fits)


@pytest.fixture(scope="module")
def composer(tmp_path_factory: pytest.TempPathFactory) -> job_rates.Composer:
    cache = tmp_path_factory.mktemp("cost-cache")
    return job_rates.memoized(lambda overrides: compose([*overrides, f"paths.cache_dir={cache}"]))


STUDY_JOB = ["sweep=sure_study", "+experiment=slake_modality", "trainer=gpu"]
# the row's method and kernels exactly: no FLOP or kernel scaling in between
LORA_R16_EAGER = ["peft=lora", "peft.adapter.r=16", "model.compile_layers=false"]


@pytest.mark.heavy
def test_one_job_is_the_measured_rates_times_the_published_sizes(
    composer: job_rates.Composer,
) -> None:
    """LoRA r16 on slake_modality, 3 epochs, eager, trained 8 x 4 without checkpointing: the
    H100 row of that layout as measured; the base's answers at the merged rate (no adapter
    layers), the trained model's at the unmerged one, over test i.i.d. + OoD."""
    job = composer([*STUDY_JOB, *LORA_R16_EAGER])
    s = setup()
    estimate = cost.job_cost(job, planner(s), composer)
    assert estimate.missing is None, estimate.missing
    phases = {p.kind + ":" + p.name: p for p in estimate.phases}
    train = phases["train:training, 3 x 3448 rows"]
    assert (train.items, train.per_s) == (3 * TRAIN, TRAIN_RATE)
    rate = train.per_s
    base = phases["generate:base answers (zero-shot reference)"]
    tuned = phases["generate:answers after training"]
    assert (base.items, base.per_s) == (TEST, MERGED)
    assert (tuned.items, tuned.per_s) == (TEST, UNMERGED)
    # validation: 3 x 739 rows, a forward at batch 64 (the time model), ~half the FLOPs
    val = phases["val:validation, 3 x 739 rows"]
    share = job_rates.sample_flops(job.model, job.peft, True).forward_share  # type: ignore[union-attr]
    assert 0.45 < share < 0.5
    at_eval = step_time(setup(micro_batch=64)) / step_time(s)
    assert val.items == 3 * VAL and val.per_s == pytest.approx(rate / (share * at_eval))
    # beside the rows: the weights read once; the study saves last.ckpt (save_top_k 0) every 250
    # optimiser steps (3 x 3448 / 32 = 323 steps: once), and the trained weights at the end
    load = phases[f"load:loading the weights, {WEIGHTS_GIB:.1f} GiB per GPU"]
    assert load.gpu_s == pytest.approx(WEIGHTS_GIB / READ_GIB_PER_S)
    saves = phases[f"checkpoint:checkpoints, 1 x 1 files of {CHECKPOINT_GIB:.2f} GiB"]
    trained = phases[f"checkpoint:saving the trained weights, {TRAINED_GIB:.2f} GiB"]
    assert saves.gpu_s + trained.gpu_s == pytest.approx(
        (CHECKPOINT_GIB + TRAINED_GIB) / WRITE_GIB_PER_S
    )
    assert "assumed" in load.basis and "assumed" in saves.basis and "compile" not in phases
    overhead = load.gpu_s + saves.gpu_s + trained.gpu_s
    by_hand = (
        3 * TRAIN / rate + TEST / base.per_s + TEST / tuned.per_s + val.items / val.per_s
        + overhead
    )  # fmt: skip
    assert estimate.gpu_hours == pytest.approx(by_hand / 3600)
    assert estimate.wall_hours == estimate.gpu_hours and estimate.gpus == 1
    metrics = cost.cost_metrics(estimate)
    assert metrics["plan/gpu_hours"] == pytest.approx(by_hand / 3600)
    assert metrics["plan/train_gpu_hours"] == pytest.approx(3 * TRAIN / rate / 3600)
    assert metrics["plan/overhead_gpu_hours"] == pytest.approx(overhead / 3600)
    kinds = ("train", "val", "generate", "overhead")
    assert sum(metrics[f"plan/{k}_gpu_hours"] for k in kinds) == pytest.approx(
        metrics["plan/gpu_hours"]
    )


def test_the_figures_are_labelled_with_the_gpu_and_date_they_were_measured_on(
    composer: job_rates.Composer,
) -> None:
    estimate = cost.job_cost(composer([*STUDY_JOB, *LORA_R16_EAGER]), planner(setup()), composer)
    assert estimate.label == LABEL
    described = cost.describe_cost(estimate)
    assert described["label"] == LABEL
    assert described["measured"] == [
        "benchmarks/results/gpu-h100-2026-11-26.jsonl",
        "benchmarks/results/gpu-h100-2026-11-28.jsonl",
    ]
    # each row it used, by file and line, with the commit it ran (these rows predate recording it)
    assert described["rows"] == [
        "benchmarks/results/gpu-h100-2026-11-26.jsonl:7 (commit not recorded)",
        "benchmarks/results/gpu-h100-2026-11-28.jsonl:2 (commit not recorded)",
        "benchmarks/results/gpu-h100-2026-11-28.jsonl:3 (commit not recorded)",
    ]
    assert described["sizes"].startswith("published")
    train = next(p for p in described["phases"] if p["phase"].startswith("training"))
    assert "lora r16, slake-shaped batches, micro-batch 8, checkpointing off: 14.5" in train["from"]
    assert estimate_label([]) == "no estimate"


@pytest.mark.heavy
def test_another_layout_method_and_kernels_are_scaled_from_the_nearest_row(
    composer: job_rates.Composer,
) -> None:
    """The study's LoRA (r128 on SLAKE) planned 8 x 4 with every 4th layer checkpointed: the
    eager row nearest by the time model, scaled by FLOPs (r128 costs more than the row's r16)
    and by the time model; with compiled layers (`auto` on a GPU), the compiled row."""
    job = composer([*STUDY_JOB, "peft=lora", "model.compile_layers=false"])
    s = setup(checkpoint_every=4)
    per_s, basis, measured = job_rates.training_rate(job, s, composer)  # type: ignore[misc]
    row = next(r for r in rates.rows(rates.TrainRow) if r.name in basis)
    assert (row.micro_batch, row.checkpoint_every, row.kernels) == (4, 0, "eager")
    r16 = composer(["model=llava_med", "peft=lora", "trainer=gpu"])
    flops = job_rates.sample_flops(r16.model, r16.peft, True).train  # type: ignore[union-attr]
    flops /= job_rates.sample_flops(job.model, job.peft, True).train  # type: ignore[union-attr]
    assert 0.9 < flops < 1.0 and f"x {flops:.2f} FLOPs (lora as configured)" in basis
    layout = step_time(setup(micro_batch=4)) / step_time(s)
    assert per_s == pytest.approx(row.samples_per_s * flops * layout)
    assert estimate_label([measured]) == "estimate, from NVIDIA H100 80GB HBM3 measured 2026-11-26"

    # compiled layers: the newest compiled row (2026-11-28's 22.9, not 2026-11-26's 23.5), and
    # the compilation and warm-up the measured whole job spent beyond its steady rate
    compiled = cost.job_cost(composer([*STUDY_JOB, "peft=ia3"]), planner(setup()), composer)
    train = next(p for p in compiled.phases if p.kind == "train")
    assert "compiled: 22.9 samples/s" in train.basis, train.basis
    (compiling,) = [p for p in compiled.phases if p.kind == "compile"]
    # make gpu-check's job (2026-11-28): 512 samples in 139.6 s, 21.8 samples/s steady
    assert compiling.gpu_s == pytest.approx(139.562 - 512 / 21.8137, abs=0.01)
    assert "gpu-check-h100-2026-11-28.jsonl:1" in compiling.basis and compiled.note == ""


def test_longer_answers_generate_slower_in_proportion(composer: job_rates.Composer) -> None:
    """MIMIC-CXR-VQA generates up to 100 new tokens, the rows 16: an upper bound of the time."""
    job = composer(["sweep=sure_study", "+experiment=mimic_age", "trainer=gpu", "peft=none"])
    long = dataclasses.replace(setup(), max_new_tokens=100)
    estimate = cost.job_cost(job, planner(long), composer)
    (base,) = [p for p in estimate.phases if p.kind == "generate"]
    assert base.items == 6686 + 2076 and base.per_s == pytest.approx(38.253 * 16 / 100, rel=1e-3)
    assert "x 16/100 new tokens (an upper bound)" in base.basis


SLAKE = ["sweep=sure_study", "+experiment=slake_modality"]


@pytest.mark.parametrize(
    ("overrides", "plan", "why"),
    [
        (["sweep=sure_study", "trainer=gpu"], setup(), "synthetic under shift modality are not"),
        ([*SLAKE, "trainer=cpu"], setup(), "is not a GPU"),
        ([*STUDY_JOB, "model=medgemma"], setup(), "no training row was measured for gemma3"),
        ([*STUDY_JOB, "baseline=no_image"], setup(), "further than 2x"),
        ([*SLAKE, "peft=full", "trainer=deepspeed_zero2"], setup(strategy="zero2"), "ZeRO-2"),
        ([*STUDY_JOB, "model.fp8=true"], setup(), "compiled kernels and FP8 (model.fp8)"),
    ],
)
def test_no_estimate_where_no_measured_row_applies(
    overrides: list[str], plan: Setup, why: str, composer: job_rates.Composer
) -> None:
    """Without documented sizes, on a CPU, for a family without rows, without images (10x
    fewer FLOPs per sample than any row), under ZeRO-2 or with FP8 (no row measured it): no
    number, a reason."""
    estimate = cost.job_cost(composer(overrides), planner(plan), composer)
    assert estimate.missing is not None and why in estimate.missing, estimate.missing
    assert cost.cost_metrics(estimate) == {}
    assert cost.describe_cost(estimate) == {"estimate": None, "why": estimate.missing}


def test_no_estimate_for_a_job_that_does_not_fit(composer: job_rates.Composer) -> None:
    job = composer([*STUDY_JOB, *LORA_R16_EAGER])
    refused = cost.job_cost(job, planner(setup(), fits=False), composer)
    assert "does not fit" in str(refused.missing)


def test_baselines_without_a_model_need_no_gpu(composer: job_rates.Composer) -> None:
    estimate = cost.job_cost(
        composer([*STUDY_JOB, "baseline=most_frequent"]), planner(setup()), composer
    )
    assert estimate.missing is None and estimate.gpu_hours == 0 and "no GPU" in estimate.note


def test_sizes_come_from_a_runs_splits_json_where_none_are_documented(
    composer: job_rates.Composer, tmp_path: Path
) -> None:
    job = composer(["trainer=gpu", "model=llava_med", "peft=ia3"])  # synthetic / modality
    assert isinstance(known_sizes(job), str)
    run = tmp_path / "runs" / "0"
    run.mkdir(parents=True)
    report = {"dataset": "synthetic", "shift": str(job.shift.name),
              "splits": {"train": {"n": 100}, "val": {"n": 20}, "test_iid": {"n": 30},
                         "test_ood": {"n": 10}}}  # fmt: skip
    (run / "splits.json").write_text(json.dumps(report))
    sizes = known_sizes(job, tmp_path / "runs")
    assert isinstance(sizes, Sizes)
    assert (sizes.train, sizes.val, sizes.test_iid, sizes.test_ood) == (100, 20, 30, 10)
    assert sizes.source == str(run / "splits.json")
    capped = composer(["trainer=gpu", "model=llava_med", "peft=ia3", "data.limit.test_ood=4"])
    estimate = cost.job_cost(capped, planner(setup()), composer, splits=run / "splits.json")
    assert estimate.missing is None and {
        p.items for p in estimate.phases if p.kind == "generate"
    } == {34}


@pytest.mark.heavy
def test_a_sweep_file_is_enumerated_as_hydra_would_and_summed(composer: job_rates.Composer) -> None:
    """sweep=sure_study is 7 shifts x 4 methods x 3 seeds = 84 jobs; with +experiment on the
    command line, as under -m, one shift's 12. Seeds repeat a job; the untuned base's answers,
    cached per sweep, count once for the shift's four methods and three seeds."""
    top = composer(["task=plan", "sweep=sure_study", "trainer=gpu"])
    assert len(sweep_jobs(top.hydra)) == 84
    one = composer(["task=plan", "sweep=sure_study", "trainer=gpu", "+experiment=slake_modality",
                    "model.compile_layers=false", "+task.gpu_gib=80"])  # fmt: skip
    jobs = sweep_jobs(one.hydra)
    assert len(jobs) == 12
    assert all("+experiment=slake_modality" in j and "task=plan" in j for j in jobs)
    assert job_overrides(jobs[0]) == [o for o in jobs[0] if not o.startswith(("task", "+task"))]

    sweep = sweep_cost(jobs, one.hydra.sweeper.params.keys(), composer, planner(setup()))
    assert (sweep.jobs, sweep.without_estimate, len(sweep.groups)) == (12, 0, 4)
    assert [g.overrides for g in sweep.groups] == [
        ("peft=none",), ("peft=prompt_tuning",), ("peft=lora",), ("peft=ia3",)]  # fmt: skip
    assert all(g.jobs == 3 for g in sweep.groups)
    base = TEST / 38.253  # the base's answers, one pass
    assert sweep.shared_s == pytest.approx(11 * base, rel=1e-3)  # 12 generate them, once counts
    each = sum(3 * g.cost.gpu_hours for g in sweep.groups)
    assert sweep.gpu_hours == pytest.approx(each - sweep.shared_s / 3600)
    assert sweep.label == LABEL
    metrics = sweep_metrics(sweep)
    assert metrics["plan/sweep_jobs"] == 12 and metrics["plan/sweep_gpu_hours"] == sweep.gpu_hours
    assert describe_sweep(sweep)["groups"][2]["overrides"] == ["peft=lora"]


def test_a_sweep_counts_jobs_without_an_estimate(composer: job_rates.Composer) -> None:
    top = composer(["task=plan", "sweep=synthetic_study", "trainer=gpu", "model=llava_med"])
    jobs = sweep_jobs(top.hydra)
    assert len(jobs) == 24
    grid = top.hydra.sweeper.params.keys()
    sweep = sweep_cost(jobs[:3], grid, composer, planner(setup()))  # one group, 3 seeds
    assert (sweep.jobs, sweep.without_estimate) == (3, 3) and sweep.label == "no estimate"
    assert sweep_metrics(sweep) == {
        "plan/sweep_jobs": 3.0,
        "plan/sweep_jobs_without_estimate": 3.0,
    }


def test_task_plan_prints_and_records_the_job_and_its_sweep(
    cache_dir: Path, tmp_path: Path
) -> None:
    """`python run.py task=plan sweep=...` (not -m): the job's table and the sweep's, the job's
    `plan/gpu_hours` and the sweep's totals in results.json, their labels in its provenance."""
    args = ["task=plan", "sweep=sure_study", "+experiment=slake_modality", "peft=ia3",
            "trainer=gpu", "logger=csv", "+task.gpu_gib=80"]  # fmt: skip
    run = run_main(args, tmp_path / "plan", cache_dir, small=[])
    assert run.returncode == 0, run.stderr[-3000:]
    # ia3 with compiled layers (auto on a GPU): the newest rows only
    label = "estimate, from NVIDIA H100 80GB HBM3 measured 2026-11-28"
    assert f"GPU time of this job · {label}" in run.stdout
    # stdout is a file (and xdist sets COLUMNS=80): the sweep's title, over 80 columns, whole
    assert f"GPU time of sweep=sure_study: 3 jobs · {label}" in run.stdout
    assert "measured rows used: benchmarks/results/gpu-check-h100-2026-11-28.jsonl:1" in (
        " ".join(run.stdout.split())
    )
    record = read_record(tmp_path / "plan" / "results.json")
    metrics = record["metrics"]
    assert 0.1 < metrics["plan/gpu_hours"] < 1 and metrics["plan/sweep_jobs"] == 3
    # the power table of the job's shift (medvqa.statistics.power; tests/test_power.py)
    assert "What two methods' runs of shift slake_modality can tell apart" in run.stdout
    assert metrics["plan/power/test_ood/judge_closed_acc_mdd"] > 0
    # three seeds of the job; the base's answers once
    base = TEST / 38.253 / 3600
    assert metrics["plan/sweep_gpu_hours"] == pytest.approx(
        3 * metrics["plan/gpu_hours"] - 2 * base, rel=1e-4
    )
    described = record["provenance"]["cost"]
    assert described["job"]["label"] == described["sweep"]["label"] == label
    assert described["sweep"]["rows"] == described["job"]["rows"]
    assert (
        "benchmarks/results/gpu-h100-2026-11-28.jsonl:1 (commit not recorded)"
        in (described["job"]["rows"])
    )


def test_the_estimate_counts_the_passes_train_eval_runs(
    composer: job_rates.Composer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan reads `passes.job_passes`, the one list of a job's generation passes: a pass
    kind registered like any plug-in is in the GPU-hours without touching the plan, at its
    rows x its kind's factor (tests/test_pass_kinds.py adds one from outside the repository)."""
    from dataclasses import dataclass

    from medvqa import plugins
    from medvqa.generation import passes

    job = composer([*STUDY_JOB, *LORA_R16_EAGER, "data.extra_eval_images=[blank]"])
    before = cost.job_cost(job, planner(setup()), composer)
    names = [p.name for p in before.phases if p.kind == "generate"]
    assert names == [
        "base answers (zero-shot reference)",
        "answers after training",
        "answers after training, blank image",
    ]

    # The kind registers itself when defined: into a copy of the registry, dropped afterwards.
    monkeypatch.setitem(plugins._REGISTRY, "pass", dict(passes.kinds()))

    @dataclass(frozen=True, kw_only=True)
    class Twice(passes.EvalPass):
        name = "twice_for_the_plan"
        cost_factor = 2

        @classmethod
        def of_job(cls, job: passes.Job) -> list[passes.EvalPass]:
            return [cls.after(job.label)]

        @property
        def key(self) -> str:
            return "twice"

    after = cost.job_cost(job, planner(setup()), composer)
    added = [p for p in after.phases if p.name == "answers after training, twice"]
    assert len(added) == 1 and added[0].items == 2 * TEST
    assert after.gpu_hours == pytest.approx(before.gpu_hours + added[0].gpu_s / 3600)
