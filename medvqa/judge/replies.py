"""Reading the judge's replies: from a backend's `Reply` to a `Judgment` (score, reason).

Models wrap their answer in prose, code fences or markdown, so parsing is tolerant; but a
score outside the rubric's labels is unreadable, never clipped. In `generate` mode an
unreadable first reply earns one stricter reminder (`reminder_messages`); if the second reply
is unreadable too the judgment is recorded as failed. In `logits` mode the backend already
returns label probabilities, which the rubric reduces to a score.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from medvqa.judge.base import Reply
from medvqa.judge.rubrics import Rubric

__all__ = [
    "Judgment",
    "after_reminder",
    "parse_judgment",
    "read_reply",
    "reminder_messages",
]


@dataclass
class Judgment:
    """The outcome for one distinct (rubric, question, ground truth, prediction) item."""

    score: float | None
    reason: str
    raw: str
    status: str  # ok | failed
    error: str = ""

    @property
    def label_mass(self) -> float:
        """In logits mode, the probability the judge put on the allowed labels where it wrote
        the score (low: it wanted to write something else); NaN otherwise."""
        try:
            value = json.loads(self.raw).get("label_mass")
        except (ValueError, AttributeError):
            return math.nan
        return float(value) if isinstance(value, int | float) else math.nan


_NUMBER = r"\d+(?:\.\d+)?"
_KEY_VALUE = re.compile(rf"""score["']?\s*[:=]\s*["']?({_NUMBER})""", re.IGNORECASE)
# A reply that opens with the score, after optional quotes, brackets or markdown emphasis.
_LEADING = re.compile(rf"""^[\s"'`*(\[]*({_NUMBER})(?![\d])""")


def _label(value: Any, rubric: Rubric) -> str | None:
    """`value` as one of the rubric's labels ("4", 4, 4.0, " 4 " -> "4"), or None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        if not math.isfinite(value):
            return None
        text = str(int(value)) if float(value).is_integer() else str(value)
    else:
        text = str(value).strip().strip("\"'").strip()
        try:
            number = float(text)
        except ValueError:
            pass
        else:
            if math.isfinite(number) and number.is_integer():
                text = str(int(number))
    return text if text in rubric.labels else None


def _json_objects(text: str) -> list[dict]:
    """Every JSON object that starts somewhere in `text` (models wrap them in prose or
    code fences)."""
    decoder = json.JSONDecoder()
    found = []
    for start in (i for i, ch in enumerate(text) if ch == "{"):
        try:
            obj, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            found.append(obj)
    return found


def parse_judgment(text: str, rubric: Rubric) -> tuple[float, str] | None:
    """(score, reason) from a judge reply, or None if it holds no allowed score.

    Tolerant, in order: a JSON object anywhere in the text with a "score" key; a
    `score: 4`-style pair; a reply that starts with a bare label ("4", "4 - correct"). A
    score outside the rubric's labels (e.g. 7 on the 1-5 scale) is unreadable, not clipped.
    """
    for obj in _json_objects(text):
        lowered = {str(k).lower(): v for k, v in obj.items()}
        if "score" in lowered:
            label = _label(lowered["score"], rubric)
            if label is not None:
                return rubric.value_of(label), str(lowered.get("reason", "") or "")
    for pattern in (_KEY_VALUE, _LEADING):
        match = pattern.search(text)
        if match:
            label = _label(match.group(1), rubric)
            if label is not None:
                return rubric.value_of(label), ""
    return None


def read_reply(reply: Reply, rubric: Rubric) -> Judgment | None:
    """The judgment a first reply gives, or None when its text is unreadable (then the
    caller sends `reminder_messages` and reads the answer with `after_reminder`)."""
    if reply.error is not None:
        return Judgment(None, "", reply.text, "failed", reply.error)
    if reply.label_probs is not None:
        return Judgment(rubric.from_probs(reply.label_probs), "", reply.text, "ok")
    parsed = parse_judgment(reply.text, rubric)
    if parsed is None:
        return None
    return Judgment(parsed[0], parsed[1], reply.text, "ok")


def reminder_messages(messages: list[dict], first: Reply, rubric: Rubric) -> list[dict]:
    """The conversation that asks again: the first request, its unreadable reply and the
    rubric's stricter reminder."""
    return [
        *messages,
        {"role": "assistant", "content": first.text},
        {"role": "user", "content": rubric.reminder()},
    ]


def after_reminder(first: Reply, second: Reply, rubric: Rubric) -> Judgment:
    """The judgment after a reminder: the second reply's score, or a failure (no second
    chance). `raw` keeps both replies."""
    raw = f"{first.text}\n--- after reminder ---\n{second.text}"
    parsed = None if second.error else parse_judgment(second.text, rubric)
    if parsed is None:
        error = second.error or (
            f"unreadable judge reply, also after a reminder: {second.text[:200]!r}"
        )
        return Judgment(None, "", raw, "failed", error)
    return Judgment(parsed[0], parsed[1], raw, "ok")
