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
from medvqa.models.prompting import chat_template
from medvqa.zoo import tiny

log = logging.getLogger(__name__)

BUILDER_VERSION = 1


# --- chat templates: the family's turn markers, content lists of image/text items -------------


def _content(image: str) -> str:
    return (
        "{% for c in m['content'] %}{% if c['type'] == 'image' %}" + image + "{% elif c['type'] "
        "== 'text' %}{{ c['text'] }}{% endif %}{% endfor %}"
    )


QWEN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    + _content("<|vision_start|><|image_pad|><|vision_end|>")
    + "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GEMMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    + _content("<start_of_image>")
    + "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
IDEFICS3_TEMPLATE = (
    "<|im_start|>{% for m in messages %}{{ m['role'] | capitalize }}:"
    "{% if m['role'] == 'assistant' %} {% endif %}"
    + _content("<image>")
    + "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)

ROW_COL_TOKENS = [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)]

# Per family: special tokens (the first is padding), bos/eos, tokenizer extras, chat template.
TOKENS: dict[str, dict[str, Any]] = {
    "llava": {
        "special": tiny.RESERVED_TOKENS,
        "bos": "<s>",
        "eos": "</s>",
        "extra": {"image_token": "<image>"},
        "template": tiny.CHAT_TEMPLATE,
    },
    "qwen2_vl": {
        "special": [
            "<|endoftext|>",
            "<|im_start|>",
            "<|im_end|>",
            "<|vision_start|>",
            "<|vision_end|>",
            "<|image_pad|>",
            "<|video_pad|>",
        ],
        "bos": None,
        "eos": "<|im_end|>",
        "extra": {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>"},
        "template": QWEN_TEMPLATE,
    },
    "gemma3": {
        "special": [
            "<pad>",
            "<eos>",
            "<bos>",
            "<start_of_turn>",
            "<end_of_turn>",
            "<start_of_image>",
            "<end_of_image>",
            "<image_soft_token>",
        ],
        "bos": "<bos>",
        "eos": "<end_of_turn>",
        "extra": {
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
        "template": GEMMA3_TEMPLATE,
    },
    "idefics3": {
        "special": [
            "<|endoftext|>",
            "<|im_start|>",
            "<end_of_utterance>",
            "<fake_token_around_image>",
            "<global-img>",
            "<image>",
            *ROW_COL_TOKENS,
        ],
        "bos": "<|im_start|>",
        "eos": "<end_of_utterance>",
        "extra": {
            "image_token": "<image>",
            "fake_image_token": "<fake_token_around_image>",
            "global_image_token": "<global-img>",
            "end_of_utterance_token": "<end_of_utterance>",
        },
        "template": IDEFICS3_TEMPLATE,
    },
    "paligemma": {
        "special": ["<pad>", "<eos>", "<bos>", "<image>"],
        "bos": "<bos>",
        "eos": "<eos>",
        "extra": {"image_token": "<image>"},
        "template": chat_template("paligemma"),  # the real checkpoints have none
    },
}
TOKENS["qwen2_5_vl"] = TOKENS["qwen2_vl"]
TOKENS["smolvlm"] = TOKENS["idefics3"]
FAMILIES = ("llava", "qwen2_vl", "qwen2_5_vl", "gemma3", "idefics3", "smolvlm", "paligemma")

CORPUS = [
    "USER: ASSISTANT: User: Assistant: user model assistant system",
    "what modality is this image? is there a lesion? which organ is shown? yes no",
    "the image shows a ct scan of the chest with an abnormality in the left lung",
    "mri x-ray ultrasound brain liver kidney heart abdomen normal abnormal",
]


def build_tokenizer(family: str, vocab_size: int) -> Any:
    """A byte-level BPE (any text tokenises) with the family's special tokens and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    spec = TOKENS[family]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(spec["special"]),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=spec["bos"],
        eos_token=spec["eos"],
        pad_token=spec["special"][0],
        extra_special_tokens=dict(spec["extra"]),
        chat_template=spec["template"],
    )


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
