"""`task=plan`: what the configured run needs on each GPU and host, before any GPU hour.

    python run.py task=plan model=llava_med peft=lora
    python run.py task=plan model=llava_med peft=full trainer=gpu          # refused, with the fixes
    python run.py task=plan +experiment=slake_modality study=sure_vqa model=llava_med trainer=gpu
    python run.py task=plan sweep=sure_study trainer=gpu        # and every job of the sweep

No data is loaded and no weights are downloaded (`medvqa.planning`). The numbers go to
results.json as `plan/...`; a run that cannot fit is refused (status `failed`, exit status 1)
with the settings that would make it fit. The GPU-hours of the job, and of every job of the
sweep a `sweep=` file describes, are estimated from the measured throughput
(`medvqa.planning.cost`), labelled with the GPU and date of the measurement. The power table
says, per shift and test split, the smallest difference between two methods the runs can find
(`plan_power`, medvqa.statistics.power); `+task.icc_from=<a finished run of the dataset>` measures
its clustering and spread instead of assuming them (docs/protocols.md#how-to-size-a-study).
"""

from __future__ import annotations

import dataclasses
import logging
import math
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
from medvqa.analysis.claims import PER_PAIR
from medvqa.console import console as console_for_output
from medvqa.data.shifts import SPLITS_FILE
from medvqa.models.adapters import checkpoint_every, compiles_layers
from medvqa.planning.cost import Planner, cost_metrics, describe_cost, job_cost
from medvqa.planning.job_rates import Composer, memoized
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
from medvqa.planning.phases import JobCost
from medvqa.planning.setup import PlanError, build_setup
from medvqa.planning.sizes import capped, dataset_name, known_sizes
from medvqa.planning.sweep import (
    SweepCost,
    describe_sweep,
    job_overrides,
    seed_groups,
    sweep_cost,
    sweep_jobs,
    sweep_metrics,
)
from medvqa.statistics.power import ALPHA, FEW_CLUSTERS, POWER, Detectable, detectable
from medvqa.tasks.finished_runs import TEST_SPLITS, FinishedRun, finished_runs
from medvqa.tasks.finished_runs import designs as finished_designs
from medvqa.tasks.finished_runs import spreads as finished_spreads
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
    icc_from: str | None = None,
) -> dict[str, float]:
    """Print the plan of `cfg` and record it; refuse (PlanError) a run that cannot fit.

    `gpu_gib`: each GPU's memory (None: this machine's, or an 80 GB GPU's without one);
    `text_tokens`: tokens per sample beside the image's; `devices`: the GPUs per node assumed
    for `trainer.devices=-1` on a machine that has none; `splits`: a run's splits.json (or a
    folder of runs) whose row counts the GPU-hours use where none are documented; `icc_from`:
    a finished run (or a folder of runs) of the dataset whose scored rows give the power table
    its clustering and spread (`plan_power`).
    """
    result = estimate(build_setup(cfg, gpu_gib, text_tokens, devices))
    print_plan(result)
    if checkpoint_every(cfg.model.gradient_checkpointing) is None:
        print_layouts(result.setup)
    compiled = compiles_layers(cfg.model, cfg.trainer.accelerator)
    console_for_output().print(
        f"decoder layers in the fit: {'compiled' if compiled else 'eager'} "
        f"(model.compile_layers={cfg.model.compile_layers}, trainer.accelerator="
        f"{cfg.trainer.accelerator}; auto compiles on CUDA GPUs without Liger)"
    )
    metrics = plan_metrics(result) | {"plan/compiled_layers": float(compiled)}
    study: list[DictConfig] = []
    if HydraConfig.initialized():  # the job and the sweep need Hydra to compose them
        hydra = HydraConfig.get()
        compose = memoized(_composer(str(hydra.job.config_name)))
        jobs = sweep_jobs(hydra) if hydra.mode == RunMode.RUN else []
        metrics |= plan_cost(
            result, gpu_gib, text_tokens, devices, splits, provenance, compose, jobs
        )
        study = [compose(job_overrides(group[0])) for group in seed_groups(jobs).values()]
    metrics |= plan_power(cfg, study, splits, icc_from, provenance)
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
    compose: Composer | None = None,
    jobs: Sequence[Sequence[str]] | None = None,
) -> dict[str, float]:
    """Print and return the GPU-hours of the job this command line plans and, outside `-m`, of
    every job of its sweep (`sweep=...`: `jobs`, composed by `compose`); their labels and bases
    go to `provenance["cost"]`."""
    hydra = HydraConfig.get()
    compose = compose or memoized(_composer(str(hydra.job.config_name)))
    job = compose(job_overrides(hydra.overrides.task))
    cost = job_cost(job, lambda _: (result.setup, result.fits), compose, splits, text_tokens)
    print_job_cost(cost)
    metrics = cost_metrics(cost)
    described: dict[str, Any] = {"job": describe_cost(cost)}
    if jobs is None:
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


def plan_power(
    cfg: DictConfig,
    study: Sequence[DictConfig],
    splits: str | None,
    icc_from: str | None,
    provenance: MutableMapping[str, Any] | None = None,
    console: Console | None = None,
) -> dict[str, float]:
    """Print and return what the test splits can decide between two methods (medvqa.planning.
    power): for the shift of `cfg` and, for a sweep, of each shift of its jobs (`study`, one
    composed job per group of seeds), per split and headline score the rows, cases, design
    effect and minimum detectable difference at 80 % power and α = 0.05 two-sided, and that
    of the sweep's family of comparisons (α over the family: the strictest step of Holm's
    adjustment, medvqa-report's default). Rows are the documented ones (or `splits`, or a same-shift
    run under `icc_from`); clustering and spread come from the finished runs under `icc_from`,
    else the stated defaults. The job's shift's figures are `plan/power/...` metrics; every
    row goes to `provenance["power"]`."""
    runs = finished_runs(icc_from) if icc_from else []
    shifts: dict[tuple[str, str], list[DictConfig]] = {}
    for job in study or [cfg]:
        shifts.setdefault((dataset_name(job), str(job.shift.name)), []).append(job)
    family = sum(
        PER_PAIR * math.comb(len({str(j.peft.name) for j in jobs if not j.get("baseline")}), 2)
        for jobs in shifts.values()
    )
    own = (dataset_name(cfg), str(cfg.shift.name))
    metrics: dict[str, float] = {}
    described: list[dict[str, Any]] = []
    for (dataset, shift), jobs in shifts.items():
        job = jobs[0]
        rows = _test_rows(job, runs, dataset, shift, splits)
        if isinstance(rows, str):
            (console or console_for_output()).print(f"power of shift {shift}: no estimate: {rows}.")
            continue
        counts, source = rows
        scores = {
            "closed": str(job.evaluation.primary_closed),
            "open": str(job.evaluation.primary_open),
        }
        table = detectable(
            shift,
            finished_designs(runs, dataset, shift, counts, source),
            finished_spreads(runs, dataset, shift, scores),
            scores,
            max(family, 1),
        )
        print_power(table, family, console)
        described += [dataclasses.asdict(row) for row in table]
        if (dataset, shift) == own:
            metrics |= power_metrics(table, family)
    if provenance is not None:
        provenance["power"] = {"icc_from": icc_from, "family": family, "rows": described}
    return metrics


def _test_rows(
    job: DictConfig,
    runs: Sequence[FinishedRun],
    dataset: str,
    shift: str,
    splits: str | None,
) -> tuple[dict[str, int], str] | str:
    """The job's rows per test split (under `data.limit`) and where they come from: a finished
    run of the same dataset and shift, else the documented or `splits` counts; a string says
    why there are none."""
    same = next((r for r in runs if (r.dataset, r.shift) == (dataset, shift)), None)
    if same is not None and all(s in same.splits["splits"] for s in TEST_SPLITS):
        counts = {s: int(same.splits["splits"][s]["n"]) for s in TEST_SPLITS}
        source = str(same.source / SPLITS_FILE)
    else:
        sizes = known_sizes(job, splits)
        if isinstance(sizes, str):
            return f"{sizes}, or +task.icc_from=<a finished run of this shift>"
        counts, source = {s: sizes.split(s) for s in TEST_SPLITS}, sizes.source
    limit = job.data.get("limit") or {}
    return {s: capped(n, limit.get(s)) for s, n in counts.items()}, source


def power_metrics(table: Sequence[Detectable], family: int) -> dict[str, float]:
    """`plan/power/<split>/<score>_mdd` (and `_mdd_family`, `_cases`, `_design_effect`);
    RR's under `plan/power/robustness/rr_<closed|open>`."""
    out: dict[str, float] = {}
    for row in table:
        key = (
            f"plan/power/robustness/rr_{row.answer_type}"
            if row.split == "RR"
            else f"plan/power/{row.split}/{row.score}"
        )
        out[f"{key}_mdd"] = row.mdd
        if family > 1:
            out[f"{key}_mdd_family"] = row.mdd_family
        if row.split != "RR":
            out[f"{key}_cases"] = row.clusters
            out[f"{key}_design_effect"] = row.design_effect
    return out


def print_power(table: Sequence[Detectable], family: int, console: Console | None = None) -> None:
    """One shift's power table; each row's bases listed below it by number."""
    if not table:
        return
    bases = list(dict.fromkeys(row.basis for row in table))
    view = Table(
        title=f"What two methods' runs of shift {table[0].shift} can tell apart · smallest "
        f"difference found at {POWER:.0%} power, α = {ALPHA} two-sided, paired over rows, "
        "cases as clusters",
        caption_justify="left",
        caption="\n".join(f"[{i}] {basis}" for i, basis in enumerate(bases, 1))
        + (
            f"\n*: under {FEW_CLUSTERS} cases, the normal approximation is optimistic"
            if any(row.few_clusters for row in table)
            else ""
        )
        + (
            f"\nfamily: {family} comparisons of the sweep's methods, tested at α / {family} "
            "(the strictest step of Holm's adjustment, medvqa-report's default)"
            if family > 1
            else ""
        ),
    )
    columns = ["split", "score", "rows", "cases", "ICC", "design effect", "MDD"]
    columns += ["MDD in the family"] * (family > 1) + ["from"]
    for column in columns:
        view.add_column(column, justify="left" if column in ("split", "score") else "right")
    for row in table:
        unit = " sd" if row.unit == "sd" else ""
        star = "*" if row.few_clusters else ""
        cells = [
            row.split,
            row.score,
            f"{row.rows:,}",
            f"{row.clusters:,.0f}{star}",
            _number(row.icc, "{:.2f}"),
            _number(row.design_effect, "{:.2f}"),
            _number(row.mdd, "{:.3f}") + unit,
        ]
        cells += [_number(row.mdd_family, "{:.3f}") + unit] * (family > 1)
        view.add_row(*cells, f"[{bases.index(row.basis) + 1}]")
    (console or console_for_output()).print(view)


def _number(value: float, form: str) -> str:
    return "—" if math.isnan(value) else form.format(value)


def _composer(config_name: str) -> Composer:
    """Compose a job as run.py would, inside the running Hydra app."""
    from hydra import compose

    return lambda overrides: compose(config_name=config_name, overrides=list(overrides))


def _planner(gpu_gib: float | None, text_tokens: int, devices: int | None) -> Planner:
    def plan_job(job: DictConfig) -> tuple[Setup, bool]:
        planned = estimate(build_setup(job, gpu_gib, text_tokens, devices))
        return planned.setup, planned.fits

    return plan_job


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
    console = console or console_for_output()
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
    (console or console_for_output()).print(view)


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
    (console or console_for_output()).print(view)


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
    (console or console_for_output()).print(view)
