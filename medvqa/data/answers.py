"""How a reply is read as an answer: normalisation, the candidate a free-text reply selects,
and the option a multiple-choice reply commits to.

Every family, the judge's shortcut and the readers of others' predictions compare answers with
these, so "Yes", "yes" and "YES." agree everywhere (docs/metrics.md).

Multiple-choice resolution rules (:func:`resolve_prediction`), first match wins, on the reply
with compatibility forms folded (full-width ``Ｂ`` and ``：``), invisible characters (a
zero-width space after the letter) dropped, and a JSON object (``{"answer": "B"}``) read as its
answer:

1. the whole reply is an option: its text (exactly, or ignoring case) or a bare letter ``B``,
   ``b``, ``B)``, ``(B)``, ``B.``, also after a lead-in ("Answer:", "The answer is", "Option"),
   and also inside a wrapper real models write: ``**B**``, ``[B]``, ``'B'``,
   ``<answer>B</answer>``, ``\\boxed{B}`` (a letter past the last option is invalid);
2. the **committed** answers anywhere in the reply: the span after "the answer is", "Answer:",
   "答案：" / "答案是", "My answer:", "I choose", a ``<answer>`` tag or ``\\boxed{}``, "B is correct", and a letter
   (or an option's text) alone on the first or last line. A model that reasons through the
   options before committing names them all; only its commitment counts, so "Although Edema was
   considered, the answer is B." is B. Commitments that disagree ("Answer: A ... Answer: B"),
   name two options ("the answer is A or B") or contradict their letter ("B) liver" where B is
   not liver) are invalid;
3. with no commitment, a letter followed by text, "B) liver": the letter's option, unless the
   text selects a *different* option (a contradiction, invalid);
4. the option text inside prose, by :func:`closed_choice` (normalised exact match or a unique
   whole-word containment; two options -> invalid).

The answer key may be the option's text or its letter (:func:`key_option`); a key that is
neither is an error rather than a silent zero.
"""

from __future__ import annotations

import functools
import json
import math
import re
import unicodedata
from collections.abc import Sequence
from typing import Any

from medvqa.data.questions import LETTERS, YES_NO, is_zh, resolve_answer, zh_side

NUMBER_WORDS: dict[str, str] = {
    w: str(i)
    for i, w in enumerate(
        [
            "zero",
            "one",
            "two",
            "three",
            "four",
            "five",
            "six",
            "seven",
            "eight",
            "nine",
            "ten",
            "eleven",
            "twelve",
            "thirteen",
            "fourteen",
            "fifteen",
            "sixteen",
            "seventeen",
            "eighteen",
            "nineteen",
            "twenty",
        ]
    )
}


# SURE-VQA's own map (med_vlm_robustness/eval/glossary.py `manual_map`, from the VQA
# evaluation): "none" is "0", and only zero..ten are numbers (`sure_number_words`).
SURE_NUMBER_WORDS: dict[str, str] = {
    "none": "0",
    **{w: NUMBER_WORDS[w] for w in list(NUMBER_WORDS)[:11]},
}


ARTICLES: frozenset[str] = frozenset({"a", "an", "the"})


_APOSTROPHES = re.compile(r"['\u2019\u2018`]")


_DIGIT_COMMA = re.compile(r"(?<=\d),(?=\d)")


# Everything that is neither a word character, whitespace nor a period, plus the underscore
# (which \w would keep).
_PUNCT = re.compile(r"[^\w\s.]|_")


# A period survives only with a digit on both sides (a decimal point).
_NON_DECIMAL_PERIOD = re.compile(r"(?<!\d)\.|\.(?!\d)")


def tokens(text: Any, number_words: dict[str, str] = NUMBER_WORDS) -> list[str]:
    """Normalised tokens of ``text``; see :func:`normalize_answer` for the rules.
    `number_words` replaces the map of rule 5 (`SURE_NUMBER_WORDS`: SURE-VQA's)."""
    if text is None or (isinstance(text, float) and math.isnan(text)):
        return []
    s = str(text).lower()
    s = _APOSTROPHES.sub("", s)
    s = _DIGIT_COMMA.sub("", s)
    s = _PUNCT.sub(" ", s)
    s = _NON_DECIMAL_PERIOD.sub(" ", s)
    out = []
    for tok in s.split():
        tok = number_words.get(tok, tok)
        if tok not in ARTICLES:
            out.append(tok)
    return out


def normalize_answer(text: str) -> str:
    """VQA-style normalisation so that surface variants of the same answer compare equal.

    Rules, applied in order (idempotent; identical for predictions, references, candidates):

    * lower-case; ``None``/NaN become the empty string;
    * apostrophes are deleted (``"patient's"`` -> ``"patients"``, ``"don't"`` -> ``"dont"``);
    * a comma between digits is deleted (``"1,000"`` -> ``"1000"``);
    * every other punctuation character, **including hyphens** and underscores, becomes a space,
      so ``"x-ray"``, ``"X ray"`` and ``"x_ray"`` all give ``"x ray"`` (two tokens; ``"xray"``
      stays one token and does not match). Splitting rather than deleting hyphens keeps
      ``"t2-weighted"`` comparable with ``"t2 weighted"``; a leading minus sign is lost, which is
      irrelevant for the answers in medical VQA data sets;
    * a period is kept only as a decimal point (digit on both sides: ``"2.5"``), otherwise it
      becomes a space (``"5."`` -> ``"5"``);
    * number words ``zero`` .. ``twenty`` become digits (``"two"`` -> ``"2"``); ``"none"`` is not
      mapped to ``"0"`` because in medical VQA it usually means "no finding";
    * the articles a / an / the are dropped and whitespace is collapsed.
    """
    return " ".join(tokens(text))


def choice_from_normalised(pred: str, cands: Sequence[str], norm: Sequence[str]) -> str | None:
    """Core of :func:`closed_choice` on pre-normalised prediction and candidates."""
    sides = _zh_sides(tuple(norm)) if len(cands) == 2 else None
    if sides is not None:
        # Chinese yes/no (是 / 否): CJK has no spaces between words, so a reply's side is read
        # from its synonyms ("是的。" is 是, "没有" is 否; a plain "yes" / "no" too, as
        # lmms-eval reads them), not by whole-word containment.
        side = pred if pred in YES_NO else zh_side(pred)
        return cands[sides.index(side)] if side is not None else None
    exact = [i for i, n in enumerate(norm) if n == pred]
    if exact:
        return cands[exact[0]] if len(exact) == 1 else None
    padded = f" {pred} "
    hits = [i for i, n in enumerate(norm) if n and f" {n} " in padded]
    # A candidate contained (as whole words) in another matched candidate is not a separate
    # choice: "left lung" selects "left lung", not also "left".
    hits = [
        i
        for i in hits
        if not any(norm[j] != norm[i] and f" {norm[i]} " in f" {norm[j]} " for j in hits)
    ]
    return cands[hits[0]] if len(hits) == 1 else None


@functools.lru_cache(maxsize=4096)
def _zh_sides(norm: tuple[str, ...]) -> tuple[str | None, ...] | None:
    """The yes/no side of each of two normalised candidates when they are a Chinese yes/no
    pair, else None; cached: a split's closed rows share a few candidate pairs (hot path)."""
    if not any(map(is_zh, norm)):
        return None
    sides = tuple(zh_side(n) for n in norm)
    return sides if set(sides) == {"yes", "no"} else None


def closed_choice(pred: str, candidates: Sequence[str]) -> str | None:
    """The candidate a free-text prediction selects, or None if it selects none or several.

    A candidate matches if the normalised prediction equals it, or contains it as a whole-word
    token sequence ("yes, there is" selects "yes"; "yes or no" matches two -> None). Two
    refinements keep verbose but unambiguous answers valid: an exact match wins over
    containment matches, and a matched candidate that is itself contained in another matched
    candidate is dropped ("the left lung" with candidates "left"/"left lung" -> "left lung").
    Candidates that normalise to the same string are indistinguishable, hence ambiguous (None).
    """
    if candidates is None:
        return None
    cands = list(candidates)
    return choice_from_normalised(
        normalize_answer(pred), cands, [normalize_answer(c) for c in cands]
    )


def same_answer(choice: str | None, answer: Any) -> bool:
    """Whether a selected candidate is the reference answer, both sides normalised alike.

    Candidates, references and predictions come from different writers (medvqa's yes/no space
    is lower case, SLAKE's raw answers are "Yes"/"No"), so a raw ``==`` would score a right
    answer 0; :func:`normalize_answer` on both sides makes "Yes", "yes" and "YES." agree.
    """
    return choice is not None and normalize_answer(choice) == normalize_answer(answer)


def closed_correct(pred: str, answer: str, candidates: Sequence[str]) -> float:
    """1.0 iff the prediction selects exactly the answer candidate (invalid counts as wrong)."""
    return float(same_answer(closed_choice(pred, candidates), answer))


_LEAD_IN = re.compile(
    r"^(?:(?:the\s+)?(?:correct\s+|final\s+|best\s+)?(?:answer|option|choice)\b\s*(?:is\b)?"
    r"\s*[:\-]?|(?:正确|最终)?(?:答案|选项)\s*(?:是|为)?\s*:?)\s*",
    re.IGNORECASE,
)


_LETTER_TEXT = re.compile(r"^\(?([A-Ea-e])\s*[).:]\s*(.+)$", re.DOTALL)


# Any letter alone, in range or not ("E" with three options is an invalid pick, not prose).
_BARE_LETTER = re.compile(r"^\(?([A-Ea-e])[).:]?$")


# An upper-case letter opening a committed span: "B because ...", "B (lung)", "B - lung".
_LEAD_LETTER = re.compile(r"^\(?([A-E])\)?(?=$|[\s.,;:!?)\]\-])\s*[).:\-]?\s*(.*)$", re.DOTALL)


_TWO_LETTERS = re.compile(
    r"^\(?([A-Ea-e])\)?\s*(?:or|and|/|,|&)\s*\(?([A-Ea-e])\)?(?![A-Za-z])", re.IGNORECASE
)


_MARKDOWN = re.compile(r"\*\*|__")


_WRAPPERS = (
    re.compile(r"^<answer>\s*(.*?)\s*</answer>$", re.DOTALL | re.IGNORECASE),
    re.compile(r"^\\boxed\{(.*)\}$", re.DOTALL),
    re.compile(r"^\\text(?:bf)?\{(.*)\}$", re.DOTALL),
    re.compile(r"^\[(.*)\]$", re.DOTALL),
    re.compile(r"^'(.*)'$", re.DOTALL),
    re.compile(r'^"(.*)"$', re.DOTALL),
    re.compile(r"^`(.*)`$", re.DOTALL),
    re.compile(r"^\*(.*)\*$", re.DOTALL),
)


_SPAN_END = r"(.*?)(?=[.!?;](?:\s|$)|。|\n|$)"


# Where a reply commits to an answer; group 1 is the span that names it.
_COMMITS = (
    re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL | re.IGNORECASE),
    re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}"),
    re.compile(
        r"\b(?:answer|choice|option)s?\s*(?:is|would\s+be|should\s+be|will\s+be|:|=|\s[-–])\s*"
        r"(?:(?:option|choice|letter)\s+)?" + _SPAN_END,
        re.IGNORECASE,
    ),
    re.compile(
        r"\bI\s*(?:would\s+|will\s+|'d\s+|'ll\s+)?(?:choose|select|pick|go\s+with)\s+"
        r"(?:(?:option|choice|letter)\s+)?" + _SPAN_END,
        re.IGNORECASE,
    ),
    re.compile(
        r"(?:^|(?<=[\s(]))(?:[Oo]ption\s+|[Cc]hoice\s+)?(\(?[A-E]\)?)\s+is\s+(?:the\s+)?"
        r"(?:correct|right|best)\b"
    ),
    re.compile(r"(?:正确|最终)?答案\s*(?:应该?是|是|为|:)\s*(?:选项\s*)?" + _SPAN_END),
)


# Characters that do not show: a zero-width space after a letter is still the letter.
_INVISIBLE = re.compile("[\u00ad\u200b-\u200f\u2060\ufeff]")
# The keys a reply written as a JSON object names its answer under.
_JSON_KEYS = ("answer", "final_answer", "choice", "option", "prediction")
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL | re.IGNORECASE)


def _canonical(text: str) -> str:
    """The reply as the rules read it: compatibility forms folded (NFKC: full-width ``Ｂ`` is
    ``B``, ``：`` is ``:``), invisible characters dropped, and a JSON object
    (``{"answer": "B"}``, also in a ```json fence) replaced by its answer."""
    text = _INVISIBLE.sub("", unicodedata.normalize("NFKC", text)).strip()
    fenced = _FENCE.match(text)
    body = fenced.group(1) if fenced else text
    if body.startswith("{") and body.endswith("}"):
        try:
            obj = json.loads(body)
        except ValueError:
            return text
        named = {str(k).lower(): v for k, v in obj.items()} if isinstance(obj, dict) else {}
        for key in _JSON_KEYS:
            if isinstance(named.get(key), str | int):
                return str(named[key]).strip()
    return text


def _strip(text: str) -> str:
    return text.strip().rstrip(".").strip()


def _unwrap(text: str) -> str:
    """The text inside the wrappers models put around an answer (``**B**``, ``[B]``, tags)."""
    text = _strip(_MARKDOWN.sub("", text))
    while True:
        for wrapper in _WRAPPERS:
            inner = wrapper.match(text)
            if inner is not None:
                text = _strip(inner.group(1))
                break
        else:
            return text


def _letter_pick(letter: str, rest: str, options: Sequence[str]) -> str | None:
    """The letter's option unless it is out of range or the text beside it names another."""
    index = LETTERS.index(letter.upper())
    if index >= len(options):
        return None
    named = closed_choice(rest, options) if rest.strip() else None
    return options[index] if named in (None, options[index]) else None


def _names_several(text: str, options: Sequence[str]) -> bool:
    return sum(closed_choice(text, [option]) is not None for option in options) > 1


def _span_picks(span: str, options: Sequence[str]) -> list[str | None]:
    """What a committed span names: [] nothing, [option], or [None] an invalid pick."""
    text = _unwrap(span)
    if not text or re.match(r"not\b", text, re.IGNORECASE):
        return []
    if _TWO_LETTERS.match(text) is not None:
        return [None]
    hit = resolve_answer(text, options)
    if hit is not None:
        return [hit]
    if _BARE_LETTER.match(text) is not None:
        return [None]  # a letter past the last option
    lettered = _LEAD_LETTER.match(text) or _LETTER_TEXT.match(text)
    if lettered is not None:
        return [_letter_pick(lettered.group(1), lettered.group(2), options)]
    named = closed_choice(text, options)
    if named is not None:
        return [named]
    return [None] if _names_several(text, options) else []


def _line_picks(line: str, options: Sequence[str]) -> list[str | None]:
    """A first or last line that is only a letter or an option ("B", "B) lung", "**lung**")."""
    text = _unwrap(line)
    hit = resolve_answer(text, options)
    if hit is not None:
        return [hit]
    if _BARE_LETTER.match(text) is not None:
        return [None]
    lettered = _LETTER_TEXT.match(text)
    if lettered is not None and lettered.group(1).isupper():
        return [_letter_pick(lettered.group(1), lettered.group(2), options)]
    return []


def _committed(text: str, options: Sequence[str]) -> list[str | None]:
    """Every answer the reply commits to, in no particular order (see the module docstring)."""
    text = _MARKDOWN.sub("", text)
    picks: list[str | None] = []
    for pattern in _COMMITS:
        for found in pattern.finditer(text):
            picks += _span_picks(found.group(1), options)
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) > 1:
        picks += _line_picks(lines[0], options) + _line_picks(lines[-1], options)
    return picks


def resolve_prediction(prediction: Any, options: Sequence[str]) -> str | None:
    """The option a free-text response selects, or None if it selects none or several."""
    if prediction is None or (isinstance(prediction, float) and math.isnan(prediction)):
        return None
    options = [str(o) for o in options]
    text = _canonical(str(prediction))
    if not text:
        return None
    body = _strip(_LEAD_IN.sub("", text, count=1))
    for candidate in (
        text,
        _strip(text),
        body,
        _unwrap(text),
        _unwrap(_LEAD_IN.sub("", _unwrap(text), count=1)),
    ):
        if candidate:
            hit = resolve_answer(candidate, options)
            if hit is not None:
                return hit
    picks = set(_committed(text, options))
    if picks:
        return picks.pop() if len(picks) == 1 else None
    if _TWO_LETTERS.match(_unwrap(body)) is not None:
        return None
    lettered = _LETTER_TEXT.match(body)
    if lettered is not None:
        return _letter_pick(lettered.group(1), lettered.group(2), options)
    return closed_choice(text, options)


def key_option(answer: Any, options: Sequence[str]) -> str | None:
    """The option an answer key names: its text (exactly or ignoring case) or its letter.

    Keys written as letters ("B") would otherwise never equal a resolved option's text and
    every row would score 0. None if the key names no option.
    """
    return resolve_answer(answer, [str(o) for o in options])
