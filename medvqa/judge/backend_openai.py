"""The `openai` judge backend: any OpenAI-compatible chat-completions server, through the
official `openai` client (transport retries, structured output, log-probabilities).

Which API key goes to which server (OPENAI_HOST, LOCAL_KEY, `api_key_for`):
`medvqa.judge.keys`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any
from urllib.parse import urlsplit

from medvqa.judge.base import (
    JudgeBackend,
    JudgeRequest,
    Reply,
    label_probs_text,
    renormalise,
    reply_schema,
)
from medvqa.judge.errors import JudgeConfigError
from medvqa.judge.keys import (
    LOCAL_KEY,
    OPENAI_HOST,
    OPENAI_URL,
    api_key_for,
    check_api_key_env,
)

log = logging.getLogger(__name__)

__all__ = ["OpenAIBackend", "create_with_retries", "openai_client", "score_token_probs"]


class _FeatureRejected(Exception):
    """The server rejected the system role or structured output; the request is sent again
    without it."""


_STRUCTURED_WORDS = ("response_format", "json_schema", "structured", "guided")
_LOOPBACK = ("localhost", "127.0.0.1", "::1")
# HTTP statuses worth asking again (a timeout, too many requests); 5xx are too.
RETRYABLE = (408, 429)


def openai_client(base_url: str | None, api_key_env: str | None, timeout: float, who: str) -> Any:
    """The official client for `base_url` (None: OpenAI's API) with the key
    `keys.api_key_for` allows there, its own retries off (`create_with_retries` retries, so
    every request is counted); the log names `who` and where the key comes from, never it."""
    from openai import OpenAI

    # Explicit, so that $OPENAI_BASE_URL cannot send OpenAI's key to another server.
    url = base_url or OPENAI_URL
    key, source = api_key_for(url, api_key_env)
    parts = urlsplit(url)
    log.info("%s at %s: sending %s", who, parts.hostname, source)
    if key and parts.scheme == "http" and parts.hostname not in _LOOPBACK:
        log.warning(
            "%s at %s is plain http: the key in $%s crosses the network unencrypted; use https",
            who,
            url,
            api_key_env,
        )
    return OpenAI(base_url=url, api_key=key or LOCAL_KEY, max_retries=0, timeout=timeout)


def create_with_retries(
    create: Callable[[], Any],
    *,
    retries: int,
    backoff: float,
    timeout: float,
    refused: Callable[[Any], None],
    transient: tuple[type[Exception], ...] = (),
) -> tuple[Any | None, int, str]:
    """Send one request (`create`) until it is answered, at most `retries` more times, waiting
    `backoff * 2**attempt` seconds between tries: after a timeout, a connection error, HTTP
    408/429/5xx or one of the `transient` errors (a reply that is not one). Any other HTTP
    error goes to `refused`, which raises (asking again cannot help). Returns (the response,
    or None; the attempts made; the last error)."""
    import openai

    last_error = ""
    for attempt in range(retries + 1):
        try:
            return create(), attempt + 1, ""
        except openai.APITimeoutError:
            last_error = f"timed out after {timeout:g}s"
        except openai.APIConnectionError as err:
            last_error = f"connection error: {err}"
        except openai.APIStatusError as err:
            if err.status_code < 500 and err.status_code not in RETRYABLE:
                refused(err)
            last_error = f"HTTP {err.status_code}: {err.message}"
        except transient as err:
            last_error = f"{type(err).__name__}: {err}"
        if attempt < retries:
            delay = backoff * 2**attempt
            log.debug("request failed (%s); retry in %.2fs", last_error, delay)
            time.sleep(delay)
    return None, retries + 1, last_error


@dataclass(kw_only=True)
class OpenAIBackend(JudgeBackend):
    """Any OpenAI-compatible chat-completions server, through the official `openai` client.

    The client's own retries are off (`max_retries=0`): this class retries timeouts,
    connection errors, HTTP 408/429 and 5xx itself, with exponential backoff
    (`backoff * 2**attempt` seconds), so every request is counted. Other HTTP errors (401,
    404, 400) raise `JudgeConfigError` at once: retrying a wrong model name cannot help.

    The key sent is the one `medvqa.judge.keys.api_key_for` allows for `base_url`:
    `$OPENAI_API_KEY` only to api.openai.com, another server only the variable named in
    `api_key_env` (else a placeholder).
    """

    model: str
    base_url: str | None
    api_key_env: str | None
    timeout: float
    retries: int
    backoff: float
    top_logprobs: int = 20
    # generate mode: ask for a reply that matches the rubric's JSON with an allowed score
    # (`response_format` json_schema); a server that rejects it is asked without, from then on.
    structured: bool

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
        return openai_client(
            self.base_url, self.api_key_env, self.timeout, f"judge {self.judge_id}"
        )

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

        def refused(err: Any) -> None:
            if err.status_code == 400 and (
                self.drop_system_role(err.message, kwargs["messages"])
                or self._drop_structured(err.message, kwargs)
            ):
                raise _FeatureRejected from err
            raise JudgeConfigError(
                f"judge server {self.base_url or OPENAI_HOST} answered HTTP {err.status_code} "
                f"for model {self.model!r}: {err.message}. Check judge.model, "
                f"judge.base_url and the key in ${self.api_key_env}."
            ) from err

        response, attempts, last_error = create_with_retries(
            lambda: self.client.chat.completions.create(**kwargs),
            retries=self.retries,
            backoff=self.backoff,
            timeout=self.timeout,
            refused=refused,
        )
        if response is not None:
            return self._reply(response, attempts, request.labels)
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
    return renormalise(probs), min(1.0, sum(probs.values()))
