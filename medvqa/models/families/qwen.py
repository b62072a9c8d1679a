"""Qwen2-VL and Qwen2.5-VL: a native-resolution ViT whose patches are merged 2x2 into one LLM
token each, and multimodal rotary positions (M-RoPE)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from medvqa.models.families.base import (
    ImageSize,
    ModelFamily,
    StandIn,
    TinyShape,
    content,
)

# transformers 5.23's processor defaults, used when a checkpoint's processor files omit a field.
MIN_PIXELS = 56 * 56  # Qwen2VLImageProcessor.size["shortest_edge"]
MAX_PIXELS = 28 * 28 * 1280  # Qwen2VLImageProcessor.size["longest_edge"]

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    + content("<|vision_start|><|image_pad|><|vision_end|>")
    + "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def smart_resize(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """Qwen2-VL's resize: sides multiples of `factor`, pixels in [min_pixels, max_pixels], aspect kept.

    A copy of transformers.models.qwen2_vl.image_processing_qwen2_vl.smart_resize (5.23), which cannot
    be imported without torchvision; tests/test_architectures.py checks the two agree.
    """
    if max(height, width) / min(height, width) > 200:
        raise ValueError(
            f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def qwen_resize(
    config: Any, pre: Mapping[str, Any]
) -> tuple[int, int, int, Callable[[int, int], ImageSize]]:
    """Qwen2-VL's image processing for `config`/`pre`: (patch, merge, max_pixels, resize), where
    resize(height, width) is the (height, width) the processor resizes a picture to.

    Qwen2VLImageProcessor: min_pixels/max_pixels (older files) override size's
    shortest/longest_edge."""
    vision = config.vision_config
    size = pre.get("size") or {}
    min_pixels = int(pre.get("min_pixels") or size.get("shortest_edge") or MIN_PIXELS)
    max_pixels = int(pre.get("max_pixels") or size.get("longest_edge") or MAX_PIXELS)
    patch = int(pre.get("patch_size") or vision.patch_size)
    merge = int(pre.get("merge_size") or vision.spatial_merge_size)
    factor = patch * merge  # one LLM token per merge x merge patches

    def resize(height: int, width: int) -> ImageSize:
        return smart_resize(height, width, factor, min_pixels, max_pixels)

    return patch, merge, max_pixels, resize


class Qwen2VL(ModelFamily):
    name = "qwen2_vl"
    stand_in = StandIn(
        special=(
            "<|endoftext|>",
            "<|im_start|>",
            "<|im_end|>",
            "<|vision_start|>",
            "<|vision_end|>",
            "<|image_pad|>",
            "<|video_pad|>",
        ),
        bos=None,
        eos="<|im_end|>",
        extra={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>"},
        template=TEMPLATE,
        config_tokens={
            "image_token_id": "<|image_pad|>",
            "video_token_id": "<|video_pad|>",
            "vision_start_token_id": "<|vision_start|>",
            "vision_end_token_id": "<|vision_end|>",
        },
    )
    image_processor = "Qwen2VLImageProcessorPil"
    processor = "medvqa.models.processors.ImageOnlyQwen2VLProcessor"
    model_classes = ("Qwen2VLConfig", "Qwen2VLForConditionalGeneration")
    counts_flops = True  # the batch's image_grid_thw gives each image's patches
    preset = "qwen2_vl"
    # M-RoPE's sections must add up to half the head size: keep 128-wide heads.
    shrunk_text = (128, 1, 1)

    @classmethod
    def image_tokens(
        cls, config: Any, preprocessor: Mapping[str, Any], image_size: ImageSize | None
    ) -> tuple[int, int]:
        # One token per merge x merge patches, between <|vision_start|> and <|vision_end|>.
        patch, merge, max_pixels, resize = qwen_resize(config, preprocessor)
        factor = patch * merge
        if image_size is None:
            # smart_resize keeps h*w <= max_pixels with both sides multiples of factor: this
            # bound is reached by a square of side sqrt(max_pixels) when that is a multiple of
            # factor.
            return max_pixels // factor**2, 2
        height, width = resize(*image_size)
        return (height // factor) * (width // factor), 2

    @classmethod
    def shrink_vision(cls, config: Any, text: Any) -> None:
        vision = config.vision_config  # its `hidden_size` is the merger's output
        vision.embed_dim, vision.hidden_size, vision.depth, vision.num_heads = (
            64,
            text.hidden_size,
            2,
            4,
        )

    @classmethod
    def _image_processor(cls, shape: TinyShape) -> Any:
        pixels = shape.image_size**2  # every image is resized to about image_size²
        return cls.make_image_processor(
            size={"shortest_edge": pixels, "longest_edge": pixels},
            patch_size=shape.patch_size,
            temporal_patch_size=2,
            merge_size=2,
        )

    @staticmethod
    def _text(shape: TinyShape, tokenizer: Any) -> dict[str, Any]:
        half_head = shape.text_hidden // 4 // 2  # 4 heads; sections sum to head_dim/2
        t, rest = half_head // 4, half_head - half_head // 4
        section = [t, rest // 2, rest - rest // 2]
        rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section}
        return shape.text(tokenizer, rope_parameters=rope)

    @staticmethod
    def _tiny_vision(shape: TinyShape) -> dict[str, Any]:
        return {
            "depth": 1,
            "embed_dim": shape.vision_hidden,
            "hidden_size": shape.text_hidden,
            "num_heads": 2,
            "patch_size": shape.patch_size,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        }

    @classmethod
    def tiny(cls, shape: TinyShape, tokenizer: Any) -> tuple[Any, Any]:
        config_class, model_class = cls.classes()
        config = config_class(
            text_config=cls._text(shape, tokenizer),
            vision_config=cls._tiny_vision(shape),
            **cls.stand_in.config_ids(tokenizer),
        )
        processor = cls.make_processor(cls._image_processor(shape), tokenizer)
        return model_class(config), processor


class Qwen2_5VL(Qwen2VL):
    name = "qwen2_5_vl"
    processor = "medvqa.models.processors.ImageOnlyQwen2_5_VLProcessor"
    preset = "qwen2_5_vl"
    model_classes = ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration")

    @classmethod
    def shrink_vision(cls, config: Any, text: Any) -> None:
        vision = config.vision_config
        vision.hidden_size, vision.intermediate_size = 64, 128
        vision.depth, vision.num_heads, vision.out_hidden_size = 2, 4, text.hidden_size
        vision.fullatt_block_indexes = [1]

    @staticmethod
    def _tiny_vision(shape: TinyShape) -> dict[str, Any]:
        return {
            "depth": 2,
            "hidden_size": shape.vision_hidden,
            "intermediate_size": 2 * shape.vision_hidden,
            "out_hidden_size": shape.text_hidden,
            "num_heads": 2,
            "patch_size": shape.patch_size,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 4 * shape.patch_size,
            "fullatt_block_indexes": [1],
        }
