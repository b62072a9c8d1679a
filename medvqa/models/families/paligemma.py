"""PaliGemma (SigLIP + Gemma): the image and the prompt form a bidirectional prefix, the answer
a causal suffix."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from medvqa.models.families.base import (
    ImageSize,
    ModelFamily,
    StandIn,
    TinyShape,
)

# The checkpoints carry no chat template; the processor itself puts the image tokens and <bos>
# first and "\n" after the prompt, and the answer (its `suffix`) ends with <eos>. A system turn,
# if any, is a line before the question.
TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- for c in m['content'] if c['type'] == 'text' -%}{{ c['text'] }}{%- endfor -%}"
    "{%- if m['role'] == 'system' -%}{{ '\\n' }}{%- endif -%}"
    "{%- if m['role'] == 'assistant' -%}{{ eos_token }}{%- endif -%}"
    "{%- endfor -%}"
)


class PaliGemma(ModelFamily):
    name = "paligemma"
    stand_in = StandIn(
        special=("<pad>", "<eos>", "<bos>", "<image>"),
        bos="<bos>",
        eos="<eos>",
        extra={"image_token": "<image>"},
        template=TEMPLATE,
        config_tokens={"image_token_index": "<image>"},
    )
    image_processor = "SiglipImageProcessorPil"
    processor = "PaliGemmaProcessor"
    model_classes = ("PaliGemmaConfig", "PaliGemmaForConditionalGeneration")
    chat_template = TEMPLATE  # model.chat_template: paligemma
    unshareable = (
        "PaliGemma attends bidirectionally over its whole prompt (a prefix-LM), so the image's "
        "keys and values depend on the question after it"
    )
    preset = "paligemma"

    @classmethod
    def image_tokens(
        cls, config: Any, preprocessor: Mapping[str, Any], image_size: ImageSize | None
    ) -> tuple[int, int]:
        # PaliGemmaProcessor: image_seq_length copies of <image> before the prompt, whatever
        # the picture.
        vision = config.vision_config
        tokens = (
            preprocessor.get("image_seq_length") or (vision.image_size // vision.patch_size) ** 2
        )
        return int(tokens), 0

    @classmethod
    def shrink_vision(cls, config: Any, text: Any) -> None:
        super().shrink_vision(config, text)
        # the projector maps into the text width
        config.projection_dim = config.vision_config.projection_dim = text.hidden_size

    @classmethod
    def tiny(cls, shape: TinyShape, tokenizer: Any) -> tuple[Any, Any]:
        config_class, model_class = cls.classes()
        size = shape.image_size
        image_processor = cls.make_image_processor(size={"height": size, "width": size})
        image_processor.image_seq_length = (size // shape.patch_size) ** 2
        # adds 1152 <loc>/<seg> tokens: size the vocabulary after this
        processor = cls.make_processor(image_processor, tokenizer)
        head_dim = shape.text_hidden // 4
        config = config_class(
            vision_config=shape.vision(model_type="siglip_vision_model"),
            text_config={"model_type": "gemma", **shape.text(tokenizer, head_dim=head_dim)},
            projection_dim=shape.text_hidden,
            **cls.stand_in.config_ids(tokenizer),
        )
        return model_class(config), processor
