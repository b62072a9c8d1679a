"""The FLOPs a training step needs, counted from the model's own modules and the batch (one
count for `benchmarks/gpu.py` and for what a run records of itself, `medvqa.measure`): model
FLOPs for MFU, and what a setup computes beyond them (recomputation, full logits) for HFU.

Counted for the families whose image geometry the batch shows (LLaVA: pixel_values at the
tower's resolution; Qwen2/2.5-VL: image_grid_thw); for the others (`ModelFamily.counts_flops`
false) MFU is left out rather than guessed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch

from medvqa.measure import Phase
from medvqa.models.families.base import family_of_config
from medvqa.models.prompting import labelled_tokens

# Dense bf16 tensor-core peak, FLOP/s (vendor data sheets, without sparsity).
PEAK_BF16 = {"H100 SXM": 989e12, "H100 NVL": 835e12, "H100 PCIe": 756e12, "H200": 989e12,
             "A100": 312e12, "L40S": 362e12}  # fmt: skip
# Memory bandwidth (bytes/s, the vendors' data sheets): a decode step's floor is the weights and
# the KV cache read once at this rate.
PEAK_BANDWIDTH = {"H100 SXM": 3.35e12, "H100 NVL": 3.9e12, "H100 PCIe": 2.0e12, "H200": 4.8e12,
                  "A100": 2.039e12, "L40S": 0.864e12}  # fmt: skip
# What `add_batch` sums (per batch, over its samples).
SUMS = ("samples", "tokens", "tokens_sq", "labelled", "positions", "patches", "patches_sq",
        "projected")  # fmt: skip


@dataclass(frozen=True)
class MatmulParams:
    """Weights that multiply activations, by where they run (embedding tables excluded)."""

    language_frozen: int
    language_trained: int  # adapters and trained weights of the decoder layers
    lm_head: int
    vision: int
    vision_trained: int
    projector: int
    projector_trained: int


def matmul_params(model: torch.nn.Module, model_roles: Mapping[str, str]) -> MatmulParams:
    """Count the Linear/Conv weights of `model` per role (projector before vision: Qwen's merger
    sits inside its vision module); the rest is the language model."""
    counts = {f.name: 0 for f in fields(MatmulParams)}
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear | torch.nn.Conv2d | torch.nn.Conv3d):
            continue
        weight = module.weight
        dotted = f".{name}."
        if f".{model_roles['projector']}." in dotted:
            role = "projector"
        elif f".{model_roles['vision']}." in dotted:
            role = "vision"
        elif f".{model_roles['lm_head']}." in dotted:
            counts["lm_head"] += weight.numel()
            continue
        else:
            role = "language"
        frozen = "language_frozen" if role == "language" else role
        counts[f"{role}_trained" if weight.requires_grad else frozen] += weight.numel()
    return MatmulParams(**counts)


@dataclass(frozen=True)
class Shape:
    """The attention shapes FLOPs need."""

    layers: int
    attn_width: int  # heads x head_dim of the language model
    vision_layers: int  # of them with full attention over the image's patches
    vision_width: int
    window_layers: int = 0  # Qwen2.5-VL: layers attending within windows of `window` patches
    window: int = 0


def attention_shape(config: Any) -> Shape:
    text = config.get_text_config(decoder=True)
    vision = config.vision_config
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    v_layers = int(getattr(vision, "num_hidden_layers", None) or vision.depth)
    full = getattr(vision, "fullatt_block_indexes", None)
    window = 0
    if full is not None:  # windows of window_size pixels, in patches
        window = (int(vision.window_size) // int(vision.patch_size)) ** 2
    return Shape(
        layers=int(text.num_hidden_layers),
        attn_width=int(text.num_attention_heads * head_dim),
        vision_layers=len(full) if full is not None else v_layers,
        vision_width=int(vision.hidden_size),
        window_layers=v_layers - len(full) if full is not None else 0,
        window=window,
    )


def model_flops(
    p: MatmulParams,
    shape: Shape,
    tokens: float,
    tokens_sq: float,
    labelled: float,
    patches: float,
    patches_sq: float,
    projected: float,
) -> float:
    """FLOPs a training step needs for a batch (sums over its samples): `tokens` (and the sum of
    squared lengths `tokens_sq`) of the language model, `labelled` positions predicting a label,
    vision `patches` (and `patches_sq`, per image), `projected` tokens through the projector.

    A frozen weight costs 2 (forward) + 2 (gradient of its input) FLOPs per token where a
    gradient flows through it, a trained one 6 (its own gradient too), a frozen part nothing
    trains before (the vision tower) 2; attention's QK^T and AV 4·T²·width per layer forward,
    halved by the causal mask, and twice that backward. The vocabulary projection is needed at
    the labelled positions only. Nothing recomputed is counted (`recompute_flops`).
    """
    lm = 4 * p.language_frozen * tokens + 6 * p.language_trained * tokens
    head = 4 * p.lm_head * labelled
    # A gradient reaches the vision tower only if something in or before it trains.
    vision_grad = p.vision_trained > 0
    vision = (4 if vision_grad else 2) * p.vision * patches + 6 * p.vision_trained * patches
    proj_frozen = 4 if vision_grad else 2
    projector = proj_frozen * p.projector * projected + 6 * p.projector_trained * projected
    attention = 3 * 2 * shape.layers * shape.attn_width * tokens_sq
    vision_attention = (
        4
        * shape.vision_width
        * (shape.vision_layers * patches_sq + shape.window_layers * shape.window * patches)
    )
    return lm + head + vision + projector + attention + vision_attention


def recompute_flops(
    p: MatmulParams,
    shape: Shape,
    checkpoint_every: int,
    tokens: float,
    tokens_sq: float,
    positions: float,
) -> float:
    """FLOPs a setup spends beyond `model_flops`: the re-forward of checkpointed decoder layers,
    and the vocabulary projection (forward and input gradient) at `positions` beyond the
    labelled ones (every position when logits are not restricted to the labels)."""
    extra = 0.0
    if checkpoint_every:
        share = math.ceil(shape.layers / checkpoint_every) / shape.layers
        forward = 2 * (p.language_frozen + p.language_trained) * tokens
        forward += 2 * shape.layers * shape.attn_width * tokens_sq
        extra += share * forward
    return extra + 4 * p.lm_head * positions


def add_batch(sums: dict[str, float], batch: Mapping[str, Any], patch_size: int) -> None:
    """Add one batch's sample, token and patch counts to `sums` (keys `SUMS`). Read them from
    the batch on the host, before it goes to the GPU: on the GPU every count waits for it.
    `patch_size`: the vision tower's (LLaVA's patches per image follow from the pixels)."""
    lengths = batch["attention_mask"].sum(dim=1).double()
    sums["samples"] += len(lengths)
    sums["tokens"] += float(lengths.sum())
    sums["tokens_sq"] += float((lengths**2).sum())
    sums["positions"] += float(batch["attention_mask"].numel())  # logits at every position
    if "labels" in batch:
        sums["labelled"] += float(labelled_tokens(batch["labels"]))
    grid = batch.get("image_grid_thw")
    if grid is not None:  # Qwen: patches per image from the grid, 4 patches per LLM token
        per_image = grid.prod(dim=1).double()
        sums["patches"] += float(per_image.sum())
        sums["patches_sq"] += float((per_image**2).sum())
        sums["projected"] += float(per_image.sum()) / 4
    elif "pixel_values" in batch:  # LLaVA: the tower's full grid (+ CLS), each patch projected
        pixels = batch["pixel_values"]
        images = pixels.shape[0]
        p = (pixels.shape[-2] // patch_size) * (pixels.shape[-1] // patch_size)
        sums["patches"] += images * (p + 1)
        sums["patches_sq"] += images * (p + 1) ** 2
        sums["projected"] += images * p


def peak_flops(name: str, override: float | None = None) -> float | None:
    """The dense bf16 peak of the GPU named `name` (`override` TFLOP/s wins); None: unknown."""
    return override * 1e12 if override else _peak(PEAK_BF16, name)


def peak_bandwidth(name: str) -> float | None:
    """The memory bandwidth (bytes/s) of the GPU named `name`; None: unknown."""
    return _peak(PEAK_BANDWIDTH, name)


def _peak(table: Mapping[str, float], name: str) -> float | None:
    for key, value in table.items():
        if all(part in name for part in key.split()):
            return value
    if "H100" in name:  # the SXM part is the common one in clusters
        return table["H100 SXM"]
    return None


def new_sums() -> dict[str, float]:
    return dict.fromkeys(SUMS, 0.0)


def step_flops(
    model: torch.nn.Module, model_roles: Mapping[str, str], config: Any, sums: Mapping[str, float]
) -> float:
    """`model_flops` of the batches summed in `sums` (`add_batch`), for `model` as it trains."""
    return model_flops(
        matmul_params(model, model_roles),
        attention_shape(config),
        sums["tokens"],
        sums["tokens_sq"],
        sums["labelled"],
        sums["patches"],
        sums["patches_sq"],
        sums["projected"],
    )


def counts_flops(config: Any) -> bool:
    """Whether `add_batch` reads the image patches of `config`'s family from its batches."""
    kind = family_of_config(config)
    return kind is not None and kind.counts_flops


def fit_rates(
    model: torch.nn.Module, roles_: Any, phase: Phase, world_size: int
) -> dict[str, float]:
    """The fit's tokens/s and model-FLOPs utilisation from this rank's batch counts (`add_batch`,
    with the FLOP count `benchmarks/gpu.py` uses), over the whole fit and its
    steady second half (the whole fit's FLOPs per sample at the steady rate). MFU is NaN where
    the GPU's peak is unknown (the CPU) or the family's image FLOPs are not counted."""
    sums = phase.sums
    if not sums.get("samples") or phase.seconds <= 0:
        return {}
    out = {"tokens_per_s": sums["tokens"] * world_size / phase.seconds}
    config = model.config
    peak = peak_flops(torch.cuda.get_device_name()) if torch.cuda.is_available() else None
    if not counts_flops(config):
        return {**out, "mfu": float("nan")}
    per_sample = step_flops(model, roles_, config, sums) / sums["samples"]
    out["tflop_per_sample"] = per_sample / 1e12
    rate = phase.items / phase.seconds  # samples/s over all ranks
    out["mfu"] = per_sample * rate / world_size / peak if peak else float("nan")
    out["steady_mfu"] = per_sample * phase.steady_rate / world_size / peak if peak else float("nan")
    return out
