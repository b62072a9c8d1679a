"""A composed run config as a `memory.Setup`: architecture, method, trainer and batch sizes.

Nothing is downloaded and no weights are loaded: the model is built on the meta device from
its architecture config (a local checkpoint's config.json, or the copy shipped for its hub id),
the run's method is applied to it exactly as training applies it, and the activations of one
decoder layer with that method are measured on the CPU (cached under `paths.cache_dir`).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
from hydra.utils import get_class
from omegaconf import DictConfig

from medvqa.atomic import write_file
from medvqa.cluster import GPU_ACCELERATORS, device_count
from medvqa.errors import ConfigError
from medvqa.generation.lengths import generation_length
from medvqa.hashing import Hasher
from medvqa.models.adapters import (
    AUTO,
    apply_method,
    build_adapter_config,
    checkpoint_every,
    count_parameters,
    decoder_layers,
    mergeable_layers,
    on_meta,
)
from medvqa.models.architectures import image_tokens, meta_model
from medvqa.models.families.base import config_image_token, sharing_refusal
from medvqa.models.fp8 import fp8_params, fp8_supported
from medvqa.models.loading import architecture, roles, torch_dtype
from medvqa.models.spec import ModelSchema
from medvqa.planning.activations import LayerActivations, measure_layer
from medvqa.planning.memory import (
    AUTO_EVAL_BATCH,
    DEFAULT_GPU_GIB,
    TEXT_TOKENS,
    Setup,
    batch_if_fits,
    fastest_layout,
    merge_if_fits,
)
from medvqa.planning.rates import fp8_faster
from medvqa.training.spec import TrainerSchema
from medvqa.training.strategies import is_deepspeed

log = logging.getLogger(__name__)

# Under paths.cache_dir: one measured layer per (layer config, method, dtypes, versions).
CACHE = "plans"
# Trainer precision -> the autocast dtype the layer runs under (others: no autocast).
AUTOCAST = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


class PlanError(RuntimeError):
    """The configured run cannot be planned, or cannot fit; the message names the fix."""


def build_setup(
    cfg: DictConfig,
    gpu_gib: float | None = None,
    text_tokens: int = TEXT_TOKENS,
    devices: int | None = None,
) -> Setup:
    """The `Setup` of the composed config `cfg` for GPUs of `gpu_gib` (None: this machine's
    GPU, or `DEFAULT_GPU_GIB` without one); `devices` replaces a `trainer.devices` of -1."""
    config, preprocessor = architecture(cfg.model)  # as loaded: the processor, a shrunk rehearsal
    images = str(cfg.data.train_image) != "none"
    deepspeed = is_deepspeed(cfg.trainer.strategy)
    dtype = torch_dtype(cfg.model)
    trainable_dtype = dtype if deepspeed else torch.float32
    trainable, total, mergeable, fp8 = _counts(config, cfg, images, trainable_dtype)
    peft = cfg.peft

    text = config.get_text_config(decoder=True)
    heads = int(text.num_attention_heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    adapter = build_adapter_config(peft.adapter, None, roles(cfg.model))
    adapter = adapter if injectable(adapter) else None
    train_weights = "language" in peft.train_modules
    autocast = AUTOCAST.get(str(cfg.trainer.precision))
    cache = Path(cfg.paths.cache_dir) / CACHE
    n_devices, nodes = _devices(cfg.trainer, devices)
    source = get_class(str(cfg.dataset._target_))
    every = checkpoint_every(cfg.model.gradient_checkpointing)  # None: auto, decided below
    setup = Setup(
        model=str(cfg.model.name),
        params=total,
        trainable=trainable,
        dtype_bytes=_bytes(dtype),
        trainable_bytes=_bytes(trainable_dtype),
        layers=int(text.num_hidden_layers),
        hidden=int(text.hidden_size),
        vocab=int(text.vocab_size),
        kv_width=kv_heads * head_dim,
        intermediate=int(text.intermediate_size),
        layer=_measured(cache, config, adapter, train_weights, dtype, trainable_dtype, autocast),
        image_tokens=image_tokens(config, preprocessor, with_markers=True) if images else 0,
        text_tokens=int(text_tokens) + int(peft.virtual_tokens),
        micro_batch=int(cfg.data.batch_size),
        accumulate=int(cfg.trainer.accumulate_grad_batches),
        eval_batch=eval_batch_size(cfg.data, None),
        max_new_tokens=generation_length(cfg.model, source),
        checkpoint_every=1 if every is None else every,
        strategy="zero2" if deepspeed else ("ddp" if n_devices * nodes > 1 else "single"),
        devices=n_devices,
        nodes=nodes,
        offload_optimizer=_offloads_optimizer(cfg.trainer.strategy),
        gpu_gib=gpu_capacity_gib() if gpu_gib is None else float(gpu_gib),
        merged=mergeable if merges_adapters(cfg.model, None) else 0,  # auto: decided below
        shared_prefix=bool(cfg.model.share_image_prefix)
        and sharing_refusal(config, config_image_token(config)) is None,
        decode=str(cfg.model.decode),
        fp8_params=fp8 if uses_fp8(cfg.model, cfg.trainer.accelerator, planning=True) else 0,
    )
    if every is None:
        setup = fastest_layout(setup)
    on_gpu = str(cfg.trainer.accelerator) in GPU_ACCELERATORS
    if cfg.model.merge_adapters == "auto" and on_gpu:
        setup = merge_if_fits(setup, mergeable)
    if cfg.data.eval_batch_size == AUTO and on_gpu:
        setup = batch_if_fits(setup)
    return setup


def eval_batch_size(data_cfg: Any, planned: Setup | None) -> int:
    """The rows of a generation batch (`data.eval_batch_size`): as set, or under auto the
    plan's pick (`batch_if_fits`) where it ran, else `AUTO_EVAL_BATCH`."""
    value = data_cfg.eval_batch_size
    if value == AUTO:
        return planned.eval_batch if planned is not None else AUTO_EVAL_BATCH
    return int(value)


def uses_fp8(model_cfg: Any, accelerator: str, planning: bool = False) -> bool:
    """Whether the fit runs the frozen weights' GEMMs in FP8 (`model.fp8`, medvqa.models.fp8):
    true on a CUDA GPU with FP8 (refused elsewhere, except by a plan made on another machine:
    `planning`); auto only where a shipped measured row found it faster on this GPU
    (`rates.fp8_faster`), off with a log line otherwise; false never."""
    value = model_cfg.get("fp8", ModelSchema.fp8)
    if value is False or value is None:
        return False
    on_gpu = str(accelerator) in GPU_ACCELERATORS or (
        str(accelerator) == "auto" and torch.cuda.is_available()
    )
    why = fp8_supported() if on_gpu else f"trainer.accelerator={accelerator}"
    if value == AUTO:
        if why is None:
            gpu = torch.cuda.get_device_name()
            if fp8_faster(gpu):
                return True
            why = f"no shipped row measured it faster on {gpu} (benchmarks/gpu.py --setups none-8-compile-fp8)"
        if not planning:
            log.info("model.fp8=auto: off (%s)", why)
        return False
    if why is not None and not (planning and on_gpu):
        raise ConfigError(
            f"model.fp8=true: {why}; FP8 GEMMs need a CUDA GPU of compute capability 8.9+ "
            "(H100, L40S): use model.fp8=auto or false"
        )
    return True


def merges_adapters(model_cfg: Any, planned: Setup | None) -> bool:
    """Whether generation folds the adapters into copies of their base weights
    (`model.merge_adapters`): true or false as set; auto where the memory plan ran before the
    fit (`planned`: CUDA, `task.check_memory`) and found room for the copies (`merge_if_fits`)."""
    value = model_cfg.merge_adapters
    if value == "auto":
        return planned is not None and planned.merged > 0
    return bool(value)


def gpu_capacity_gib() -> float:
    """This machine's first GPU's memory, or an 80 GB GPU's where there is none."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory / 2**30
    return DEFAULT_GPU_GIB


def _counts(
    config: Any, cfg: DictConfig, images: bool, trainable_dtype: torch.dtype
) -> tuple[int, int, int, int]:
    """(trained, total, mergeable, fp8) parameters of the model with the run's method applied,
    on meta; mergeable: the base weights of the adapted layers (`model.merge_adapters` copies
    them while generating); fp8: the decoder layers' frozen weights `model.fp8` copies."""
    method, _ = on_meta(cfg.peft)
    model = meta_model(config, torch_dtype(cfg.model))
    with torch.device("meta"):  # adapters are created where the weights are: nowhere
        model = apply_method(model, method, roles(cfg.model), None, images, trainable_dtype)
    mergeable = sum(
        p.numel()
        for layer in mergeable_layers(model)
        for p in layer.get_base_layer().parameters(recurse=False)
    )
    fp8 = fp8_params(model, list(decoder_layers(model)))
    return (*count_parameters(model), mergeable, fp8)


def injectable(adapter: Any) -> bool:
    """Adapters that live in the decoder layers (LoRA, (IA)^3); prompt tuning's trainable
    tokens live in the embedding, and leave the layers frozen."""
    return adapter is not None and type(adapter).__name__ in ("LoraConfig", "IA3Config")


def _measured(
    cache: Path,
    config: Any,
    adapter: Any,
    train_weights: bool,
    dtype: torch.dtype,
    trainable_dtype: torch.dtype,
    autocast: torch.dtype | None,
) -> LayerActivations:
    """One layer's activations, measured where the run will train when this machine has a GPU
    (what autograd keeps depends on the attention kernel: on an H100 a LoRA layer of
    Mistral-7B keeps 251 KiB per token, on the CPU 365 KiB), else on the CPU (an upper bound)."""
    import transformers

    device = _local_gpu() if torch.cuda.is_available() else torch.device("cpu")
    text = config.get_text_config(decoder=True).to_dict()
    key = Hasher().update(
        {
            "device": device.type,
            "text": text,
            "adapter": None if adapter is None else adapter.to_dict(),
            "train_weights": train_weights,
            "dtypes": [str(dtype), str(trainable_dtype), str(autocast)],
            "versions": [torch.__version__, transformers.__version__],
        }
    )
    path = cache / f"{key.hexdigest()}.json"
    if path.is_file():
        return LayerActivations(**json.loads(path.read_text()))
    layer = measure_layer(
        config, adapter, train_weights, dtype, trainable_dtype, autocast, device=device
    )
    write_file(path, lambda tmp: tmp.write_text(json.dumps(layer.__dict__)))
    return layer


def _local_gpu() -> torch.device:
    """This rank's GPU: every rank plans before Lightning picks its device, and measuring on the
    first GPU from every rank would leave a CUDA context of each rank there."""
    local = os.environ.get("LOCAL_RANK") or os.environ.get("SLURM_LOCALID") or "0"
    return torch.device("cuda", int(local) % max(1, torch.cuda.device_count()))


def _devices(trainer_cfg: Any, devices: int | None) -> tuple[int, int]:
    """(devices per node, nodes); `trainer.devices=-1`/"auto" is every visible GPU, or
    `devices` (default 1) where none is visible."""
    nodes = int(trainer_cfg.get("num_nodes", TrainerSchema.num_nodes) or 1)
    value = trainer_cfg.get("devices", TrainerSchema.devices)
    count = device_count(value) or torch.cuda.device_count()
    if count:
        return count, nodes
    n = devices or 1
    log.warning("trainer.devices=%s (every visible GPU): none here; planning for %d", value, n)
    return n, nodes


def _offloads_optimizer(strategy: Any) -> bool:
    """DeepSpeed's optimizer state on the host: `offload_optimizer: true`, or Lightning's
    registry names ending in `_offload` (deepspeed_stage_2_offload)."""
    if isinstance(strategy, DictConfig):
        return bool(strategy.get("offload_optimizer", False))
    return isinstance(strategy, str) and strategy.endswith("_offload")


def _bytes(dtype: torch.dtype) -> int:
    return torch.finfo(dtype).bits // 8
