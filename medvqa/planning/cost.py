"""GPU-hours of a job and of a sweep before either runs (`task=plan`): an estimate from the
rates measured on a GPU (`medvqa.planning.rates`: the rows the package ships, each with its GPU,
date, commit and file), the datasets' documented sizes and what a job runs.

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
  trained model's answers (and a pass per extra image mode and option order), at the rows/s
  measured (`rates.GenerateRow`).

GPU-hours assume that the rate per GPU does not change with the number of GPUs (not measured);
wall-clock hours are GPU-hours / GPUs. Not counted: process start, scoring, and compiling the
decode (`model.compile_decode`; never timed on a GPU). A sweep's second job compiles from the
shared inductor cache (`training.hardware.configure_compile_cache`) but is counted at the first's
cost: the cache's saving was never measured on a GPU. Where no measured row is close enough the
estimate says why instead of giving a number (`JobCost.missing`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from medvqa.data import records as R
from medvqa.data.shifts import SPLITS, SPLITS_FILE
from medvqa.generation import passes as eval_passes
from medvqa.models.adapters import (
    apply_method,
    build_adapter_config,
    compiles_layers,
    on_meta,
)
from medvqa.models.architectures import image_tokens, load_architecture, meta_model
from medvqa.models.flops import attention_shape, counts_flops, matmul_params, model_flops
from medvqa.models.loading import (
    architecture,
    model_option,
    resolve_pretrained,
    roles,
    torch_dtype,
)
from medvqa.planning.memory import LABELLED_TOKENS, TEXT_TOKENS, Setup, checkpointing_label
from medvqa.planning.memory import step_time as time_model
from medvqa.planning.rates import GenerateRow, JobRow, Measured, TrainRow, rows
from medvqa.planning.setup import eval_batch_size, injectable, uses_fp8
from medvqa.training.spec import TrainerSchema
from medvqa.untrusted import read_plain_json

# Composes one job's config from its overrides (Hydra's compose API, as run.py composes it).
Composer = Callable[[Sequence[str]], DictConfig]
# The memory plan of a composed job: its setup (layout, GPUs) and whether it fits.
Planner = Callable[[DictConfig], tuple[Setup, bool]]


def memoized(compose: Composer) -> Composer:
    """`compose` composing each list of overrides once (a sweep's jobs share the rows' configs;
    a composition takes about a second)."""
    done: dict[tuple[str, ...], DictConfig] = {}

    def composed(overrides: Sequence[str]) -> DictConfig:
        key = tuple(overrides)
        if key not in done:
            done[key] = compose(key)
        return done[key]

    return composed


# A measured row further than this factor of FLOPs per sample from the job is not scaled from:
# utilisation changes with the model's size and the sequence length (Qwen2.5-VL-7B's MFU was
# half LLaVA-Med's on the same GPU).
MAX_FLOP_SCALE = 2.0
# The task whose jobs use a GPU (task=train_eval and task=eval run it).
TRAIN_EVAL = "medvqa.tasks.train_eval.train_eval"


# Reading the weights and writing checkpoints: assumed, not measured (a node's local NVMe; a
# network file system can be slower). The estimate's basis says so where it uses them.
READ_GIB_PER_S = 2.0
WRITE_GIB_PER_S = 1.0
# AdamW's two moments in float32 per trained parameter, in every Lightning checkpoint.
ADAM_BYTES = 8

# SURE-VQA's shifts after cleaning: dataset, train / test i.i.d. / test OoD rows as published
# (docs/shifts.md#the-papers-shifts; SLAKE's checked on the real files, tests/test_real_data.py).
SHIFT_SIZES = {
    "slake_modality": ("slake", 3448, 689, 1779),
    "slake_question_type": ("slake", 4581, 994, 56),
    "ovqa_body_part": ("ovqa", 8755, 1044, 5350),
    "ovqa_question_type": ("ovqa", 11924, 1420, 237),
    "mimic_gender": ("mimic_cxr_vqa", 147790, 7277, 6120),
    "mimic_ethnicity": ("mimic_cxr_vqa", 171593, 8101, 3713),
    "mimic_age": ("mimic_cxr_vqa", 155941, 6686, 2076),
}
# The datasets' own splits after cleaning, train / validate / test (docs/datasets.md).
SOURCE_SIZES = {
    "slake": (4866, 1043, 1050),
    "ovqa": (13492, 1645, 1657),
    "mimic_cxr_vqa": (290031, 73567, 13793),
}


@dataclass(frozen=True)
class Sizes:
    """Rows per split of a job (before `data.limit`), and where they come from."""

    train: int
    val: int
    test_iid: int
    test_ood: int
    source: str

    def split(self, name: str) -> int:
        return int(getattr(self, name))


# A job's kinds of phase; "load", "compile" and "checkpoint" are what a job spends beside its
# samples and rows (`OVERHEADS`).
PHASE_KINDS = ("load", "compile", "train", "checkpoint", "val", "generate")
OVERHEADS = ("load", "compile", "checkpoint")


@dataclass(frozen=True)
class Phase:
    """One phase of a job: `items` samples or rows at `per_s` per GPU."""

    kind: str  # one of PHASE_KINDS
    name: str
    items: float
    per_s: float
    basis: str
    # Where other jobs of a sweep share the pass (the untuned base's cached answers): its key.
    shared: tuple[Any, ...] | None = None

    @property
    def gpu_s(self) -> float:
        return self.items / self.per_s if self.items else 0.0


@dataclass(frozen=True)
class JobCost:
    """The GPU time of one job by phase; `missing` says why there is no estimate, `note` what
    else the reader should know (e.g. a task that needs no GPU)."""

    phases: tuple[Phase, ...] = ()
    gpus: int = 1
    sizes: str = ""
    measured: tuple[Measured, ...] = ()
    missing: str | None = None
    note: str = ""

    @property
    def gpu_hours(self) -> float:
        return self.hours(*PHASE_KINDS)

    @property
    def wall_hours(self) -> float:
        return self.gpu_hours / self.gpus

    @property
    def sources(self) -> list[str]:
        """Each measured row the estimate used: file:line and commit."""
        return sorted({m.cited for m in self.measured})

    @property
    def label(self) -> str:
        return label(self.measured)

    def hours(self, *kinds: str) -> float:
        return sum(p.gpu_s for p in self.phases if p.kind in kinds) / 3600


def label(measured: Iterable[Measured]) -> str:
    """'estimate, from <GPU> measured <dates>' for each GPU the figures come from."""
    dates: dict[str, set[str]] = {}
    for m in measured:
        dates.setdefault(m.gpu, set()).add(m.date)
    labels = [f"estimate, from {gpu} measured {', '.join(sorted(d))}" for gpu, d in dates.items()]
    return "; ".join(sorted(labels)) if labels else "no estimate"


# -- sizes ----------------------------------------------------------------------------------------


def dataset_name(cfg: DictConfig) -> str:
    return str(get_class(str(cfg.dataset._target_)).name)


def known_sizes(cfg: DictConfig, splits: str | Path | None = None) -> Sizes | str:
    """The job's rows per split without loading data: from a run's `splits.json` (`splits`: the
    file, or a folder searched for one of the same dataset and shift), else SURE-VQA's published
    counts with the val split estimated (its rows are not published: the dataset's validate rows
    x the share of its train rows the shift keeps). A string says why there are none."""
    dataset, shift = dataset_name(cfg), str(cfg.shift.name)
    if splits is not None:
        found = _splits_report(Path(splits), dataset, shift)
        if found is not None:
            path, report = found
            n = {name: int(v["n"]) for name, v in report["splits"].items()}
            return Sizes(*(n[s] for s in SPLITS), str(path))
    if shift in SHIFT_SIZES and SHIFT_SIZES[shift][0] == dataset:
        _, train, iid, ood = SHIFT_SIZES[shift]
        source_train, validate, _ = SOURCE_SIZES[dataset]
        val = round(validate * train / source_train)
        return Sizes(train, val, iid, ood, "published (docs/shifts.md); val estimated")
    where = f" under {splits}" if splits is not None else ""
    return (
        f"the rows of {dataset} under shift {shift} are not documented and no splits.json of "
        f"them was found{where}: give a run's: +task.splits=<run dir or splits.json>"
    )


def _splits_report(path: Path, dataset: str, shift: str) -> tuple[Path, dict[str, Any]] | None:
    candidates = [path] if path.is_file() else sorted(path.rglob(SPLITS_FILE))
    for candidate in candidates:
        # A run folder's file: plain values, refused by name if it names code (untrusted).
        report = read_plain_json(candidate, SPLITS_FILE, "give another run's splits.json").value
        if (
            isinstance(report, dict)
            and report.get("dataset") == dataset
            and report.get("shift") == shift
        ):
            return candidate, report
    return None


def capped(n: int, cap: Any) -> int:
    """A split's rows under `data.limit.<split>`."""
    return n if cap is None else min(n, int(cap))


# -- FLOPs per sample -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SampleFlops:
    """Training FLOPs of one sample (`flops.model_flops`) and the language model's forward
    share of them (2 per weight and token of its 4 frozen / 6 trained): what a val forward costs."""

    train: float
    forward_share: float


_FLOPS: dict[str, SampleFlops | None] = {}


def sample_flops(
    model_cfg: DictConfig,
    peft_cfg: DictConfig | None,
    images: bool,
    text_tokens: int = TEXT_TOKENS,
) -> SampleFlops | None:
    """The FLOPs of one sample of the plan's shape (the processor's largest image and
    `text_tokens`, plus the method's virtual tokens) for `model_cfg` with `peft_cfg` applied on
    the meta device (None: the bare model, frozen); None for a family whose image FLOPs
    `medvqa.models.flops` does not count. Cached per model, method and shape."""
    peft = OmegaConf.to_container(peft_cfg, resolve=True) if peft_cfg is not None else None
    model = OmegaConf.to_container(model_cfg, resolve=True)
    key = json.dumps([model, peft, images, text_tokens], sort_keys=True, default=str)
    if key not in _FLOPS:
        _FLOPS[key] = _sample_flops(model_cfg, peft, images, text_tokens)
    return _FLOPS[key]


def _sample_flops(
    model_cfg: DictConfig, peft: Any, images: bool, text_tokens: int
) -> SampleFlops | None:
    config, preprocessor = architecture(model_cfg)
    if not counts_flops(config):
        return None
    model_roles = roles(model_cfg)
    model = meta_model(config, torch_dtype(model_cfg)).requires_grad_(False)
    virtual = 0
    if peft is not None:  # trainable token rows: in the embedding, no matmul
        method, virtual = on_meta(OmegaConf.create(peft))
        with torch.device("meta"):
            model = apply_method(model, method, model_roles, None, images)
    p = matmul_params(model, model_roles)
    tokens = text_tokens + virtual
    patches = projected = 0
    if images:
        projected = image_tokens(config, preprocessor)
        tokens += image_tokens(config, preprocessor, with_markers=True)
        # Qwen: merge^2 patches per LLM token; CLIP (LLaVA): one per token and the class token
        merge = getattr(config.vision_config, "spatial_merge_size", None)
        patches = projected * merge**2 if merge else projected + 1
    shape = attention_shape(config)
    train = model_flops(
        p, shape, tokens, tokens**2, LABELLED_TOKENS, patches, patches**2, projected
    )
    language = p.language_frozen + p.language_trained
    forward_share = 2 * language / (4 * p.language_frozen + 6 * p.language_trained)
    return SampleFlops(train, forward_share)


# -- rates ----------------------------------------------------------------------------------------

Rate = tuple[float, str, Measured]  # per second and GPU, its basis, the table it comes from


def _family(model_cfg: Any) -> str:
    return str(architecture(model_cfg)[0].model_type)


def _kernels(cfg: DictConfig) -> str:
    """The kernels the fit runs: compiled decoder layers, Liger's, or eager ones."""
    if compiles_layers(cfg.model, cfg.trainer.accelerator):
        return "compiled"
    return "liger" if bool(model_option(cfg.model, "liger_kernels")) else "eager"


def _row_family(row: TrainRow | GenerateRow | JobRow) -> str:
    return str(load_architecture(row.pretrained)[0].model_type)


def _images(cfg: DictConfig, phase: str) -> bool:
    return str(cfg.data.get(f"{phase}_image", "image")) != "none"


def _row_config(compose: Composer, preset: str, pretrained: str, method: str) -> DictConfig:
    """The config the benchmark composed for a row (benchmarks/gpu.py `compose_cfg`)."""
    overrides = [f"model={preset}", f"model.pretrained={pretrained}", f"peft={method}"]
    return compose([*overrides, "trainer=gpu"])


def _flop_factor(
    row: DictConfig, job: DictConfig, method: bool, images: bool, text_tokens: int
) -> float | str:
    """Row FLOPs / job FLOPs per sample (`method`: with each one's method applied, else the bare
    models), or why the row's rate cannot be scaled to the job."""
    mine = sample_flops(job.model, job.peft if method else None, images, text_tokens)
    theirs = sample_flops(row.model, row.peft if method else None, True, text_tokens)
    if mine is None or theirs is None:
        return f"the FLOPs of model={job.model.name} are not counted (medvqa.models.flops)"
    factor = theirs.train / mine.train
    if not 1 / MAX_FLOP_SCALE <= factor <= MAX_FLOP_SCALE:
        return (
            f"the nearest measured row is {1 / factor:.2f}x its FLOPs per sample, further than "
            f"{MAX_FLOP_SCALE:g}x: its utilisation would not carry over"
        )
    return factor


def training_rate(
    job: DictConfig, setup: Setup, compose: Composer, text_tokens: int = TEXT_TOKENS
) -> Rate | str:
    """Samples/s per GPU of `job` trained in `setup`'s layout: the measured row of the same
    family and kernels nearest to it (the same checkpoint, method and data first, then the
    layout), scaled by FLOPs and the time model. A string says why no row applies."""
    pretrained, method, data = resolve_pretrained(job.model), str(job.peft.name), dataset_name(job)
    family, kernels = _family(job.model), _kernels(job)

    def layout(row: TrainRow) -> float:  # the job's time per sample relative to the row's
        at_row = dataclasses.replace(
            setup, micro_batch=row.micro_batch, checkpoint_every=row.checkpoint_every
        )
        return time_model(at_row) / time_model(setup)

    def order(row: TrainRow) -> tuple[bool, bool, bool, float]:
        return (
            row.pretrained != pretrained,
            row.method != method,
            row.data != data,
            abs(math.log(layout(row))),
        )

    fp8 = uses_fp8(job.model, job.trainer.accelerator, planning=True)
    found = [
        r
        for r in rows(TrainRow)
        if r.kernels == kernels and r.fp8 == fp8 and _row_family(r) == family
    ]
    if not found:
        return (
            f"no training row was measured for {family} models with {kernels} kernels"
            + " and FP8 (model.fp8)" * fp8
        )
    row = min(found, key=order)
    row_cfg = _row_config(compose, row.preset, row.pretrained, row.method)
    flops = _flop_factor(row_cfg, job, True, _images(job, "train"), text_tokens)
    if isinstance(flops, str):
        return flops
    basis = [row.name]
    if abs(flops - 1) >= 0.005:
        basis.append(f"x {flops:.2f} FLOPs ({method} as configured)")
    if abs(layout(row) - 1) >= 0.005:
        basis.append(
            f"x {layout(row):.2f} time model (micro-batch {setup.micro_batch}, checkpointing "
            f"{checkpointing_label(setup.checkpoint_every)})"
        )
    return row.samples_per_s * flops * layout(row), "; ".join(basis), row.measured


def generation_rate(
    job: DictConfig,
    merged: bool,
    new_tokens: int,
    compose: Composer,
    text_tokens: int = TEXT_TOKENS,
) -> Rate | str:
    """Rows/s per GPU of one generation pass of `job`'s model (`merged`: no adapter layers in
    the decoder: the base, prompt tuning, full fine-tuning or merged adapters), from the nearest
    measured row of the family (another checkpoint: scaled by the bare models' FLOPs); with up to
    `new_tokens` generated where the row generated fewer, slower in proportion (an upper bound:
    a batch stops when every answer has ended)."""
    pretrained, data = resolve_pretrained(job.model), dataset_name(job)
    family = _family(job.model)

    def order(row: GenerateRow) -> tuple[bool, bool, bool]:
        return row.pretrained != pretrained, row.merged != merged, row.data != data

    found = [r for r in rows(GenerateRow) if _row_family(r) == family]
    if not found:
        return f"no generation row was measured for {family} models"
    row = min(found, key=order)
    basis, rate = [row.name], row.rows_per_s
    images = _images(job, "eval")
    if row.pretrained != pretrained or not images:
        row_cfg = _row_config(compose, row.preset, row.pretrained, "none")
        flops = _flop_factor(row_cfg, job, False, images, text_tokens)
        if isinstance(flops, str):
            return flops
        rate *= flops
        basis.append(f"x {flops:.2f} FLOPs")
    if new_tokens > row.new_tokens:
        rate *= row.new_tokens / new_tokens
        basis.append(f"x {row.new_tokens}/{new_tokens} new tokens (an upper bound)")
    return rate, "; ".join(basis), row.measured


# -- a job ----------------------------------------------------------------------------------------


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
    setup, fits = plan(job)
    gpus = setup.world_size
    if not fits:
        return JobCost(gpus=gpus, missing="it does not fit its GPUs (task=plan refuses it)")
    task, limit = job.task, job.data.limit
    test = sum(capped(sizes.split(s), limit.get(s)) for s in task.eval_splits)
    from_run = task.get("from_run")
    fit = bool(job.peft.fit) and from_run is None
    tuned = fit or from_run is not None
    adapters = injectable(build_adapter_config(job.peft.adapter, None, roles(job.model)))
    merged = not tuned or not adapters or setup.merged > 0  # model.merge_adapters, as planned
    # the untuned base's answers are cached under paths.cache_dir, keyed by what changes them
    base_key = (
        resolve_pretrained(job.model),
        dataset_name(job),
        str(job.shift.name),
        test,
        str(job.data.eval_image),
        gpus,
    )
    # The job's passes as train_eval runs them (evaluation.passes.job_passes, the one list):
    # the untuned base's answers first (no adapters: merged), shared under the base key.
    label = "answers after training" if tuned else "base answers"
    references = "base answers (zero-shot reference)" if "zero_shot" in task.references else None
    extra = list(job.data.extra_eval_images)
    runs = eval_passes.job_passes(
        label, str(job.data.eval_image), tuned, references, extra, int(job.data.option_orders)
    )
    passes = [  # (name, merged, shared key)
        (
            f"{p.label}, all rows (closed ones only: at most)" if p.order else p.label,
            p.base or merged,
            base_key if p.shared else None,
        )
        for p in runs
    ]
    zero_shot = runs[0].base  # before the fit

    phases: list[Phase] = []
    measured: list[Measured] = []
    compiled: tuple[Phase, Measured] | str | None = None
    if fit and setup.strategy == "zero2":
        return JobCost(gpus=gpus, missing="no training row was measured under DeepSpeed ZeRO-2")
    if fit:
        rate = training_rate(job, setup, compose, text_tokens)
        if isinstance(rate, str):
            return JobCost(gpus=gpus, missing=rate)
        per_s, basis, table = rate
        train = capped(sizes.train, limit.get(R.TRAIN))
        samples, epochs = train_samples(job, train, setup)
        name = f"training, {samples / train:g} x {train} rows" if train else "training"
        phases.append(Phase("train", name, samples, per_s, basis))
        measured.append(table)
        compiled = compile_phase(job, setup)
        if isinstance(compiled, tuple):
            phases.insert(len(phases) - 1, compiled[0])
            measured.append(compiled[1])
        phases.extend(checkpoint_phases(job, setup, samples, epochs))
        every = job.trainer.get("check_val_every_n_epoch")
        validations = epochs // int(every) if every else 0
        rows = val_rows(job, capped(sizes.val, limit.get(R.VAL)), setup)
        flops = sample_flops(job.model, job.peft, _images(job, "train"), text_tokens)
        if validations and rows and flops is not None:
            # the fit validates at the batch train_eval gives it (auto: not the plan's pick)
            batch = eval_batch_size(job.data, None)
            at_eval = dataclasses.replace(setup, micro_batch=batch, checkpoint_every=0)
            factor = flops.forward_share * time_model(at_eval) / time_model(setup)
            why = (
                f"the training rate x {1 / factor:.2f}: a forward ({flops.forward_share:.2f} "
                f"of the FLOPs) at batch {batch} (time model)"
            )
            phases.append(
                Phase(
                    "val",
                    f"validation, {validations} x {rows} rows",
                    validations * rows,
                    per_s / factor,
                    why,
                )
            )
    rates: dict[bool, Rate | str] = {}
    for i, (name, merge, shared) in enumerate(passes):
        if merge not in rates:
            rates[merge] = generation_rate(job, merge, setup.max_new_tokens, compose, text_tokens)
        rate = rates[merge]
        if isinstance(rate, str):
            return JobCost(gpus=gpus, missing=rate)
        at = 0 if i == 0 and zero_shot else len(phases)  # the job's phases in their order
        phases.insert(at, Phase("generate", name, test, rate[0], rate[1], shared))
        measured.append(rate[2])
    phases.insert(0, load_phase(setup))
    note = compiled if isinstance(compiled, str) else ""
    return JobCost(tuple(phases), gpus, sizes.source, tuple(measured), note=note)


def _gib(n_bytes: float) -> float:
    return n_bytes / 2**30


def load_phase(setup: Setup) -> Phase:
    """Each GPU reads the model's weights once (assumed rate, `READ_GIB_PER_S`)."""
    gib = _gib(setup.params * setup.dtype_bytes)
    return Phase(
        "load", f"loading the weights, {gib:.1f} GiB per GPU", gib * setup.world_size,
        READ_GIB_PER_S, f"assumed {READ_GIB_PER_S:g} GiB/s read (not measured)",
    )  # fmt: skip


def compile_phase(job: DictConfig, setup: Setup) -> tuple[Phase, Measured] | str | None:
    """The seconds a measured job's fit spent beyond its steady rate (compiling the decoder
    layers, warming up), on every GPU, and where it was measured: the whole job of the same
    checkpoint (else family) and kernels. None for eager layers, a note where none was
    measured."""
    kernels, family = _kernels(job), _family(job.model)
    if kernels != "compiled":
        return None
    found = [r for r in rows(JobRow) if r.kernels == kernels and _row_family(r) == family]
    if not found:
        return f"not counted: no whole job with compiled layers was measured for {job.model.name}"
    pretrained = resolve_pretrained(job.model)
    row = min(found, key=lambda r: r.pretrained != pretrained)
    phase = Phase(  # items: the seconds on every GPU
        "compile", "compiling the decoder layers, first steps (s)",
        row.compile_s * setup.world_size, 1.0,
        f"{row.compile_s:.0f} s beyond the steady rate in {row.preset}'s measured job "
        f"({row.measured.cited})",
    )  # fmt: skip
    return phase, row.measured


def checkpoint_phases(job: DictConfig, setup: Setup, samples: float, epochs: int) -> list[Phase]:
    """The fit's checkpoints as `callbacks.model_checkpoint` saves them (every epoch, or every
    `every_n_train_steps` optimiser steps; a top-k file and last.ckpt each time), each holding
    the trained weights and AdamW's moments, and the trained weights saved at the end; written
    while every GPU waits (assumed rate, `WRITE_GIB_PER_S`)."""
    saver = (job.get("callbacks") or {}).get("model_checkpoint")
    trained = _gib(setup.trainable * setup.trainable_bytes)
    out = [
        Phase(
            "checkpoint", f"saving the trained weights, {trained:.2f} GiB",
            trained * setup.world_size, WRITE_GIB_PER_S,
            f"assumed {WRITE_GIB_PER_S:g} GiB/s write (not measured)",
        )
    ]  # fmt: skip
    if saver is None:
        return out
    every = saver.get("every_n_train_steps")
    saves = int(samples // setup.global_batch) // int(every) if every else epochs
    files = int(saver.get("save_top_k", 1) != 0) + int(bool(saver.get("save_last")))
    each = _gib(setup.trainable * (setup.trainable_bytes + ADAM_BYTES))
    if saves * files:
        out.insert(
            0,
            Phase(
                "checkpoint", f"checkpoints, {saves} x {files} files of {each:.2f} GiB",
                saves * files * each * setup.world_size, WRITE_GIB_PER_S,
                f"assumed {WRITE_GIB_PER_S:g} GiB/s write (not measured)",
            ),
        )  # fmt: skip
    return out


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


# -- a sweep --------------------------------------------------------------------------------------


def sweep_jobs(hydra_cfg: DictConfig) -> list[list[str]]:
    """Every job's overrides of the sweep `hydra_cfg` describes (`hydra.sweeper.params` and the
    command line's, combined as Hydra's basic sweeper combines them for `-m`); [] without a
    grid."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    sweeper = hydra_cfg.sweeper
    params = sweeper.get("params") or {}
    if not params:
        return []
    basic = f"{BasicSweeper.__module__}.{BasicSweeper.__name__}"
    if str(sweeper.get("_target_")) != basic:
        raise ValueError(f"only Hydra's basic sweeper is enumerated, not {sweeper._target_}")
    arguments = [f"{k}={v}" for k, v in params.items()] + list(hydra_cfg.overrides.task)
    overrides = OverridesParser.create().parse_overrides(arguments)
    return [list(job) for job in BasicSweeper.split_arguments(overrides, None)[0]]


def job_overrides(overrides: Iterable[str]) -> list[str]:
    """A `task=plan` command line's overrides without those of its task: the job it plans."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    return [
        str(o.input_line)
        for o in parsed
        if o.key_or_group != "task" and not o.key_or_group.startswith("task.")
    ]


@dataclass(frozen=True)
class Group:
    """Jobs of a sweep that differ only in their seed: the same rows, the same estimate."""

    overrides: tuple[str, ...]  # the values of the grid's varying keys
    jobs: int
    cost: JobCost


@dataclass(frozen=True)
class SweepCost:
    """A sweep's jobs, grouped, and the GPU-seconds its jobs share (the base's cached answers,
    counted once per key)."""

    groups: tuple[Group, ...]
    shared_s: float = 0.0

    @property
    def jobs(self) -> int:
        return sum(g.jobs for g in self.groups)

    @property
    def without_estimate(self) -> int:
        return sum(g.jobs for g in self.groups if g.cost.missing is not None)

    @property
    def gpu_hours(self) -> float:
        each = sum(g.jobs * g.cost.gpu_hours for g in self.groups if g.cost.missing is None)
        return each - self.shared_s / 3600

    @property
    def label(self) -> str:
        return label(m for g in self.groups for m in g.cost.measured)

    @property
    def sources(self) -> list[str]:
        """Each measured row any job's estimate used: file:line and commit."""
        return sorted({s for g in self.groups for s in g.cost.sources})


def seed_groups(jobs: Sequence[Sequence[str]]) -> dict[tuple[str, ...], list[Sequence[str]]]:
    """A sweep's jobs grouped by their overrides without `seed` (and without the task's): the
    jobs of one group have the same rows, method and settings."""
    groups: dict[tuple[str, ...], list[Sequence[str]]] = {}
    for overrides in jobs:
        key = tuple(o for o in job_overrides(overrides) if o.split("=", 1)[0] != "seed")
        groups.setdefault(key, []).append(overrides)
    return groups


def sweep_cost(
    jobs: Sequence[Sequence[str]],
    grid_keys: Iterable[str],
    compose: Composer,
    plan: Planner,
    splits: str | Path | None = None,
    text_tokens: int = TEXT_TOKENS,
) -> SweepCost:
    """The estimate of every job of a sweep (`sweep_jobs`): jobs whose overrides differ only in
    `seed` are composed and estimated once; a base pass several jobs share counts once. Each
    group is named by the values of the `grid_keys` that vary over the sweep."""
    groups = seed_groups(jobs)
    values: dict[str, set[str]] = {k: set() for k in grid_keys if k != "seed"}
    for overrides in jobs:
        for o in overrides:
            values.get(o.split("=", 1)[0], set()).add(o)
    named = {k for k, v in values.items() if len(v) > 1}  # what tells the groups apart
    out = []
    uses: dict[tuple[Any, ...], list[float]] = {}
    for key, members in groups.items():
        cost = job_cost(compose(job_overrides(members[0])), plan, compose, splits, text_tokens)
        out.append(Group(tuple(o for o in key if o.split("=", 1)[0] in named), len(members), cost))
        for phase in cost.phases if cost.missing is None else ():
            if phase.shared is not None:
                uses.setdefault(phase.shared, []).extend([phase.gpu_s] * len(members))
    return SweepCost(tuple(out), sum(sum(s) - s[0] for s in uses.values()))


def sweep_metrics(sweep: SweepCost) -> dict[str, float]:
    """The sweep's estimate as `plan/...` metrics: its GPU-hours sum the jobs that have one
    (none where no job has)."""
    metrics = {
        "plan/sweep_jobs": float(sweep.jobs),
        "plan/sweep_jobs_without_estimate": float(sweep.without_estimate),
    }
    if sweep.without_estimate < sweep.jobs:
        metrics["plan/sweep_gpu_hours"] = sweep.gpu_hours
    return metrics


def describe_sweep(sweep: SweepCost) -> dict[str, Any]:
    """The sweep's estimate, group by group (results.json's provenance)."""
    return {
        "label": sweep.label,
        "jobs": sweep.jobs,
        "without_estimate": sweep.without_estimate,
        "gpu_hours": sweep.gpu_hours,
        "shared_gpu_hours_counted_once": sweep.shared_s / 3600,
        "rows": sweep.sources,
        "groups": [
            {"overrides": list(g.overrides), "jobs": g.jobs, **describe_cost(g.cost)}
            for g in sweep.groups
        ],
    }
