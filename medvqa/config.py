"""Typed schemas behind the YAML under conf/.

Each group's YAML files start from one of these schemas (`defaults: [<name>_schema, _self_]`),
so a misspelled key in a YAML file or on the command line (or a bool key given 2 or "yes",
`_strict_bools`) fails when Hydra composes the config, not hours into a job; `check_config`
refuses the values no type can rule out (a batch size of -1, a breakdown by a column the dataset
lacks) when a run starts. `register()` is idempotent and runs on import.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from omegaconf.nodes import BooleanNode

from medvqa import plugins
from medvqa.cluster import GPU_ACCELERATORS, rank_log_name, slurm_gpus, slurm_mem_gb, slurm_tasks
from medvqa.data import records as R
from medvqa.data.shifts import IMAGE_TRANSFORM, SPLITS, Shift
from medvqa.errors import ConfigError
from medvqa.generation.passes import pass_problems
from medvqa.hashing import content_hash
from medvqa.judge.config import JudgeConfig
from medvqa.models.spec import DECODE_ENGINES, ModelSchema, random_weights_kind
from medvqa.progress import WHEN, ProgressSettings
from medvqa.statistics.bootstrap import Bootstrap
from medvqa.training.hardware import cuda_allocator_problem

# PeftSchema, DataSchema and TrainerSchema sit with the training code that reads their defaults.
from medvqa.training.spec import IMAGE_MODES, DataSchema, PeftSchema, TrainerSchema


class _Schemas:
    """Where the schema classes generated from signatures live, under their names, so that
    pickle finds them by reference. The SLURM launcher sends Hydra's config store to the job; a
    copy of a generated dataclass would lose `dataclasses.MISSING`'s identity and break
    composition there. A fresh process that asks before generating them gets them here."""

    def __getattr__(self, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        register()
        try:
            return plugins.GENERATED[name]
        except KeyError:
            raise AttributeError(f"no generated schema {name!r}") from None


schemas = _Schemas()


def schema(cls: type, target: bool = True) -> type:
    """`plugins.schema`, given its importable name `medvqa.config.schemas.<name>`."""
    made = plugins.schema(cls, target)
    made.__module__ = __name__
    made.__qualname__ = f"schemas.{made.__name__}"
    return made


# The shift's fields are those of `medvqa.data.shifts.Shift` (declared there once).
ShiftSchema = schema(Shift, target=False)


# The judge node's keys and defaults are those of JudgeConfig (declared there once).
JudgeSchema = schema(JudgeConfig, target=False)


def check_judge_config(cfg: Any) -> None:
    """Refuse a judge config that must not run, before anything records it: a key pasted as
    `judge.api_key_env` (it takes a variable's name; a juror's too) would otherwise be written to
    results.json with the resolved config, and a jury that cannot be built would fail only after
    the answers. Raises JudgeConfigError; a config without a judge passes."""
    from medvqa.judge.config import JURY_KEYS
    from medvqa.judge.keys import check_api_key_env

    judge = cfg.get("judge") if hasattr(cfg, "get") else None
    if judge is not None:
        check_api_key_env(judge.get("api_key_env"))
        node = OmegaConf.to_container(judge) if isinstance(judge, DictConfig) else dict(judge)
        jury = {k: node[k] for k in JURY_KEYS if k in node}
        if jury:
            # Each juror's name, keys and key variable, and the verdict rules, refused now
            # rather than when the judge is built after the model's answers.
            JudgeConfig(**jury)


# The bootstrap settings are those of `medvqa.statistics.bootstrap.Bootstrap` (declared there).
BootstrapSchema = Bootstrap


@dataclass
class EvaluationSchema:
    """How scores become headline numbers: which ones feed RR, and the breakdown fields."""

    primary_closed: str = "closed_acc"
    primary_open: str = "open_f1"
    breakdown: list[str] = dataclasses.field(default_factory=lambda: ["question_type"])
    bootstrap: BootstrapSchema = dataclasses.field(default_factory=BootstrapSchema)


@dataclass
class PathsSchema:
    root_dir: str = MISSING
    data_dir: str = MISSING
    cache_dir: str = MISSING
    log_dir: str = MISSING
    output_dir: str = MISSING


@dataclass
class Config:
    """The primary config; groups without a fixed shape are `Any` and typed by their schema."""

    task: Any = MISSING
    dataset: Any = MISSING
    shift: ShiftSchema = MISSING
    model: ModelSchema = MISSING
    peft: PeftSchema = MISSING
    metric: Any = MISSING  # family name -> its config; `metric=[traditional,judge]`
    prompt: Any = MISSING  # a medvqa.models.prompting.PromptTemplate (conf/prompt/)
    evaluation: EvaluationSchema = dataclasses.field(default_factory=EvaluationSchema)
    judge: JudgeSchema = MISSING
    trainer: TrainerSchema = MISSING
    logger: Any = None
    callbacks: Any = None
    # Progress lines in the log where stdout is not a terminal (medvqa.progress).
    progress: ProgressSettings = dataclasses.field(default_factory=ProgressSettings)
    paths: PathsSchema = MISSING
    data: DataSchema = dataclasses.field(default_factory=DataSchema)
    seed: int = 0
    # torch.set_float32_matmul_precision: "highest" (full float32), "high" (TF32 on Ampere and
    # later GPUs: the paper's tf32), "medium"; set before the task runs, on every rank.
    matmul_precision: str = "highest"
    # PYTORCH_CUDA_ALLOC_CONF for the job unless exported (medvqa.training.hardware): expandable
    # segments keep the caching allocator's reserve near what is allocated (an H200 job's 7B
    # LoRA fit: 104 instead of 120 GiB reserved); null: PyTorch's default.
    cuda_allocator: str | None = "expandable_segments:True"
    force: bool = False
    # A model built offline for running the pipeline (`model.builder`: tiny, smollm2_llava, the
    # families' test twins) is refused on a real dataset unless this is true (debug=smoke sets
    # it): its rows would look like results.
    allow_toy_model: bool = False
    ckpt_path: str | None = None
    label: str | None = None  # how tables name this run (baselines set it); default: peft.label
    tags: list[str] = dataclasses.field(default_factory=list)
    eval: Any = None  # task=eval: {from_run: <run dir>}, whose trained weights are evaluated
    # The pass kinds' own settings, `passes.<kind>` (medvqa.generation.passes): the kinds that
    # have no key elsewhere, e.g. passes.region_occlusion; null: none of them asked for.
    passes: Any = None


# -- values checked when a run starts -------------------------------------------------------------


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _one_of(value: Any, *choices: Any) -> bool:
    """`value` is one of `choices`, of the same type: 1 is not true, nor 0 false."""
    return any(type(value) is type(c) and value == c for c in choices)


def _at_least(low: float, *also: Any) -> Callable[[Any], bool]:
    """A whole number >= `low`, or one of the special values `also` (e.g. -1, null)."""
    return lambda v: (_whole(v) and v >= low) or v in also


def _between(
    low: float, high: float, *, low_open: bool = False, high_open: bool = False
) -> Callable[[Any], bool]:
    """A number between `low` and `high`, each end included unless it is open."""

    def ok(v: Any) -> bool:
        if not _number(v):
            return False
        above = v > low if low_open else v >= low
        below = v < high if high_open else v <= high
        return above and below

    return ok


def _positive_number(v: Any) -> bool:
    return _number(v) and v > 0


def _non_negative_number(v: Any) -> bool:
    return _number(v) and v >= 0


def _finite_positive_or_null(v: Any) -> bool:
    return v is None or (_positive_number(v) and math.isfinite(v))


def _batch_limit(v: Any) -> bool:
    """Lightning's limit_*_batches: null, a whole number of batches, or a fraction in [0, 1]."""
    return v is None or (_whole(v) and v >= 0) or (isinstance(v, float) and 0.0 <= v <= 1.0)


def _val_interval(v: Any) -> bool:
    """null, every k training batches (k >= 1) or a fraction of an epoch in (0, 1]; a time
    ("DD:HH:MM:SS", a dict) is Lightning's to read."""
    if isinstance(v, float):
        return 0.0 < v <= 1.0
    return not _whole(v) or v >= 1


def _devices(v: Any) -> bool:
    """Lightning's forms: N > 0, -1 or "auto" (every visible device), a list of device
    indices, or the same as a string ("2", "-1", "0,1")."""
    if isinstance(v, str):
        text = v.strip()
        if text in ("auto", "-1"):
            return True
        if text.isdigit():
            return int(text) > 0
        parts = [p.strip() for p in text.split(",") if p.strip()]
        return bool(parts) and all(p.isdigit() for p in parts)
    if _whole(v):
        return v > 0 or v == -1
    if isinstance(v, Sequence):
        return len(v) > 0 and all(_whole(d) and d >= 0 for d in v) and len(set(v)) == len(v)
    return False


# key -> (valid?, what a valid value is and how to set one). Lightning, torch and the judge
# would refuse most of these too, but only once data, model or generation work is done.
_RULES: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("seed", _between(0, 2**32 - 1), "needs a whole number in [0, 2^32 - 1] (seed=0)"),
    ("data.batch_size", _at_least(1), "needs a whole number >= 1 (data.batch_size=16)"),
    (
        "data.eval_batch_size",
        _at_least(1, "auto"),
        "needs a whole number >= 1 or auto (the memory plan's pick; data.eval_batch_size=64)",
    ),
    ("data.option_orders", _at_least(0), "needs a whole number >= 0 (data.option_orders=2)"),
    (
        "data.num_workers",
        _at_least(0, None),
        "needs a whole number >= 0 (data.num_workers=0: no workers), or null (from the cores)",
    ),
    (
        "trainer.max_epochs",
        _at_least(1, -1, None),
        "needs a whole number >= 1, or -1 (no limit: set trainer.max_steps), or null",
    ),
    ("trainer.max_steps", _at_least(1, -1), "needs a whole number >= 1, or -1 (no limit)"),
    ("trainer.min_epochs", _at_least(0, None), "needs a whole number >= 0, or null"),
    (
        "trainer.accumulate_grad_batches",
        _at_least(1),
        "needs a whole number >= 1 (1: an optimiser step after every batch)",
    ),
    (
        "trainer.devices",
        _devices,
        'needs N >= 1 devices, -1 or "auto" (every visible one), or device indices such as [0,1]',
    ),
    ("trainer.num_nodes", _at_least(1), "needs a whole number >= 1 (trainer.num_nodes=1)"),
    ("trainer.log_every_n_steps", _at_least(1), "needs a whole number >= 1"),
    ("progress.when", lambda v: v in WHEN, f"needs one of {', '.join(WHEN)}"),
    ("progress.every_n_steps", _at_least(1), "needs a whole number >= 1 (optimiser steps)"),
    (
        "progress.every_s",
        lambda v: _non_negative_number(v) and v > 0,
        "needs a number of seconds > 0",
    ),
    ("trainer.check_val_every_n_epoch", _at_least(1, None), "needs a whole number >= 1, or null"),
    (
        "trainer.num_sanity_val_steps",
        _at_least(-1),
        "needs a whole number >= 0, or -1 (the whole validation set)",
    ),
    (
        "trainer.gradient_clip_val",
        lambda v: v is None or _non_negative_number(v),
        "needs a number >= 0, or null (no clipping)",
    ),
    (
        "trainer.limit_train_batches",
        _batch_limit,
        "needs a whole number of batches >= 0, a fraction in [0.0, 1.0], or null",
    ),
    (
        "trainer.limit_val_batches",
        _batch_limit,
        "needs a whole number of batches >= 0, a fraction in [0.0, 1.0], or null",
    ),
    (
        "trainer.val_check_interval",
        _val_interval,
        "needs a whole number of batches >= 1, a fraction of an epoch in (0.0, 1.0], or null",
    ),
    ("model.max_new_tokens", _at_least(1), "needs a whole number >= 1 (model.max_new_tokens=16)"),
    (
        "model.gradient_checkpointing",
        lambda v: isinstance(v, bool) or _at_least(1)(v) or v == "auto",
        "needs true (every decoder layer), false, a whole number n >= 1 (every n-th layer) "
        "or auto (the least that fits the GPU)",
    ),
    ("peft.lr", _positive_number, "needs a learning rate > 0 (e.g. peft.lr=3e-4)"),
    ("peft.projector_lr", _non_negative_number, "needs a learning rate >= 0"),
    ("peft.weight_decay", _non_negative_number, "needs a number >= 0"),
    ("peft.warmup_ratio", _between(0, 1, high_open=True), "needs a fraction in [0, 1)"),
    ("peft.virtual_tokens", _at_least(0), "needs a whole number >= 0"),
    (
        "evaluation.bootstrap.samples",
        _at_least(0),
        "needs a whole number >= 0 (0: no confidence intervals)",
    ),
    ("evaluation.bootstrap.seed", _between(0, 2**32 - 1), "needs a whole number >= 0"),
    (
        "evaluation.bootstrap.level",
        _between(0, 1, low_open=True, high_open=True),
        "needs a confidence level in (0, 1), e.g. 0.95",
    ),
    ("judge.batch_size", _at_least(1), "needs a whole number >= 1 (judge.batch_size=8)"),
    ("judge.concurrency", _at_least(1), "needs a whole number >= 1 (judge.concurrency=8)"),
    ("judge.max_new_tokens", _at_least(1), "needs a whole number >= 1"),
    ("judge.retries", _at_least(0), "needs a whole number >= 0 (0: no retry)"),
    ("judge.timeout", _positive_number, "needs seconds > 0 (judge.timeout=60)"),
    ("judge.backoff", _non_negative_number, "needs seconds >= 0"),
    ("judge.selfcheck_min_closed_acc", _between(0, 1), "needs an accuracy in [0, 1]"),
    ("judge.selfcheck_min_open_tau", _between(-1, 1), "needs a rank correlation in [-1, 1]"),
    # task=plan's own options (+task.<name>=...)
    (
        "task.gpu_gib",
        _finite_positive_or_null,
        "needs each GPU's memory in GiB, a number > 0 (+task.gpu_gib=80), or null (this "
        "machine's GPU, else an 80 GB one)",
    ),
    (
        "task.text_tokens",
        _at_least(1),
        "needs a whole number of text tokens per sample >= 1 (+task.text_tokens=64)",
    ),
    (
        "task.devices",
        _at_least(1, None),
        "needs a whole number of GPUs per node >= 1 (+task.devices=8), or null",
    ),
)


_ABSENT = object()


def _show(value: Any) -> str:
    """A value as it is written on the command line (`[a,b]`, `null`)."""
    if value is None:
        return "null"
    if isinstance(value, Sequence) and not isinstance(value, str):
        return "[" + ",".join(_show(v) for v in value) + "]"
    return str(value)


def _plain(value: Any) -> Any:
    """Config nodes as plain Python values (lists, dicts)."""
    if OmegaConf.is_config(value):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _served_problems(cfg: DictConfig) -> list[str]:
    """What `model=served` cannot run with: a method that would train (a served model is asked,
    never trained here), an endpoint or model left unset, a key pasted where the name of its
    variable belongs, numbers that cannot work."""
    from medvqa.judge.errors import JudgeConfigError
    from medvqa.judge.keys import check_api_key_env

    if OmegaConf.select(cfg, "model.served") is None:
        return []
    keys = ("base_url", "model", "api_key_env", "timeout", "concurrency", "retries", "backoff")
    served = {key: _plain(OmegaConf.select(cfg, f"model.served.{key}")) for key in keys}
    method = _plain(OmegaConf.select(cfg, "peft.name"))
    problems = []
    if method != "none":
        problems.append(
            f"model=served with peft={method}: a served model is evaluated as it is served, never "
            "trained here; add peft=none (to evaluate weights trained here behind a server, "
            "export them first: medvqa-export, docs/export.md)"
        )
    for key in ("base_url", "model"):
        if served[key] in (None, ""):
            problems.append(f"model.served.{key}: not set; e.g. model.served.{key}=...")
    try:
        check_api_key_env(served["api_key_env"], "model.served.api_key_env")
    except JudgeConfigError as err:
        problems.append(str(err))
    for key, low in (("timeout", 0), ("concurrency", 1), ("retries", 0), ("backoff", 0)):
        value = served[key]
        if not (_number(value) and value >= low) or (key == "timeout" and value == 0):
            problems.append(f"model.served.{key}={_show(value)}: needs a number >= {low}")
    return problems


def _value_problems(cfg: DictConfig) -> list[str]:
    """The numeric and choice keys whose value cannot work."""
    problems = []
    for key, ok, need in _RULES:
        value = _plain(OmegaConf.select(cfg, key, default=_ABSENT))
        if value is _ABSENT:
            continue  # a key this config has no node for (a partial config) is not checked
        if not ok(value):
            problems.append(f"{key}={_show(value)}: {need}")
    problems += _served_problems(cfg)
    problems += _training_problems(cfg)
    problems += _model_problems(cfg)
    allocator = OmegaConf.select(cfg, "cuda_allocator")
    problem = cuda_allocator_problem(allocator)
    if problem:
        problems.append(f"cuda_allocator={allocator}: {problem}")
    problems += _data_problems(cfg)
    from medvqa.training.checkpoints import ckpt_path_problems  # torch: only when checking

    problems += ckpt_path_problems(OmegaConf.select(cfg, "ckpt_path"))
    allow = _plain(OmegaConf.select(cfg, "eval.allow_seen_rows", default=False))
    if not isinstance(allow, bool):  # `eval` is not typed: a YAML `on` or a 2 reaches here
        problems.append(f"eval.allow_seen_rows={_show(allow)}: needs true or false")
    problems += _image_mode_problems(cfg)
    return problems


def _training_problems(cfg: DictConfig) -> list[str]:
    """A LoRA rank or an epoch range that cannot train (the schema types them, not ranges)."""
    problems = []
    r = _plain(OmegaConf.select(cfg, "peft.adapter.r"))
    if r is not None and not (_whole(r) and r >= 1):
        problems.append(f"peft.adapter.r={_show(r)}: needs a LoRA rank >= 1 (peft.adapter.r=16)")
    max_epochs = _plain(OmegaConf.select(cfg, "trainer.max_epochs"))
    min_epochs = _plain(OmegaConf.select(cfg, "trainer.min_epochs"))
    if _whole(max_epochs) and _whole(min_epochs) and 1 <= max_epochs < min_epochs:
        problems.append(
            f"trainer.min_epochs={min_epochs}: above trainer.max_epochs={max_epochs}; lower it "
            "or raise trainer.max_epochs"
        )
    return problems


def _model_problems(cfg: DictConfig) -> list[str]:
    """The model's speed switches that cannot work: `Any` fields that take auto or a real bool,
    a decode engine that does not exist, FP8 off a GPU, Liger kernels under compiled layers,
    and `model.random_weights` as its one reader reads it."""
    problems = []
    words = (  # `Any` fields that take auto or a real bool (1 is not true, nor 0 false)
        ("model.compile_layers", "compiled on CUDA GPUs, eager elsewhere"),
        (
            "model.merge_adapters",
            "merged for generation where the memory plan finds room on the GPU",
        ),
        ("model.compile_decode", "the static decode compiled on CUDA GPUs, eager elsewhere"),
        ("model.fp8", "FP8 for the frozen weights where it was measured faster on this GPU"),
    )
    for key, meaning in words:
        value = _plain(OmegaConf.select(cfg, key))
        if not _one_of(value, True, False, "auto", None):
            problems.append(f"{key}={_show(value)}: use auto ({meaning}), true or false")
    compile_layers = _plain(OmegaConf.select(cfg, "model.compile_layers"))
    engine = _plain(OmegaConf.select(cfg, "model.decode"))
    if engine is not None and engine not in DECODE_ENGINES:
        problems.append(f"model.decode={_show(engine)}: use one of {list(DECODE_ENGINES)}")
    accelerator = _plain(OmegaConf.select(cfg, "trainer.accelerator"))
    on_gpu = accelerator in (None, "auto", *GPU_ACCELERATORS)
    if _plain(OmegaConf.select(cfg, "model.fp8")) is True and not on_gpu:
        problems.append(
            f"model.fp8=true with trainer.accelerator={accelerator}: FP8 GEMMs run on CUDA GPUs "
            "of compute capability 8.9+ (H100, L40S); use model.fp8=auto (off here) or false"
        )
    if _plain(OmegaConf.select(cfg, "model.liger_kernels")) and compile_layers is True:
        problems.append(
            "model.liger_kernels=true with model.compile_layers=true: torch.compile cannot trace "
            "Liger's Triton kernels in the decoder layers (measured on an H100); choose one "
            "(compiled layers were the faster, docs/gpus.md#speed-measured-on-an-h100)"
        )
    try:  # the one reading of it (loading, planning, records, reports)
        random_weights_kind(_plain(OmegaConf.select(cfg, "model.random_weights")))
    except ValueError as err:
        problems.append(str(err))
    return problems


def _data_problems(cfg: DictConfig) -> list[str]:
    """Per-split row caps that name no split or cap nothing (what the evaluation passes refuse
    is theirs to say: `generation.passes.pass_problems`)."""
    problems = []
    limits = _plain(OmegaConf.select(cfg, "data.limit")) or {}
    for split, cap in limits.items():
        if split not in SPLITS:
            problems.append(
                f"data.limit.{split}={_show(cap)}: {split!r} is not a split; the splits are "
                f"{list(SPLITS)} (e.g. data.limit.train=100)"
            )
        elif cap is not None and not (_whole(cap) and cap >= 1):
            problems.append(
                f"data.limit.{split}={_show(cap)}: needs a whole number of rows >= 1, or null "
                "(no cap)"
            )
    return problems


def _image_mode_problems(cfg: DictConfig) -> list[str]:
    """Image modes (training, evaluation, the extra evaluation passes) that are no mode."""
    problems = []
    for key in ("data.train_image", "data.eval_image", "data.extra_eval_images"):
        value = _plain(OmegaConf.select(cfg, key))
        modes = value if isinstance(value, list) else [] if value is None else [value]
        if any(m not in IMAGE_MODES for m in modes):
            problems.append(f"{key}={_show(value)}: each image mode must be one of {IMAGE_MODES}")
    return problems


def _dataset_class(cfg: DictConfig) -> type | None:
    """The registered dataset class `dataset._target_` builds (None: not a registered one)."""
    target = OmegaConf.select(cfg, "dataset._target_")
    for cls in plugins.registered("dataset").values():
        if plugins.target_of(cls) == target:
            return cls
    return None


def _shift_problems(cfg: DictConfig) -> list[str]:
    """A shift definition that `make_splits` would refuse only after loading the table."""
    shift = OmegaConf.select(cfg, "shift")
    if not isinstance(shift, DictConfig):
        return []
    missing = [k for k in shift if OmegaConf.is_missing(shift, k)]
    if missing:
        return [f"shift.{k}=???: this shift kind needs it; set shift.{k}=..." for k in missing]
    try:
        Shift.from_config(_shift_spec(shift))
    except (OmegaConfBaseException, TypeError, ValueError) as err:
        return [f"shift: {err}"]
    return []


def _shift_spec(shift: DictConfig) -> dict[str, Any]:
    """The shift as plain values. A `name` interpolating a key that is not set (`${.field}`
    without a field) is left out, so that Shift itself says which key the kind needs."""
    try:
        return OmegaConf.to_container(shift, resolve=True)  # type: ignore[return-value]
    except OmegaConfBaseException:
        return {k: _plain(shift[k]) for k in shift if k != "name"} | {"name": "shift"}


def _field_problems(cfg: DictConfig) -> list[str]:
    """Breakdown and shift fields that the dataset's records do not have.

    A dataset class declares its metadata columns once (`VQASource.metadata_fields`); the
    records have those plus the core columns (medvqa.data.records), and predictions add the
    split and, under a transform shift, the image transform. A class that declares nothing
    (a plug-in's choice) is not checked here: its table is, when it is loaded.
    """
    cls = _dataset_class(cfg)
    declared = getattr(cls, "metadata_fields", None)
    if cls is None or declared is None:
        return []
    fields = (*R.CORE_COLUMNS, *declared)
    listed = f"dataset {cls.name!r} has {list(declared)} beside the record columns"
    listed += f" {list(R.CORE_COLUMNS)}"
    problems = []
    transform = OmegaConf.select(cfg, "shift.transform") is not None
    scored = (*fields, R.SPLIT, *((IMAGE_TRANSFORM,) if transform else ()))
    breakdown = _plain(OmegaConf.select(cfg, "evaluation.breakdown")) or []
    unknown = [f for f in breakdown if f not in scored]
    if unknown:
        kept = [f for f in breakdown if f in scored] or ["question_type"]
        problems.append(
            f"evaluation.breakdown={_show(breakdown)}: the records have no field "
            f"{', '.join(map(repr, unknown))}; {listed}, and predictions add {R.SPLIT!r}"
            f"{f' and (a transform shift) {IMAGE_TRANSFORM!r}' if transform else ''}. "
            f"Pick from those, e.g. evaluation.breakdown={_show(kept)}"
        )
    node = OmegaConf.select(cfg, "shift")
    try:
        shift = _shift_spec(node) if isinstance(node, DictConfig) else {}
    except OmegaConfBaseException:
        shift = {}  # _shift_problems reports it
    named = [("shift.field", shift.get("field")), ("shift.val_group", shift.get("val_group"))]
    named += [("shift.val_stratify", f) for f in shift.get("val_stratify") or ()]
    for i, part in enumerate(shift.get("any_of") or ()):
        if isinstance(part, dict):
            named.append((f"shift.any_of[{i}].field", part.get("field")))
    for key, field in named:
        if isinstance(field, str) and field != "???" and field not in fields:
            problems.append(
                f"{key}={field}: the records have no field {field!r}; {listed}. Set {key} to "
                "one of them"
            )
    modes = [
        _plain(OmegaConf.select(cfg, "data.train_image")),
        _plain(OmegaConf.select(cfg, "data.eval_image")),
        *(_plain(OmegaConf.select(cfg, "data.extra_eval_images")) or []),
    ]
    mismatch = OmegaConf.select(cfg, "data.mismatch_field")
    if "mismatched" in modes and mismatch not in fields:
        problems.append(
            f"data.mismatch_field={mismatch}: the image mode 'mismatched' shows a row the image "
            f"of a row with another value of it, and the records have no field {mismatch!r}; "
            f"{listed}. Set data.mismatch_field to one of them"
        )
    return problems


def check_config(cfg: DictConfig, *, fields: bool = True) -> None:
    """Refuse values that cannot work before any data, model or record work is done.

    The typed schemas catch misspelled keys and wrong types when Hydra composes the config;
    this catches what a type cannot say (a batch size of -1, a breakdown by a column the
    dataset does not have), which used to fail only after data preparation, generation or
    training. Every problem is reported at once, as a `ConfigError`. `fields=False` skips the
    dataset's fields (breakdown and shift): medvqa-score reads its columns from a file.
    """
    problems = _value_problems(cfg) + pass_problems(cfg)
    if fields:
        problems += _shift_problems(cfg) + _field_problems(cfg)
    if problems:
        raise ConfigError(
            f"{len(problems)} config value(s) cannot work; nothing was run. Fix them on the "
            "command line or in the config file:\n" + "\n".join(f"  - {p}" for p in problems)
        )


MAX_DIRNAME = 200


def job_dirname(overrides: str, default: str) -> str:
    """The overrides as a folder name; `default` if none; a long one is cut and hashed.

    File systems refuse names over 255 bytes, and a grid with many overrides gets there.
    """
    if not overrides:
        return default
    if len(overrides.encode()) <= MAX_DIRNAME:
        return overrides
    digest = content_hash(overrides, length=10)
    return f"{overrides.encode()[: MAX_DIRNAME - 11].decode(errors='ignore')}~{digest}"


def _strict_bools(node: DictConfig) -> DictConfig:
    """`node` with every bool-typed field taking true or false only, from YAML and from the
    command line alike (returned for chaining).

    OmegaConf converts into a bool field whatever reads as one: `model.share_image_prefix=2`, "2",
    "yes" or "on" composed as true, silently. Its `convert=False` flag on those nodes makes such
    a value fail when Hydra composes, naming the key, the value and the type (bool) it needs.
    Which fields: those the schemas' dataclasses type `bool` (OmegaConf makes a BooleanNode of
    each). A structured field left missing (Config's `model: ModelSchema = MISSING`) is filled
    with its schema first: a group merged into a missing node gets fresh nodes, without flags.
    """
    for key in list(node.keys()):
        child = node._get_node(key)
        if isinstance(child, BooleanNode):
            child._set_flag("convert", False)
            continue
        if not isinstance(child, DictConfig):
            continue
        schema_type = child._metadata.ref_type
        if child._is_missing() and dataclasses.is_dataclass(schema_type):
            node[key] = OmegaConf.structured(schema_type)
            child = node._get_node(key)
        if not (child._is_missing() or child._is_none()):
            _strict_bools(child)
    return node


def register() -> None:
    """Put the schemas in Hydra's ConfigStore and the resolvers in OmegaConf (idempotent)."""
    # `${job_dirname:overrides,default}`: a multirun folder name from the overrides.
    OmegaConf.register_new_resolver("job_dirname", job_dirname, replace=True)
    # `${times:2,${.r}}`: LoRA's alpha = 2r, kept in step when a sweep changes r.
    OmegaConf.register_new_resolver("times", lambda a, b: a * b, replace=True)
    # `${slurm_tasks:${trainer.devices}}`, `${slurm_gpus:accelerator,devices}`: the SLURM
    # launcher's job size follows the trainer (conf/hydra/launcher/slurm.yaml).
    OmegaConf.register_new_resolver("slurm_tasks", slurm_tasks, replace=True)
    OmegaConf.register_new_resolver("slurm_gpus", slurm_gpus, replace=True)
    # `${slurm_mem_gb:tasks,per_task_gb,reserve_gb}`: host memory per node from the tasks on it.
    OmegaConf.register_new_resolver("slurm_mem_gb", slurm_mem_gb, replace=True)
    # `${rank_log:}`: the job log's name, run.log on global rank 0, run_rank<k>.log on rank k.
    OmegaConf.register_new_resolver("rank_log", rank_log_name, replace=True)
    cs = ConfigStore.instance()

    def store(node: type, name: str, group: str | None = None) -> None:
        cs.store(group=group, name=name, node=_strict_bools(OmegaConf.structured(node)))

    store(Config, "config_schema")
    # Datasets and metric families: one schema per registered plug-in, made from its class.
    for kind in plugins.GROUPS:
        for name, cls in plugins.registered(kind).items():
            store(schema(cls), f"{name}_schema", kind)
    store(ShiftSchema, "shift_schema", "shift")
    store(ModelSchema, "model_schema", "model")
    store(PeftSchema, "peft_schema", "peft")
    store(TrainerSchema, "trainer_schema", "trainer")
    store(PathsSchema, "paths_schema", "paths")
    store(JudgeSchema, "judge_schema", "judge")


register()
