"""Processors for families whose stock processor needs torchvision, registered at import.

Qwen2-VL, Qwen2.5-VL and SmolVLM processors insist on a (torchvision-backed) video processor;
without torchvision `AutoProcessor.from_pretrained` cannot build them (docs/offline.md). These
image-only subclasses are registered with `AutoProcessor`, so loading a checkpoint of those
families works with or without torchvision. `medvqa.models.loading` imports this module.
"""

from __future__ import annotations

from transformers import (
    AutoProcessor,
    ProcessorMixin,
    Qwen2_5_VLConfig,
    Qwen2_5_VLProcessor,
    Qwen2VLConfig,
    Qwen2VLProcessor,
    SmolVLMConfig,
    SmolVLMProcessor,
)

# Explicit parameters (no *args/**kwargs): ProcessorMixin saves and restores what __init__ lists.


class _ImageOnlyQwen:
    """The constructor both Qwen processors share, without the video processor; first in the
    bases, so that its signature is the one ProcessorMixin reads."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None) -> None:
        super().__init__(  # type: ignore[call-arg]  # the Qwen processor after this in the MRO
            image_processor=image_processor,
            tokenizer=tokenizer,
            video_processor=None,
            chat_template=chat_template,
        )


class ImageOnlyQwen2VLProcessor(_ImageOnlyQwen, Qwen2VLProcessor):
    """Qwen2-VL processor without the (torchvision-backed) video processor."""


class ImageOnlyQwen2_5_VLProcessor(_ImageOnlyQwen, Qwen2_5_VLProcessor):
    """Qwen2.5-VL processor without the (torchvision-backed) video processor."""


class ImageOnlySmolVLMProcessor(SmolVLMProcessor):
    """SmolVLM processor without the (torchvision-backed) video processor."""

    def __init__(
        self, image_processor=None, tokenizer=None, image_seq_len: int = 169, chat_template=None
    ) -> None:
        super().__init__(
            image_processor=image_processor,
            tokenizer=tokenizer,
            video_processor=None,
            image_seq_len=image_seq_len,
            chat_template=chat_template,
        )

    def apply_chat_template(self, conversation, chat_template=None, **kwargs):
        # SmolVLMProcessor's override only adds video defaults (and reads the video processor)
        return ProcessorMixin.apply_chat_template(self, conversation, chat_template, **kwargs)


AutoProcessor.register(Qwen2VLConfig, ImageOnlyQwen2VLProcessor, exist_ok=True)
AutoProcessor.register(Qwen2_5_VLConfig, ImageOnlyQwen2_5_VLProcessor, exist_ok=True)
AutoProcessor.register(SmolVLMConfig, ImageOnlySmolVLMProcessor, exist_ok=True)
