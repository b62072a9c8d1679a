"""Greedy decoding of one batch: plain or from shared image prefixes, into a static or a growing
KV cache, compiled where it pays.

Why transformers' `generate` and not a loop of our own: from 5.x it decodes into a `StaticCache`
(keys and values allocated once for prompt + new tokens, written in place) and, on CUDA with such
a cache, compiles the model's decoding call (`reduce-overhead`: a CUDA graph per shape, no kernel
launches from Python per layer). What it lacks is a cache filled from shared prefixes; that is
the one thing done here: each group's prefix runs once (`prefix.share_prefixes`) and its keys and
values are written once into the rows' slots of the static cache (one indexed copy per layer),
where the growing cache copied them per row and then concatenated the whole cache at every step.
What it keeps, and a loop of our own would remove: a host synchronisation per step (its
end-of-sequence check; deferred only on Apple's MPS) and the Python of its input preparation
per step, which the compiled graph does not hide. benchmarks/gpu.py measures the step time
against the floor of reading the weights and the cache once (docs/gpus.md).

The static cache's length is the batch's prompt length plus the new tokens, rounded up to
`models.spec.CACHE_BUCKET` tokens, and never shorter than an earlier batch's (as transformers
sizes its own static caches across `generate` calls): one shape per batch size, so one compiled
graph. The positions past a row's tokens are masked, so in float32 the answers are the growing
cache's (tests/test_generation_engine.py). Under `compile_decode=auto`, a model whose decoding call does
not compile is decoded eagerly from then on, with a log line saying why.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers import LogitsProcessorList, StaticCache
from transformers.generation.configuration_utils import CompileConfig

from medvqa.generation.logprobs import ChosenLogProbs
from medvqa.generation.prefix import SHARED_KEY
from medvqa.generation.settings import GenerationSettings
from medvqa.models.spec import decode_cache_length

log = logging.getLogger(__name__)


class TypedStaticCache(StaticCache):
    """transformers' StaticCache holding every layer in one dtype (the language model's).

    Under mixed precision a layer's keys can come in float32 at one call and bfloat16 at the
    next (autocast), which the static layers' in-place writes refuse, where the growing cache's
    concatenation promotes. They are cast to `dtype`: an exact upcast where the model's dtype
    is the wider one (float32 weights under bf16 autocast), a no-op where both are bfloat16 (a
    GPU run's weights)."""

    def __init__(self, config: Any, max_cache_len: int, dtype: torch.dtype) -> None:
        super().__init__(config=config, max_cache_len=max_cache_len)
        self.dtype = dtype

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        keys, values = key_states.to(self.dtype), value_states.to(self.dtype)
        return super().update(keys, values, layer_idx, *args, **kwargs)


class Decoder:
    """Decodes batches with one job's `GenerationSettings`; remembers a failed compilation so
    that later batches go eagerly at once."""

    def __init__(self, settings: GenerationSettings, pad_token_id: int) -> None:
        self.settings = settings
        self.pad_token_id = pad_token_id
        self.eager = False  # set when compiling failed under compile_decode=auto
        self.cache_length = 0  # the longest static cache so far: later ones are as long

    def __call__(
        self, model: torch.nn.Module, batch: dict[str, Any], recorder: ChosenLogProbs
    ) -> torch.Tensor:
        """The sequences (prompt and new tokens) of `batch`; `recorder` holds the chosen
        tokens' log-probabilities afterwards. `batch` is left as it was given."""
        device = batch["input_ids"].device
        compiles = self.settings.compiles(device) and not self.eager
        try:
            return self._generate(model, batch, recorder, compiles)
        except Exception as err:
            if not compiles or self.settings.compile is True:
                raise
            log.warning(
                "the compiled decode failed (%s: %s); decoding eagerly from here on "
                "(model.compile_decode=false skips the attempt)",
                type(err).__name__,
                err,
            )
            self.eager = True
            recorder.steps.clear()
            return self._generate(model, batch, recorder, False)

    def _generate(
        self,
        model: torch.nn.Module,
        batch: dict[str, Any],
        recorder: ChosenLogProbs,
        compiles: bool,
    ) -> torch.Tensor:
        inputs = {k: v for k, v in batch.items() if k != SHARED_KEY}
        options: dict[str, Any] = {
            "max_new_tokens": self.settings.max_new_tokens,
            "do_sample": False,
            "pad_token_id": self.pad_token_id,
            "logits_processor": LogitsProcessorList([recorder]),
        }
        cache = None
        if self.settings.decode == "static":
            prompt = inputs["input_ids"].shape[1]
            length = decode_cache_length("static", prompt, self.settings.max_new_tokens)
            self.cache_length = max(self.cache_length, length)
            dtype = model.get_input_embeddings().weight.dtype
            cache = TypedStaticCache(model.config, self.cache_length, dtype)
            options["disable_compile"] = not compiles
            if compiles and inputs["input_ids"].device.type != "cuda":
                config = CompileConfig()
                config._compile_all_devices = True  # transformers' switch for other devices
                options["compile_config"] = config
        if SHARED_KEY in batch:
            cache = prefill_shared(model, batch[SHARED_KEY], cache)
        if cache is not None:
            options["past_key_values"] = cache
        return model.generate(**inputs, **options)


def prefill_shared(
    model: torch.nn.Module, shared: dict[str, Any], cache: TypedStaticCache | None
) -> Any:
    """Each group's prefix run once; its keys and values given to the group's rows: written
    into `cache` (a static one), each prefix layer freed once copied (at most one layer of both
    at once, as the memory plan counts), or, without one, the prefix's growing cache repeated
    over the rows. Qwen-VL's remembered rotary offsets are dropped: `generate` computes the
    rows'."""
    prefix = model(**shared["prefix"], use_cache=True, logits_to_keep=1).past_key_values
    rows = shared["rows"].to(shared["prefix"]["input_ids"].device)
    if cache is None:
        prefix.batch_select_indices(rows)
        cache = prefix
    else:
        for index, layer in enumerate(prefix.layers):
            cache.update(layer.keys[rows], layer.values[rows], index)
            layer.keys = layer.values = None
    for module in model.modules():
        if getattr(module, "rope_deltas", None) is not None:
            module.rope_deltas = None
    return cache
