"""GPU-hours of a job before it runs (`task=plan`; a sweep's: `medvqa.planning.sweep`): an
estimate from the rates measured on a GPU (`medvqa.planning.rates`: the rows the package ships,
each with its GPU, date, commit and file, carried over to the job by `planning.job_rates`), the
datasets' documented sizes (`planning.sizes`) and what a job runs. The phases and the overheads
beside samples and rows are `planning.phases`'.

A job (`task=train_eval`, `medvqa.tasks.train_eval`) spends its GPU time in these phases:

- setup: loading the weights (their bytes at an assumed read rate), and, where the fit compiles
  its decoder layers, the compilation and warm-up a whole measured job spent (`rates.JobRow`);
- training: epochs x train rows (`data.limit.train`, `trainer.max_steps`,
  `trainer.limit_train_batches`), at the samples/s measured for the nearest setup
  (`rates.TrainRow`), scaled to the job's model and method by the FLOPs of a sample
  (`medvqa.models.flops`) and to the plan's layout (micro-batch, checkpointing) by the time model
  (`memory.step_time`); and the checkpoints it writes (the trained weights and AdamW's moments,
  as `callbacks.model_checkpoint` saves them, at an assumed write rate);
- validation: each epoch's val rows (`data.limit.val`), a forward at the eval batch: the
  training rate scaled by the forward's share of the language model's FLOPs and the time model;
- generation over the test splits: the untuned base's answers (the zero-shot reference; the
  whole job for `peft=none`), which a sweep's jobs share (cached under `paths.cache_dir`), and the
  trained model's answers (and each other pass of the job: an extra image mode, an option
  order, a plug-in's; its rows x its kind's `cost_factor`), at the rows/s measured
  (`rates.GenerateRow`).

GPU-hours assume that the rate per GPU does not change with the number of GPUs (not measured);
wall-clock hours are GPU-hours / GPUs. Not counted: process start, scoring, and compiling the
decode (`model.compile_decode`; never timed on a GPU). A sweep's second job compiles from the
shared inductor cache (`training.hardware.configure_compile_cache`) but is counted at the first's
cost: the cache's saving was never measured on a GPU. Where no measured row is close enough the
estimate says why instead of giving a number (`JobCost.missing`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from medvqa.data import records as R
from medvqa.generation import passes as eval_passes
from medvqa.models.adapters import build_adapter_config
from medvqa.models.loading import resolve_pretrained, roles
from medvqa.planning.job_rates import (
    Composer,
    Rate,
    generation_rate,
    sample_flops,
    sees_images,
    training_rate,
)
from medvqa.planning.memory import TEXT_TOKENS, Setup
from medvqa.planning.memory import step_time as time_model
from medvqa.planning.phases import (
    OVERHEADS,
    JobCost,
    Phase,
    checkpoint_phases,
    compile_phase,
    load_phase,
)
from medvqa.planning.rates import Measured
from medvqa.planning.setup import eval_batch_size, injectable
from medvqa.planning.sizes import Sizes, capped, dataset_name, known_sizes
from medvqa.training.spec import TrainerSchema

# The memory plan of a composed job: its setup (layout, GPUs) and whether it fits.
Planner = Callable[[DictConfig], tuple[Setup, bool]]
# The task whose jobs use a GPU (task=train_eval and task=eval run it).
TRAIN_EVAL = "medvqa.tasks.train_eval.train_eval"


def train_samples(cfg: DictConfig, rows: int, setup: Setup) -> tuple[float, int]:
    """(samples trained, whole epochs): epochs x rows per epoch (`limit_train_batches`), at most
    `max_steps` optimiser steps of the global batch (Lightning: neither is 1000 epochs)."""
    trainer = cfg.trainer
    per_epoch = float(rows)
    limit = trainer.get("limit_train_batches")
    if isinstance(limit, float):
        per_epoch = math.floor(rows * limit)
    elif limit is not None:
        per_epoch = min(rows, int(limit) * setup.micro_batch * setup.world_size)
    steps = int(trainer.get("max_steps", TrainerSchema.max_steps))
    epochs = trainer.get("max_epochs")
    epochs = (1000 if steps == -1 else math.inf) if epochs is None else int(epochs)
    total = epochs * per_epoch
    if steps > 0:
        total = min(total, steps * setup.global_batch)
    return total, int(total // per_epoch) if per_epoch else 0


def val_rows(cfg: DictConfig, rows: int, setup: Setup) -> int:
    """Rows of one validation under `trainer.limit_val_batches` (batches of the eval batch)."""
    limit = cfg.trainer.get("limit_val_batches")
    if isinstance(limit, float):
        return math.floor(rows * limit)
    if limit is not None:
        return min(rows, int(limit) * setup.eval_batch * setup.world_size)
    return rows


def job_cost(
    job: DictConfig,
    plan: Planner,
    compose: Composer,
    splits: str | Path | None = None,
    text_tokens: int = TEXT_TOKENS,
) -> JobCost:
    """The GPU time of `job` (a composed run config), phase by phase (the module docstring)."""
    from medvqa.models.architectures import UnknownArchitectureError

    task = job.task
    if str(task.get("_target_")) != TRAIN_EVAL:
        return JobCost(note=f"task={task.name}: no model, no GPU")
    if str(job.trainer.accelerator) not in ("gpu", "cuda"):
        return JobCost(missing=f"trainer.accelerator={job.trainer.accelerator} is not a GPU")
    if str(job.trainer.precision) != "bf16-mixed":
        return JobCost(missing=f"trainer.precision={job.trainer.precision}: the rows are bf16")
    if job.model.get("builder") is not None:
        return JobCost(missing=f"model={job.model.name} is an offline toy model")
    sizes = known_sizes(job, splits)
    if isinstance(sizes, str):
        return JobCost(missing=sizes)
    try:
        return _job_cost(job, sizes, plan, compose, text_tokens)
    except UnknownArchitectureError as err:
        return JobCost(missing=str(err))


def _job_cost(
    job: DictConfig, sizes: Sizes, plan: Planner, compose: Composer, text_tokens: int
) -> JobCost:
    """The phases of a job the memory plan fits: loading, the fit's (`_fit_phases`), and a
    generation phase per pass, the untuned base's before the fit (its answers come first)."""
    setup, fits = plan(job)
    gpus = setup.world_size
    if not fits:
        return JobCost(gpus=gpus, missing="it does not fit its GPUs (task=plan refuses it)")
    from_run = job.task.get("from_run")
    fit = bool(job.peft.fit) and from_run is None
    passes = _planned_passes(job, sizes, setup, tuned=fit or from_run is not None)
    zero_shot = passes[0][-1]  # before the fit
    phases: list[Phase] = []
    measured: list[Measured] = []
    note = ""
    if fit:
        trained = _fit_phases(job, sizes, setup, compose, text_tokens)
        if isinstance(trained, str):
            return JobCost(gpus=gpus, missing=trained)
        phases, measured, note = trained
    rates: dict[bool, Rate | str] = {}
    for i, (name, items, merge, shared, _) in enumerate(passes):
        if merge not in rates:
            rates[merge] = generation_rate(job, merge, setup.max_new_tokens, compose, text_tokens)
        rate = rates[merge]
        if isinstance(rate, str):
            return JobCost(gpus=gpus, missing=rate)
        at = 0 if i == 0 and zero_shot else len(phases)  # the job's phases in their order
        phases.insert(at, Phase("generate", name, items, rate[0], rate[1], shared))
        measured.append(rate[2])
    phases.insert(0, load_phase(setup))
    return JobCost(tuple(phases), gpus, sizes.source, tuple(measured), note=note)


def _planned_passes(
    job: DictConfig, sizes: Sizes, setup: Setup, tuned: bool
) -> list[tuple[str, float, bool, tuple[Any, ...] | None, bool]]:
    """(name, rows, merged, shared key, untuned) of each generation pass, as train_eval runs
    them (generation.passes.job_passes, the one list), each costing its rows x its kind's
    factor. The untuned base's answers (no adapters: merged) are cached under paths.cache_dir,
    keyed by what changes them: the sweep's jobs with that key share them."""
    task, limit = job.task, job.data.limit
    test = sum(capped(sizes.split(s), limit.get(s)) for s in task.eval_splits)
    adapters = injectable(build_adapter_config(job.peft.adapter, None, roles(job.model)))
    merged = not tuned or not adapters or setup.merged > 0  # model.merge_adapters, as planned
    base_key = (
        resolve_pretrained(job.model),
        dataset_name(job),
        str(job.shift.name),
        test,
        str(job.data.eval_image),
        setup.world_size,
    )
    label = "answers after training" if tuned else "base answers"
    references = "base answers (zero-shot reference)" if "zero_shot" in task.references else None
    runs = eval_passes.job_passes(eval_passes.Job(job, label, tuned, references))
    return [
        (*p.planned(test), p.base or merged, base_key if p.shared else None, p.base) for p in runs
    ]


def _fit_phases(
    job: DictConfig, sizes: Sizes, setup: Setup, compose: Composer, text_tokens: int
) -> tuple[list[Phase], list[Measured], str] | str:
    """The fit's phases (compiling, training, checkpoints, validation), the measured rows they
    come from and a note (compiled layers no whole job measured); a string says why there is
    no estimate (no training row applies)."""
    if setup.strategy == "zero2":
        return "no training row was measured under DeepSpeed ZeRO-2"
    rate = training_rate(job, setup, compose, text_tokens)
    if isinstance(rate, str):
        return rate
    per_s, basis, table = rate
    train = capped(sizes.train, job.data.limit.get(R.TRAIN))
    samples, epochs = train_samples(job, train, setup)
    name = f"training, {samples / train:g} x {train} rows" if train else "training"
    phases = [Phase("train", name, samples, per_s, basis)]
    measured = [table]
    compiled = compile_phase(job, setup)
    if isinstance(compiled, tuple):
        phases.insert(0, compiled[0])
        measured.append(compiled[1])
    phases.extend(checkpoint_phases(job, setup, samples, epochs))
    validation = _val_phase(job, sizes, setup, epochs, per_s, text_tokens)
    if validation is not None:
        phases.append(validation)
    return phases, measured, compiled if isinstance(compiled, str) else ""


def _val_phase(
    job: DictConfig, sizes: Sizes, setup: Setup, epochs: int, train_per_s: float, text_tokens: int
) -> Phase | None:
    """The fit's validations (none where it validates no rows, or the FLOPs are not counted):
    a forward at the eval batch, so the training rate scaled by the forward's share of the
    FLOPs and by the time model at that batch."""
    every = job.trainer.get("check_val_every_n_epoch")
    validations = epochs // int(every) if every else 0
    rows = val_rows(job, capped(sizes.val, job.data.limit.get(R.VAL)), setup)
    flops = sample_flops(job.model, job.peft, sees_images(job, "train"), text_tokens)
    if not (validations and rows and flops is not None):
        return None
    # the fit validates at the batch train_eval gives it (auto: not the plan's pick)
    batch = eval_batch_size(job.data, None)
    at_eval = dataclasses.replace(setup, micro_batch=batch, checkpoint_every=0)
    factor = flops.forward_share * time_model(at_eval) / time_model(setup)
    why = (
        f"the training rate x {1 / factor:.2f}: a forward ({flops.forward_share:.2f} "
        f"of the FLOPs) at batch {batch} (time model)"
    )
    name = f"validation, {validations} x {rows} rows"
    return Phase("val", name, validations * rows, train_per_s / factor, why)


def cost_metrics(cost: JobCost) -> dict[str, float]:
    """The job's estimate as `plan/...` metrics (none without an estimate)."""
    if cost.missing is not None:
        return {}
    return {
        "plan/gpu_hours": cost.gpu_hours,
        "plan/wall_hours": cost.wall_hours,
        "plan/train_gpu_hours": cost.hours("train"),
        "plan/val_gpu_hours": cost.hours("val"),
        "plan/generate_gpu_hours": cost.hours("generate"),
        "plan/overhead_gpu_hours": cost.hours(*OVERHEADS),
    }


def describe_cost(cost: JobCost) -> dict[str, Any]:
    """The job's estimate with its label and bases (results.json's provenance)."""
    if cost.missing is not None:
        return {"estimate": None, "why": cost.missing}
    return {
        "label": cost.label,
        "measured": sorted({m.file for m in cost.measured}),
        "rows": cost.sources,
        "sizes": cost.sizes,
        "gpus": cost.gpus,
        "note": cost.note,
        "phases": [
            {"phase": p.name, "items": p.items, "per_s_per_gpu": p.per_s, "from": p.basis}
            for p in cost.phases
        ],
    }
