"""Closed-set metrics of fixed-label tasks such as RoboSurg-VQA (docs/metrics.md#closed_set).

Each task (the rows' ``question_id``) has a fixed label list: its rows' candidates. Labels are
skewed (most frames show no bleeding), so accuracy rewards the majority answer; the primary
score per task is **macro-F1** and the headline is its unweighted mean over the primary tasks.

Label set (``labels``). ``fixed`` (the RoboSurg release): macro-F1 and balanced accuracy average
over the task's whole label list; a label absent from both the truth and the predictions of the
rows scored contributes 0, not nothing (F1 = 2tp / (2tp + fp + fn) and recall = tp / (tp + fn)
are 0 where the denominator is 0). So a subset without smoke frames cannot score higher by
never answering "yes"; scikit-learn's ``balanced_accuracy_score`` skips such labels and is not
this number, ``recall_score(labels=..., average="macro", zero_division=0)`` is. ``observed``:
average over the labels occurring in the truth or the valid predictions (macro-F1) or in the
truth (balanced accuracy, as scikit-learn's ``balanced_accuracy_score``).

Parsing. A prediction selects a label by
:func:`medvqa.data.answers.closed_choice` (normalised exact match, else a
unique whole-word containment). One that selects no label of the task's list, or several, is
**invalid**: it is a miss of its true label (an fn, never an fp of any label), counts as wrong,
and the invalid rate reports it.

Abstention (``abstain_label``, off for RoboSurg, which has none): for a task whose labels
include it, coverage = 1 - N_abstain / N and the accuracy on the committed rows.

Intervals. The headline's percentile interval resamples ``cluster_field`` (RoboSurg: the source
sequence) B times; every task's per-cluster tp/fp/fn counts are resampled together, so macro-F1
is recomputed on each resample rather than averaged per cluster. Clusters are taken in sorted
order, so two conditions scored on the same sequences draw the same resamples and
:meth:`ClosedSetMetric.paired_delta` gives their paired difference.

Keys (``cs_`` prefix, no "/"): ``cs_primary_macro_f1`` with ``_ci_lo/_ci_hi/_ci_half``,
``cs_primary_invalid_rate``, ``cs_invalid_rate``, ``cs_n``, and per task
``cs_<task>_macro_f1``, ``_acc``, ``_balanced_acc``, ``_invalid_rate``, ``_n`` (plus
``_coverage``, ``_cond_acc`` for abstaining tasks).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from medvqa.data.answers import closed_choice
from medvqa.data.records import ANSWER, ANSWER_TYPE, CANDIDATES, CASE_ID, ID, PREDICTION
from medvqa.errors import ConfigError
from medvqa.scoring.metrics.base import (
    COUNT,
    ERROR_RATE,
    MetricFamily,
    ScoreInfo,
    answer_rows,
    no_candidates,
)
from medvqa.statistics.bootstrap import (
    Bootstrap,
    BootstrapCI,
    cluster_sum_replicates,
    mean_or_nan,
    percentile_ci,
)

log = logging.getLogger(__name__)

__all__ = [
    "CS_CHOICE",
    "CS_CORRECT",
    "CS_INVALID",
    "LABEL_SETS",
    "ClosedSetMetric",
    "balanced_accuracy",
    "macro_f1",
    "parse_label",
]

QUESTION_ID = "question_id"
LABEL_SETS = ("fixed", "observed")


# --------------------------------------------------------------------------------------------
# Label scores
# --------------------------------------------------------------------------------------------


def parse_label(prediction: Any, labels: Sequence[str]) -> str | None:
    """The label of ``labels`` a prediction selects, or None (invalid)."""
    return closed_choice("" if prediction is None else str(prediction), [str(s) for s in labels])


def _counts(gt: np.ndarray, pred: np.ndarray, labels: Sequence[str]) -> np.ndarray:
    """(3, L) per-label tp, fp, fn; a prediction outside ``labels`` is only an fn."""
    out = np.zeros((3, len(labels)))
    for j, label in enumerate(labels):
        is_gt, is_pred = gt == label, pred == label
        out[:, j] = (np.sum(is_gt & is_pred), np.sum(~is_gt & is_pred), np.sum(is_gt & ~is_pred))
    return out


def _safe_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)


def _macro_f1(tp: np.ndarray, fp: np.ndarray, fn: np.ndarray, fixed: bool) -> np.ndarray:
    """Macro-F1 over the last axis: every label (fixed) or those with tp + fp + fn > 0."""
    f1 = _safe_div(2 * tp, 2 * tp + fp + fn)
    if fixed:
        return f1.mean(axis=-1)
    occurs = (tp + fp + fn) > 0
    return _safe_div((f1 * occurs).sum(axis=-1), occurs.sum(axis=-1).astype(float)) + np.where(
        occurs.any(axis=-1), 0.0, np.nan
    )


def _balanced(tp: np.ndarray, fn: np.ndarray, fixed: bool) -> np.ndarray:
    """Mean recall over the last axis: every label (fixed) or those in the truth."""
    recall = _safe_div(tp, tp + fn)
    if fixed:
        return recall.mean(axis=-1)
    present = (tp + fn) > 0
    return _safe_div((recall * present).sum(axis=-1), present.sum(axis=-1).astype(float))


def _labels_of(gt: np.ndarray, pred: np.ndarray, labels: Sequence[str] | None) -> list[str]:
    if labels is not None:
        return [str(v) for v in labels]
    return sorted({str(g) for g in gt} | {str(p) for p in pred if p is not None})


def macro_f1(
    gt: Sequence[str], pred: Sequence[str | None], labels: Sequence[str] | None = None
) -> float:
    """Mean per-label F1 = 2tp / (2tp + fp + fn) over ``labels`` (a label absent from truth and
    prediction scores 0), or with ``labels=None`` over the labels occurring in ``gt`` or the
    valid ``pred``. A prediction outside the labels (None: invalid) only misses its truth.
    NaN for no rows."""
    g, p = np.asarray(gt, dtype=object), np.asarray(pred, dtype=object)
    if g.size == 0:
        return math.nan
    tp, fp, fn = _counts(g, p, _labels_of(g, p, labels))
    return float(_macro_f1(tp, fp, fn, fixed=labels is not None))


def balanced_accuracy(
    gt: Sequence[str], pred: Sequence[str | None], labels: Sequence[str] | None = None
) -> float:
    """Mean recall tp / (tp + fn) over ``labels`` (a label absent from the truth scores 0), or
    with ``labels=None`` over the labels in ``gt`` (scikit-learn's balanced_accuracy_score).
    NaN for no rows."""
    g, p = np.asarray(gt, dtype=object), np.asarray(pred, dtype=object)
    if g.size == 0:
        return math.nan
    chosen = [str(v) for v in labels] if labels is not None else sorted({str(v) for v in g})
    tp, _, fn = _counts(g, p, chosen)
    return float(_balanced(tp, fn, fixed=labels is not None))


def _natural(qid: Any) -> tuple:
    """q2 before q10."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(qid)))


# --------------------------------------------------------------------------------------------
# Metric family
# --------------------------------------------------------------------------------------------


class ClosedSetMetric(MetricFamily):
    """Per-task accuracy / macro-F1 / balanced accuracy / invalid rate, the mean macro-F1 over
    the primary tasks with a cluster-bootstrap interval (see the module docstring).

    ``tasks`` always get keys (NaN where a subset has none of their rows), so the i.i.d. and
    OoD splits report the same keys; tasks found in the data but not listed are scored too.
    ``primary`` names the headline's tasks (None: every task scored); the headline is NaN when
    one of them has no rows, never a mean over the others.
    """

    name = "closed_set"
    not_performance: ClassVar[dict[str, ScoreInfo]] = {"n": COUNT, "invalid_rate": ERROR_RATE}

    def __init__(
        self,
        tasks: Sequence[str] | None = None,
        primary: Sequence[str] | None = None,
        labels: str = "fixed",
        question_field: str = QUESTION_ID,
        abstain_label: str | None = None,
        *,
        bootstrap: Bootstrap | Mapping[str, Any],
        cluster_field: str = CASE_ID,
    ) -> None:
        if labels not in LABEL_SETS:
            raise ConfigError(
                f"metric.{self.name}.labels={labels!r}: labels must be one of {LABEL_SETS}"
            )
        self.tasks = [str(q) for q in tasks] if tasks is not None else []
        self.primary = [str(q) for q in primary] if primary is not None else None
        self.labels = labels
        self.question_field = question_field
        self.abstain_label = abstain_label
        # conf/metric/closed_set.yaml: ${evaluation.bootstrap}, the run's one setting.
        self.bootstrap = Bootstrap.of(bootstrap)
        self.cluster_field = cluster_field

    # ---- per sample ----------------------------------------------------------------------

    def _require(self, table: pd.DataFrame, columns: Sequence[str], what: str) -> None:
        missing = [c for c in columns if c not in table.columns]
        if missing:
            raise ValueError(
                f"{self.name}: {what} lacks column(s) {missing}. The closed-set metric needs "
                f"the task id per row (`{self.question_field}`; RoboSurg records have "
                "`question_id`, other data sets set `question_field`) and the cluster "
                f"(`{self.cluster_field}`)."
            )

    def per_sample(self, preds: pd.DataFrame) -> pd.DataFrame:
        """Parsed label (``cs_choice``, None = invalid), float ``cs_correct`` and
        ``cs_invalid`` per row; NaN/None on open rows."""
        self._require(
            preds, [PREDICTION, ANSWER, ANSWER_TYPE, CANDIDATES, self.question_field], "table"
        )
        n = len(preds)
        choice: list[str | None] = [None] * n
        correct, invalid = np.full(n, np.nan), np.full(n, np.nan)
        no_space = 0
        for i, (kind, pred, answer, space) in enumerate(answer_rows(preds)):
            if kind != "closed":
                continue
            if no_candidates(space):
                no_space += 1
            label = None if no_candidates(space) else parse_label(pred, space)
            choice[i] = label
            correct[i] = float(label is not None and label == str(answer))
            invalid[i] = float(label is None)
        if no_space:
            log.warning("%s: %d closed row(s) without a label list; invalid", self.name, no_space)
        return pd.DataFrame(
            {
                self.column("choice"): pd.Series(choice, index=preds.index, dtype=object),
                self.column("correct"): correct,
                self.column("invalid"): invalid,
            },
            index=preds.index,
        )

    # ---- aggregate -----------------------------------------------------------------------

    def _task_labels(self, task: str, group: pd.DataFrame) -> list[str]:
        """The task's fixed label list: its rows' candidates, which must all be the same."""
        lists = {tuple(str(v) for v in c) for c in group[CANDIDATES] if not no_candidates(c)}
        if len(lists) > 1:
            raise ValueError(
                f"{self.name}: task {task!r} has rows with different label lists {sorted(lists)}; "
                "a fixed-label task needs one list (fix the records' candidates)."
            )
        return list(next(iter(lists))) if lists else []

    def _table(
        self, group: pd.DataFrame, labels: list[str], codes: np.ndarray, n: int
    ) -> np.ndarray:
        """Per-cluster additive totals (clusters x (3L + 3)): tp, fp, fn per label, then the
        row count, correct count and invalid count."""
        gt = group[ANSWER].astype(str).to_numpy(dtype=object)
        pred = group[self.column("choice")].to_numpy(dtype=object)
        if self.labels == "observed":
            labels = _labels_of(gt, pred, None)
        out = np.zeros((n, 3 * len(labels) + 3))
        for j, label in enumerate(labels):
            is_gt, is_pred = gt == label, pred == label
            for k, hit in enumerate((is_gt & is_pred, ~is_gt & is_pred, is_gt & ~is_pred)):
                out[:, k * len(labels) + j] = np.bincount(codes, weights=hit, minlength=n)
        tail = (np.ones(len(gt)), group[self.column("correct")], group[self.column("invalid")])
        for k, values in enumerate(tail):
            out[:, 3 * len(labels) + k] = np.bincount(
                codes, weights=np.asarray(values, dtype=float), minlength=n
            )
        return out

    def _scores(self, totals: np.ndarray, n_labels: int) -> dict[str, np.ndarray]:
        """Task scores from summed totals (..., 3L + 3); NaN where there are no rows."""
        tp, fp, fn = (totals[..., k * n_labels : (k + 1) * n_labels] for k in range(3))
        rows, right, bad = (totals[..., 3 * n_labels + k] for k in range(3))
        if n_labels == 0:  # a task without rows (its labels come from its rows' candidates)
            nan = np.full(np.shape(rows), np.nan)
            return {k: nan for k in ("macro_f1", "acc", "balanced_acc", "invalid_rate")}
        none = np.where(rows > 0, 0.0, np.nan)
        fixed = self.labels == "fixed"
        observed_truth = (tp + fn).sum(axis=-1) > 0
        balanced = _balanced(tp, fn, fixed) + np.where(fixed | observed_truth, 0.0, np.nan)
        return {
            "macro_f1": _macro_f1(tp, fp, fn, fixed) + none,
            "acc": _safe_div(right, rows) + none,
            "balanced_acc": balanced + none,
            "invalid_rate": _safe_div(bad, rows) + none,
        }

    def headline(self) -> dict[str, str]:
        """Macro-F1 averaged over the primary tasks (module docstring)."""
        return {"closed": self.column("primary_macro_f1")}

    def aggregate(self, scored: pd.DataFrame) -> dict[str, float]:
        """Flat ``cs_*`` scores of any subset of scored rows (closed rows only)."""
        self._require(
            scored,
            [
                ANSWER,
                ANSWER_TYPE,
                CANDIDATES,
                self.question_field,
                self.column("choice"),
                self.column("correct"),
                self.column("invalid"),
            ],
            "scored table",
        )
        closed = scored[scored[ANSWER_TYPE] == "closed"]
        point, totals, sizes, tasks = self._totals(closed)
        out: dict[str, float] = {}
        for task in tasks:
            p = self.column(f"{task}_")
            out.update({p + k: float(v) for k, v in point[task].items()})
            out[p + "n"] = float(sizes[task])
            out.update(self._abstention(task, closed))
        primary = self._primary(tasks)
        headline = mean_or_nan([point[t]["macro_f1"] for t in primary])
        ci = self._headline_ci(headline, totals, primary)
        return {
            self.column("primary_macro_f1"): headline,
            **(ci.entries(self.column("primary_macro_f1")) if self.bootstrap.samples else {}),
            self.column("primary_invalid_rate"): mean_or_nan(
                [point[t]["invalid_rate"] for t in primary]
            ),
            self.column("invalid_rate"): mean_or_nan(
                closed[self.column("invalid")].to_numpy(dtype=float)
            ),
            self.column("n"): float(len(closed)),
            **out,
        }

    def _primary(self, tasks: Sequence[str]) -> list[str]:
        return list(self.primary) if self.primary is not None else list(tasks)

    def _totals(
        self, closed: pd.DataFrame, clusters: Sequence[Any] | None = None
    ) -> tuple[
        dict[str, dict[str, float]], dict[str, tuple[np.ndarray, int]], dict[str, int], list[str]
    ]:
        """Point scores, per-cluster totals (with the label count) and row counts per task.

        Clusters are numbered in sorted order (or as given), so that equal cluster sets give
        equal bootstrap draws across conditions."""
        present = {str(q) for q in closed[self.question_field].dropna().unique()}
        listed = [*self.tasks, *(self.primary or [])]
        tasks = [*dict.fromkeys(listed), *sorted(present - set(listed), key=_natural)]

        def cluster_of(rows: pd.DataFrame) -> pd.Series:
            if self.cluster_field in rows.columns:
                return rows[self.cluster_field].astype(str)
            return pd.Series("all", index=rows.index)

        found = set(cluster_of(closed))
        order = sorted(found) if clusters is None else [str(c) for c in clusters]
        index = {c: i for i, c in enumerate(order)}
        if found - set(index):
            raise ValueError(
                f"{self.name}: cluster(s) {sorted(found - set(index))[:5]} are not among the "
                "clusters resampled; both conditions of a paired delta must cover the same ones."
            )
        groups = {str(q): g for q, g in closed.groupby(self.question_field, sort=False)}
        point, totals, sizes = {}, {}, {}
        for task in tasks:
            group = groups.get(task, closed.iloc[0:0])
            task_labels = self._task_labels(task, group)
            codes = cluster_of(group).map(index).to_numpy(dtype=np.intp)
            table = self._table(group, task_labels, codes, max(len(order), 1))
            n_labels = (table.shape[1] - 3) // 3
            point[task] = {
                k: float(v) for k, v in self._scores(table.sum(axis=0), n_labels).items()
            }
            totals[task] = (table, n_labels)
            sizes[task] = len(group)
        return point, totals, sizes, tasks

    def _headline_replicates(
        self, totals: Mapping[str, tuple[np.ndarray, int]], primary: Sequence[str]
    ) -> np.ndarray:
        """The headline on each resample of clusters (one draw for all tasks)."""
        blocks = [totals[t][0] for t in primary]
        boot = self.bootstrap
        reps = cluster_sum_replicates(np.concatenate(blocks, axis=1), boot.samples, boot.seed)
        per_task, start = [], 0
        for task, block in zip(primary, blocks, strict=True):
            width = block.shape[1]
            per_task.append(
                self._scores(reps[:, start : start + width], totals[task][1])["macro_f1"]
            )
            start += width
        return np.mean(np.stack(per_task, axis=1), axis=1)

    def _headline_ci(
        self, headline: float, totals: Mapping[str, tuple[np.ndarray, int]], primary: Sequence[str]
    ) -> BootstrapCI:
        nan = BootstrapCI(headline, math.nan, math.nan, math.nan)
        few = next(iter(totals.values()))[0].shape[0] < 2
        if math.isnan(headline) or not primary or few or not self.bootstrap.samples:
            return nan
        reps = self._headline_replicates(totals, primary)
        return percentile_ci(
            headline, reps, self.bootstrap.level, f"{self.name} {self.column('primary_macro_f1')}"
        )

    def paired_delta(
        self,
        scored_a: pd.DataFrame,
        scored_b: pd.DataFrame,
        score: str | None = None,
        **bootstrap: Any,
    ) -> BootstrapCI | None:
        """Headline(a) - headline(b) with a paired percentile interval: both conditions (e.g.
        canonical vs held-out wording, or a model vs the answer-frequency baseline) are scored
        on the same questions, and every resample of clusters is applied to both.

        Only the headline has a rule here (`score` None or `<prefix>primary_macro_f1`; None
        for any other `score`, and for a side scored without this family's columns); the
        resamples are this family's own (its `bootstrap`, the run's `evaluation.bootstrap`, as
        for the headline's interval), so the `bootstrap` keywords are unused."""
        if score not in (None, self.column("primary_macro_f1")):
            return None
        needed = [ANSWER, ANSWER_TYPE, CANDIDATES, self.question_field, self.column("choice")]
        if any(c not in s.columns for s in (scored_a, scored_b) for c in needed):
            return None
        sides = [s[s[ANSWER_TYPE] == "closed"] for s in (scored_a, scored_b)]
        ids = [set(s[ID]) for s in sides if ID in s.columns]
        if len(ids) == 2 and ids[0] != ids[1]:
            raise ValueError(
                f"{self.name}: a paired delta needs the same questions on both sides; "
                f"{len(ids[0] ^ ids[1])} record id(s) differ."
            )
        clusters = sorted(
            set().union(*(set(s[self.cluster_field].astype(str)) for s in sides))
            if self.cluster_field in sides[0].columns
            else {"all"}
        )
        results = [self._totals(s, clusters) for s in sides]
        primary = self._primary(results[0][3])
        heads = [mean_or_nan([r[0][t]["macro_f1"] for t in primary]) for r in results]
        delta = heads[0] - heads[1]
        if math.isnan(delta) or len(clusters) < 2 or not self.bootstrap.samples:
            return BootstrapCI(delta, math.nan, math.nan, math.nan)
        reps = [self._headline_replicates(r[1], primary) for r in results]
        level = self.bootstrap.level
        return percentile_ci(delta, reps[0] - reps[1], level, f"{self.name} paired delta")

    def _abstention(self, task: str, closed: pd.DataFrame) -> dict[str, float]:
        """Coverage and accuracy on committed rows, for a task whose labels offer abstaining."""
        if self.abstain_label is None:
            return {}
        group = closed[closed[self.question_field].astype(str) == task]
        if self.abstain_label not in self._task_labels(task, group):
            return {}
        abstain = (
            group[self.column("choice")]
            .map(lambda c: c == self.abstain_label)
            .to_numpy(dtype=float)
        )
        correct = group[self.column("correct")].to_numpy(dtype=float)
        return {
            self.column(f"{task}_coverage"): 1.0 - mean_or_nan(abstain),
            self.column(f"{task}_cond_acc"): mean_or_nan(correct[abstain == 0.0]),
        }


# The `closed_set` family's per-sample columns and headline (a family writes `self.column`).
CS_CHOICE = ClosedSetMetric.column("choice")
CS_CORRECT = ClosedSetMetric.column("correct")
CS_INVALID = ClosedSetMetric.column("invalid")
HEADLINE = ClosedSetMetric.column("primary_macro_f1")
