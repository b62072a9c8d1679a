"""Load a VLM and its processor: the same `from_pretrained` call for hub ids and local dirs."""

from __future__ import annotations

import importlib.util
import json
import logging
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from transformers import AutoModelForImageTextToText, AutoProcessor

import medvqa.models.processors  # noqa: F401  (registers torchvision-free processors)
from medvqa.errors import ConfigError
from medvqa.models.architectures import load_architecture, shrink
from medvqa.models.prompting import chat_template
from medvqa.models.rehearsal import random_vlm
from medvqa.models.spec import SHRUNK, ModelSchema, random_weights_kind

if TYPE_CHECKING:
    from transformers import PretrainedConfig

log = logging.getLogger(__name__)

ATTN_IMPLEMENTATIONS = ("sdpa", "flash_attention_2", "eager")


def model_option(model_cfg: Any, key: str) -> Any:
    """`model_cfg.key`, or ModelSchema's default when a bare spec (e.g. a test's) omits it."""
    return model_cfg.get(key, getattr(ModelSchema, key))


def torch_dtype(model_cfg: Any) -> torch.dtype:
    """The torch dtype the base weights are loaded in (`model.dtype`, e.g. "bfloat16")."""
    name = str(model_option(model_cfg, "dtype"))
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(
            f"model.dtype={name!r} is not a torch dtype; use float32, bfloat16 or float16."
        )
    return dtype


def attn_implementation(model_cfg: Any) -> str:
    """`model.attn_implementation`, checked: a known kernel whose package is installed."""
    name = str(model_option(model_cfg, "attn_implementation"))
    if name not in ATTN_IMPLEMENTATIONS:
        raise ValueError(
            f"model.attn_implementation={name!r} is not supported; choose one of "
            f"{list(ATTN_IMPLEMENTATIONS)}."
        )
    if name == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        raise ImportError(
            "model.attn_implementation=flash_attention_2 needs the flash-attn package, which is "
            "not installed: pip install flash-attn --no-build-isolation (CUDA GPUs only), or "
            "set model.attn_implementation=sdpa."
        )
    return name


# The original LLaVA-Med v1.5 release's model type (its own code base, not transformers').
ORIGINAL_LLAVA_TYPE = "llava_mistral"


def _model_type(source: str) -> str | None:
    """`model_type` of a local checkpoint's config.json (None for hub ids or no config)."""
    config = Path(source) / "config.json"
    try:
        return json.loads(config.read_text()).get("model_type") if config.is_file() else None
    except (OSError, ValueError):
        return None


def processor_kwargs(model_cfg: Any) -> dict[str, Any]:
    """`model.processor_kwargs` as plain values: what AutoProcessor.from_pretrained gets, over
    the checkpoint's own processor files (e.g. Qwen's max_pixels). Remote code has one switch,
    `model.trust_remote_code`, passed beside these on every path (a rehearsal's too)."""
    kwargs = model_cfg.get("processor_kwargs")  # a bare spec (a test's) may omit it
    if isinstance(kwargs, DictConfig):
        kwargs = OmegaConf.to_container(kwargs, resolve=True)
    if "trust_remote_code" in (kwargs or {}):
        raise ConfigError(
            "model.processor_kwargs.trust_remote_code: remote code is turned on by "
            "model.trust_remote_code alone (for the processor and the model together); "
            "remove it from processor_kwargs and set model.trust_remote_code=true instead."
        )
    return dict(kwargs or {})


def resolve_pretrained(model_cfg: Any) -> str:
    """A local directory or hub id; an offline `builder` (e.g. the tiny model) makes one first."""
    if model_cfg.get("builder") is not None:
        return str(instantiate(model_cfg.builder).build())
    if not model_cfg.get("pretrained"):
        raise ValueError(
            f"model {model_cfg.name!r}: set model.pretrained to a local directory or hub id "
            "(or give a builder)."
        )
    return str(model_cfg.pretrained)


def random_weights(model_cfg: Any) -> str | None:
    """`model.random_weights` as None (the checkpoint's weights), "full" or "shrunk"."""
    return random_weights_kind(model_option(model_cfg, "random_weights"))


def architecture(model_cfg: Any) -> tuple[PretrainedConfig, dict[str, Any]]:
    """The architecture and image-token fields of the model as it will be loaded: the local
    checkpoint's or the shipped config (no weights, no network), shrunk for a shrunk
    rehearsal, with `model.processor_kwargs` over the processor files' fields."""
    config, preprocessor = load_architecture(resolve_pretrained(model_cfg))
    if random_weights(model_cfg) == SHRUNK:
        config = shrink(config)
    return config, {**preprocessor, **processor_kwargs(model_cfg)}


def roles(model_cfg: Any) -> dict[str, str]:
    """The family's module names for vision tower, projector, language model, lm head."""
    modules = model_cfg.modules
    if isinstance(modules, DictConfig):
        return dict(OmegaConf.to_container(modules, resolve=True))  # type: ignore[arg-type]
    return asdict(modules) if is_dataclass(modules) else dict(modules)


def apply_liger_kernels(model: torch.nn.Module) -> None:
    """Liger's Triton kernels in place of the language (and, where Liger has them, vision)
    model's RMSNorm, SwiGLU MLP and rotary embedding (`model.liger_kernels`), patched on this
    instance as transformers' Trainer does (`use_liger_kernel`). Fused cross-entropy stays off:
    the training loss is computed at the labelled positions only (`causal_lm_loss`).

    RoPE is patched in the transformers modeling module, so it holds for every model of that
    family in the process.
    """
    if not torch.cuda.is_available():
        raise RuntimeError(
            "model.liger_kernels=true: Liger's kernels are Triton kernels for CUDA GPUs; this "
            "machine has none. Set model.liger_kernels=false."
        )
    try:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance
    except ImportError as err:
        raise ImportError(
            "model.liger_kernels=true needs the liger-kernel package: pip install liger-kernel "
            "(or set model.liger_kernels=false)"
        ) from err
    _apply_liger_kernel_to_instance(model, cross_entropy=False, fused_linear_cross_entropy=False)
    log.info("Liger kernels applied to %s", type(model).__name__)


def load_vlm(model_cfg: Any) -> tuple[torch.nn.Module, Any]:
    """Return (model, processor) loaded with AutoModelForImageTextToText / AutoProcessor.

    The weights come in `model.dtype` with `model.attn_implementation`'s attention kernel;
    `model.random_weights` draws them instead (a rehearsal, `medvqa.models.rehearsal`).
    """
    attention = attn_implementation(model_cfg)  # before building or loading anything
    dtype = torch_dtype(model_cfg)
    source = resolve_pretrained(model_cfg)
    remote = bool(model_option(model_cfg, "trust_remote_code"))
    if random_weights(model_cfg) is not None:
        model, processor = random_vlm(
            str(model_cfg.name),
            source,
            architecture(model_cfg),
            dtype,
            attention,
            processor_kwargs(model_cfg),
            remote,
        )
    else:
        model, processor = _from_pretrained(model_cfg, source, dtype, attention, remote)
    if getattr(processor, "tokenizer", None) is None:
        raise ValueError(
            f"AutoProcessor.from_pretrained({source!r}) returned no multimodal processor; the "
            "family's processor is not registered (see docs/offline.md on torchvision-free setups)."
        )
    _keep_load_settings_off_calls(processor, processor_kwargs(model_cfg))
    template = model_option(model_cfg, "chat_template")
    if template is not None:
        processor.chat_template = chat_template(str(template))
    if model_option(model_cfg, "liger_kernels"):
        apply_liger_kernels(model)
    log.info(
        "loaded %s (%s, %s, %s attention) from %s",
        model_cfg.name,
        type(model).__name__,
        dtype,
        attention,
        source,
    )
    return model, processor


def _keep_load_settings_off_calls(processor: Any, kwargs: dict[str, Any]) -> None:
    """AutoProcessor.from_pretrained also gives its keyword arguments to the tokenizer, and
    transformers passes the tokenizer's init kwargs to every call as defaults: Qwen's
    `min_pixels`/`max_pixels`, already in the image processor's `size` when it was built, came
    back on each call (a FutureWarning per process; the call-time keys go in transformers 5.23)
    and into a saved tokenizer_config.json. Keys the tokenizer does not have leave its init
    kwargs."""
    tokenizer = processor.tokenizer
    init = getattr(tokenizer, "init_kwargs", None)
    if isinstance(init, dict):
        for key in kwargs:
            if key in init and not hasattr(tokenizer, key):
                del init[key]


def _from_pretrained(
    model_cfg: Any, source: str, dtype: torch.dtype, attention: str, remote: bool
) -> tuple[torch.nn.Module, Any]:
    """The checkpoint's processor and weights, with the fix named for each way that fails."""
    try:
        processor = AutoProcessor.from_pretrained(
            source, trust_remote_code=remote, **processor_kwargs(model_cfg)
        )
        model = AutoModelForImageTextToText.from_pretrained(
            source, dtype=dtype, attn_implementation=attention, trust_remote_code=remote
        )
    except OSError as err:
        hint = (
            "it is not a local directory and the model hub is unreachable: download the model "
            "elsewhere and set model.pretrained to its local path"
            if not Path(source).exists()
            else "the directory is incomplete or corrupt: rebuild or re-download it"
        )
        raise OSError(f"cannot load model {model_cfg.name!r} from {source!r}: {hint}.") from err
    except (ValueError, KeyError) as err:
        if ORIGINAL_LLAVA_TYPE in str(err) or _model_type(source) == ORIGINAL_LLAVA_TYPE:
            raise ValueError(
                f"model {model_cfg.name!r}: {source!r} is the original LLaVA(-Med) checkpoint "
                f"layout (model_type {ORIGINAL_LLAVA_TYPE!r}), which transformers cannot load. "
                "Convert it once into transformers' LLaVA format with `medvqa-convert llava-med "
                f"{source} DST` (or `python -m medvqa.models.convert llava-med {source} DST`; add "
                "`--vision-tower CLIP_DIR`, a local openai/clip-vit-large-patch14-336, if the "
                "checkpoint lacks the tower's weights) and set model.pretrained=DST; or use a "
                "converted copy (model=llava_med defaults to "
                "chaoyinshe/llava-med-v1.5-mistral-7b-hf)."
            ) from err
        raise
    return model, processor
