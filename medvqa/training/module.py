"""The LightningModule that fine-tunes a VLM (any method: the model arrives already adapted)."""

from __future__ import annotations

import inspect
import logging
import math
from functools import cache
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.utilities import GradClipAlgorithmType
from transformers import get_cosine_schedule_with_warmup

from medvqa.measure import BATCH_COUNTS_KEY, Phase
from medvqa.models.adapters import role_parameters
from medvqa.models.flops import add_batch, new_sums
from medvqa.models.prompting import IGNORE_INDEX, labelled_tokens
from medvqa.training.datamodule import META_KEY, STEP_TOKENS_KEY
from medvqa.training.spec import PeftSchema

log = logging.getLogger(__name__)

# Training steps between two checks that the loss stayed finite: each check reads a flag back
# from the GPU (and reduces it over the ranks), which stalls the host until the GPU has caught up.
FINITE_CHECK_EVERY = 32
NO_STEP = 2**62  # "no non-finite loss yet", the identity of the ranks' min-reduction
# Devices AdamW runs its fused kernel on (tests add "cpu", where torch has one too, to run the
# GPU path's optimizer and clipping; CPU runs keep the foreach kernel their figures came from).
FUSED_DEVICES: tuple[str, ...] = ("cuda",)
# Where `on_before_batch_transfer` puts the batch's `label_positions`.
POSITIONS_KEY = "label_positions"
# What a batch carries beside the model's inputs.
BATCH_EXTRAS = (META_KEY, POSITIONS_KEY, STEP_TOKENS_KEY, BATCH_COUNTS_KEY)


def accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether `model`'s forward takes `logits_to_keep` (every transformers causal/VLM head does;
    peft's wrappers pass keyword arguments through to the model they wrap)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return _takes_logits_to_keep(type(base))


@cache  # asked at every step: read each class's signature once
def _takes_logits_to_keep(cls: type) -> bool:
    return "logits_to_keep" in inspect.signature(cls.forward).parameters


def label_positions(labels: torch.Tensor) -> torch.Tensor:
    """The positions whose next token is a label in some row of the batch (the union over the
    rows), ascending. Computed on the host before the batch goes to the GPU
    (`VQAModule.on_before_batch_transfer`): `nonzero` on a GPU tensor waits for the GPU."""
    return (labels[:, 1:] != IGNORE_INDEX).any(dim=0).nonzero().squeeze(1)


def causal_lm_loss(
    model: torch.nn.Module,
    inputs: dict[str, Any],
    positions: torch.Tensor | None = None,
    normalizer: float | None = None,
) -> torch.Tensor:
    """transformers' causal-LM loss (mean token cross-entropy of `labels` shifted by one), with
    the vocabulary projection computed only at the positions that predict a label.

    transformers computes float32 logits over the whole vocabulary at every position (~610 for
    a LLaVA sample, 576 of them image tokens) for the ~5 answer tokens that carry a label: 3-6 GB
    per batch, and their gradient, for nothing. `logits_to_keep` (a tensor of positions) makes
    the model project only the union over the batch of the positions whose next token is a label;
    the loss is then transformers' own formula on those (equal to float tolerance,
    tests/test_training_speed.py). A batch without labels, or a model whose forward lacks
    `logits_to_keep`, gets the model's own loss. `positions`: `label_positions(labels)`, if the
    caller has it (on the GPU nothing here then waits for the device). `normalizer`: what the
    summed cross-entropy is divided by instead of this batch's label count (a training step's
    share of its whole step's count, `VQAModule._loss`).
    """
    labels = inputs.get("labels")
    if labels is None or not accepts_logits_to_keep(model):
        return causal_lm_loss_unpruned(model, inputs, normalizer)
    targets = labels[:, 1:]  # position p predicts token p + 1 (transformers' shift)
    keep = label_positions(labels) if positions is None else positions.to(labels.device)
    rest = {k: v for k, v in inputs.items() if k != "labels"}
    logits = model(**rest, logits_to_keep=keep, use_cache=False).logits.float()
    picked = targets[:, keep]
    total = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        picked.reshape(-1).to(logits.device),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )
    return total / (labelled_tokens(labels) if normalizer is None else normalizer)


def causal_lm_loss_unpruned(
    model: torch.nn.Module, inputs: dict[str, Any], normalizer: float | None = None
) -> torch.Tensor:
    """transformers' own loss (logits at every position: the benchmark's "before"), divided by
    `normalizer` instead of the batch's label count where one is given."""
    loss = model(**inputs, use_cache=False).loss
    labels = inputs.get("labels")
    if labels is None or normalizer is None:
        return loss
    return loss * labelled_tokens(labels) / normalizer


class Diverged(RuntimeError):
    """The loss became NaN/inf (on any rank); the run is recorded as `diverged` at `step`."""

    def __init__(self, step: int, loss: float) -> None:
        super().__init__(
            f"the loss became NaN/inf at optimiser step {step} (this rank's loss: {loss}); "
            "the run diverged"
        )
        self.step = step
        self.loss = loss


class VQAModule(L.LightningModule):
    """Causal-LM loss on answer tokens (labels are -100 elsewhere), AdamW + cosine warmup.

    Only parameters with `requires_grad` are optimised, so the fine-tuning method (which
    parameters are trainable) is decided entirely by `medvqa.models.adapters`. The projector's
    parameters (those inside the module named `projector`, the model's projector role) form
    their own group at `projector_lr`, the rest train at `lr`; `projector_lr=None` keeps the
    projector at `lr`. The rates' defaults are PeftSchema's (declared there once); the
    projector's rate has none here: a caller says which it means (`for_method`: the method's).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        lr: float = PeftSchema.lr,
        weight_decay: float = PeftSchema.weight_decay,
        warmup_ratio: float = PeftSchema.warmup_ratio,
        *,
        projector_lr: float | None,
        projector: str | None = None,
        label_logits_only: bool = True,
        check_finite_every: int = FINITE_CHECK_EVERY,
    ) -> None:
        super().__init__()
        if projector_lr is not None and projector is None:
            raise ValueError(
                "VQAModule: projector_lr needs `projector`, the projector's module name "
                "(roles(cfg.model)['projector'], e.g. 'multi_modal_projector')."
            )
        self.model = model
        self.lr = lr
        self.weight_decay = weight_decay
        self.warmup_ratio = warmup_ratio
        self.projector_lr = projector_lr
        self.projector = projector
        # False: transformers' loss from logits at every position (the benchmark's "before").
        self.label_logits_only = label_logits_only
        self.check_finite_every = max(1, int(check_finite_every))
        # On the device: the first optimiser step whose loss was not finite (NO_STEP: none yet)
        # and that loss; read back only at the checks (`_check_finite`).
        self._bad_step: torch.Tensor | None = None
        self._bad_loss: torch.Tensor | None = None
        self.save_hyperparameters(ignore=["model"])
        # Checkpoints hold only the trained weights (the frozen base is reloaded from
        # `model.pretrained`), so loading them must not demand the frozen keys.
        self.strict_loading = False

    @classmethod
    def for_method(cls, model: torch.nn.Module, peft_cfg: Any, projector: str) -> VQAModule:
        """The module a `peft=` method trains with: its rates (the projector's own, given the
        model's projector module name), weight decay and warmup."""
        return cls(
            model,
            lr=float(peft_cfg.lr),
            weight_decay=float(peft_cfg.weight_decay),
            warmup_ratio=float(peft_cfg.warmup_ratio),
            projector_lr=float(peft_cfg.projector_lr),
            projector=projector,
        )

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        trainable = {f"model.{n}" for n, p in self.model.named_parameters() if p.requires_grad}
        state = checkpoint["state_dict"]
        checkpoint["state_dict"] = {k: v for k, v in state.items() if k in trainable}

    def on_fit_start(self) -> None:
        # from_pretrained() leaves modules in eval mode; dropout (e.g. LoRA's) must be active.
        self.model.train()

    def on_train_start(self) -> None:
        trainer = self.trainer
        accumulate, batches = int(trainer.accumulate_grad_batches), trainer.num_training_batches
        if (
            trainer.strategy.handles_gradient_accumulation
            and accumulate > 1
            and math.isfinite(batches)
            and int(batches) % accumulate
        ):
            log.warning(
                "%d batches per epoch with %d per optimiser step: DeepSpeed counts micro-steps "
                "across epochs, so each epoch's last %d batches share a step with the next "
                "epoch's first, and that step's loss is not one token mean. A batch count per "
                "epoch that %d divides (data.batch_size, data.limit.train) avoids it.",
                int(batches),
                accumulate,
                int(batches) % accumulate,
                accumulate,
            )

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # Still on the host: where the labels are, and what the batch holds (the run's own
        # throughput and MFU, medvqa.measure), are known without waiting for the GPU.
        if isinstance(batch, dict) and "labels" in batch:
            if self.label_logits_only:
                batch[POSITIONS_KEY] = label_positions(batch["labels"])
            counts = new_sums()
            add_batch(counts, batch, self._patch_size())
            batch[BATCH_COUNTS_KEY] = counts
        return batch

    def _patch_size(self) -> int:
        vision = getattr(self.model.config, "vision_config", None)
        return int(getattr(vision, "patch_size", 0) or 0) or 1

    def _loss(self, batch: dict[str, Any]) -> torch.Tensor:
        """The batch's cross-entropy summed over its label tokens, divided so that the
        gradient of the optimiser step is that of its token mean: over every micro-batch of the
        accumulation and every rank (`STEP_TOKENS_KEY`, counted by the training loader).
        Lightning divides each micro-batch's loss by `accumulate_grad_batches` and DDP averages
        the ranks' gradients (DeepSpeed does both, and divides by its accumulation steps once
        more), so the count is shared out by those factors. A batch without a step count (the
        validation loader, a loader of one's own) gets its own token mean."""
        inputs = {k: v for k, v in batch.items() if k not in BATCH_EXTRAS}
        normalizer = self._normalizer(batch)
        if self.label_logits_only:
            return causal_lm_loss(self.model, inputs, batch.get(POSITIONS_KEY), normalizer)
        return causal_lm_loss_unpruned(self.model, inputs, normalizer)

    def _normalizer(self, batch: dict[str, Any]) -> float | None:
        """The step's label tokens shared out by the frameworks' divisions (None: no count)."""
        if STEP_TOKENS_KEY not in batch or self._trainer is None:
            return None
        return max(1, int(batch[STEP_TOKENS_KEY])) / self._split_factor()

    def _token_mean(self, loss: torch.Tensor, batch: dict[str, Any]) -> torch.Tensor:
        """This micro-batch's own mean token cross-entropy (what `train/loss` shows), from the
        step-normalised `loss` and the batch's label count taken on the host (no GPU sync)."""
        normalizer = self._normalizer(batch)
        if normalizer is None:
            return loss.detach()
        return loss.detach() * normalizer / max(1.0, batch[BATCH_COUNTS_KEY]["labelled"])

    def _split_factor(self) -> int:
        """What the frameworks divide a micro-batch's gradient by (see `_loss`)."""
        trainer = self.trainer
        accumulate = int(trainer.accumulate_grad_batches)
        factor = accumulate * int(trainer.world_size)
        if trainer.strategy.handles_gradient_accumulation:  # DeepSpeed: its own 1/accumulate
            factor *= accumulate
        return factor

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self._note_finite(loss.detach())
        if self._check_due(batch_idx):
            self._check_finite()
        shown = self._token_mean(loss, batch)
        self.log("train/loss", shown, prog_bar=True, batch_size=batch["input_ids"].shape[0])
        return loss

    def _note_finite(self, loss: torch.Tensor) -> None:
        """Record on the device (no host sync) the first step whose loss is not finite."""
        if self._bad_step is None or self._bad_step.device != loss.device:
            self._bad_step = torch.full((), NO_STEP, dtype=torch.long, device=loss.device)
            self._bad_loss = torch.zeros((), dtype=torch.float32, device=loss.device)
        first = ~torch.isfinite(loss) & (self._bad_step == NO_STEP)
        self._bad_step = torch.where(first, self.global_step, self._bad_step)
        self._bad_loss = torch.where(first, loss.float(), self._bad_loss)

    def _check_due(self, batch_idx: int) -> bool:
        """Every `check_finite_every` batches, and wherever weights may be kept or training ends:
        the epoch's last batch, the last step, a step that a checkpoint callback saves after."""
        trainer = self.trainer
        if (batch_idx + 1) % self.check_finite_every == 0 or trainer.is_last_batch:
            return True
        if 0 < trainer.max_steps <= self.global_step + 1:
            return True
        for callback in trainer.checkpoint_callbacks:
            every = int(getattr(callback, "_every_n_train_steps", 0) or 0)
            if every and (self.global_step + 1) % every == 0:
                return True
        return False

    def _check_finite(self) -> None:
        """Stop every rank if any rank's loss was not finite since training began.

        Every rank takes the same decision (the earliest bad step over the ranks, one
        min-reduction): a rank that stopped alone would leave the others waiting in the
        gradient all-reduce until the process group times out (30 minutes).
        """
        if self._bad_step is None:
            return
        step = self._bad_step.clone()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(step, op=torch.distributed.ReduceOp.MIN)
        first = int(step)
        if first != NO_STEP:
            assert self._bad_loss is not None
            mine = int(self._bad_step) != NO_STEP
            raise Diverged(first, float(self._bad_loss) if mine else float("nan"))

    def on_validation_start(self) -> None:
        # Mid-epoch validation (val_check_interval) may be followed by a checkpoint.
        self._check_finite()

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        loss = self._loss(batch)
        # The mean over every rank's shard of the validation split, not rank 0's alone.
        self.log(
            "val/loss", loss, prog_bar=True, batch_size=batch["input_ids"].shape[0], sync_dist=True
        )

    def param_groups(self) -> list[dict[str, Any]]:
        """AdamW's groups: `method` at `lr`, `projector` at `projector_lr`; empty ones omitted.

        The names show in LearningRateMonitor's keys (`lr-AdamW/projector`).
        """
        in_projector = (
            {id(p) for _, p in role_parameters(self.model, self.projector)}
            if self.projector is not None
            else set()
        )
        projector_lr = self.lr if self.projector_lr is None else self.projector_lr
        groups = [
            {"name": "method", "lr": self.lr, "params": []},
            {"name": "projector", "lr": projector_lr, "params": []},
        ]
        method, projector = groups
        for param in (p for p in self.model.parameters() if p.requires_grad):
            (projector if id(param) in in_projector else method)["params"].append(param)
        return [g for g in groups if g["params"]]

    def _adamw(self, groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
        """AdamW where its state lives: DeepSpeed's CPU AdamW when ZeRO offloads the optimizer
        to the host (DeepSpeed refuses torch's there), torch's fused kernel on CUDA (one launch
        instead of list-sized foreach temporaries: +1 fp32 copy of every trained tensor), the
        default (foreach) elsewhere."""
        strategy = self.trainer.strategy
        zero = getattr(strategy, "config", None) or {}
        if isinstance(zero, dict) and zero.get("zero_optimization", {}).get("offload_optimizer"):
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            return DeepSpeedCPUAdam(
                groups, lr=self.lr, weight_decay=self.weight_decay, adamw_mode=True
            )
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        fused = scaler is None and all(
            p.device.type in FUSED_DEVICES for group in groups for p in group["params"]
        )
        return torch.optim.AdamW(
            groups, lr=self.lr, weight_decay=self.weight_decay, fused=fused or None
        )

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip as Lightning does, also for the fused AdamW.

        Lightning's mixed-precision plugin refuses to clip for any optimizer that can unscale
        gradients itself (fused AdamW), because under float16 it would clip scaled gradients.
        Under bfloat16 there is no scaler and nothing to unscale: the gradients are clipped
        by Lightning's base precision plugin. (This refusal stopped every training job on a GPU
        at its first step: `trainer=gpu` clips at 1.0.)
        """
        fused = bool(getattr(optimizer, "_step_supports_amp_scaling", False))
        plugin = self.trainer.precision_plugin
        if not gradient_clip_val or not fused or getattr(plugin, "scaler", None) is not None:
            self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)
            return
        # Lightning's own clipping, without the mixed-precision plugin's refusal in front of it.
        algorithm = GradClipAlgorithmType(gradient_clip_algorithm or GradClipAlgorithmType.NORM)
        Precision.clip_gradients(plugin, optimizer, float(gradient_clip_val), algorithm)

    def configure_optimizers(self) -> dict[str, Any]:
        groups = self.param_groups()
        if not groups:
            raise ValueError(
                "no trainable parameters: the peft method froze everything (use peft=none "
                "for evaluation without training)."
            )
        optimizer = self._adamw(groups)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        # A LambdaLR: the same warmup + cosine factor scales every group's own rate.
        scheduler = get_cosine_schedule_with_warmup(
            optimizer,
            num_warmup_steps=math.ceil(self.warmup_ratio * total),
            num_training_steps=total,
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }


class SampleCounter(L.Callback):
    """Adds the training samples of every micro-batch, over all ranks, to the `fit` phase, and
    this rank's batch counts (`BATCH_COUNTS_KEY`) to its `sums`."""

    def __init__(self, phase: Phase) -> None:
        self.phase = phase

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # type: ignore[no-untyped-def]
        self.phase.mark(int(batch["input_ids"].shape[0]) * trainer.world_size)
        for key, value in (batch.get(BATCH_COUNTS_KEY) or {}).items():
            self.phase.sums[key] = self.phase.sums.get(key, 0.0) + float(value)
