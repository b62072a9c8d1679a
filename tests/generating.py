"""Generation settings for tests: `settings.resolve` with the config's defaults (shared image
prefixes on, the static decode) unless a test says otherwise."""

from __future__ import annotations

from typing import Any

from medvqa.generation.settings import GenerationSettings, resolve
from medvqa.models.spec import ModelSchema
from medvqa.planning.memory import AUTO_EVAL_BATCH


def settings(model: Any, processor: Any, **options: Any) -> GenerationSettings:
    """`resolve` for `model`; `options` override the batch (`AUTO_EVAL_BATCH`), new tokens,
    sharing, merge (false), decode engine and compilation."""
    chosen = {
        "batch_size": AUTO_EVAL_BATCH,
        "max_new_tokens": ModelSchema.max_new_tokens,
        "share_image_prefix": ModelSchema.share_image_prefix,
        "merge_adapters": False,
        **options,
    }
    return resolve(model, processor, **chosen)
