"""What every judge backend shares: the request and reply types, the `JudgeBackend` base class,
and the helpers both backends use to shape a chat or a logits-mode reply.

A backend only turns chat requests into replies; rubrics, parsing, the hybrid shortcut, the
cache and the counters live in the rest of `medvqa.judge` (rubrics, replies, cache,
engine), so both backends are scored, cached and counted identically. Each reply says how many
requests it took (`attempts`) so that the metric can count every request a server saw, retries
included.

Two modes:

* ``generate``: greedy decoding; the reply text is parsed by the judge.
* ``logits``: the probability of each allowed score label at the position where the score is
  written. The `hf` backend (`backend_hf`) pre-fills the assistant turn with ``{"score": `` and
  reads the next-token distribution; the `openai` backend (`backend_openai`) reads
  ``top_logprobs`` at the first generated score token, and fails with a clear message when the
  server does not return log-probabilities.
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from medvqa.judge.config import MODES
from medvqa.judge.errors import JudgeConfigError

log = logging.getLogger(__name__)

__all__ = [
    "JudgeBackend",
    "JudgeRequest",
    "Reply",
    "label_probs_text",
    "merge_system_role",
    "renormalise",
    "reply_schema",
]


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


@dataclass(kw_only=True)
class JudgeBackend(ABC):
    """A judge model. `judge_id` (backend, model, mode) is part of every cache key.

    The fields that `JudgeConfig` declares have no default here (every default once): a
    backend is built by `medvqa.judge.backends.build_backend` from a `JudgeConfig`,
    or given every value explicitly.
    """

    mode: str
    batch_size: int
    concurrency: int
    max_new_tokens: int
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


def renormalise(probs: Mapping[str, float]) -> dict[str, float]:
    """`probs` rescaled to sum to 1 over its labels; empty when they hold no probability."""
    total = sum(probs.values())
    if total <= 0:
        return {}
    return {k: v / total for k, v in probs.items()}


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
