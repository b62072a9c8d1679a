"""Closed-set metrics for fixed-question data sets such as RoboSurg-VQA (docs/metrics.md).

Every question id (Q1..Q9) has its own answer space, and the label distributions are skewed
(most frames have no bleeding), so accuracy alone rewards always answering the majority label.
The headline per question is therefore **macro-F1**: F1 per label of the answer space, averaged
with equal weight over the labels that occur in the ground truth or the predictions. The
overall score is the unweighted mean of the per-question macro-F1, so a question with few
frames weighs as much as one with many.

Parsing. A prediction selects a label by :func:`medvqa.evaluation.families.traditional.closed_choice`
(normalised, case-insensitive exact match, else a unique whole-word containment: "Yes, there is
glare" selects "yes", "yes or no" selects nothing). Whole words matter: a raw substring test
would read "unknown" as containing "no". A prediction that selects no label or several is
**invalid**; it counts as wrong everywhere (a miss of its ground-truth label in F1, recall and
accuracy) and is never dropped, and the invalid rate is reported.

Q4 (artefact tuple). The answer is the canonical tuple ``bleeding=no, smoke=yes, occlusion=no``.
A prediction in that key=value format is read with
:func:`medvqa.data.sources.robosurg_vqa.parse_artefacts` (any order, ``;`` or ``,``), otherwise by
containment of one of the eight tuple labels. The primary Q4 score is the tuple exact match;
the bit-wise macro-F1 (macro-F1 per artefact over yes/no, then the mean of the three) is the
Q4 entry of the overall macro-F1 because it credits partially right tuples. An invalid tuple
gives no bit (all three bits count as misses).

Unknown. For a question whose answer space contains "Unknown" (Q3, Q5, Q8), answering
"Unknown" is an abstention: coverage = 1 - N_Unknown / N counts how often the model commits,
and the conditional accuracy is the accuracy on the rows where it did (invalid predictions are
not abstentions, so they stay in that denominator as wrong answers).

Metric names carry a ``cs_`` prefix and no "/" (the runner adds ``split/`` and computes RR only
for "/"-free keys): ``cs_overall_macro_f1``, ``cs_invalid_rate``, ``cs_n``, and per question
``cs_<qid>_macro_f1``, ``_acc``, ``_balanced_acc``, ``_invalid_rate``, ``_n``, for
Unknown-enabled questions ``_coverage``, ``_cond_acc``, and for tuple questions ``_tuple_em``,
``_bit_macro_f1``, ``_<artefact>_macro_f1`` (instead of ``_macro_f1``/``_acc``/
``_balanced_acc``).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from medvqa.data.records import ANSWER, ANSWER_TYPE, CANDIDATES, ID
from medvqa.data.sources.robosurg_vqa import (
    ARTEFACTS,
    QUESTIONS,
    UNKNOWN,
    format_artefacts,
    parse_artefacts,
)
from medvqa.evaluation.families.base import MetricFamily
from medvqa.evaluation.families.traditional import PREDICTION, closed_choice
from medvqa.evaluation.statistics import mean_or_nan

log = logging.getLogger(__name__)

__all__ = [
    "CS_CHOICE",
    "CS_CORRECT",
    "CS_INVALID",
    "CS_UNKNOWN",
    "ROBOSURG_QUESTIONS",
    "ROBOSURG_UNKNOWN_QUESTIONS",
    "ClosedSetMetric",
    "balanced_accuracy",
    "macro_f1",
    "parse_label",
]

QUESTION_ID = "question_id"
# Per-sample columns. CS_CHOICE holds the parsed label (None = invalid); the others are floats.
CS_CHOICE = "cs_choice"
CS_CORRECT = "cs_correct"
CS_INVALID = "cs_invalid"
CS_UNKNOWN = "cs_unknown"  # 1 if the prediction is "Unknown"; NaN if the space has no Unknown
PREFIX = "cs_"
# RoboSurg's question ids and those whose answer space offers "Unknown" (Q3, Q5, Q8).
ROBOSURG_QUESTIONS: tuple[str, ...] = tuple(QUESTIONS)
ROBOSURG_UNKNOWN_QUESTIONS: tuple[str, ...] = tuple(
    qid for qid, (_, space) in QUESTIONS.items() if UNKNOWN in space
)


# --------------------------------------------------------------------------------------------
# Parsing and label scores
# --------------------------------------------------------------------------------------------


def _missing(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return len(value) == 0


def parse_label(prediction: Any, space: Sequence[str], tuple_question: bool = False) -> str | None:
    """The label of ``space`` a prediction selects, or None (invalid).

    ``tuple_question`` first reads the artefact key=value format (Q4) and maps it onto the
    space's spelling of that tuple; everything else, and a Q4 answer embedded in prose, goes
    through :func:`closed_choice`.
    """
    space = [str(s) for s in space]
    if tuple_question and prediction is not None:
        bits = parse_artefacts(str(prediction).strip())
        if bits is not None:
            wanted = format_artefacts(bits).lower()
            hits = [s for s in space if s.lower() == wanted]
            if len(hits) == 1:
                return hits[0]
    text = "" if prediction is None else str(prediction)
    return closed_choice(text, space)


def _f1_per_label(gt: np.ndarray, pred: np.ndarray, labels: Sequence[str]) -> list[float]:
    """F1 = 2tp / (2tp + fp + fn) per label; an invalid prediction (None) is only an fn."""
    out = []
    for label in labels:
        is_gt, is_pred = gt == label, pred == label
        tp = float(np.sum(is_gt & is_pred))
        fp = float(np.sum(~is_gt & is_pred))
        fn = float(np.sum(is_gt & ~is_pred))
        out.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else math.nan)
    return out


def _labels(gt: np.ndarray, pred: np.ndarray) -> list[str]:
    return sorted({str(g) for g in gt} | {str(p) for p in pred if p is not None})


def macro_f1(gt: Sequence[str], pred: Sequence[str | None]) -> float:
    """Mean F1 over the labels that occur in ``gt`` or among the valid ``pred``.

    Equals ``sklearn.metrics.f1_score(gt, pred, labels=<those labels>, average="macro")`` with
    invalid predictions mapped to a label outside the list. Restricting to occurring labels
    avoids averaging in zeros for labels that never appear in this subset (e.g. a site without
    smoke); NaN for no rows.
    """
    g, p = np.asarray(gt, dtype=object), np.asarray(pred, dtype=object)
    if g.size == 0:
        return math.nan
    return float(np.mean(_f1_per_label(g, p, _labels(g, p))))


def balanced_accuracy(gt: Sequence[str], pred: Sequence[str | None]) -> float:
    """Mean recall over the ground-truth labels (as sklearn's ``balanced_accuracy_score``)."""
    g, p = np.asarray(gt, dtype=object), np.asarray(pred, dtype=object)
    if g.size == 0:
        return math.nan
    return float(np.mean([np.mean(p[g == label] == label) for label in sorted(set(g))]))


def _natural(qid: Any) -> tuple:
    """Q2 before Q10."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(qid)))


# --------------------------------------------------------------------------------------------
# Metric family
# --------------------------------------------------------------------------------------------


class ClosedSetMetric(MetricFamily):
    """Per-question macro-F1 / accuracy / balanced accuracy, Q4 tuple and bit scores, Unknown
    coverage and invalid rate (see the module docstring for definitions and names).

    ``questions`` fixes the question ids that always get keys (NaN where a subset has none of
    their rows), so the i.i.d. and OoD splits report the same keys; ids found in the data but
    not listed are scored too. ``unknown_questions`` likewise always get coverage keys; other
    questions get them when their rows' answer space contains the Unknown label.
    For RoboSurg pass ``ROBOSURG_QUESTIONS`` and ``ROBOSURG_UNKNOWN_QUESTIONS``.
    """

    name = "closed_set"

    def __init__(
        self,
        questions: Sequence[str] | None = None,
        question_field: str = QUESTION_ID,
        tuple_questions: Sequence[str] = ("Q4",),
        unknown_questions: Sequence[str] = (),
        unknown_label: str = UNKNOWN,
    ) -> None:
        self.questions = [str(q) for q in questions] if questions is not None else []
        self.question_field = question_field
        self.tuple_questions = {str(q) for q in tuple_questions}
        self.unknown_questions = {str(q) for q in unknown_questions}
        self.unknown_label = unknown_label

    # ---- per sample ----------------------------------------------------------------------

    def _require(self, table: pd.DataFrame, columns: Sequence[str], what: str) -> None:
        missing = [c for c in columns if c not in table.columns]
        if missing:
            raise ValueError(
                f"{self.name}: {what} lacks column(s) {missing}. The closed-set metric needs "
                f"the question id per row (`{self.question_field}`; RoboSurg records have "
                "`question_id`, other data sets set `question_field`)."
            )

    def per_sample(self, preds: pd.DataFrame) -> pd.DataFrame:
        """Parsed label (``cs_choice``, None = invalid) and float ``cs_correct``,
        ``cs_invalid``, ``cs_unknown`` per row; NaN/None on open rows."""
        self._require(
            preds, [PREDICTION, ANSWER, ANSWER_TYPE, CANDIDATES, self.question_field], "table"
        )
        n = len(preds)
        choice: list[str | None] = [None] * n
        correct, invalid, unknown = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
        unk = self.unknown_label.lower()
        no_space = 0
        rows = zip(
            preds[ANSWER_TYPE].to_numpy(),
            preds[PREDICTION].to_numpy(),
            preds[ANSWER].to_numpy(),
            preds[CANDIDATES].to_numpy(),
            preds[self.question_field].to_numpy(),
            strict=True,
        )
        for i, (kind, pred, answer, space, qid) in enumerate(rows):
            if kind != "closed":
                continue
            if _missing(space):
                no_space += 1
                space = []
            space = [str(s) for s in space]
            label = parse_label(pred, space, str(qid) in self.tuple_questions) if space else None
            choice[i] = label
            correct[i] = float(label is not None and label == str(answer))
            invalid[i] = float(label is None)
            if any(s.lower() == unk for s in space):
                unknown[i] = float(label is not None and label.lower() == unk)
        if no_space:
            log.warning(
                "%s: %d closed row(s) without an answer space; invalid", self.name, no_space
            )
        return pd.DataFrame(
            {
                CS_CHOICE: pd.Series(choice, index=preds.index, dtype=object),
                CS_CORRECT: correct,
                CS_INVALID: invalid,
                CS_UNKNOWN: unknown,
            },
            index=preds.index,
        )

    # ---- aggregate -----------------------------------------------------------------------

    def _bits(self, group: pd.DataFrame) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Ground-truth and predicted artefact bits (None where the prediction is invalid)."""
        gt = {name: [] for name in ARTEFACTS}
        pred = {name: [] for name in ARTEFACTS}
        for rid, answer, label in zip(
            group[ID] if ID in group.columns else group.index,
            group[ANSWER],
            group[CS_CHOICE],
            strict=True,
        ):
            bits = parse_artefacts(str(answer))
            if bits is None:
                raise ValueError(
                    f"{self.name}: row {rid!r} is a tuple question but its answer {answer!r} is "
                    "not 'bleeding=yes|no, smoke=yes|no, occlusion=yes|no'; fix the records or "
                    "the metric's tuple_questions."
                )
            got = parse_artefacts(label) if label is not None else None
            for name in ARTEFACTS:
                gt[name].append(bits[name])
                pred[name].append(None if got is None else got[name])
        return (
            {k: np.asarray(v, dtype=object) for k, v in gt.items()},
            {k: np.asarray(v, dtype=object) for k, v in pred.items()},
        )

    def _question(self, qid: str, group: pd.DataFrame) -> dict[str, float]:
        """All keys of one question id (NaN values for an empty group)."""
        p = f"{PREFIX}{qid}_"
        gt = group[ANSWER].astype(str).to_numpy(dtype=object)
        pred = group[CS_CHOICE].to_numpy(dtype=object)
        correct = group[CS_CORRECT].to_numpy(dtype=float)
        out: dict[str, float] = {}
        if qid in self.tuple_questions:
            out[p + "tuple_em"] = mean_or_nan(correct)
            per_bit = {}
            if len(group):
                gt_bits, pred_bits = self._bits(group)
                per_bit = {k: macro_f1(gt_bits[k], pred_bits[k]) for k in ARTEFACTS}
            for k in ARTEFACTS:
                out[p + f"{k}_macro_f1"] = per_bit.get(k, math.nan)
            out[p + "bit_macro_f1"] = (
                float(np.mean(list(per_bit.values()))) if per_bit else math.nan
            )
        else:
            out[p + "macro_f1"] = macro_f1(gt, pred)
            out[p + "acc"] = mean_or_nan(correct)
            out[p + "balanced_acc"] = balanced_accuracy(gt, pred)
            unknown = group[CS_UNKNOWN].to_numpy(dtype=float)
            if qid in self.unknown_questions or not np.isnan(unknown).all():
                out[p + "coverage"] = 1.0 - mean_or_nan(unknown)
                out[p + "cond_acc"] = mean_or_nan(correct[unknown == 0.0])
        out[p + "invalid_rate"] = mean_or_nan(group[CS_INVALID].to_numpy(dtype=float))
        out[p + "n"] = float(len(group))
        return out

    def _primary(self, qid: str, scores: dict[str, float]) -> float:
        kind = "bit_macro_f1" if qid in self.tuple_questions else "macro_f1"
        return scores[f"{PREFIX}{qid}_{kind}"]

    def aggregate(self, scored: pd.DataFrame) -> dict[str, float]:
        """Flat ``cs_*`` scores of any subset of scored rows (closed rows only)."""
        self._require(
            scored,
            [ANSWER, ANSWER_TYPE, self.question_field, CS_CHOICE, CS_CORRECT, CS_INVALID],
            "scored table",
        )
        closed = scored[scored[ANSWER_TYPE] == "closed"]
        present = {str(q) for q in closed[self.question_field].dropna().unique()}
        qids = [*self.questions, *sorted(present - set(self.questions), key=_natural)]
        groups = {str(q): g for q, g in closed.groupby(self.question_field, sort=False)}
        empty = closed.iloc[0:0]
        out: dict[str, float] = {}
        primaries = []
        for qid in qids:
            scores = self._question(qid, groups.get(qid, empty))
            out.update(scores)
            primaries.append(self._primary(qid, scores))
        finite = [x for x in primaries if not math.isnan(x)]
        overall = {
            f"{PREFIX}overall_macro_f1": float(np.mean(finite)) if finite else math.nan,
            f"{PREFIX}invalid_rate": mean_or_nan(closed[CS_INVALID].to_numpy(dtype=float)),
            f"{PREFIX}n": float(len(closed)),
        }
        return {**overall, **out}
