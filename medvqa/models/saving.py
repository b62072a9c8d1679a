"""Save and reload what a fine-tuning method trained (adapter, projector, or the full LM).

One safetensors file of the trainable parameters, whatever the method: reloading is "load the
base, apply the same method, load this file", so the same code path serves LoRA, (IA)^3,
prompt tuning and full fine-tuning.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

log = logging.getLogger(__name__)

WEIGHTS_FILE = "trainable.safetensors"
META_FILE = "trainable.json"


def save_trainable(model: torch.nn.Module, out_dir: Path, method: str) -> Path:
    """Write the trainable parameters (contiguous CPU copies) and a small manifest."""
    state = {
        name: param.detach().to("cpu").contiguous()
        for name, param in model.named_parameters()
        if param.requires_grad
    }
    if not state:
        raise ValueError(f"method {method!r} trained no parameters; nothing to save")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / WEIGHTS_FILE
    save_file(state, str(path), metadata={"method": method})
    meta = {
        "method": method,
        "n_tensors": len(state),
        "n_params": sum(t.numel() for t in state.values()),
    }
    (out_dir / META_FILE).write_text(json.dumps(meta, indent=2))
    log.info("saved %d trained tensors (%d parameters) to %s", len(state), meta["n_params"], path)
    return path


def load_trainable(model: torch.nn.Module, weights_dir: Path, method: Any = None) -> None:
    """Load saved trainable parameters into a model that has the same method applied."""
    path = Path(weights_dir) / WEIGHTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; train with task=train_eval first")
    state = load_file(str(path))
    expected = {n for n, p in model.named_parameters() if p.requires_grad}
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(
            f"{path} does not match the model's trainable parameters (method {method!r}): "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}. Apply the same peft method "
            "and model before loading."
        )
    model.load_state_dict(state, strict=False)
