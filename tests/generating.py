"""Generation settings for tests: `settings.resolve` with the config's defaults (shared image
prefixes on, the static decode) unless a test says otherwise."""

from __future__ import annotations

from typing import Any

from medvqa.generation.settings import GenerationSettings, resolve
from medvqa.models.spec import ModelSchema
from medvqa.planning.memory import AUTO_EVAL_BATCH


def settings(
    model: Any,
    processor: Any,
    batch_size: int = AUTO_EVAL_BATCH,
    max_new_tokens: int = ModelSchema.max_new_tokens,
    share_image_prefix: bool = ModelSchema.share_image_prefix,
    merge_adapters: bool = False,
    decode: str = ModelSchema.decode,
    compile: Any = ModelSchema.compile_decode,
) -> GenerationSettings:
    return resolve(
        model,
        processor,
        batch_size=batch_size,
        max_new_tokens=max_new_tokens,
        share_image_prefix=share_image_prefix,
        merge_adapters=merge_adapters,
        decode=decode,
        compile=compile,
    )
