"""VLMEvalKit's exact matching: the option its MCQ scorer reads from a reply without a judge.

VLMEvalKit (github.com/open-compass/VLMEvalKit, vlmeval/utils/matching_util.py at commit
e8e78f05f3080fe28154f2130321f17951c3be94) reads a reply with `can_infer`; its MCQ scorer
(vlmeval/dataset/utils/multiple_choice.py, `extract_answer_from_item` under
`exact_matching`, i.e. no judge model) counts a reply it cannot read as the option 'Z', which
is never the key. `metric.mcq.matching=vlmevalkit_exact` scores with this reading, so a figure
VLMEvalKit printed can be checked from its prediction file (docs/metrics.md#multiple-choice).

It differs from medvqa's own reading (`medvqa.data.answers.resolve_prediction`) on
purpose: a letter counts only upper-case, as a word of its own, and only among the reply's last
four words ("b", "B" followed by a line of explanation, "D is correct, since ..." are read as
no option), and an option's text counts as a plain substring of a reply at most twice as long
as the options' texts together. A reply that names no option is 'Z'.
The copy of VLMEvalKit's own code in tests/peers/vlmevalkit.py is the test of this port.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

FAILED = "Z"  # the option VLMEvalKit records for a reply it cannot read (never a key)
# Replies can_infer_option reads as 'Z' (a refusal) or as nothing (an API error).
REFUSALS = (
    "Sorry, I can't help with images of people yet.",
    "I can't process this file.",
    "I'm sorry, but without the image provided",
    "Cannot determine the answer",
)
API_FAILURE = "Failed to obtain answer via API"
# Characters can_infer_option turns into spaces before splitting the reply into words.
_SEPARATORS = str.maketrans(dict.fromkeys(".()[],:;!*#{}", " "))
# can_infer_option's last resort ("The correct answer is **B**"); A-D only, as theirs.
_VERBOSE_ANSWER = re.compile(r"(?i)(?:correct\s+)?answer\s+is\s+\**([ABCD])\**")
# A letter counts only among a reply's last LAST_WORDS words (`splits.index(ch) > len - 5`).
LAST_WORDS = 4


def _option_letter(reply: str, choices: Mapping[str, Any]) -> str | None:
    """`can_infer_option` with VERBOSE unset (its default): the one option letter written as a
    word near the reply's end, 'Z' for a refusal, else None."""
    if API_FAILURE in reply:
        return None
    if any(refusal in reply for refusal in REFUSALS):
        return FAILED
    words = reply.translate(_SEPARATORS).split()
    named = [letter for letter in choices if letter in words]
    if len(named) == 1:
        if words.index(named[0]) >= len(words) - LAST_WORDS:
            return named[0]
    elif not named and FAILED in words:
        return FAILED
    verbose = _VERBOSE_ANSWER.search(reply)
    if verbose is not None and verbose.group(1).upper() in choices:
        return verbose.group(1).upper()
    return None


def _option_text(reply: str, choices: Mapping[str, Any]) -> str | None:
    """`can_infer_text`: the one option whose lower-cased text is inside a reply no longer
    than twice the options' texts together."""
    reply = reply.lower()
    if len(reply) > 2 * sum(len(str(text)) for text in choices.values()):
        return None
    named = [letter for letter, text in choices.items() if str(text).lower() in reply]
    return named[0] if len(named) == 1 else None


def can_infer(reply: Any, choices: Mapping[str, Any]) -> str:
    """The option letter VLMEvalKit's exact matching reads from `reply` over `choices`
    ({letter: option text}), or FAILED ('Z') where it reads none (`can_infer`, then
    `extract_answer_from_item` without a judge)."""
    reply = str(reply)
    return _option_letter(reply, choices) or _option_text(reply, choices) or FAILED
