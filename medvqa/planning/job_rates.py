"""A job's training and generation rates (per second and GPU) from the nearest rows measured on
a GPU (`medvqa.planning.rates`), carried over to the job by the FLOPs of a sample
(`medvqa.models.flops`) and, for training, to its layout by the time model (`memory.step_time`).
A string says why no measured row applies."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from medvqa.models.adapters import apply_method, compiles_layers, on_meta
from medvqa.models.architectures import image_tokens, load_architecture, meta_model
from medvqa.models.flops import attention_shape, counts_flops, matmul_params, model_flops
from medvqa.models.loading import architecture, model_option, resolve_pretrained, roles, torch_dtype
from medvqa.planning.memory import LABELLED_TOKENS, TEXT_TOKENS, Setup, checkpointing_label
from medvqa.planning.memory import step_time as time_model
from medvqa.planning.rates import GenerateRow, JobRow, Measured, TrainRow, rows
from medvqa.planning.setup import uses_fp8
from medvqa.planning.sizes import dataset_name

# Composes one job's config from its overrides (Hydra's compose API, as run.py composes it).
Composer = Callable[[Sequence[str]], DictConfig]


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


# -- FLOPs per sample -------------------------------------------------------------------------


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


# -- rates ------------------------------------------------------------------------------------


Rate = tuple[float, str, Measured]  # per second and GPU, its basis, the table it comes from


def family_of(model_cfg: Any) -> str:
    """The `model_type` of a model config's architecture: a measured rate is carried over
    within a family only."""
    return str(architecture(model_cfg)[0].model_type)


def kernels_of(cfg: DictConfig) -> str:
    """The kernels the fit runs: compiled decoder layers, Liger's, or eager ones."""
    if compiles_layers(cfg.model, cfg.trainer.accelerator):
        return "compiled"
    return "liger" if bool(model_option(cfg.model, "liger_kernels")) else "eager"


def row_family(row: TrainRow | GenerateRow | JobRow) -> str:
    """The `model_type` of the checkpoint a measured row ran."""
    return str(load_architecture(row.pretrained)[0].model_type)


def sees_images(cfg: DictConfig, phase: str) -> bool:
    """Whether the job's `phase` (train, eval) shows images: their tokens are in its FLOPs."""
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
    family, kernels = family_of(job.model), kernels_of(job)

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
        if r.kernels == kernels and r.fp8 == fp8 and row_family(r) == family
    ]
    if not found:
        return (
            f"no training row was measured for {family} models with {kernels} kernels"
            + " and FP8 (model.fp8)" * fp8
        )
    row = min(found, key=order)
    row_cfg = _row_config(compose, row.preset, row.pretrained, row.method)
    flops = _flop_factor(row_cfg, job, True, sees_images(job, "train"), text_tokens)
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
    family = family_of(job.model)

    def order(row: GenerateRow) -> tuple[bool, bool, bool]:
        return row.pretrained != pretrained, row.merged != merged, row.data != data

    found = [r for r in rows(GenerateRow) if row_family(r) == family]
    if not found:
        return f"no generation row was measured for {family} models"
    row = min(found, key=order)
    basis, rate = [row.name], row.rows_per_s
    images = sees_images(job, "eval")
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
