"""How a job generates, decided once: `GenerationSettings`.

Every choice that changes how answers are computed (batch, new tokens, shared image prefixes,
merged adapters, the decode engine and its compilation) is resolved here from the config, the
model and the memory plan, logged where a wish is refused, recorded in `results.json`
(`provenance.generation`) and part of the shared-answer key (`predict.prediction_key`).
Nothing downstream re-decides any of them.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import torch

from medvqa.generation.prefix import model_sharing_refusal, sliding_window
from medvqa.models.adapters import mergeable_layers
from medvqa.models.spec import DECODE_ENGINES, ModelSchema

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationSettings:
    """What one job's generation does, resolved (`resolve`): the same for every split and pass.

    `share_image_prefix` is what happens, not what was asked: false where the family cannot
    (the reason logged once); `merge_adapters`: fold the adapters into copies of their base
    weights while generating, where the model has any (`models.adapters.merged_adapters`);
    `shared_length`: the longest row a shared batch may hold (a sliding window less the new
    tokens), None without a window; `decode`: one of `DECODE_ENGINES` (`model.decode`);
    `compile`: "auto" (on CUDA, eager where it fails), True or False (`model.compile_decode`).
    """

    batch_size: int
    max_new_tokens: int
    share_image_prefix: bool
    shared_length: int | None
    merge_adapters: bool
    decode: str = ModelSchema.decode
    compile: Any = ModelSchema.compile_decode

    def __post_init__(self) -> None:
        if self.decode not in DECODE_ENGINES:
            raise ValueError(
                f"model.decode={self.decode!r}: use one of {list(DECODE_ENGINES)} (static: a "
                "cache allocated once per batch, compiled on CUDA; dynamic: transformers' "
                "growing cache)."
            )
        if not (self.compile == "auto" or isinstance(self.compile, bool)):
            raise ValueError(f"model.compile_decode={self.compile!r}: use auto, true or false.")
        if self.batch_size < 1 or self.max_new_tokens < 1:
            raise ValueError(
                f"generation needs a positive batch size and number of new tokens, got "
                f"data.eval_batch_size={self.batch_size}, max_new_tokens={self.max_new_tokens}."
            )

    def compiles(self, device: torch.device) -> bool:
        """Whether the decode is compiled on `device`: a static cache only (a growing one
        changes shape every step), on CUDA under auto."""
        if self.decode != "static" or self.compile is False:
            return False
        return self.compile is True or device.type == "cuda"

    def record(self) -> dict[str, Any]:
        """The settings as `results.json` holds them."""
        return dataclasses.asdict(self)

    def computing(self, model: torch.nn.Module) -> dict[str, Any]:
        """What of the settings decides `model`'s answers (`predict.prediction_key`): a merge
        only where it has adapters to merge, so the untuned base's answers are one set
        whatever the method."""
        return {**self.record(), "merge_adapters": self.merge_adapters and merges(model)}


def merges(model: torch.nn.Module) -> bool:
    """Whether `model` has adapters a merge would fold in."""
    return bool(mergeable_layers(model))


def resolve(
    model: torch.nn.Module,
    processor: Any,
    *,
    batch_size: int,
    max_new_tokens: int,
    share_image_prefix: bool,
    merge_adapters: bool,
    decode: str = ModelSchema.decode,
    compile: Any = ModelSchema.compile_decode,
) -> GenerationSettings:
    """The job's settings for `model` with `processor`: the wishes (the config's, the plan's
    merge decision) narrowed to what the model's family can do, each refusal logged once."""
    share = bool(share_image_prefix)
    if share:
        refusal = model_sharing_refusal(model, processor)
        if refusal is not None:
            log.info("generating without shared image prefixes: %s", refusal)
            share = False
    window = sliding_window(getattr(model, "config", None))
    return GenerationSettings(
        batch_size=int(batch_size),
        max_new_tokens=int(max_new_tokens),
        share_image_prefix=share,
        shared_length=None if window is None or not share else window - int(max_new_tokens),
        merge_adapters=bool(merge_adapters),
        decode=decode,
        compile=compile,
    )
