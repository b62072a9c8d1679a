"""Gemma 3 (SigLIP + Gemma 3; MedGemma): a fixed number of soft tokens per image, optionally
pan-and-scan crops."""

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

# Gemma3Processor.images_kwargs (the checkpoints' preprocessor files say null).
PAN_AND_SCAN = {
    "pan_and_scan_min_crop_size": 256,
    "pan_and_scan_max_num_crops": 4,
    "pan_and_scan_min_ratio_to_activate": 1.2,
}

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    + content("<start_of_image>")
    + "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def pan_and_scan_crops(
    height: int, width: int, min_crop_size: int, max_num_crops: int, min_ratio_to_activate: float
) -> int:
    """Number of extra crops Gemma 3's pan-and-scan cuts from an image (0: none).

    A copy of the crop count of Gemma3ImageProcessor.pan_and_scan_batched in transformers 5.23.
    """
    if width >= height:
        if width / height < min_ratio_to_activate:
            return 0
        crops_w = min(math.floor(width / min_crop_size), math.floor(width / height + 0.5))
        crops_w, crops_h = min(max_num_crops, max(2, crops_w)), 1
    else:
        if height / width < min_ratio_to_activate:
            return 0
        crops_h = min(math.floor(height / min_crop_size), math.floor(height / width + 0.5))
        crops_w, crops_h = 1, min(max_num_crops, max(2, crops_h))
    if min(math.ceil(width / crops_w), math.ceil(height / crops_h)) < min_crop_size:
        return 0
    return crops_w * crops_h


class Gemma3(ModelFamily):
    name = "gemma3"
    stand_in = StandIn(
        special=(
            "<pad>",
            "<eos>",
            "<bos>",
            "<start_of_turn>",
            "<end_of_turn>",
            "<start_of_image>",
            "<end_of_image>",
            "<image_soft_token>",
        ),
        bos="<bos>",
        eos="<end_of_turn>",
        extra={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
        template=TEMPLATE,
        config_tokens={
            "boi_token_index": "<start_of_image>",
            "eoi_token_index": "<end_of_image>",
            "image_token_index": "<image_soft_token>",
        },
    )
    image_processor = "Gemma3ImageProcessorPil"
    processor = "Gemma3Processor"
    processor_fields = ("image_seq_length",)
    model_classes = ("Gemma3Config", "Gemma3ForConditionalGeneration")
    preset = "medgemma"

    @classmethod
    def image_tokens(
        cls, config: Any, preprocessor: Mapping[str, Any], image_size: ImageSize | None
    ) -> tuple[int, int]:
        # Gemma3Processor: each image (and each pan-and-scan crop, when enabled) becomes
        # <start_of_image> + mm_tokens_per_image soft tokens + <end_of_image>.
        pre = preprocessor
        per_image = int(config.mm_tokens_per_image)
        crops = 0
        if pre.get("do_pan_and_scan"):
            settings = {key: pre.get(key) or default for key, default in PAN_AND_SCAN.items()}
            if image_size is None:
                crops = int(settings["pan_and_scan_max_num_crops"])
            else:
                crops = pan_and_scan_crops(
                    *image_size,
                    min_crop_size=int(settings["pan_and_scan_min_crop_size"]),
                    max_num_crops=int(settings["pan_and_scan_max_num_crops"]),
                    min_ratio_to_activate=float(settings["pan_and_scan_min_ratio_to_activate"]),
                )
        sequences = 1 + crops
        return sequences * per_image, sequences * 2

    @classmethod
    def tiny(cls, shape: TinyShape, tokenizer: Any) -> tuple[Any, Any]:
        config_class, model_class = cls.classes()
        size = shape.image_size
        tokens_per_image = ((size // shape.patch_size) // 2) ** 2  # pooled 2x2 per side
        head_dim = shape.text_hidden // 4
        config = config_class(
            text_config=shape.text(
                tokenizer, head_dim=head_dim, query_pre_attn_scalar=head_dim, sliding_window=64
            ),
            vision_config=shape.vision(model_type="siglip_vision_model"),
            mm_tokens_per_image=tokens_per_image,
            **cls.stand_in.config_ids(tokenizer),
        )
        processor = cls.make_processor(
            cls.make_image_processor(size={"height": size, "width": size}),
            tokenizer,
            image_seq_length=tokens_per_image,
        )
        model = model_class(config)
        # random init zero-fills this bare Parameter: the model would ignore images
        weight = model.model.multi_modal_projector.mm_input_projection_weight
        import torch  # here, not at import: listing families builds no model

        with torch.no_grad():
            weight.normal_(0.0, shape.vision_hidden**-0.5)
        return model, processor
