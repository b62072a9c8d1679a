"""Tiny randomly initialised VLMs of each supported family, built offline from configs.

The real models (`conf/model/<family>.yaml`) are hub checkpoints far too large for a CPU test;
`TinyFamilyBuilder(family, cache_dir)` makes a ~1M-parameter model of the *same architecture*
(same transformers classes, module names, processor and special tokens, a chat template of the
family's shape) so every code path (loading, adapters, training, generation, saving) is tested
offline. Nothing is pre-trained: these models only have to run, not to answer.

The processors they save are the runtime's (`medvqa.models.processors`), imported here so the
tiny models reload exactly as real checkpoints do.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2_5_VLConfig, Qwen2VLConfig, SmolVLMConfig

from medvqa.models.builders.cache import CachedModelBuilder
from medvqa.models.processors import (
    ImageOnlyQwen2_5_VLProcessor,
    ImageOnlyQwen2VLProcessor,
    ImageOnlySmolVLMProcessor,
)
from medvqa.models.stand_in import FAMILIES, build_tokenizer
from medvqa.zoo import tiny

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
        if family not in FAMILIES:
            raise ValueError(f"unknown tiny family {family!r}; choose one of {FAMILIES}")
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
        family = p["family"]
        tokenizer = build_tokenizer(family, p["vocab_size"])
        torch.manual_seed(p["seed"])
        model, processor = getattr(self, f"_{family}")(tokenizer)
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.bos_token_id = tokenizer.bos_token_id
        return model, processor

    # -- per family -------------------------------------------------------------------------

    def _text(self, tokenizer: Any, **extra: Any) -> dict[str, Any]:
        p = self.params
        return {
            "vocab_size": len(tokenizer),
            "hidden_size": p["text_hidden"],
            "intermediate_size": 2 * p["text_hidden"],
            "num_hidden_layers": p["text_layers"],
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 512,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
            **extra,
        }

    def _vision(self, **extra: Any) -> dict[str, Any]:
        p = self.params
        return {
            "hidden_size": p["vision_hidden"],
            "intermediate_size": 2 * p["vision_hidden"],
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": p["image_size"],
            "patch_size": p["patch_size"],
            **extra,
        }

    def _llava(self, tokenizer: Any) -> tuple[torch.nn.Module, Any]:
        from transformers import CLIPImageProcessorPil, LlavaProcessor

        p = self.params
        size = p["image_size"]
        processor = LlavaProcessor(
            image_processor=CLIPImageProcessorPil(
                size={"shortest_edge": size}, crop_size={"height": size, "width": size}
            ),
            tokenizer=tokenizer,
            patch_size=p["patch_size"],
            vision_feature_select_strategy="default",
            num_additional_image_tokens=1,
            chat_template=tokenizer.chat_template,
        )
        model = tiny.build_model(
            processor,
            image_size=size,
            patch_size=p["patch_size"],
            vision_hidden=p["vision_hidden"],
            vision_layers=1,
            vision_heads=2,
            text_hidden=p["text_hidden"],
            text_layers=p["text_layers"],
            text_heads=4,
        )
        return model, processor

    def _qwen_image_processor(self) -> Any:
        from transformers import Qwen2VLImageProcessorPil

        p = self.params
        pixels = p["image_size"] ** 2  # every image is resized to about image_size²
        return Qwen2VLImageProcessorPil(
            size={"shortest_edge": pixels, "longest_edge": pixels},
            patch_size=p["patch_size"],
            temporal_patch_size=2,
            merge_size=2,
        )

    def _qwen_ids(self, tokenizer: Any) -> dict[str, int]:
        ids = tokenizer.convert_tokens_to_ids
        return {
            "image_token_id": ids("<|image_pad|>"),
            "video_token_id": ids("<|video_pad|>"),
            "vision_start_token_id": ids("<|vision_start|>"),
            "vision_end_token_id": ids("<|vision_end|>"),
        }

    def _qwen_text(self, tokenizer: Any) -> dict[str, Any]:
        half_head = self.params["text_hidden"] // 4 // 2  # 4 heads; sections sum to head_dim/2
        t, rest = half_head // 4, half_head - half_head // 4
        section = [t, rest // 2, rest - rest // 2]
        rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section}
        return self._text(tokenizer, rope_parameters=rope)

    def _qwen2_vl(self, tokenizer: Any) -> tuple[torch.nn.Module, Any]:
        from transformers import Qwen2VLForConditionalGeneration

        p = self.params
        config = Qwen2VLConfig(
            text_config=self._qwen_text(tokenizer),
            vision_config={
                "depth": 1,
                "embed_dim": p["vision_hidden"],
                "hidden_size": p["text_hidden"],
                "num_heads": 2,
                "patch_size": p["patch_size"],
                "spatial_merge_size": 2,
                "temporal_patch_size": 2,
            },
            **self._qwen_ids(tokenizer),
        )
        processor = ImageOnlyQwen2VLProcessor(
            image_processor=self._qwen_image_processor(),
            tokenizer=tokenizer,
            chat_template=tokenizer.chat_template,
        )
        return Qwen2VLForConditionalGeneration(config), processor

    def _qwen2_5_vl(self, tokenizer: Any) -> tuple[torch.nn.Module, Any]:
        from transformers import Qwen2_5_VLForConditionalGeneration

        p = self.params
        config = Qwen2_5_VLConfig(
            text_config=self._qwen_text(tokenizer),
            vision_config={
                "depth": 2,
                "hidden_size": p["vision_hidden"],
                "intermediate_size": 2 * p["vision_hidden"],
                "out_hidden_size": p["text_hidden"],
                "num_heads": 2,
                "patch_size": p["patch_size"],
                "spatial_merge_size": 2,
                "temporal_patch_size": 2,
                "window_size": 4 * p["patch_size"],
                "fullatt_block_indexes": [1],
            },
            **self._qwen_ids(tokenizer),
        )
        processor = ImageOnlyQwen2_5_VLProcessor(
            image_processor=self._qwen_image_processor(),
            tokenizer=tokenizer,
            chat_template=tokenizer.chat_template,
        )
        return Qwen2_5_VLForConditionalGeneration(config), processor

    def _gemma3(self, tokenizer: Any) -> tuple[torch.nn.Module, Any]:
        from transformers import (
            Gemma3Config,
            Gemma3ForConditionalGeneration,
            Gemma3ImageProcessorPil,
            Gemma3Processor,
        )

        p = self.params
        size = p["image_size"]
        tokens_per_image = ((size // p["patch_size"]) // 2) ** 2  # pooled 2x2 per side
        ids = tokenizer.convert_tokens_to_ids
        head_dim = p["text_hidden"] // 4
        config = Gemma3Config(
            text_config=self._text(
                tokenizer, head_dim=head_dim, query_pre_attn_scalar=head_dim, sliding_window=64
            ),
            vision_config=self._vision(model_type="siglip_vision_model"),
            mm_tokens_per_image=tokens_per_image,
            boi_token_index=ids("<start_of_image>"),
            eoi_token_index=ids("<end_of_image>"),
            image_token_index=ids("<image_soft_token>"),
        )
        processor = Gemma3Processor(
            image_processor=Gemma3ImageProcessorPil(size={"height": size, "width": size}),
            tokenizer=tokenizer,
            chat_template=tokenizer.chat_template,
            image_seq_length=tokens_per_image,
        )
        model = Gemma3ForConditionalGeneration(config)
        # random init zero-fills this bare Parameter: the model would ignore images
        weight = model.model.multi_modal_projector.mm_input_projection_weight
        with torch.no_grad():
            weight.normal_(0.0, p["vision_hidden"] ** -0.5)
        return model, processor

    def _idefics3_parts(self, tokenizer: Any, config_cls: Any, image_processor_cls: Any) -> Any:
        p = self.params
        scale = 2
        seq_len = (p["image_size"] // p["patch_size"]) ** 2 // scale**2
        config = config_cls(
            vision_config=self._vision(),
            text_config={"model_type": "llama", **self._text(tokenizer)},
            scale_factor=scale,
            image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
            pad_token_id=tokenizer.pad_token_id,
        )
        image_processor = image_processor_cls(
            do_image_splitting=False,
            size={"longest_edge": p["image_size"]},
            max_image_size={"longest_edge": p["image_size"]},
        )
        return config, image_processor, seq_len

    def _idefics3(self, tokenizer: Any) -> tuple[torch.nn.Module, Any]:
        from transformers import (
            Idefics3Config,
            Idefics3ForConditionalGeneration,
            Idefics3ImageProcessorPil,
            Idefics3Processor,
        )

        config, image_processor, seq_len = self._idefics3_parts(
            tokenizer, Idefics3Config, Idefics3ImageProcessorPil
        )
        processor = Idefics3Processor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            image_seq_len=seq_len,
            chat_template=tokenizer.chat_template,
        )
        return Idefics3ForConditionalGeneration(config), processor

    def _smolvlm(self, tokenizer: Any) -> tuple[torch.nn.Module, Any]:
        from transformers import SmolVLMForConditionalGeneration, SmolVLMImageProcessorPil

        config, image_processor, seq_len = self._idefics3_parts(
            tokenizer, SmolVLMConfig, SmolVLMImageProcessorPil
        )
        processor = ImageOnlySmolVLMProcessor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            image_seq_len=seq_len,
            chat_template=tokenizer.chat_template,
        )
        return SmolVLMForConditionalGeneration(config), processor

    def _paligemma(self, tokenizer: Any) -> tuple[torch.nn.Module, Any]:
        from transformers import (
            PaliGemmaConfig,
            PaliGemmaForConditionalGeneration,
            PaliGemmaProcessor,
            SiglipImageProcessorPil,
        )

        p = self.params
        size = p["image_size"]
        image_processor = SiglipImageProcessorPil(size={"height": size, "width": size})
        image_processor.image_seq_length = (size // p["patch_size"]) ** 2
        processor = PaliGemmaProcessor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            chat_template=tokenizer.chat_template,
        )  # adds 1152 <loc>/<seg> tokens: size the vocabulary after this
        head_dim = p["text_hidden"] // 4
        config = PaliGemmaConfig(
            vision_config=self._vision(model_type="siglip_vision_model"),
            text_config={"model_type": "gemma", **self._text(tokenizer, head_dim=head_dim)},
            projection_dim=p["text_hidden"],
            image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        )
        return PaliGemmaForConditionalGeneration(config), processor
