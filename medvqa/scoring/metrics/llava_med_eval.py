"""LLaVA-Med v1.0's VQA scores: its `llava/eval/run_eval.py` reproduced, quirks included.

LLaVA-Med (and many medical VLM papers after it) report VQA-RAD, SLAKE and PathVQA with the
script `llava/eval/run_eval.py` of github.com/microsoft/LLaVA-Med at tag v1.0.0 (commit
b9a98a7), which scores the answers file of `model_vqa_med.py` against its conversation-format
`test.json`. This family computes what that script prints, row for row (the script is copied
in tests/peers/llava_med_eval.py; tests/test_llava_med_eval.py holds the two equal):

* every reply and ground truth is lower-cased and normalised by `glossary.py`'s
  `normalize_word` (:func:`normalize_word`), and each scorer below normalises its inputs once
  more, as `evaluate_metrics.py` does;
* CLOSED rows: "yes/no accuracy", a substring test (:func:`closed_hit`);
* OPEN rows: "exact match score", "f1 score", "precision", "recall" on whitespace tokens that
  keep the punctuation `normalize_word` leaves (`*`, `'`, `:`, `%`, ...); NLTK's
  `sentence_bleu` ("bleu_score" at its default weights and "bleu_score_1/2/3", each a single
  n-gram order); "open accuracy", the reply mapped to the most similar answer of a candidate
  list (LLaVA-Med's `train_open_answers.json`, `candidate_file`) and compared with the truth;
* each figure is the per-row values added left to right in file order over their count, as the
  script's on the Python 3.10 LLaVA-Med ran on (:func:`left_to_right_mean`); it prints them
  times 100.

docs/metrics.md#llava-med-v10-run_evalpy names each quirk with the line it comes from, and where
this family cannot follow the script (no open rows, answer types other than OPEN/CLOSED).
"""

from __future__ import annotations

import json
import logging
import math
import re
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from medvqa.data.records import ANSWER, ANSWER_TYPE, ID, PREDICTION
from medvqa.errors import ConfigError
from medvqa.hashing import file_hash
from medvqa.scoring.metrics.base import MetricFamily

log = logging.getLogger(__name__)

__all__ = [
    "OPEN_SCORES",
    "LlavaMedEval",
    "closed_hit",
    "exact_match",
    "f1_precision_recall",
    "left_to_right_mean",
    "normalize_word",
    "read_candidates",
]

# -- eval_metrics/glossary.py, verbatim --------------------------------------------------------

CONTRACTIONS: dict[str, str] = {
    "aint": "ain't",
    "arent": "aren't",
    "cant": "can't",
    "couldve": "could've",
    "couldnt": "couldn't",
    "couldn'tve": "couldn't've",
    "couldnt've": "couldn't've",
    "didnt": "didn't",
    "doesnt": "doesn't",
    "dont": "don't",
    "hadnt": "hadn't",
    "hadnt've": "hadn't've",
    "hadn'tve": "hadn't've",
    "hasnt": "hasn't",
    "havent": "haven't",
    "hed": "he'd",
    "hed've": "he'd've",
    "he'dve": "he'd've",
    "hes": "he's",
    "howd": "how'd",
    "howll": "how'll",
    "hows": "how's",
    "Id've": "I'd've",
    "I'dve": "I'd've",
    "Im": "I'm",
    "Ive": "I've",
    "isnt": "isn't",
    "itd": "it'd",
    "itd've": "it'd've",
    "it'dve": "it'd've",
    "itll": "it'll",
    "let's": "let's",
    "maam": "ma'am",
    "mightnt": "mightn't",
    "mightnt've": "mightn't've",
    "mightn'tve": "mightn't've",
    "mightve": "might've",
    "mustnt": "mustn't",
    "mustve": "must've",
    "neednt": "needn't",
    "notve": "not've",
    "oclock": "o'clock",
    "oughtnt": "oughtn't",
    "ow's'at": "'ow's'at",
    "'ows'at": "'ow's'at",
    "'ow'sat": "'ow's'at",
    "shant": "shan't",
    "shed've": "she'd've",
    "she'dve": "she'd've",
    "she's": "she's",
    "shouldve": "should've",
    "shouldnt": "shouldn't",
    "shouldnt've": "shouldn't've",
    "shouldn'tve": "shouldn't've",
    "somebody'd": "somebodyd",
    "somebodyd've": "somebody'd've",
    "somebody'dve": "somebody'd've",
    "somebodyll": "somebody'll",
    "somebodys": "somebody's",
    "someoned": "someone'd",
    "someoned've": "someone'd've",
    "someone'dve": "someone'd've",
    "someonell": "someone'll",
    "someones": "someone's",
    "somethingd": "something'd",
    "somethingd've": "something'd've",
    "something'dve": "something'd've",
    "somethingll": "something'll",
    "thats": "that's",
    "thered": "there'd",
    "thered've": "there'd've",
    "there'dve": "there'd've",
    "therere": "there're",
    "theres": "there's",
    "theyd": "they'd",
    "theyd've": "they'd've",
    "they'dve": "they'd've",
    "theyll": "they'll",
    "theyre": "they're",
    "theyve": "they've",
    "twas": "'twas",
    "wasnt": "wasn't",
    "wed've": "we'd've",
    "we'dve": "we'd've",
    "weve": "we've",
    "werent": "weren't",
    "whatll": "what'll",
    "whatre": "what're",
    "whats": "what's",
    "whatve": "what've",
    "whens": "when's",
    "whered": "where'd",
    "wheres": "where's",
    "whereve": "where've",
    "whod": "who'd",
    "whod've": "who'd've",
    "who'dve": "who'd've",
    "wholl": "who'll",
    "whos": "who's",
    "whove": "who've",
    "whyll": "why'll",
    "whyre": "why're",
    "whys": "why's",
    "wont": "won't",
    "wouldve": "would've",
    "wouldnt": "wouldn't",
    "wouldnt've": "wouldn't've",
    "wouldn'tve": "wouldn't've",
    "yall": "y'all",
    "yall'll": "y'all'll",
    "y'allll": "y'all'll",
    "yall'd've": "y'all'd've",
    "y'alld've": "y'all'd've",
    "y'all'dve": "y'all'd've",
    "youd": "you'd",
    "youd've": "you'd've",
    "you'dve": "you'd've",
    "youll": "you'll",
    "youre": "you're",
    "youve": "you've",
}
MANUAL_MAP: dict[str, str] = {
    "none": "0",
    "zero": "0",
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
    "ten": "10",
}
ARTICLES = ("a", "an", "the")
# `(?!<=\d)` was meant as a look-behind and is a look-ahead that never fails before a ".": every
# period not followed by a digit goes.
_PERIOD_STRIP = re.compile(r"(?!<=\d)(\.)(?!\d)")
_COMMA_STRIP = re.compile(r"(\d)(\,)(\d)")
PUNCT = (";", r"/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@",
         "`", ",", "?", "!")  # fmt: skip
# glossary.py passes re.UNICODE (32) where `sub` takes its `count`: at most 32 periods go per
# call (docs/metrics.md).
_PERIODS_PER_CALL = int(re.UNICODE)


def normalize_word(token: str) -> str:
    """`glossary.py`'s `normalize_word`: each listed punctuation mark deleted where the text has
    it beside a space (or has a digit-comma-digit anywhere), else made a space; periods deleted
    unless a digit follows (32 at most); number words zero..ten and "none" as digits; articles
    dropped; its contraction table; commas deleted; the words lower-cased."""
    out = token
    joined = _COMMA_STRIP.search(token) is not None
    for p in PUNCT:
        joined_here = joined or p + " " in token or " " + p in token
        out = out.replace(p, "" if joined_here else " ")
    out = _PERIOD_STRIP.sub("", out, _PERIODS_PER_CALL)
    words = [MANUAL_MAP.get(w, w) for w in out.lower().split()]
    words = [CONTRACTIONS.get(w, w) for w in words if w not in ARTICLES]
    return " ".join(words).replace(",", "")


# -- eval_metrics/utils.py and evaluate_metrics.py ---------------------------------------------


def _words(sentence: str) -> Counter[str]:
    """`split_sentence(sentence, 1)`: whitespace tokens of the lower-cased text, counted."""
    return Counter(sentence.lower().strip().split())


def exact_match(prediction: str, reference: str) -> float:
    """`calculate_exactmatch`: distinct reference tokens found in the prediction over the number
    of prediction tokens (0 for none). Not an exact match: "liver liver" against "liver" is 0.5."""
    candidate = _words(normalize_word(prediction))
    ref = _words(normalize_word(reference))
    total = sum(candidate.values())
    if total == 0:
        return 0.0
    return sum(1 for word in ref if word in candidate) / total


def f1_precision_recall(prediction: str, reference: str) -> tuple[float, float, float]:
    """`calculate_f1score`: F1, precision, recall of token counts (tp and fp counted on the
    prediction, fn on the reference); all 0 when either side has no token or nothing matches."""
    candidate = _words(normalize_word(prediction))
    ref = _words(normalize_word(reference))
    if not candidate or not ref:
        return 0.0, 0.0, 0.0
    tp = sum(n for word, n in candidate.items() if word in ref)
    fp = sum(n for word, n in candidate.items() if word not in ref)
    fn = sum(n for word, n in ref.items() if word not in candidate)
    precision = tp / (tp + fp)
    recall = tp / (tp + fn)
    if tp == 0:
        return 0.0, 0.0, 0.0
    return 2 * precision * recall / (precision + recall), precision, recall


def closed_hit(prediction: str, reference: str) -> float:
    """run_eval.py's CLOSED test on normalised text: the reply contains "yes" or "no" anywhere
    ("not", "normal", "nodule" count) and the truth anywhere ("no" is in "not")."""
    return float(("yes" in prediction or "no" in prediction) and reference in prediction)


def left_to_right_mean(values: Sequence[float]) -> float:
    """The values added one after the other, over their count: run_eval.py's `sum(...) / len(...)`
    as Python 3.10 (LLaVA-Med's `conda create -n llava-med python=3.10`) computes it. From
    Python 3.12 `sum` compensates rounding errors, which can move a figure's last digit."""
    total = 0.0
    for value in values:
        total += value
    return total / len(values)


class _Candidates:
    """The open answers run_eval.py maps a reply onto (`calculate_appearance_with_
    normalization`), normalised and counted once instead of once per row."""

    def __init__(self, answers: Sequence[str]) -> None:
        self.normalised = [normalize_word(a) for a in answers]
        self.words = [_words(a) for a in self.normalised]

    def hit(self, prediction: str, reference: str) -> float:
        """1.0 when the candidate sharing the largest share of its distinct words with the
        reply (the first of equals; the first candidate when none shares any) is the truth."""
        said = _words(normalize_word(prediction))
        similarity = [
            sum(1 for word in said if word in words) / len(words) if words else 0.0
            for words in self.words
        ]
        chosen = self.normalised[similarity.index(max(similarity))]
        return float(chosen == normalize_word(reference))


def read_candidates(path: Path, option: str) -> list[str]:
    """run_eval.py's `--candidate` file: JSON whose key "0" lists the answers (strings, or
    integers it writes as text); anything the script would fail on is refused naming `option`."""
    fix = f'set {option} to LLaVA-Med\'s train_open_answers.json (JSON: {{"0": [answers]}})'
    if not path.is_file():
        raise ConfigError(f"{option}={path}: no such file; {fix}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{option}={path}: not JSON ({err}); {fix}") from err
    answers = data.get("0") if isinstance(data, dict) else None
    if not isinstance(answers, list) or not answers:
        got = sorted(data)[:5] if isinstance(data, dict) else type(data).__name__
        raise ConfigError(f'{option}={path}: no non-empty list under key "0" (got {got}); {fix}')
    bad = [i for i, a in enumerate(answers) if not isinstance(a, str | int)]
    if bad:
        raise ConfigError(
            f"{option}={path}: answer {bad[0]} is {answers[bad[0]]!r} ({len(bad)} such), "
            "neither text nor an integer, which run_eval.py cannot normalise; write it as text"
        )
    return [str(a) for a in answers]


# -- the family --------------------------------------------------------------------------------

#: run_eval.py's OPEN figures, in the order it prints them, as (base name, its label).
OPEN_SCORES: tuple[tuple[str, str], ...] = (
    ("open_exact_match", "exact match score"),
    ("open_f1", "f1 score"),
    ("open_precision", "precision"),
    ("open_recall", "recall"),
    ("open_bleu", "bleu_score"),
    ("open_bleu_1", "bleu_score_1"),
    ("open_bleu_2", "bleu_score_2"),
    ("open_bleu_3", "bleu_score_3"),
)
# NLTK's default weights, then unigrams, bigrams and trigrams alone (run_eval.py, lines 73-80).
BLEU_WEIGHTS = ((0.25, 0.25, 0.25, 0.25), (1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0))
OPEN_HIT, CLOSED_HIT = "open_hit", "closed_hit"  # per-row 0/1 behind "open"/"yes/no accuracy"
YES_NO = frozenset({"yes", "no"})


class LlavaMedEval(MetricFamily):
    """`metric=llava_med_eval`: the figures of LLaVA-Med v1.0's run_eval.py (module doc).

    `candidate_file`: run_eval.py's `--candidate`, the open answers its "open accuracy" maps a
    reply onto (LLaVA-Med's `train_open_answers.json`); without it there is no
    `llava_med_eval_open_acc`.
    """

    name = "llava_med_eval"

    def __init__(self, candidate_file: str | None = None) -> None:
        from nltk.translate.bleu_score import sentence_bleu  # here: registering stays quick

        self._bleu = sentence_bleu
        self.candidate_file = None if candidate_file is None else Path(candidate_file)
        self._candidates: _Candidates | None = None
        if self.candidate_file is not None:
            answers = read_candidates(self.candidate_file, f"metric.{self.name}.candidate_file")
            self._candidates = _Candidates(answers)
        else:
            log.info(
                'metric.%s.candidate_file is not set: no %s (run_eval.py\'s "open accuracy" '
                "maps replies onto LLaVA-Med's train_open_answers.json)",
                self.name,
                self.column("open_acc"),
            )

    @property
    def figures(self) -> dict[str, str]:
        """Score -> the per-sample column it averages, for every figure this family reports."""
        out = {self.column(base): self.column(base) for base, _ in OPEN_SCORES}
        if self._candidates is not None:
            out[self.column("open_acc")] = self.column(OPEN_HIT)
        out[self.column("closed_acc")] = self.column(CLOSED_HIT)
        return out

    def provenance(self) -> dict[str, Any]:
        from importlib.metadata import version

        path = self.candidate_file
        return {
            "bleu": f"nltk {version('nltk')} sentence_bleu",
            "candidate_file": None if path is None else str(path),
            "candidate_file_sha256": None if path is None else file_hash(path),
        }

    def _bleu_row(self, prediction: str, reference: str) -> list[float]:
        with warnings.catch_warnings():  # NLTK warns on every n-gram order without a match
            warnings.simplefilter("ignore")
            scores = self._bleu(
                references=[str(reference).lower().split()],
                hypothesis=str(prediction).lower().split(),
                weights=BLEU_WEIGHTS,
            )
        return [float(s) for s in scores]

    def per_sample(self, preds: pd.DataFrame) -> pd.DataFrame:
        """The run_eval.py score of each row: its OPEN scores and open hit on open rows, the
        yes/no hit on closed ones (NaN elsewhere)."""
        missing = [c for c in (PREDICTION, ANSWER, ANSWER_TYPE) if c not in preds.columns]
        if missing:
            raise ValueError(f"metric.{self.name}: predictions table lacks column(s) {missing}")
        n = len(preds)
        names = [base for base, _ in OPEN_SCORES]
        values = {base: np.full(n, np.nan) for base in [*names, OPEN_HIT, CLOSED_HIT]}
        ids = preds[ID].to_numpy(object) if ID in preds.columns else np.arange(n)
        rows = zip(
            preds[ANSWER_TYPE].to_numpy(object),
            preds[PREDICTION].to_numpy(object),
            preds[ANSWER].to_numpy(object),
            strict=True,
        )
        not_yes_no = 0
        for i, (kind, reply, truth) in enumerate(rows):
            if _missing(reply) or _missing(truth):
                side = PREDICTION if _missing(reply) else ANSWER
                raise ValueError(
                    f"metric.{self.name}: row {i} (id {ids[i]!r}) has no {side}; run_eval.py "
                    "cannot score it (an empty reply is '')"
                )
            pred = normalize_word(str(reply).lower())
            gt = normalize_word(str(truth).lower())
            if kind == "open":
                f1, precision, recall = f1_precision_recall(pred, gt)
                row = [exact_match(pred, gt), f1, precision, recall, *self._bleu_row(pred, gt)]
                for base, value in zip(names, row, strict=True):
                    values[base][i] = value
                if self._candidates is not None:
                    values[OPEN_HIT][i] = self._candidates.hit(pred, gt)
            elif kind == "closed":
                values[CLOSED_HIT][i] = closed_hit(pred, gt)
                not_yes_no += gt not in YES_NO
            else:
                raise ValueError(
                    f"metric.{self.name}: row {i} (id {ids[i]!r}) has answer_type {kind!r}, "
                    "neither 'open' nor 'closed'"
                )
        if not_yes_no:
            log.warning(
                "metric.%s: %d closed row(s) whose answer is not yes/no: run_eval.py credits "
                "such a row only when the reply also contains 'yes' or 'no' "
                "(docs/metrics.md#llava-med-v10-run_evalpy)",
                self.name,
                not_yes_no,
            )
        out = pd.DataFrame({self.column(k): v for k, v in values.items()}, index=preds.index)
        if self._candidates is None:
            out = out.drop(columns=self.column(OPEN_HIT))
        return out

    def aggregate(self, scored: pd.DataFrame) -> dict[str, float]:
        """Each figure as run_eval.py takes it: the rows' values added in their order over
        their count (another order can move the last digit). NaN over no rows."""
        out: dict[str, float] = {}
        for score, column in self.figures.items():
            answer_type = "closed" if column == self.column(CLOSED_HIT) else "open"
            values = scored.loc[scored[ANSWER_TYPE] == answer_type, column].tolist()
            out[score] = left_to_right_mean(values) if values else math.nan
        return out

    def headline(self) -> dict[str, str]:
        """The paper's table: yes/no accuracy, and open-set recall."""
        return {"closed": self.column("closed_acc"), "open": self.column("open_recall")}

    def ci_columns(self) -> dict[str, tuple[str, str]]:
        """Every figure is a mean of per-row values: intervals and paired deltas apply."""
        return {
            score: (column, "closed" if column == self.column(CLOSED_HIT) else "open")
            for score, column in self.figures.items()
        }


def _missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))
