"""FP8 matmuls for the frozen base weights during a fit (`model.fp8`).

A LoRA or (IA)³ fit spends most of its step in the frozen projections' GEMMs: the forward and
the gradient with respect to their input (a frozen weight needs no gradient of its own). On GPUs
with FP8 tensor cores (compute capability 8.9+: Ada, Hopper, Blackwell) those two GEMMs can run in
float8 e4m3 at twice bf16's rate; the adapters, norms, attention and everything trained stay in
the autocast dtype. The scaling is the "row-wise" recipe: each row of the activations and of the
incoming gradient gets its own scale; the frozen weight one scale per tensor, so that its one
FP8 copy serves both GEMMs (a per-row weight scale would not factor out of the backward's sum).

The copy is made once per fit (one byte per frozen weight; the plan counts it:
`planning.memory`) and dropped when a validation or generation switches the model to eval, which
runs the weights as they are (FP8 is never used for answers). The layers keep their class's
state-dict keys: the swap changes only `forward`, and the classes go back after the fit.

Matmuls run through `torch._scaled_mm`, which CUDA and (slowly, for tests) the CPU both have.
Dimensions must be multiples of 16 on CUDA; other layers stay as they are.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
# GPUs with FP8 tensor cores (torch.cuda.get_device_capability)
MIN_CAPABILITY = (8, 9)
# `_scaled_mm`'s operands on CUDA: both inner and outer dimensions multiples of this
ALIGN = 16
# a row of zeros still needs a finite scale
_TINY = 1e-12


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`x` (2-D) in e4m3 with one float32 scale per row (`x ≈ q * scale`)."""
    scale = x.detach().abs().amax(dim=1, keepdim=True).float().clamp(min=_TINY) / FP8_MAX
    return (x.float() / scale).to(FP8), scale


def quantize_tensor(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`w` in e4m3 with one float32 scale for the whole tensor."""
    scale = w.detach().abs().amax().float().clamp(min=_TINY) / FP8_MAX
    return (w.detach().float() / scale).to(FP8), scale


class _FrozenFp8Matmul(torch.autograd.Function):
    """y = x Wᵀ and dx = dy W in FP8 with the frozen weight's FP8 copy; no gradient for W."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, out_dtype):  # type: ignore[override]
        x_q, x_scale = quantize_rows(x)
        ctx.save_for_backward(w_q, w_scale)
        ctx.x_dtype = x.dtype
        scale_w = w_scale.reshape(1, 1).expand(1, w_q.shape[0]).contiguous()
        return torch._scaled_mm(x_q, w_q.t(), scale_a=x_scale, scale_b=scale_w, out_dtype=out_dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        w_q, w_scale = ctx.saved_tensors
        g_q, g_scale = quantize_rows(grad.contiguous())
        scale_w = w_scale.reshape(1, 1).expand(1, w_q.shape[1]).contiguous()
        # _scaled_mm wants its second operand column-major: Wᵀ made contiguous, viewed back
        w_cols = w_q.t().contiguous().t()
        dx = torch._scaled_mm(g_q, w_cols, scale_a=g_scale, scale_b=scale_w, out_dtype=ctx.x_dtype)
        return dx, None, None, None


class Fp8FrozenLinear(nn.Linear):
    """An `nn.Linear` whose frozen weight runs in FP8 while training (class swapped in by
    `fp8_frozen_weights`; its parameters and keys are the Linear's own). The FP8 copy is made
    when the layer enters training mode and dropped when it leaves it: the weight is frozen in
    between, and `forward` reads no version counter a compiled layer would have to guard."""

    _fp8: tuple[torch.Tensor, torch.Tensor] | None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._fp8 is None or not (self.training and torch.is_grad_enabled()):
            return F.linear(x, self.weight, self.bias)
        device = x.device.type
        out_dtype = (
            torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        )
        w_q, w_scale = self._fp8
        flat = x.reshape(-1, x.shape[-1])
        y = _FrozenFp8Matmul.apply(flat, w_q, w_scale, out_dtype)
        y = y.reshape(*x.shape[:-1], y.shape[-1])
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def train(self, mode: bool = True) -> Fp8FrozenLinear:
        # validation and generation use the weights as they are: no copy beside them; the
        # weight is frozen, so a copy made once serves until then
        if not mode:
            self._fp8 = None
        elif self._fp8 is None:
            self._fp8 = quantize_tensor(self.weight)
        return super().train(mode)


def convertible(module: nn.Module) -> bool:
    """A plain frozen Linear whose shape `_scaled_mm` takes."""
    return (
        type(module) is nn.Linear
        and not module.weight.requires_grad
        and module.in_features % ALIGN == 0
        and module.out_features % ALIGN == 0
    )


def frozen_linears(model: nn.Module, roots: list[nn.Module] | None = None) -> list[nn.Linear]:
    """The frozen Linears FP8 would run: under `roots` (the language model) or the whole model.
    peft's adapted layers hold theirs as `base_layer`, a plain Linear: it counts."""
    found: dict[int, nn.Linear] = {}
    for root in roots or [model]:
        for module in root.modules():
            if convertible(module):
                found[id(module)] = module  # type: ignore[assignment]
    return list(found.values())


def fp8_params(model: nn.Module, roots: list[nn.Module] | None = None) -> int:
    """Parameters of the weights FP8 would copy (one byte each while the fit runs)."""
    return sum(m.weight.numel() for m in frozen_linears(model, roots))


@contextmanager
def fp8_frozen_weights(
    model: nn.Module, enabled: bool = True, roots: list[nn.Module] | None = None
) -> Iterator[int]:
    """Run the frozen Linears under `roots` in FP8 while the block runs (the fit); their class
    back afterwards. Yields the number of layers converted."""
    layers = frozen_linears(model, roots) if enabled else []
    for layer in layers:
        layer.__class__ = Fp8FrozenLinear
        layer._fp8 = None  # type: ignore[attr-defined]
        layer.train(layer.training)  # the copy, where it trains now
    if layers:
        log.info("model.fp8: %d frozen Linear layers run their GEMMs in FP8 (e4m3)", len(layers))
    try:
        yield len(layers)
    finally:
        for layer in layers:
            layer.__class__ = nn.Linear
            layer.__dict__.pop("_fp8", None)


def fp8_supported(device: torch.device | str | None = None) -> str | None:
    """None where FP8 GEMMs run on `device` (a CUDA GPU of capability 8.9+), else why not."""
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        return (
            f"{name} (compute capability {capability[0]}.{capability[1]}) has no FP8 tensor cores"
        )
    return None
