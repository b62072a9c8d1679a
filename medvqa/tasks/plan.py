"""`task=plan`: what the configured run needs on each GPU and host, before any GPU hour.

    python run.py task=plan model=llava_med peft=lora
    python run.py task=plan model=llava_med peft=full trainer=gpu          # refused, with the fixes
    python run.py task=plan +experiment=slake_modality study=sure_vqa model=llava_med trainer=gpu
    python run.py task=plan sweep=sure_study trainer=gpu        # and every job of the sweep

No data is loaded and no weights are downloaded (`medvqa.planning`). The numbers go to
results.json as `plan/...`; a run that cannot fit is refused (status `failed`, exit status 1)
with the settings that would make it fit. The GPU-hours of the job, and of every job of the
sweep a `sweep=` file describes, are estimated from the measured throughput
(`medvqa.planning.cost`), labelled with the GPU and date of the measurement.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from medvqa import CONF_DIR
from medvqa.models.adapters import checkpoint_every, compiles_layers
from medvqa.planning.cost import (
    Composer,
    JobCost,
    Planner,
    SweepCost,
    cost_metrics,
    describe_cost,
    describe_sweep,
    job_cost,
    job_overrides,
    memoized,
    sweep_cost,
    sweep_jobs,
    sweep_metrics,
)
from medvqa.planning.memory import (
    GIB,
    TEXT_TOKENS,
    Plan,
    Setup,
    checkpointing_label,
    comfortable,
    describe,
    estimate,
    fixes,
    headline,
    layouts,
    speed_order,
    step_time,
)
from medvqa.planning.memory import refusal as refusal_text
from medvqa.planning.setup import PlanError, build_setup
from medvqa.tracking import log_metrics

log = logging.getLogger(__name__)


def plan(
    cfg: DictConfig,
    out_dir: Path,
    loggers: Sequence[Logger] = (),
    provenance: MutableMapping[str, Any] | None = None,
    gpu_gib: float | None = None,
    text_tokens: int = TEXT_TOKENS,
    devices: int | None = None,
    splits: str | None = None,
) -> dict[str, float]:
    """Print the plan of `cfg` and record it; refuse (PlanError) a run that cannot fit.

    `gpu_gib`: each GPU's memory (None: this machine's, or an 80 GB GPU's without one);
    `text_tokens`: tokens per sample beside the image's; `devices`: the GPUs per node assumed
    for `trainer.devices=-1` on a machine that has none; `splits`: a run's splits.json (or a
    folder of runs) whose row counts the GPU-hours use where none are documented.
    """
    result = estimate(build_setup(cfg, gpu_gib, text_tokens, devices))
    print_plan(result)
    if checkpoint_every(cfg.model.gradient_checkpointing) is None:
        print_layouts(result.setup)
    compiled = compiles_layers(cfg.model, cfg.trainer.accelerator)
    Console().print(
        f"decoder layers in the fit: {'compiled' if compiled else 'eager'} "
        f"(model.compile_layers={cfg.model.compile_layers}, trainer.accelerator="
        f"{cfg.trainer.accelerator}; auto compiles on CUDA GPUs without Liger)"
    )
    metrics = plan_metrics(result) | {"plan/compiled_layers": float(compiled)}
    if HydraConfig.initialized():  # the job and the sweep need Hydra to compose them
        metrics |= plan_cost(result, gpu_gib, text_tokens, devices, splits, provenance)
    log_metrics(loggers, metrics)
    if not result.fits:
        raise PlanError(refusal_text(result, fixes(result.setup)))
    log.info("%s: it fits.", headline(result))
    return metrics


def check_fits(cfg: DictConfig) -> tuple[Setup | None, dict[str, float]]:
    """The pre-flight check `train_eval` runs on CUDA before loading anything: refuse a run the
    plan says cannot fit on this machine's GPUs; return the setup it planned (for
    `model.gradient_checkpointing=auto` the fastest layout that fits: micro-batch, accumulation
    and checkpointing) and the plan's `plan/...` estimates (recorded beside the run's measured
    peaks). A model whose architecture is unknown offline (no local checkpoint, no shipped
    config) is let through with a warning (None, {})."""
    from medvqa.models.architectures import UnknownArchitectureError

    try:
        result = estimate(build_setup(cfg))
    except UnknownArchitectureError as err:
        log.warning("memory pre-flight skipped: %s", err)
        return None, {}
    if not result.fits:
        raise PlanError(
            refusal_text(result, fixes(result.setup))
            + "\n(task=plan prints the whole plan; task.check_memory=false skips this check.)"
        )
    log.info("memory pre-flight: %s", headline(result))
    return result.setup, {**plan_metrics(result), **job_estimate(cfg, result)}


def job_estimate(cfg: DictConfig, result: Plan) -> dict[str, float]:
    """The GPU time `task=plan` estimates for this job (`plan/gpu_hours`, `plan/wall_hours`
    and per phase), recorded beside the phase times the job measures of itself (`perf/...`,
    `duration_s`; `medvqa-report`'s speed table sets them side by side). A record, not a gate:
    where the estimate cannot be made (`JobCost.missing`) or fails, nothing is recorded, with
    a log line."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    name = str(HydraConfig.get().job.config_name) if HydraConfig.initialized() else "config"
    try:
        with ExitStack() as stack:
            if not GlobalHydra.instance().is_initialized():  # outside run.py (scripts, tests)
                stack.enter_context(initialize_config_dir(str(CONF_DIR), version_base="1.3"))
            planned = (result.setup, result.fits)
            cost = job_cost(cfg, lambda _: planned, memoized(_composer(name)))
    except Exception as err:  # the estimate must not stop the job it describes
        log.warning("no GPU-time estimate for this job: %r", err)
        return {}
    if cost.missing is not None:
        log.info("no GPU-time estimate for this job: %s", cost.missing)
    return cost_metrics(cost)


def plan_cost(
    result: Plan,
    gpu_gib: float | None,
    text_tokens: int,
    devices: int | None,
    splits: str | None,
    provenance: MutableMapping[str, Any] | None = None,
) -> dict[str, float]:
    """Print and return the GPU-hours of the job this command line plans and, outside `-m`, of
    every job of its sweep (`sweep=...`); their labels and bases go to `provenance["cost"]`."""
    hydra = HydraConfig.get()
    compose = memoized(_composer(str(hydra.job.config_name)))
    job = compose(job_overrides(hydra.overrides.task))
    cost = job_cost(job, lambda _: (result.setup, result.fits), compose, splits, text_tokens)
    print_job_cost(cost)
    metrics = cost_metrics(cost)
    described: dict[str, Any] = {"job": describe_cost(cost)}
    jobs = sweep_jobs(hydra) if hydra.mode == RunMode.RUN else []
    if jobs:
        grid = hydra.sweeper.params.keys()
        sweep = sweep_cost(
            jobs, grid, compose, _planner(gpu_gib, text_tokens, devices), splits, text_tokens
        )
        print_sweep_cost(sweep, str(hydra.runtime.choices.get("sweep")))
        metrics |= sweep_metrics(sweep)
        described["sweep"] = describe_sweep(sweep)
    if provenance is not None:
        provenance["cost"] = described
    return metrics


def _composer(config_name: str) -> Composer:
    """Compose a job as run.py would, inside the running Hydra app."""
    from hydra import compose

    return lambda overrides: compose(config_name=config_name, overrides=list(overrides))


def _planner(gpu_gib: float | None, text_tokens: int, devices: int | None) -> Planner:
    def plan_job(job: DictConfig) -> tuple[Setup, bool]:
        planned = estimate(build_setup(job, gpu_gib, text_tokens, devices))
        return planned.setup, planned.fits

    return plan_job


def _wide() -> Console:
    """A console wide enough for the tables' bases (a pipe's 80 columns would wrap each)."""
    return Console(width=max(Console().width, 160))


def _cost_table(
    title: str, label: str, numbers: Sequence[str], basis: str, caption: str | None = None
) -> Table:
    """The layout of both GPU-time tables: what a row is, its figures (right-aligned), and the
    measurement its rate comes from."""
    view = Table(title=title, caption=caption)
    view.add_column(label, justify="left")
    for column in numbers:
        view.add_column(column, justify="right")
    view.add_column(basis, justify="left")
    return view


def print_job_cost(cost: JobCost, console: Console | None = None) -> None:
    """The job's GPU time per phase, or why there is no estimate."""
    console = console or _wide()
    if cost.missing is not None:
        console.print(f"GPU time of this job: no estimate: {cost.missing}.")
        return
    if not cost.phases:
        console.print(f"GPU time of this job: none ({cost.note}).")
        return
    view = _cost_table(
        f"GPU time of this job · {cost.label}",
        "phase",
        ("items", "per s per GPU", "GPU-hours"),
        "from",
        caption=f"{cost.gpu_hours:.2f} GPU-hours, {cost.wall_hours:.2f} h on {cost.gpus} GPU(s) "
        f"(the rate per GPU assumed the same on more GPUs) · rows: {cost.sizes}"
        + (f" · {cost.note}" if cost.note else "")
        + f" · measured rows used: {'; '.join(cost.sources)}",
    )
    for p in cost.phases:
        view.add_row(p.name, f"{p.items:,.0f}", f"{p.per_s:.1f}", f"{p.gpu_s / 3600:.2f}", p.basis)
    view.add_row("job", "", "", f"{cost.gpu_hours:.2f}", "", style="bold")
    console.print(view)


def print_sweep_cost(sweep: SweepCost, name: str, console: Console | None = None) -> None:
    """Every job of the sweep, grouped over seeds: GPU-hours each and together."""
    view = _cost_table(
        f"GPU time of sweep={name}: {sweep.jobs} jobs · {sweep.label}",
        "jobs",
        ("n", "GPU-h each", "GPU-h"),
        "training from",
        caption=f"measured rows used: {'; '.join(sweep.sources)}" if sweep.sources else None,
    )
    for g in sweep.groups:
        c = g.cost
        if c.missing is not None:
            view.add_row(" ".join(g.overrides), str(g.jobs), "no estimate", "", c.missing)
            continue
        train = next((p.basis for p in c.phases if p.kind == "train"), c.note or "no training")
        each = c.gpu_hours
        view.add_row(
            " ".join(g.overrides), str(g.jobs), f"{each:.2f}", f"{g.jobs * each:.1f}", train
        )
    if sweep.shared_s:
        view.add_row(
            "base answers shared by jobs (cached per sweep): counted once",
            "",
            "",
            f"-{sweep.shared_s / 3600:.1f}",
            "",
        )
    missing = (
        f", {sweep.without_estimate} jobs without an estimate" if sweep.without_estimate else ""
    )
    total = f"{sweep.gpu_hours:.1f}" if sweep.without_estimate < sweep.jobs else "no estimate"
    view.add_row(f"sweep{missing}", str(sweep.jobs), "", total, "", style="bold")
    (console or _wide()).print(view)


def plan_metrics(result: Plan) -> dict[str, float]:
    """The plan as `plan/...` metrics (results.json, the loggers)."""
    return {f"plan/{key}": float(value) for key, value in describe(result).items()}


def print_layouts(chosen: Setup, console: Console | None = None) -> None:
    """What `auto` chose and what the other layouts of the same step would cost: GiB per GPU in
    training and the time model's estimate of speed relative to the chosen one."""
    view = Table(
        title=f"auto layout · step of {chosen.micro_batch * chosen.accumulate} per GPU · "
        "speed: the time model's estimate (MICRO_BATCH_COST, RECOMPUTE_COST)"
    )
    for column in ("micro-batch x accumulation", "checkpointing", "training GiB", "fits", "speed"):
        view.add_column(column, justify="right")
    mine = step_time(chosen)
    for c in sorted(layouts(chosen), key=speed_order):
        plan = estimate(c)
        picked = c == chosen
        view.add_row(
            f"{c.micro_batch} x {c.accumulate}",
            checkpointing_label(c.checkpoint_every),
            f"{plan.training / GIB:.1f}",
            "chosen" if picked else ("yes" if comfortable(plan) else "no"),
            f"{mine / step_time(c):.2f}x",
            style="bold" if picked else None,
        )
    (console or Console()).print(view)


def print_plan(result: Plan, console: Console | None = None) -> None:
    """The plan as a table: per GPU in training and generation, per host."""
    s = result.setup
    view = Table(title=f"plan · model={s.model} · {s.world_size} GPU(s), {s.strategy}")
    view.add_column("", style="bold")
    view.add_column("GiB per GPU", justify="right")
    view.add_column("what", style="dim")
    rows = [
        (
            "weights",
            result.weights,
            f"{s.params / 1e9:.2f} B parameters, {s.trainable / 1e6:.1f} M trained",
        ),
        ("gradients", result.gradients, "sharded 1/N" if s.strategy == "zero2" else "float32"),
        (
            "optimizer",
            result.optimizer,
            "AdamW moments" + (" + fp32 master, 1/N" if s.strategy == "zero2" else ""),
        ),
        (
            "activations",
            result.activations,
            f"micro-batch {s.micro_batch} x {s.tokens} tokens ({s.image_tokens} image), "
            f"{s.layers} layers, checkpointing {checkpointing_label(s.checkpoint_every)}",
        ),
        ("loss", result.loss, f"float32 logits over {s.vocab} entries"),
        ("reserve", result.reserve, "CUDA context, workspaces (estimate)"),
        ("training", result.training, f"global batch {s.global_batch}"),
        (
            "generation",
            result.generation,
            f"eval batch {s.eval_batch}, KV cache"
            + (f", adapters merged into copies of {s.merged / 1e9:.2f} B weights" * (s.merged > 0)),
        ),
    ]
    for name, value, what in rows:
        view.add_row(name, f"{value / GIB:.1f}", what)
    view.add_row("GPU", f"{s.gpu_gib:.1f}", "fits" if result.fits else "DOES NOT FIT")
    view.add_row("host per node", f"{result.host_per_node / GIB:.1f}", f"{s.devices} rank(s)")
    (console or Console()).print(view)
