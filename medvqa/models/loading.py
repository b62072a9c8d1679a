"""Load a VLM and its processor: the same `from_pretrained` call for hub ids and local dirs."""

from __future__ import annotations

import logging
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from transformers import AutoModelForImageTextToText, AutoProcessor

import medvqa.models.processors  # noqa: F401  (registers torchvision-free processors)

log = logging.getLogger(__name__)


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


def roles(model_cfg: Any) -> dict[str, str]:
    """The family's module names for vision tower, projector, language model, lm head."""
    modules = model_cfg.modules
    if isinstance(modules, DictConfig):
        return dict(OmegaConf.to_container(modules, resolve=True))  # type: ignore[arg-type]
    return asdict(modules) if is_dataclass(modules) else dict(modules)


def load_vlm(model_cfg: Any) -> tuple[torch.nn.Module, Any]:
    """Return (model, processor) loaded with AutoModelForImageTextToText / AutoProcessor."""
    source = resolve_pretrained(model_cfg)
    remote = bool(model_cfg.get("trust_remote_code", False))
    try:
        processor = AutoProcessor.from_pretrained(source, trust_remote_code=remote)
        model = AutoModelForImageTextToText.from_pretrained(
            source, dtype=getattr(torch, model_cfg.dtype), trust_remote_code=remote
        )
    except OSError as err:
        hint = (
            "it is not a local directory and the model hub is unreachable: download the model "
            "elsewhere and set model.pretrained to its local path"
            if not Path(source).exists()
            else "the directory is incomplete or corrupt: rebuild or re-download it"
        )
        raise OSError(f"cannot load model {model_cfg.name!r} from {source!r}: {hint}.") from err
    if getattr(processor, "tokenizer", None) is None:
        raise ValueError(
            f"AutoProcessor.from_pretrained({source!r}) returned no multimodal processor; the "
            "family's processor is not registered (see docs/offline.md on torchvision-free setups)."
        )
    log.info("loaded %s (%s) from %s", model_cfg.name, type(model).__name__, source)
    return model, processor
