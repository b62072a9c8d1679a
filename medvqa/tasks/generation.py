"""A job's `GenerationSettings` from its config, its dataset and its memory plan.

Apart from `settings` so that the plan (`medvqa.planning`), which sizes the decode's cache, and
the settings it decides stay free of each other.
"""

from __future__ import annotations

from typing import Any

import torch

from medvqa.data.base import VQASource
from medvqa.generation.lengths import generation_length
from medvqa.generation.settings import GenerationSettings, resolve
from medvqa.planning.setup import Setup, eval_batch_size, merges_adapters


def from_config(
    cfg: Any,
    model: torch.nn.Module,
    processor: Any,
    source: VQASource,
    planned: Setup | None = None,
) -> GenerationSettings:
    """A job's settings: its config (`model.*`, `data.eval_batch_size`), the dataset's answer
    length and the memory plan's decisions (`planned`: the eval batch and the merge under
    `auto`; None where no plan ran)."""
    return resolve(
        model,
        processor,
        batch_size=eval_batch_size(cfg.data, planned),
        max_new_tokens=generation_length(cfg.model, source),
        share_image_prefix=bool(cfg.model.share_image_prefix),
        merge_adapters=merges_adapters(cfg.model, planned),
        decode=str(cfg.model.decode),
        compile=cfg.model.compile_decode,
    )
