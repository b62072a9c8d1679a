"""The training specs: the trainer (`conf/trainer/*.yaml`, the `lightning.Trainer` arguments),
the fine-tuning method (`conf/peft/*.yaml`) and the loaders (the `data` node). They sit with the
training code, which reads their defaults (`medvqa.training.hardware`, `VQAModule`,
`VQADataModule`); `medvqa.config` registers them as the groups' schemas."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING

from medvqa.data.shifts import SPLITS


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


IMAGE_MODES = ("image", "none", "blank", "shuffled", "mismatched")
# The image modes that show a row another row's image, and what the other row must differ in
# ("mismatched": the metadata column `data.mismatch_field` names, e.g. the modality).
PARTNER_MODES = ("shuffled", "mismatched")


@dataclass
class DataSchema:
    """Loader settings shared by every dataset; `limit` caps split sizes (debug runs)."""

    batch_size: int = 16
    # Rows per generation batch (and per validation batch of a fit). auto: for generation, the
    # largest of `planning.memory.EVAL_BATCHES` whose generation leaves a tenth of the GPU free
    # where the memory plan ran (a fit on CUDA GPUs with task.check_memory); for validation
    # (beside the optimiser's state) and where no plan ran, `planning.memory.AUTO_EVAL_BATCH`.
    eval_batch_size: Any = "auto"
    # Loader processes per rank; null: from the cores the rank has (SLURM's cpus_per_task, the
    # machine's shared by the local ranks) less one, at most 8, on a GPU trainer; none on a CPU
    # one (training.datamodule.auto_workers). Answers and weights do not depend on it.
    num_workers: int | None = None
    # What the model sees (baselines change these): "image", "none" (no image, no image
    # tokens) or "blank" (a black image of the same size).
    train_image: str = "image"
    eval_image: str = "image"
    # Further evaluations with other image modes, recorded as `<mode>/...` plus
    # `delta_<mode>/... = main - <mode>` (e.g. [blank]: the blind ablation; [shuffled]: another
    # case's image from the same split, the same for every run: how much the answers use it).
    extra_eval_images: list[str] = dataclasses.field(default_factory=list)
    # The image mode "mismatched" shows a row the image of a row with another value of this
    # metadata column (the same split, never the same value): another modality by default.
    mismatch_field: str = "modality"
    # Further evaluations of the closed questions with their candidates in other orders: k
    # seeded permutations per row (never the original order), recorded as `order<k>/...`; the
    # answer's meaning (the chosen candidate), not its position, is compared with the main one
    # (option-order flips, docs/metrics.md#option-order-invariance).
    option_orders: int = 0
    limit: dict[str, int | None] = dataclasses.field(default_factory=lambda: dict.fromkeys(SPLITS))
