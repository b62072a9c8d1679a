"""LLaVA (CLIP ViT + projector + Llama/Mistral): LLaVA-1.5 and LLaVA-Med v1.5 in transformers'
layout."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from medvqa.models.families.base import ImageSize, ModelFamily, StandIn, TinyShape

if TYPE_CHECKING:  # torch is imported where a model is built: listing families needs none
    import torch

IMAGE_TOKEN = "<image>"
# Kept deliberately plain: every token here costs sequence length on a CPU.
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'system' %}SYSTEM: {{ m['content'][0]['text'] }}{{ '\\n' }}"
    "{% elif m['role'] == 'user' %}USER: "
    "{% for c in m['content'] %}{% if c['type'] == 'image' %}<image>{{ '\\n' }}"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{{ '\\n' }}"
    "{% else %}ASSISTANT: {% for c in m['content'] %}{{ c['text'] }}{% endfor %}{{ eos_token }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


def _height_width(size: Any) -> ImageSize:
    """(height, width) of a processor `size`/`crop_size`: {height, width}, {shortest_edge} or an int."""
    if isinstance(size, Mapping):
        if "height" in size and "width" in size:
            return int(size["height"]), int(size["width"])
        if "shortest_edge" in size:
            return int(size["shortest_edge"]), int(size["shortest_edge"])
    if isinstance(size, int):
        return size, size
    raise ValueError(f"cannot read an image size from {size!r}")


@dataclass(frozen=True)
class ClipTower:
    """The size of the fresh CLIP vision tower of a LLaVA medvqa builds; the fields are named
    as the builders' parameters (conf/model/tiny.yaml, smollm2_llava.yaml)."""

    image_size: int
    patch_size: int
    vision_hidden: int
    vision_layers: int
    vision_heads: int

    @classmethod
    def of(cls, params: Mapping[str, Any]) -> ClipTower:
        """The tower a builder's parameters describe."""
        return cls(**{f.name: params[f.name] for f in fields(cls)})


def llava_config(tokenizer: Any, text: Any, tower: ClipTower, **extra: Any) -> Any:
    """A LLaVA config: a fresh CLIP `tower` around the text config `text`, its image token
    `tokenizer`'s IMAGE_TOKEN."""
    from transformers import CLIPVisionConfig, LlavaConfig

    vision = CLIPVisionConfig(
        hidden_size=tower.vision_hidden,
        intermediate_size=2 * tower.vision_hidden,
        num_hidden_layers=tower.vision_layers,
        num_attention_heads=tower.vision_heads,
        image_size=tower.image_size,
        patch_size=tower.patch_size,
        projection_dim=tower.vision_hidden,
    )
    return LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        image_seq_length=(tower.image_size // tower.patch_size) ** 2,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        **extra,
    )


def clip_processor(tokenizer: Any, image_size: int, patch_size: int, **extra: Any) -> Any:
    """A `LlavaProcessor` of `tokenizer` (with its chat template) and a CLIP image processor
    that resizes and centre-crops to `image_size`: the processor of every LLaVA medvqa builds
    (the tiny twin, the tiny pre-trained LLaVA, SmolLM2's)."""
    from transformers import CLIPImageProcessorPil, LlavaProcessor

    return LlavaProcessor(
        image_processor=CLIPImageProcessorPil(
            size={"shortest_edge": image_size},
            crop_size={"height": image_size, "width": image_size},
        ),
        tokenizer=tokenizer,
        patch_size=patch_size,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # CLIP's CLS token, dropped by the "default" strategy
        chat_template=tokenizer.chat_template,
        **extra,
    )


def build_model(
    processor: Any, tower: ClipTower, text_hidden: int, text_layers: int, text_heads: int
) -> torch.nn.Module:
    """A randomly initialised LLaVA (CLIP ViT + Llama) sized for a CPU."""
    from transformers import LlamaConfig, LlavaForConditionalGeneration

    tok = processor.tokenizer
    text = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=text_hidden,
        intermediate_size=2 * text_hidden,
        num_hidden_layers=text_layers,
        num_attention_heads=text_heads,
        num_key_value_heads=text_heads,
        max_position_embeddings=512,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = LlavaForConditionalGeneration(llava_config(tok, text, tower))
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    return model


class Llava(ModelFamily):
    name = "llava"
    stand_in = StandIn(
        special=("<pad>", "<s>", "</s>", "<image>"),
        bos="<s>",
        eos="</s>",
        extra={"image_token": "<image>"},
        template=TEMPLATE,
        config_tokens={"image_token_index": "<image>"},
    )
    image_processor = "LlavaImageProcessorPil"
    processor = "LlavaProcessor"
    processor_fields = (
        "patch_size",
        "vision_feature_select_strategy",
        "num_additional_image_tokens",
    )
    counts_flops = True  # the batch's pixel_values are at the tower's resolution
    preset = "llava_med"

    @classmethod
    def image_tokens(
        cls, config: Any, preprocessor: Mapping[str, Any], image_size: ImageSize | None
    ) -> tuple[int, int]:
        # LlavaProcessor: every picture is resized and centre-cropped to crop_size, so its own
        # size does not matter; CLIP adds one CLS token that the "default" strategy drops again.
        pre, vision = preprocessor, config.vision_config
        height, width = _height_width(pre.get("crop_size") or vision.image_size)
        patch = int(pre.get("patch_size") or vision.patch_size)
        strategy = (
            pre.get("vision_feature_select_strategy") or config.vision_feature_select_strategy
        )
        extra = int(pre.get("num_additional_image_tokens", 1))
        tokens = (height // patch) * (width // patch) + extra - (1 if strategy == "default" else 0)
        return tokens, 0

    @classmethod
    def tiny(cls, shape: TinyShape, tokenizer: Any) -> tuple[Any, Any]:
        processor = clip_processor(tokenizer, shape.image_size, shape.patch_size)
        tower = ClipTower(
            shape.image_size, shape.patch_size, shape.vision_hidden, vision_layers=1, vision_heads=2
        )
        model = build_model(
            processor,
            tower,
            text_hidden=shape.text_hidden,
            text_layers=shape.text_layers,
            text_heads=4,
        )
        return model, processor
