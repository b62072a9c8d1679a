"""Apply a fine-tuning method (a `peft=` config) to a loaded VLM.

One function reads the method's data: which peft adapter (if any) and where, and which model
parts are trained as full weights. There is no per-method branch: `full` is "no adapter, train
the language model and projector", `none` is "no adapter, train nothing".
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from hydra.utils import instantiate
from peft import PeftConfig, get_peft_model

log = logging.getLogger(__name__)


def build_adapter_config(
    adapter_cfg: Any, scope: str | None, roles: Mapping[str, str]
) -> PeftConfig | None:
    """Instantiate the peft config; confine `target_modules` to the model part `scope`.

    CLIP/SigLIP vision towers reuse `q_proj`/`v_proj`, so plain names would also adapt the
    vision tower; a regex over the scope's module name keeps adapters in the language model.
    """
    if adapter_cfg is None:
        return None
    config: PeftConfig = instantiate(adapter_cfg, _convert_="all")  # lists, not ListConfig
    targets = getattr(config, "target_modules", None)
    if scope is not None and targets is not None and not isinstance(targets, str):
        if scope not in roles:
            raise KeyError(
                f"peft.adapter_scope={scope!r} is not a model role; roles: {list(roles)}"
            )
        names = "|".join(re.escape(t) for t in sorted(targets))
        config.target_modules = rf".*{re.escape(roles[scope])}\..*\.({names})"
    return config


def set_trainable(
    model: torch.nn.Module, train_modules: Sequence[str], roles: Mapping[str, str]
) -> None:
    """Unfreeze the parameters of the named model roles (e.g. projector, language)."""
    for role in train_modules:
        if role not in roles:
            raise KeyError(
                f"peft.train_modules entry {role!r} is not a model role; roles: {list(roles)}"
            )
        fragment = f"{roles[role]}."
        hits = [p for n, p in model.named_parameters() if fragment in f"{n}."]
        if not hits:
            raise ValueError(
                f"model role {role!r} (module name {roles[role]!r}) matches no parameter; fix "
                "model.modules for this family."
            )
        for p in hits:
            p.requires_grad_(True)


def apply_method(
    model: torch.nn.Module, peft_cfg: Any, roles: Mapping[str, str]
) -> torch.nn.Module:
    """Freeze the base, wrap it with the method's adapter, unfreeze its full-weight parts."""
    model.requires_grad_(False)
    adapter = build_adapter_config(peft_cfg.adapter, peft_cfg.adapter_scope, roles)
    if adapter is not None:
        model = get_peft_model(model, adapter)
    set_trainable(model, list(peft_cfg.train_modules), roles)
    n_train, n_all = count_parameters(model)
    log.info(
        "method %s: %d of %d parameters trainable (%.2f%%)",
        peft_cfg.name,
        n_train,
        n_all,
        100.0 * n_train / max(n_all, 1),
    )
    return model


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in model.parameters())
