"""Activation memory of one decoder layer, measured: what autograd keeps for the backward pass.

Per token and per layer, the bytes a training step keeps depend on the layer type (the norms'
fp32 upcasts, the attention kernel's saved tensors, the MLP), the method (LoRA keeps a bf16 copy
of each adapted module's input, dropout its masks and dropped inputs; full fine-tuning keeps the
bf16 copies autocast makes of its fp32 weights) and the dtypes. Rather than a formula per
family, the real layer is run: the language model of the architecture, with two decoder layers,
is built on the meta device and materialised on the CPU without initialisation (values do not
matter, only which tensors are saved), the method is injected, and the storages autograd saves
while the second layer runs forward (its input requires grad, as for every layer but the first)
are counted under bf16 autocast. Two sequence lengths separate the per-token bytes from those a
forward keeps whatever its length (autocast's weight copies).

Non-reentrant checkpointing keeps only each layer's input (the hidden state) and recomputes
one layer at a time in the backward pass: `hidden_bytes` per token per layer, plus one layer's
full activations at the peak.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

# Sequence lengths the layer runs at; their difference gives the bytes per token.
TOKEN_COUNTS = (32, 64)


@dataclass(frozen=True)
class LayerActivations:
    """Bytes one decoder layer keeps for the backward pass of a training step."""

    per_token: float  # per token of the batch (all samples' tokens together)
    per_forward: float  # per forward whatever its length (e.g. autocast's bf16 weight copies)
    hidden_bytes: float  # per token, under checkpointing: the layer's input hidden state


def text_config(config: Any) -> Any:
    """The language model's config of a VLM config (a deep copy, safe to change)."""
    return copy.deepcopy(config.get_text_config(decoder=True))


def _two_layers(config: Any) -> Any:
    """`config` cut to two decoder layers, a tiny vocabulary and SDPA attention."""
    small = text_config(config)
    small.num_hidden_layers = 2
    layer_types = getattr(small, "layer_types", None)
    if layer_types:  # Gemma 3 / Qwen: per-layer attention kinds, one entry per layer
        small.layer_types = list(layer_types)[:2]
    small.vocab_size = 8
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if getattr(small, key, None) is not None:
            setattr(small, key, 0)
    small._attn_implementation = "sdpa"
    return small


def measure_layer(
    config: Any,
    adapter: Any = None,
    train_weights: bool = False,
    dtype: torch.dtype = torch.bfloat16,
    trainable_dtype: torch.dtype = torch.float32,
    autocast: torch.dtype | None = torch.bfloat16,
    device: torch.device | str = "cpu",
) -> LayerActivations:
    """Measure one decoder layer of `config`'s language model on the CPU, under autocast to
    `autocast` (the trainer's mixed precision; None: none, e.g. "32-true").

    `adapter`: a peft config (LoRA, (IA)^3) with plain module names as targets, or None;
    `train_weights`: the layer's own weights are trained (full fine-tuning). Neither: a frozen
    layer whose input still needs a gradient (prompt tuning: the trained tokens come first).
    """
    from transformers import AutoModel

    small = _two_layers(config)
    with torch.device("meta"):
        model = AutoModel.from_config(small, dtype=dtype)
        if adapter is not None:
            from peft import inject_adapter_in_model

            model = inject_adapter_in_model(copy.deepcopy(adapter), model)
    # Uninitialised: which tensors are saved does not need values. On a GPU the attention kernel
    # (and so what it saves) may differ: benchmarks/gpu.py measures there with the same code.
    model.to_empty(device=device)
    for name, param in model.named_parameters():
        trained = train_weights or (adapter is not None and _is_adapter(name))
        param.requires_grad_(trained)
        if trained and param.is_floating_point():
            param.data = param.data.to(trainable_dtype)
    model.train()
    layers = _decoder_layers(model)
    saved = [
        _saved_bytes(model, layers[1], small.hidden_size, dtype, autocast, n) for n in TOKEN_COUNTS
    ]
    short, long = TOKEN_COUNTS
    per_token = (saved[1] - saved[0]) / (long - short)
    per_forward = max(0.0, saved[0] - per_token * short)
    hidden = small.hidden_size * torch.finfo(dtype).bits / 8
    return LayerActivations(per_token=per_token, per_forward=per_forward, hidden_bytes=hidden)


def _is_adapter(name: str) -> bool:
    return any(part in name for part in ("lora_", "ia3_"))


def _decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    layers = getattr(model, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) < 2:
        raise TypeError(f"{type(model).__name__} has no `layers` list of decoder layers")
    return layers


def _saved_bytes(
    model: torch.nn.Module,
    layer: torch.nn.Module,
    hidden: int,
    dtype: torch.dtype,
    autocast: torch.dtype | None,
    tokens: int,
) -> float:
    """Bytes of the distinct storages autograd saves while `layer` runs forward (parameters,
    which exist anyway, excluded)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}
    inside = [False]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if inside[0]:
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in params:
                storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    hooks = [
        layer.register_forward_pre_hook(lambda *_: inside.__setitem__(0, True)),
        layer.register_forward_hook(lambda *_: inside.__setitem__(0, False)),
    ]
    device = next(model.parameters()).device
    embeds = torch.zeros(1, tokens, hidden, dtype=dtype, device=device, requires_grad=True)
    mask = torch.ones(1, tokens, dtype=torch.long, device=device)
    try:
        with (
            torch.autocast(
                device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None
            ),
            torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor),
        ):
            model(inputs_embeds=embeds, attention_mask=mask, use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    return float(sum(storages.values()))
