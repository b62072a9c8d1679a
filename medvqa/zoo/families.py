"""Tiny randomly initialised VLMs of each supported family, built offline from configs.

The real models (`conf/model/<name>.yaml`) are hub checkpoints far too large for a CPU test;
`TinyFamilyBuilder(family, cache_dir)` makes a ~1M-parameter model of the *same architecture*
(same transformers classes, module names, processor and special tokens, a chat template of the
family's shape; `ModelFamily.tiny` in `medvqa.models.families`) so every code path (loading,
adapters, training, generation, saving) is tested offline. Nothing is pre-trained: these models
only have to run, not to answer.
"""

from __future__ import annotations

import logging
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

from medvqa.models.builders.cache import CachedModelBuilder
from medvqa.models.families.base import TinyShape, family_of
from medvqa.models.stand_in import build_tokenizer

log = logging.getLogger(__name__)

BUILDER_VERSION = 1


class TinyFamilyBuilder(CachedModelBuilder):
    """Build (once) and return the directory of a tiny random VLM of `family`."""

    def __init__(
        self,
        family: str,
        cache_dir: str | Path,
        seed: int = 0,
        image_size: int = 32,
        patch_size: int = 8,
        vision_hidden: int = 32,
        text_hidden: int = 64,
        text_layers: int = 2,
        vocab_size: int = 400,
    ) -> None:
        family_of(family, "a tiny twin")  # fails naming the known families
        super().__init__(
            cache_dir,
            {
                "family": family,
                "seed": int(seed),
                "image_size": int(image_size),
                "patch_size": int(patch_size),
                "vision_hidden": int(vision_hidden),
                "text_hidden": int(text_hidden),
                "text_layers": int(text_layers),
                "vocab_size": int(vocab_size),
                "version": BUILDER_VERSION,
            },
        )

    @property
    def name(self) -> str:
        return f"tiny-{self.params['family']}"

    def _build_into(self, out: Path) -> None:
        model, processor = self.make()
        model.save_pretrained(out)
        processor.save_pretrained(out)

    def make(self) -> tuple[torch.nn.Module, Any]:
        """(model, processor), randomly initialised, not saved."""
        p = self.params
        kind = family_of(p["family"], "a tiny twin")
        tokenizer = build_tokenizer(kind.name, p["vocab_size"])
        torch.manual_seed(p["seed"])
        shape = TinyShape(**{f.name: p[f.name] for f in fields(TinyShape)})
        model, processor = kind.tiny(shape, tokenizer)
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.bos_token_id = tokenizer.bos_token_id
        return model, processor
