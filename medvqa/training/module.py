"""The LightningModule that fine-tunes a VLM (any method: the model arrives already adapted)."""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch
from transformers import get_cosine_schedule_with_warmup

from medvqa.models.adapters import role_parameters
from medvqa.training.datamodule import META_KEY
from medvqa.training.spec import PeftSchema


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

    def _loss(self, batch: dict[str, Any]) -> torch.Tensor:
        inputs = {k: v for k, v in batch.items() if k != META_KEY}
        return self.model(**inputs).loss

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        # Every rank takes the same decision: a rank that stopped alone would leave the others
        # waiting in the gradient all-reduce until the process group times out (30 minutes).
        finite = bool(torch.isfinite(loss.detach()))
        if not self.trainer.strategy.reduce_boolean_decision(finite, all=True):
            raise Diverged(self.global_step, float(loss.detach()))
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["input_ids"].shape[0])
        return loss

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
        fused = all(p.is_cuda for group in groups for p in group["params"])
        return torch.optim.AdamW(
            groups, lr=self.lr, weight_decay=self.weight_decay, fused=fused or None
        )

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
