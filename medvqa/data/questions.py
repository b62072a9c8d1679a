"""Reading a closed question's answer space from its text (shared by the dataset loaders).

Closed questions in SLAKE, OVQA and VQA-RAD name their options in the text ("Which is bigger,
liver or spleen?", "Is this a CT or MRI?"); closed accuracy needs that answer space as the
record's candidates.
"""

from __future__ import annotations

import re

YES_NO = ("yes", "no")
_OPTION_SEP = re.compile(r",|\bor\b", flags=re.IGNORECASE)


def is_yes_no(answer: object) -> bool:
    return str(answer).strip().lower() in YES_NO


def question_options(question: str) -> list[str]:
    """The options a question lists after its first comma ("Which is bigger, liver or spleen?")."""
    if "," not in question:
        return []
    tail = question.split(",", 1)[1]
    parts = (p.strip().strip("?.").strip() for p in _OPTION_SEP.split(tail))
    return [p for p in parts if p]


def listed_options(question: str, answer: str, min_options: int = 2) -> list[str] | None:
    """The options after the first comma if there are `min_options`+ and one is the answer.

    The answer keeps its own spelling; repeated options are dropped.
    """
    low = answer.lower()
    options = question_options(question)
    if len(options) >= min_options and low in (o.lower() for o in options):
        return list(dict.fromkeys(answer if o.lower() == low else o for o in options))
    return None


def or_options(question: str, answer: str) -> list[str] | None:
    """[answer, other] when the answer is one side of " or " ("Is this a CT or MRI?").

    The other option is as many words from the other side as the answer has; None if the
    answer is on neither side.
    """
    sides = re.split(r"\bor\b", question.rstrip("?. "), maxsplit=1, flags=re.IGNORECASE)
    if len(sides) != 2:
        return None
    n = len(answer.split())
    left = " ".join(sides[0].split()[-n:]).strip(", ")
    right = " ".join(sides[1].split()[:n]).strip(", ")
    low = answer.lower()
    if left.lower() == low:
        other = right
    elif right.lower() == low:
        other = left
    else:
        return None
    return [answer, other] if other and other.lower() != low else None


def closed_candidates(question: str, answer: str) -> list[str]:
    """The answer space of a closed question: yes/no, or the two options the question names.

    A kept closed row whose text names no parsable options (the answer is in the question but
    not as an "A or B" side) gets [answer, "not <answer>"]: binary, as the paper scores it.
    """
    if is_yes_no(answer):
        return list(YES_NO)
    answer = str(answer).strip()
    return (
        listed_options(question, answer)
        or or_options(question, answer)
        or [answer, f"not {answer}"]
    )
