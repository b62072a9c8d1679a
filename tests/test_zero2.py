"""DeepSpeed ZeRO-2 wiring on CPU (test-only strategy): adapters train, save non-empty, reload;
checkpoints hold only the trained tensors and resume."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import DictConfig, OmegaConf

from medvqa.models.adapters import apply_method
from medvqa.models.loading import load_vlm, roles
from medvqa.models.saving import WEIGHTS_FILE, load_trainable, save_trainable
from medvqa.training.checkpoints import load_weights_only
from medvqa.training.datamodule import VQADataset, make_loader
from medvqa.training.module import VQAModule
from medvqa.training.strategies import deepspeed_safe_globals
from tests.conftest import SMALL, compose

deepspeed = pytest.importorskip("deepspeed", reason="deepspeed is in the dev extra")

# What DeepSpeed writes under a checkpoint "file" (a directory): <ckpt>/checkpoint/<these>.
MODEL_STATES = "mp_rank_00_model_states.pt"
OPTIM_STATES = "*optim_states.pt"


def _lora_setup(
    tiny_model_dir: Path, cache_dir: Path
) -> tuple[DictConfig, DictConfig, torch.nn.Module, torch.utils.data.DataLoader]:
    """The tiny LLaVA with LoRA and a 16-example loader (4 steps of 4)."""
    from hydra.utils import instantiate

    cfg = compose([*SMALL, "peft=lora"], cache_dir)
    spec = OmegaConf.create({"name": "tiny", "pretrained": str(tiny_model_dir), "dtype": "float32"})
    model, processor = load_vlm(spec)
    model = apply_method(model, cfg.peft, roles(cfg.model))
    source = instantiate(cfg.dataset)
    loader = make_loader(
        VQADataset(source.table().head(16), source, processor, with_answer=True),
        4,
        shuffle=False,
        padding_side="right",
    )
    return cfg, spec, model, loader


def _zero2_trainer(
    max_steps: int, exclude_frozen: bool = False, offload: bool = False, **kwargs: Any
) -> L.Trainer:
    from tests.zero2_cpu import CPUZero2Strategy

    return L.Trainer(
        accelerator="cpu",
        strategy=CPUZero2Strategy(
            exclude_frozen_parameters=exclude_frozen, offload_optimizer=offload
        ),
        precision="bf16-mixed",
        max_steps=max_steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


def _tensors(node: Any) -> Iterator[torch.Tensor]:
    """Every tensor anywhere in a loaded checkpoint (nested dicts, lists, tuples)."""
    if isinstance(node, torch.Tensor):
        yield node
    elif isinstance(node, Mapping):
        for value in node.values():
            yield from _tensors(value)
    elif isinstance(node, list | tuple):
        for value in node:
            yield from _tensors(value)


def test_zero2_trains_saves_and_reloads_the_adapter(
    tiny_model_dir: Path, cache_dir: Path, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    cfg, spec, model, loader = _lora_setup(tiny_model_dir, cache_dir)
    trainer = _zero2_trainer(2, enable_checkpointing=False)
    trainer.fit(VQAModule(model, lr=1e-2, projector_lr=None), train_dataloaders=loader)
    assert isinstance(trainer.strategy.model, deepspeed.DeepSpeedEngine)
    assert trainer.strategy.config["zero_optimization"]["stage"] == 2
    assert trainer.global_step == 2

    save_trainable(model, tmp_path, "lora")
    saved = load_file(str(tmp_path / WEIGHTS_FILE))
    assert saved and all(t.numel() > 0 and torch.isfinite(t.float()).all() for t in saved.values())
    lora_b = [t for name, t in saved.items() if "lora_B" in name]
    assert lora_b and any(t.abs().sum() > 0 for t in lora_b), "ZeRO-2 updated the adapter"

    fresh, _ = load_vlm(spec)
    fresh = apply_method(fresh, cfg.peft, roles(cfg.model))
    load_trainable(fresh, tmp_path, "lora")
    for name, param in fresh.named_parameters():
        if param.requires_grad:
            assert torch.equal(param.detach(), saved[name].to(param.dtype)), name


class _AtTrainStart(L.Callback):
    """What the resumed run starts from: after the checkpoint is restored, before any step."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.global_step = -1
        self.scheduler_epoch = -1
        self.tensor = torch.empty(0)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.global_step = trainer.global_step
        self.scheduler_epoch = trainer.lr_scheduler_configs[0].scheduler.last_epoch
        self.tensor = pl_module.get_parameter(self.name).detach().clone()


def test_zero2_checkpoint_holds_only_trained_tensors_and_resumes(
    tiny_model_dir: Path, cache_dir: Path, tmp_path: Path
) -> None:
    """`exclude_frozen_parameters` (conf/trainer/deepspeed_zero2.yaml): no frozen base on disk."""
    cfg, spec, model, loader = _lora_setup(tiny_model_dir, cache_dir)
    # The LightningModule's keys, as DeepSpeed names them (VQAModule keeps the VLM as `model`).
    trainable = {f"model.{n}": p.numel() for n, p in model.named_parameters() if p.requires_grad}
    frozen = {f"model.{n}": p.numel() for n, p in model.named_parameters() if not p.requires_grad}
    assert any("multi_modal_projector" in n for n in trainable), "LoRA trains the projector too"
    assert sum(frozen.values()) > sum(trainable.values())

    ckpt_dir = tmp_path / "checkpoints"

    def checkpointing() -> ModelCheckpoint:  # as conf/callbacks/default.yaml, every 2 steps
        return ModelCheckpoint(dirpath=ckpt_dir, save_last=True, every_n_train_steps=2)

    first = _zero2_trainer(2, exclude_frozen=True, callbacks=[checkpointing()])
    first.fit(VQAModule(model, lr=1e-2, projector_lr=None), train_dataloaders=loader)
    last = ckpt_dir / "last.ckpt"
    assert last.is_dir(), "a DeepSpeed checkpoint is a directory"

    # The model-states file: the module's state_dict, DeepSpeed's bookkeeping, Lightning's
    # client state (loops, callbacks, schedulers). Its tensors are exactly the trained ones.
    states = torch.load(last / "checkpoint" / MODEL_STATES, map_location="cpu", weights_only=True)
    module = states["module"]
    assert set(module) == set(trainable)
    assert {n: t.numel() for n, t in module.items()} == trainable
    assert states["frozen_param_fragments"] is None and states["frozen_param_shapes"] is None
    assert states["global_step"] == 2
    multi_element = sum(t.numel() for t in _tensors(states) if t.dim() > 0)
    assert multi_element == sum(trainable.values()), "no frozen tensor hides elsewhere in the file"
    # The optimizer file: ZeRO's fp32 master copy and Adam moments, of the trained tensors only.
    (optim_file,) = (last / "checkpoint").glob(OPTIM_STATES)
    optim = load_weights_only(optim_file, "cpu", deepspeed_safe_globals())["optimizer_state_dict"]
    master = optim["single_partition_of_fp32_groups"]
    assert sum(t.numel() for t in master) == sum(trainable.values())

    # Without the option the same engine writes the frozen base too: in the module state and,
    # for ZeRO >= 2, again as frozen_param_fragments.
    first.strategy.exclude_frozen_parameters = False
    first.save_checkpoint(tmp_path / "full.ckpt")
    full = torch.load(
        tmp_path / "full.ckpt" / "checkpoint" / MODEL_STATES, map_location="cpu", weights_only=True
    )
    assert set(frozen) <= set(full["module"]) and full["frozen_param_fragments"]

    # Resume with a fresh model (a new LoRA init) and a fresh trainer through `ckpt_path=last`,
    # the way a requeued job does.
    name = next(n for n in trainable if "lora_B" in n)
    assert module[name].abs().sum() > 0, "training moved lora_B away from its zero init"
    fresh, _ = load_vlm(spec)
    fresh = apply_method(fresh, cfg.peft, roles(cfg.model))
    assert not torch.equal(fresh.get_parameter(name.removeprefix("model.")), module[name])
    probe = _AtTrainStart(name)
    second = _zero2_trainer(4, exclude_frozen=True, callbacks=[checkpointing(), probe])
    second.fit(
        VQAModule(fresh, lr=1e-2, projector_lr=None), train_dataloaders=loader, ckpt_path="last"
    )
    assert Path(second.ckpt_path) == last
    assert probe.global_step == 2 and probe.scheduler_epoch == 2
    assert torch.equal(probe.tensor, module[name]), "the trained adapter was restored"
    assert second.global_step == 4


@pytest.mark.slow
def test_zero2_offloads_the_optimizer_with_deepspeeds_cpu_adam(
    tiny_model_dir: Path, cache_dir: Path
) -> None:
    """What task=plan suggests when no number of GPUs holds the optimizer state:
    `++trainer.strategy.offload_optimizer=true`. DeepSpeed refuses torch's AdamW there
    (ZeRORuntimeException: "ZeRO-Offload with a client provided optimizer"); the module gives it
    DeepSpeed's CPU AdamW (compiled on first use, ~1 minute)."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    _, _, model, loader = _lora_setup(tiny_model_dir, cache_dir)
    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    trainer = _zero2_trainer(2, offload=True, enable_checkpointing=False)
    trainer.fit(VQAModule(model, lr=1e-2, projector_lr=None), train_dataloaders=loader)
    assert trainer.global_step == 2
    assert isinstance(trainer.strategy.model.optimizer.optimizer, DeepSpeedCPUAdam)
    assert any(p.abs().sum() > 0 for p in lora_b), "the offloaded optimizer updated the adapter"
