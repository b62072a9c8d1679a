"""Reading a closed question's answer space from its text (shared by the dataset loaders).

Closed questions in SLAKE, OVQA and VQA-RAD name their options in the text ("Which is bigger,
liver or spleen?", "Is this a CT or MRI?"); closed accuracy needs that answer space as the
record's candidates.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)

YES_NO = ("yes", "no")
_OPTION_SEP = re.compile(r",|\bor\b", flags=re.IGNORECASE)

# Chinese replies that mean yes / no, as lmms-eval's SLAKE task reads them
# (lmms_eval/tasks/slake/utils.py, ZH_YES / ZH_NO): SLAKE's `zh` half answers 是 / 否.
ZH_YES = frozenset({"是", "是的", "有", "包含", "可以", "能", "会", "正常"})
ZH_NO = frozenset(
    {"否", "不是", "没有", "无", "不包含", "不能", "不会", "不可以", "不正常", "异常"}
)
ZH_YES_NO = ("是", "否")
ZH_SIDE = {**dict.fromkeys(ZH_YES, "yes"), **dict.fromkeys(ZH_NO, "no")}
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")


def is_yes_no(answer: object) -> bool:
    return str(answer).strip().lower() in YES_NO


def is_yes_no_answer(answer: object) -> bool:
    """A yes/no answer in any language medvqa knows (yes/no, 是/否 and their Chinese forms):
    how a predictions file without answer types tells closed questions from open ones."""
    return is_yes_no(answer) or str(answer).strip() in ZH_SIDE


def zh_side(text: object) -> str | None:
    """ "yes" or "no" for a Chinese yes/no reply (the whole text, else its first clause:
    "是的，图像正常。" is yes), None otherwise. Punctuation and spaces separate clauses, so a
    normalised text (punctuation turned into spaces) reads the same."""
    clauses = [c for c in re.split(r"[\W_]+", str(text)) if c]
    for clause in ("".join(clauses), *clauses[:1]):
        if clause in ZH_SIDE:
            return ZH_SIDE[clause]
    return None


def is_zh(text: object) -> bool:
    """Whether a text holds Chinese characters (a candidate of SLAKE's `zh` half)."""
    return _CJK.search(str(text)) is not None


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


_ARTICLES = frozenset({"a", "an", "the"})


def _lower(words: list[str]) -> list[str]:
    return [w.lower() for w in words]


def _after_article(words: list[str]) -> list[str]:
    """The words after the last article: "an MRI" names the option "MRI"."""
    cut = max((i + 1 for i, w in enumerate(words) if w.lower() in _ARTICLES), default=0)
    return words[cut:]


def or_options(question: str, answer: str) -> list[str] | None:
    """[answer, other] when the answer is one side of " or " ("Is this a CT or MRI?").

    The other option is as many words from the other side as the answer has, without articles
    ("an MRI or a CT scan", answer "CT" -> MRI) and without a modifier both options share ("a
    T1 weighted or T2 weighted MRI", answer "T2" -> T1, not "weighted"), so a reply naming
    the option in full still selects one candidate. Only the clause around " or " counts
    (commas bound it); None if the answer is on neither side.
    """
    sides = re.split(r"\bor\b", question.rstrip("?. "), maxsplit=1, flags=re.IGNORECASE)
    if len(sides) != 2:
        return None
    left = sides[0].rstrip(" ,").rsplit(",", 1)[-1].split()
    right = sides[1].split(",", 1)[0].split()
    if right and right[0].lower() in _ARTICLES:
        right = right[1:]
    low = _lower(answer.split())
    n = len(low)
    other: list[str] = []
    if n and _lower(right[:n]) == low:
        rest = _lower(right[n:])
        shared = next((j for j in (2, 1) if len(left) > j and _lower(left[-j:]) == rest[:j]), 0)
        other = _after_article(left[: len(left) - shared][-n:])
    elif n and _lower(left[-n:]) == low:
        other = right[:n]
    elif n:
        # The answer sits before the shared modifier: "T1" in "a T1 weighted or T2 weighted".
        for j in (2, 1):
            if len(left) > n + j and _lower(left[-n - j : -j]) == low:
                tail = _lower(left[-j:])
                k = next((k for k in range(1, n + 2) if _lower(right[k : k + j]) == tail), 0)
                other = right[:k]
                if other:
                    break
    text = " ".join(other)
    return [answer, text] if text and text.lower() != answer.lower() else None


def closed_candidates(question: str, answer: str) -> list[str]:
    """The answer space of a closed question: yes/no, or the two options the question names.

    A kept closed row whose text names no parsable options (the answer is in the question but
    not as an "A or B" side) gets [answer, "not <answer>"]: binary, as the paper scores it.
    The yes/no space is lower case whatever the answer's case ("Yes" in raw SLAKE): scoring
    compares candidate and answer after `normalize_answer`, never as raw strings.
    """
    if is_yes_no(answer):
        return list(YES_NO)
    answer = str(answer).strip()
    side = ZH_SIDE.get(answer)
    if side is not None:  # the answer and the other side's plain word: 是 / 否
        return [answer, ZH_YES_NO[1]] if side == "yes" else [ZH_YES_NO[0], answer]
    options = listed_options(question, answer) or or_options(question, answer)
    if options:
        return options
    if re.search(r"[^\x00-\x7f]", answer):
        _no_answer_space(answer)
    return [answer, f"not {answer}"]


@functools.cache
def _no_answer_space(answer: str) -> None:
    """Warn once per answer: "not X" is an English construction a reply in X's language
    rarely selects, so such a question scores near 0 whatever the model knows."""
    log.warning(
        "closed answer %r is not a yes/no answer medvqa knows in its language and its question "
        "names no options: its candidates are [%r, %r]. Give the rows a candidates column.",
        answer,
        answer,
        f"not {answer}",
    )


# The letters that name a multiple-choice question's options, in order ("A. ...", "B. ...").
LETTERS = "ABCDE"


# "B", "b", "B)", "(B)", "B." all name option B.
_LETTER = re.compile(r"^\(?([A-Ea-e])[).:]?$")


def resolve_answer(answer: Any, options: Sequence[str]) -> str | None:
    """The option an answer names: its exact text, its text ignoring case, or its letter."""
    text = str(answer).strip()
    if text in options:
        return text
    lowered = {o.lower(): o for o in options}
    if text.lower() in lowered:
        return lowered[text.lower()]
    letter = _LETTER.match(text)
    if letter is not None:
        index = LETTERS.index(letter.group(1).upper())
        if index < len(options):
            return options[index]
    return None
