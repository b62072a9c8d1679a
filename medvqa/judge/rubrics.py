"""What the judge model reads: the rubrics, written for this project, and the item layout.

Rubrics of the answer judge (docs/judge.md):

* ``open``: 1-5 (1 incorrect, 2 partially correct, 3 mostly correct, 4 correct with minor
  deviations, 5 perfect match);
* ``closed``: 0/1;
* ``closed_multilabel`` (questions answered by A, B, both or none): 0 / 0.5 / 1. The model
  writes 0, 1 or 2 points (single tokens, so `logits` mode can read them) and the score is
  points / 2.

and of the per-aspect judge (Kvasir-VQA-x1): ``aspect``, 0/1 for one question class of a row.

Each rubric's id is its name plus a short content hash of everything the model reads apart from
the item (system text, input layout, reminder, labels), so editing a rubric never reuses cached
scores made under the old text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from medvqa.hashing import content_hash

__all__ = [
    "ASKED_CLASS",
    "CLASS_RUBRIC",
    "INPUT_KEYS",
    "RUBRICS",
    "Rubric",
    "build_messages",
    "select_rubric",
]

_PREAMBLE = (
    "You grade the answers of a medical visual question answering system. The user message is "
    'a JSON object with the "question", the "ground_truth" answer and the system\'s '
    '"prediction". You do not see the image: decide only whether the prediction says the same '
    "thing as the ground truth. Wording, synonyms, abbreviations, letter case and extra "
    "courtesy do not matter; a wrong or missing finding, organ, side, location, count, size or "
    "modality does.\n\n"
)

OPEN_TEXT = _PREAMBLE + (
    "Give a score from 1 to 5:\n"
    "1 = incorrect: the prediction contradicts the ground truth or has none of its content.\n"
    "2 = partially correct: some content matches, but important parts are wrong or missing.\n"
    "3 = mostly correct: the main point matches; a secondary detail is wrong or missing.\n"
    "4 = correct with minor deviations: the same content, with an imprecision or an extra "
    "detail that does not change the meaning.\n"
    "5 = perfect match: exactly the content of the ground truth.\n\n"
    'Reply with only a JSON object: {"score": <1, 2, 3, 4 or 5>, "reason": "<one short '
    'sentence>"}'
)

CLOSED_TEXT = _PREAMBLE + (
    "The question has a fixed set of allowed answers (for example yes/no). Give a score:\n"
    "1 = the prediction gives the same answer as the ground truth.\n"
    "0 = the prediction gives another answer, several answers, or no answer.\n\n"
    'Reply with only a JSON object: {"score": <0 or 1>, "reason": "<one short sentence>"}'
)

MULTILABEL_TEXT = _PREAMBLE + (
    "The question asks which of two options applies, and the allowed answers are the first "
    'option (A), the second option (B), "both" or "none" (for example left lung, right '
    "lung, both, none). Give points:\n"
    "2 = the prediction gives exactly the ground-truth answer.\n"
    "1 = partially correct: prediction and ground truth share one option but are not equal "
    '(ground truth "both", prediction A; or ground truth A, prediction "both").\n'
    '0 = incorrect: nothing in common (A instead of B, or "none" against an option), or no '
    "answer.\n\n"
    'Reply with only a JSON object: {"score": <0, 1 or 2>, "reason": "<one short sentence>"}'
)

CLASS_RUBRIC_TEXT = (
    "You check one aspect of an answer given by a visual question answering system for "
    "gastrointestinal endoscopy images. The user message is a JSON object with the "
    '"question", the "aspect" to check, the "ground_truth" answer and the system\'s '
    '"prediction". A question may ask about several aspects at once (for example the type of '
    "a polyp and whether an instrument is visible); the aspect names one of them, as an "
    "identifier with words joined by underscores (e.g. polyp_type, instrument_presence).\n\n"
    "You do not see the image. Find what the ground truth says about this aspect only, and "
    "decide whether the prediction says the same about it. What the prediction says about "
    "other aspects, right or wrong, does not count. Wording, synonyms, abbreviations and "
    "letter case do not matter; a different finding, type, count, colour, size, location or "
    "a yes where the ground truth says no does.\n\n"
    "Give a score:\n"
    "1 = the prediction answers this aspect as the ground truth does.\n"
    "0 = the prediction contradicts the ground truth on this aspect, or says nothing about "
    "it.\n\n"
    'Reply with only a JSON object: {"score": <0 or 1>, "reason": "<one short sentence>"}'
)

REMINDER = (
    "Your reply could not be read. Answer again with only a JSON object of the form "
    '{{"score": <{labels}>, "reason": "<one short sentence>"}} and nothing before or after it.'
)
# The user message: the item as JSON (keys in this order), the same in every mode.
INPUT_KEYS = ("question", "ground_truth", "prediction")
# The extra input key of the per-aspect rubric: the question class being checked.
ASKED_CLASS = "aspect"


@dataclass(frozen=True)
class Rubric:
    """A scoring rubric: the system text, the labels the judge may write and their scores.

    `reduce` says how a label distribution (`logits` mode) becomes a score: ``expected``
    (sum p_i * value_i over the renormalised labels: an ordinal scale) or ``argmax``
    (a category). `input_keys` are the user message's keys in order: the item's question,
    ground_truth and prediction plus any extra fields a caller supplies (e.g. an aspect).
    """

    name: str
    text: str
    labels: tuple[str, ...]
    values: tuple[float, ...]
    reduce: str
    input_keys: tuple[str, ...] = INPUT_KEYS

    def __post_init__(self) -> None:
        if len(self.labels) != len(self.values) or not self.labels:
            raise ValueError(f"rubric {self.name!r}: labels and values must pair up")
        if self.reduce not in ("expected", "argmax"):
            raise ValueError(f"rubric {self.name!r}: reduce {self.reduce!r} is not expected|argmax")

    @cached_property
    def id(self) -> str:
        """`name-<12 hex>`: changes whenever anything the judge reads (besides the item) or
        the label-to-score map changes."""
        # Serialised in this key order (not canonical JSON) so that ids, and with them the
        # keys of judgments already cached, stay what they were.
        blob = json.dumps(
            {
                "text": self.text,
                "reminder": REMINDER,
                "input": self.input_keys,
                "labels": self.labels,
                "values": self.values,
                "reduce": self.reduce,
            }
        )
        return f"{self.name}-{content_hash(blob, length=12)}"

    @property
    def max_value(self) -> float:
        return max(self.values)

    @property
    def min_value(self) -> float:
        return min(self.values)

    def value_of(self, label: str) -> float:
        return self.values[self.labels.index(label)]

    def from_probs(self, probs: Mapping[str, float]) -> float:
        """The score of a label distribution (already renormalised over the labels)."""
        if self.reduce == "expected":
            return float(sum(p * self.value_of(label) for label, p in probs.items()))
        best = max(self.labels, key=lambda label: probs.get(label, 0.0))
        return self.value_of(best)

    def reminder(self) -> str:
        return REMINDER.format(labels=", ".join(self.labels))


RUBRICS: dict[str, Rubric] = {
    "open": Rubric("open", OPEN_TEXT, ("1", "2", "3", "4", "5"), (1, 2, 3, 4, 5), "expected"),
    "closed": Rubric("closed", CLOSED_TEXT, ("0", "1"), (0, 1), "argmax"),
    "closed_multilabel": Rubric(
        "closed_multilabel", MULTILABEL_TEXT, ("0", "1", "2"), (0, 0.5, 1), "argmax"
    ),
}

CLASS_RUBRIC = Rubric(
    "aspect",
    CLASS_RUBRIC_TEXT,
    ("0", "1"),
    (0, 1),
    "argmax",
    input_keys=(INPUT_KEYS[0], ASKED_CLASS, *INPUT_KEYS[1:]),
)


def select_rubric(answer_type: str, closed_kind: Any, row: Any = None) -> str:
    """Rubric name for a row: open -> open; closed with closed_kind "multilabel" ->
    closed_multilabel; any other closed row -> closed."""
    if answer_type == "open":
        return "open"
    if answer_type == "closed":
        # isinstance first: `pd.NA == "multilabel"` is NA, whose truth value raises.
        multilabel = isinstance(closed_kind, str) and closed_kind == "multilabel"
        return "closed_multilabel" if multilabel else "closed"
    raise ValueError(f"row {row!r}: answer_type {answer_type!r} is neither 'open' nor 'closed'")


def build_messages(
    rubric: Rubric,
    question: str,
    answer: str,
    prediction: str,
    extra: Mapping[str, str] | None = None,
) -> list[dict]:
    """System = rubric text; user = the item as JSON (so quotes and newlines in a prediction
    cannot be mistaken for instructions or break the layout), keys in `rubric.input_keys`
    order; `extra` supplies the keys beyond question, ground_truth and prediction."""
    fields = dict(zip(INPUT_KEYS, (question, answer, prediction), strict=True)) | dict(extra or {})
    item = {k: fields[k] for k in rubric.input_keys}
    return [
        {"role": "system", "content": rubric.text},
        {"role": "user", "content": json.dumps(item, ensure_ascii=False)},
    ]
