"""Idefics3 and SmolVLM (SigLIP + pixel-shuffle connector + Llama/SmolLM2): an image is cut into
tiles, each `image_seq_len` tokens, plus one global view."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from medvqa.models.families.base import (
    ImageSize,
    ModelFamily,
    StandIn,
    TinyShape,
    content,
)

# transformers 5.23's processor defaults, used when a checkpoint's processor files omit a field.
MAX_IMAGE_SIZE = 4096  # image_processing_idefics3.MAX_IMAGE_SIZE
TILE = 364  # Idefics3ImageProcessor.max_image_size["longest_edge"]
LONGEST_EDGE = 4 * 364  # Idefics3ImageProcessor.size["longest_edge"]

TEMPLATE = (
    "<|im_start|>{% for m in messages %}{{ m['role'] | capitalize }}:"
    "{% if m['role'] == 'assistant' %} {% endif %}"
    + content("<image>")
    + "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)
ROW_COL_TOKENS = tuple(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7))


def idefics3_tiles(
    height: int, width: int, longest_edge: int, tile: int, do_image_splitting: bool
) -> tuple[int, int]:
    """(rows, cols) of the tiles Idefics3/SmolVLM cut an image into; (0, 0) when it stays whole.

    A copy of Idefics3ImageProcessor.get_number_of_image_patches in transformers 5.23: the longest
    edge is first resized to `longest_edge` (up or down, capped at 4096), then cut into `tile` squares.
    """
    if not do_image_splitting:
        return 0, 0
    aspect = width / height
    if width >= height:
        width, height = longest_edge, int(longest_edge / aspect)
        height += height % 2  # the processor rounds odd sides up to even
    else:
        height, width = longest_edge, int(longest_edge * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    aspect = width / height
    if width >= height and width > MAX_IMAGE_SIZE:
        width, height = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE / aspect)
    elif height > width and height > MAX_IMAGE_SIZE:
        height, width = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE * aspect)
    height, width = max(height, 1), max(width, 1)
    padded_h = math.ceil(height / tile) * tile
    padded_w = math.ceil(width / tile) * tile
    if padded_h > tile or padded_w > tile:
        return math.ceil(padded_h / tile), math.ceil(padded_w / tile)
    return 0, 0


def _longest_edge(pre: Mapping[str, Any], vision: Any, key: str, default: int) -> int:
    for source in (pre.get(key), getattr(vision, key, None)):
        if isinstance(source, Mapping) and source.get("longest_edge"):
            return int(source["longest_edge"])
    return default


class Idefics3(ModelFamily):
    name = "idefics3"
    stand_in = StandIn(
        special=(
            "<|endoftext|>",
            "<|im_start|>",
            "<end_of_utterance>",
            "<fake_token_around_image>",
            "<global-img>",
            "<image>",
            *ROW_COL_TOKENS,
        ),
        bos="<|im_start|>",
        eos="<end_of_utterance>",
        extra={
            "image_token": "<image>",
            "fake_image_token": "<fake_token_around_image>",
            "global_image_token": "<global-img>",
            "end_of_utterance_token": "<end_of_utterance>",
        },
        template=TEMPLATE,
        config_tokens={"image_token_id": "<image>"},
    )
    image_processor = "Idefics3ImageProcessorPil"
    processor = "Idefics3Processor"
    processor_fields = ("image_seq_len",)
    model_classes = ("Idefics3Config", "Idefics3ForConditionalGeneration")
    preset = "smolvlm"  # SmolVLM-256M-Instruct is Idefics3 architecture

    @classmethod
    def image_tokens(
        cls, config: Any, preprocessor: Mapping[str, Any], image_size: ImageSize | None
    ) -> tuple[int, int]:
        # Idefics3Processor/SmolVLMProcessor: image_seq_len tokens per tile plus one global view.
        pre = preprocessor
        vision = config.vision_config
        # SmolVLM's config.json repeats the processor sizes in vision_config; the processor's
        # files win.
        longest_edge = _longest_edge(pre, vision, "size", LONGEST_EDGE)
        tile = _longest_edge(pre, vision, "max_image_size", TILE)
        splitting = bool(pre.get("do_image_splitting", True))
        per_tile = pre.get("image_seq_len") or int(
            (vision.image_size // vision.patch_size) ** 2 / config.scale_factor**2
        )
        # The largest picture tiles like a square with the longest allowed edge.
        side = min(longest_edge, MAX_IMAGE_SIZE)
        height, width = image_size if image_size is not None else (side, side)
        rows, cols = idefics3_tiles(height, width, longest_edge, tile, splitting)
        tiles = rows * cols
        return (tiles + 1) * int(per_tile), 2 * tiles + 3

    @classmethod
    def tiny(cls, shape: TinyShape, tokenizer: Any) -> tuple[Any, Any]:
        config_class, model_class = cls.classes()
        scale = 2
        config = config_class(
            vision_config=shape.vision(),
            text_config={"model_type": "llama", **shape.text(tokenizer)},
            scale_factor=scale,
            pad_token_id=tokenizer.pad_token_id,
            **cls.stand_in.config_ids(tokenizer),
        )
        image_processor = cls.make_image_processor(
            do_image_splitting=False,
            size={"longest_edge": shape.image_size},
            max_image_size={"longest_edge": shape.image_size},
        )
        processor = cls.make_processor(
            image_processor,
            tokenizer,
            image_seq_len=(shape.image_size // shape.patch_size) ** 2 // scale**2,
        )
        return model_class(config), processor


class SmolVLM(Idefics3):
    """SmolVLM2 checkpoints: Idefics3's architecture under its own classes and module names."""

    name = "smolvlm"
    image_processor = "SmolVLMImageProcessorPil"
    processor = "medvqa.models.processors.ImageOnlySmolVLMProcessor"
    preset = "smolvlm"  # tested with the SmolVLM preset's settings, under SmolVLM's classes
    model_classes = ("SmolVLMConfig", "SmolVLMForConditionalGeneration")
