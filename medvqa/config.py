"""Typed schemas behind the YAML under conf/.

Each group's YAML files start from one of these schemas (`defaults: [<name>_schema, _self_]`),
so a misspelled key in a YAML file or on the command line fails when Hydra composes the config,
not hours into a job. `register()` is idempotent and runs on import.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from medvqa import plugins
from medvqa.cluster import rank_log_name, slurm_gpus, slurm_mem_gb, slurm_tasks
from medvqa.data.shifts import Shift
from medvqa.evaluation.judge.backends import JudgeConfig
from medvqa.hashing import content_hash

# The shift's fields are those of `medvqa.data.shifts.Shift` (declared there once).
ShiftSchema = plugins.schema(Shift, target=False)


@dataclass
class ModuleRoles:
    """Where the parts of a VLM live, as module-name fragments (they differ per family)."""

    vision: str = "vision_tower"
    projector: str = "multi_modal_projector"
    language: str = "language_model"
    lm_head: str = "lm_head"


@dataclass
class ModelSchema:
    """A VLM: a local directory or hub id, or an offline `builder` that makes one."""

    name: str = MISSING
    family: str = "llava"
    pretrained: str | None = None
    builder: Any = None
    modules: ModuleRoles = dataclasses.field(default_factory=ModuleRoles)
    dtype: str = "float32"
    trust_remote_code: bool = False
    max_new_tokens: int = 16
    # Passed to from_pretrained: "sdpa" (PyTorch's fused attention, CPU and GPU),
    # "flash_attention_2" (needs the flash-attn package and a CUDA GPU) or "eager".
    attn_implementation: str = "sdpa"
    # Recompute activations in the backward pass: far less activation memory for a 7B model,
    # for about one extra forward pass per step.
    gradient_checkpointing: bool = False
    # A named chat template (medvqa.models.prompting.CHAT_TEMPLATES, e.g. llava_med) replacing
    # the processor's own, for checkpoints saved without the one the model was trained with.
    chat_template: str | None = None
    # Keyword arguments for AutoProcessor.from_pretrained, e.g. Qwen's image size cap
    # `{min_pixels: 3136, max_pixels: 401408}`; part of what answers are keyed by (through the
    # loaded image processor's settings), and what task=plan counts image tokens with.
    processor_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclass
class PeftSchema:
    """A fine-tuning method; each `peft/*.yaml` is the whole truth about one method.

    `adapter` is a peft config (`_target_: peft.LoraConfig`, ...) or null for full fine-tuning
    and zero-shot; `adapter_scope` restricts the adapter to one model role (CLIP/SigLIP towers
    reuse `q_proj`-style names); `train_modules` are model roles trained as full weights.
    """

    name: str = MISSING
    label: str = ""  # how tables name the method, e.g. "LoRA"
    adapter: Any = None
    adapter_scope: str | None = "language"
    train_modules: list[str] = dataclasses.field(default_factory=list)
    virtual_tokens: int = 0  # prompt tuning: trainable tokens put before every question
    fit: bool = True
    lr: float = 3e-4
    # The multimodal projector's own rate, whatever the method's `lr` (SURE-VQA: 2e-5).
    projector_lr: float = 2e-5
    weight_decay: float = 0.0
    warmup_ratio: float = 0.03


# The judge node's keys and defaults are those of JudgeConfig (declared there once).
JudgeSchema = plugins.schema(JudgeConfig, target=False)


@dataclass
class BootstrapSchema:
    """Case-clustered bootstrap of the headline scores, RR and OoD − i.i.d. (0 samples: off)."""

    samples: int = 2000
    seed: int = 42
    level: float = 0.95


@dataclass
class EvaluationSchema:
    """How scores become headline numbers: which ones feed RR, and the breakdown fields."""

    primary_closed: str = "closed_acc"
    primary_open: str = "open_f1"
    breakdown: list[str] = dataclasses.field(default_factory=lambda: ["question_type"])
    bootstrap: BootstrapSchema = dataclasses.field(default_factory=BootstrapSchema)


@dataclass
class TrainerSchema:
    """The `lightning.Trainer` arguments this project uses (others would be typos)."""

    _target_: str = "lightning.Trainer"
    accelerator: str = "cpu"
    devices: Any = 1
    strategy: Any = "auto"
    precision: Any = "32-true"
    max_epochs: int | None = 1
    max_steps: int = -1
    min_epochs: int | None = None
    accumulate_grad_batches: int = 1
    gradient_clip_val: float | None = 1.0
    log_every_n_steps: int = 10
    val_check_interval: Any = None
    check_val_every_n_epoch: int | None = 1
    limit_train_batches: Any = None
    limit_val_batches: Any = None
    num_sanity_val_steps: int = 0
    enable_progress_bar: bool = True
    enable_model_summary: bool = True
    enable_checkpointing: bool = True
    # Machines, each with `devices` devices (world size = devices x num_nodes); under SLURM
    # hydra.launcher.nodes follows it (launch/README.md, "More than one node").
    num_nodes: int = 1
    deterministic: Any = False
    benchmark: bool | None = None


@dataclass
class DataSchema:
    """Loader settings shared by every dataset; `limit` caps split sizes (debug runs)."""

    batch_size: int = 16
    eval_batch_size: int = 64
    num_workers: int = 0
    # What the model sees (baselines change these): "image", "none" (no image, no image
    # tokens) or "blank" (a black image of the same size).
    train_image: str = "image"
    eval_image: str = "image"
    # Further evaluations with other image modes, recorded as `<mode>/...` plus
    # `delta_<mode>/... = main - <mode>` (e.g. [blank]: the blind ablation).
    extra_eval_images: list[str] = dataclasses.field(default_factory=list)
    limit: dict[str, int | None] = dataclasses.field(
        default_factory=lambda: {"train": None, "val": None, "test_iid": None, "test_ood": None}
    )


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
    paths: PathsSchema = MISSING
    data: DataSchema = dataclasses.field(default_factory=DataSchema)
    seed: int = 0
    # torch.set_float32_matmul_precision: "highest" (full float32), "high" (TF32 on Ampere and
    # later GPUs: the paper's tf32), "medium"; set before the task runs, on every rank.
    matmul_precision: str = "highest"
    force: bool = False
    # A model built offline for running the pipeline (`model.builder`: tiny, smollm2_llava, the
    # families' test twins) is refused on a real dataset unless this is true (debug=smoke sets
    # it): its rows would look like results.
    allow_toy_model: bool = False
    ckpt_path: str | None = None
    label: str | None = None  # how tables name this run (baselines set it); default: peft.label
    tags: list[str] = dataclasses.field(default_factory=list)
    eval: Any = None  # task=eval: {from_run: <run dir>}, whose trained weights are evaluated


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
    cs.store(name="config_schema", node=Config)
    # Datasets and metric families: one schema per registered plug-in, made from its class.
    for kind in plugins.PACKAGES:
        for name, cls in plugins.registered(kind).items():
            cs.store(group=kind, name=f"{name}_schema", node=plugins.schema(cls))
    cs.store(group="shift", name="shift_schema", node=ShiftSchema)
    cs.store(group="model", name="model_schema", node=ModelSchema)
    cs.store(group="peft", name="peft_schema", node=PeftSchema)
    cs.store(group="trainer", name="trainer_schema", node=TrainerSchema)
    cs.store(group="paths", name="paths_schema", node=PathsSchema)
    cs.store(group="judge", name="judge_schema", node=JudgeSchema)


register()
