"""LLM-as-a-judge scoring (SURE-VQA's "Mistral score" / "Mistral accuracy"); docs/judge.md.

Token-overlap metrics punish a correct answer phrased differently ("left lung" vs "the lung on
the left side"); a judge model reads question, ground truth and prediction and grades meaning,
with the rubric a row's answer type selects (`medvqa.evaluation.judge.rubrics`): open 1-5,
closed 0/1, closed multilabel 0 / 0.5 / 1. The shortcut, cache, batching, reminders and
counters are the judge engine's (`medvqa.evaluation.judge.engine`); this family turns a
predictions table into engine items and the judgments back into columns and scores. A row
that could not be judged has `judge_failed = 1`, is counted in `judge_failures` and in the
`judge/failures` counter, and is retried by the next run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import pandas as pd

from medvqa.data.records import ANSWER, ANSWER_TYPE, PREDICTION, QUESTION
from medvqa.evaluation.judge.base import JudgeBackend
from medvqa.evaluation.judge.cache import JudgeCache
from medvqa.evaluation.judge.engine import JudgeEngine, JudgeItem, as_text
from medvqa.evaluation.judge.family import JudgedFamily
from medvqa.evaluation.judge.replies import Judgment
from medvqa.evaluation.judge.rubrics import RUBRICS, Rubric, select_rubric
from medvqa.evaluation.judge.selfcheck import selfcheck_items
from medvqa.evaluation.statistics import mean_or_nan

__all__ = [
    "CLOSED_KIND",
    "JUDGE_FAILED",
    "JUDGE_LABEL_MASS",
    "JUDGE_REASON",
    "JUDGE_RUBRIC",
    "JUDGE_SCORE",
    "JudgeMetric",
]

CLOSED_KIND = "closed_kind"  # a record column (read, never written)


class JudgeMetric(JudgedFamily):
    """The LLM judge as a metric family (`per_sample` / `aggregate` / `counters`).

    `on_judgment` is handed to the engine (`JudgeEngine`): called after each judgment made
    in this run is stored, for progress reporting.
    """

    name = "judge"

    def __init__(
        self,
        backend: JudgeBackend,
        cache: JudgeCache | None = None,
        rubrics: Mapping[str, Rubric] | None = None,
        on_judgment: Callable[[str, Judgment], None] | None = None,
        selfcheck_floors: tuple[float, float] | None = None,
    ) -> None:
        """`selfcheck_floors` (minimum closed accuracy, minimum open Kendall tau): run the
        self-check (medvqa.evaluation.judge.selfcheck) before the first scoring; None: don't."""
        self.rubrics = dict(RUBRICS if rubrics is None else rubrics)
        missing = [n for n in RUBRICS if n not in self.rubrics]
        if missing:
            raise ValueError(f"judge rubrics lack {missing}; need {list(RUBRICS)}")
        self.engine = JudgeEngine(backend, cache, on_judgment)
        self.selfcheck_floors = selfcheck_floors

    def selfcheck_pairs(self) -> list[tuple[JudgeItem, float]]:
        return selfcheck_items(self.rubrics)

    def rubric_ids(self) -> dict[str, str]:
        return {name: rubric.id for name, rubric in self.rubrics.items()}

    def per_sample(self, preds: pd.DataFrame) -> pd.DataFrame:
        """`judge_score`, `judge_rubric`, `judge_failed` (0/1), `judge_reason` and
        `judge_label_mass` (logits mode: the probability on the allowed labels) per row, each
        after the family's prefix (`self.column("score")`).

        Same index as `preds`. Failed rows have `judge_score` NaN and `judge_failed` 1.
        Identical items (same rubric, question, ground truth, prediction) are judged once.
        """
        missing = [c for c in (QUESTION, ANSWER, PREDICTION, ANSWER_TYPE) if c not in preds]
        if missing:
            raise ValueError(
                f"the judge needs column(s) {missing} in the predictions table "
                f"(has {list(preds.columns)})"
            )
        n = len(preds)
        kinds = preds[CLOSED_KIND].tolist() if CLOSED_KIND in preds else [None] * n
        items = [
            JudgeItem(self.rubrics[select_rubric(t, kind, idx)], as_text(q), as_text(a), as_text(p))
            for idx, q, a, p, t, kind in zip(
                preds.index,
                preds[QUESTION],
                preds[ANSWER],
                preds[PREDICTION],
                preds[ANSWER_TYPE],
                kinds,
                strict=True,
            )
        ]
        judgments = self.judge(items, "row(s)")
        score = np.full(n, np.nan)
        mass = np.array([j.label_mass for j in judgments], dtype=float)
        failed = np.zeros(n)
        reasons = [""] * n
        for i, j in enumerate(judgments):
            if j.status == "ok":
                score[i] = j.score
                reasons[i] = j.reason
            else:
                failed[i] = 1.0
                reasons[i] = j.error
        return pd.DataFrame(
            {
                self.column("score"): score,
                self.column("rubric"): [item.rubric.id for item in items],
                self.column("failed"): failed,
                self.column("reason"): reasons,
                self.column("label_mass"): mass,
            },
            index=preds.index,
        )

    def aggregate(self, scored: pd.DataFrame) -> dict[str, float]:
        """`judge_closed_acc` (mean closed score), `judge_open_score` (mean 1-5),
        `judge_open_score_norm` (mean of (s-1)/4, a 0-1 scale for display beside the token
        metrics; RR is a ratio, so it uses the raw `judge_open_score`), and
        `judge_failures` (rows that could not be judged). A mean over rows of which one could
        not be judged is NaN (a failed row's score is NaN): never a mean over the survivors,
        which would keep the easy items (exact matches are scored without a call). Means over
        no rows are NaN, not 0."""
        closed = scored[ANSWER_TYPE] == "closed"
        open_scores = scored.loc[scored[ANSWER_TYPE] == "open", self.column("score")]
        return {
            self.column("closed_acc"): mean_or_nan(scored.loc[closed, self.column("score")]),
            self.column("open_score"): mean_or_nan(open_scores),
            self.column("open_score_norm"): mean_or_nan((open_scores - 1.0) / 4.0),
            self.failures_key: float(scored[self.column("failed")].sum()),
        }

    def ci_columns(self) -> dict[str, tuple[str, str]]:
        """Aggregate name -> (per-sample column, answer type it averages over), for CIs: the
        headline judge scores, the open one on its raw 1-5 scale as RR uses it."""
        return {
            self.column("closed_acc"): (self.column("score"), "closed"),
            self.column("open_score"): (self.column("score"), "open"),
        }


# The `judge` family's per-sample columns (a family writes `self.column(base)`).
JUDGE_SCORE = JudgeMetric.column("score")
JUDGE_RUBRIC = JudgeMetric.column("rubric")
JUDGE_FAILED = JudgeMetric.column("failed")
JUDGE_REASON = JudgeMetric.column("reason")
JUDGE_LABEL_MASS = JudgeMetric.column("label_mass")  # logits mode: probability on the labels
