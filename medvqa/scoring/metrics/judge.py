"""LLM-as-a-judge scoring (SURE-VQA's "Mistral score" / "Mistral accuracy"); docs/judge.md.

Token-overlap metrics punish a correct answer phrased differently ("left lung" vs "the lung on
the left side"); a judge model reads question, ground truth and prediction and grades meaning,
with the rubric a row's answer type selects (`medvqa.judge.rubrics`): open 1-5,
closed 0/1, closed multilabel 0 / 0.5 / 1. The shortcut, cache, batching, reminders and
counters are the judge engine's (`medvqa.judge.engine`); this family turns a
predictions table into engine items and the judgments back into columns and scores. A row
that could not be judged has `judge_failed = 1`, is counted in `judge_failures` and in the
`judge/failures` counter, and is retried by the next run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any, cast

import numpy as np
import pandas as pd

from medvqa.data.records import ANSWER, ANSWER_TYPE, PREDICTION, QUESTION
from medvqa.judge.base import JudgeBackend
from medvqa.judge.cache import JudgeCache
from medvqa.judge.config import JudgeConfig, JudgeConfigError, judge_config
from medvqa.judge.engine import COUNTERS, JudgeEngine, JudgeItem, as_text
from medvqa.judge.jury import jury_verdict
from medvqa.judge.replies import Judgment
from medvqa.judge.rubrics import RUBRICS, Rubric, select_rubric
from medvqa.judge.selfcheck import SELFCHECK_SPLIT, SelfCheck, selfcheck_items
from medvqa.scoring.metrics.base import ScoreInfo
from medvqa.scoring.metrics.judged import JudgedFamily
from medvqa.statistics.bootstrap import mean_or_nan

log = logging.getLogger(__name__)

__all__ = [
    "CLOSED_KIND",
    "JUDGE_FAILED",
    "JUDGE_LABEL_MASS",
    "JUDGE_REASON",
    "JUDGE_RUBRIC",
    "JUDGE_SCORE",
    "JUROR_SEP",
    "JudgeJury",
    "JudgeMetric",
    "juror_column",
    "jurors_of",
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
        self-check (medvqa.judge.selfcheck) before the first scoring; None: don't."""
        self.rubrics = dict(RUBRICS if rubrics is None else rubrics)
        missing = [n for n in RUBRICS if n not in self.rubrics]
        if missing:
            raise ValueError(f"judge rubrics lack {missing}; need {list(RUBRICS)}")
        self.engine = JudgeEngine(backend, cache, on_judgment)
        self.selfcheck_floors = selfcheck_floors

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> JudgedFamily:
        """One judge from the `judge` node, or a `JudgeJury` when it lists `jury`."""
        config = judge_config(cfg)
        if not config.jury:
            return super().from_config(cfg)
        return JudgeJury.from_judge_config(config)

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

    def headline(self) -> dict[str, str]:
        """SURE-VQA's "Mistral accuracy" and "Mistral score" (its raw 1-5 scale)."""
        return {"closed": self.column("closed_acc"), "open": self.column("open_score")}

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


# Where a juror's column or score is kept beside the jury's: `judge_score@strict`.
JUROR_SEP = "@"
_JUROR_BASES = ("score", "failed", "reason", "label_mass")  # a juror's per-sample columns


def juror_column(name: str, juror: str) -> str:
    """A juror's copy of the family's column or score `name` (`judge_score` -> `...@strict`)."""
    return f"{name}{JUROR_SEP}{juror}"


def jurors_of(scored: pd.DataFrame) -> list[str]:
    """The jurors whose scores a scored table keeps (`judge_score@<juror>` columns), in order."""
    head = f"{JUDGE_SCORE}{JUROR_SEP}"
    return [str(c).removeprefix(head) for c in scored.columns if str(c).startswith(head)]


class JudgeJury(JudgeMetric):
    """The answer judge as a jury (`judge.jury`): each juror is a `JudgeMetric` of its own
    (backend, cache entries, self-check, counters); the family's unsuffixed columns and scores
    are the jury's verdict (`judge.jury_closed` for closed rows, `judge.jury_open` for open
    ones), each juror's are kept beside them under `@<juror>`.

    A row a juror could not judge has no verdict (NaN, `judge_failed` 1, counted in
    `judge_failures`, so the run is `incomplete`), whatever the other jurors said; a re-run
    asks each juror only what its cache lacks."""

    def __init__(
        self,
        jurors: Mapping[str, JudgeMetric],
        closed_rule: str,
        open_rule: str,
        configs: Mapping[str, JudgeConfig] | None = None,
    ) -> None:
        if len(jurors) < 2:
            raise JudgeConfigError("a jury needs two or more jurors")
        self.jurors = dict(jurors)
        self.rules = {"closed": closed_rule, "open": open_rule}
        self.configs = dict(configs or {})
        self.rubrics = next(iter(self.jurors.values())).rubrics  # every juror's (from_config)
        ids: dict[str, str] = {}
        for name, juror in self.jurors.items():
            judge_id = juror.backend.judge_id
            if judge_id in ids:
                raise JudgeConfigError(
                    f"judge.jury: jurors {ids[judge_id]!r} and {name!r} are the same judge "
                    f"({judge_id}: backend, model and mode); their judgments would be the same "
                    "cache entries. Give each juror another model or mode."
                )
            ids[judge_id] = name

    @classmethod
    def from_judge_config(cls, config: JudgeConfig) -> JudgeJury:
        """Each juror built as a single judge from its config (`JudgeConfig.jurors`)."""
        configs = config.jurors()
        jurors: dict[str, JudgeMetric] = {}
        try:
            for name, juror in configs.items():
                # A juror's config has no jury: `from_config` builds a single judge.
                jurors[name] = cast(JudgeMetric, JudgeMetric.from_config(asdict(juror)))
            return cls(jurors, config.jury_closed, config.jury_open, configs)
        except BaseException:
            for built in jurors.values():
                built.close()
            raise

    @property
    def backend(self) -> Any:
        raise AttributeError("a jury has one backend per juror: JudgeJury.jurors[name].backend")

    def check(self) -> None:
        for juror in self.jurors.values():
            juror.check()

    def per_sample(self, preds: pd.DataFrame) -> pd.DataFrame:
        """The jury's `judge_*` columns (its verdict, `judge_failed` 1 where any juror failed,
        the jurors' scores as its reason) and each juror's `judge_*@<juror>` columns."""
        frames = {name: juror.per_sample(preds) for name, juror in self.jurors.items()}
        scores = np.column_stack([f[JUDGE_SCORE].to_numpy(float) for f in frames.values()])
        is_open = (preds[ANSWER_TYPE] == "open").to_numpy()
        verdict = np.where(
            is_open,
            jury_verdict(scores, self.rules["open"]),
            jury_verdict(scores, self.rules["closed"]),
        )
        failed = np.column_stack([f[JUDGE_FAILED].to_numpy(float) for f in frames.values()])
        reasons = [
            "; ".join(
                f"{name}: {'failed' if row_failed else f'{score:g}'}"
                for name, score, row_failed in zip(frames, row, failed_row, strict=True)
            )
            for row, failed_row in zip(scores, failed, strict=True)
        ]
        out = pd.DataFrame(
            {
                JUDGE_SCORE: verdict,
                JUDGE_RUBRIC: next(iter(frames.values()))[JUDGE_RUBRIC],
                JUDGE_FAILED: failed.max(axis=1),
                JUDGE_REASON: reasons,
                JUDGE_LABEL_MASS: np.nan,  # a probability of one judge's; see each juror's
            },
            index=preds.index,
        )
        for name, frame in frames.items():
            for base in _JUROR_BASES:
                out[juror_column(self.column(base), name)] = frame[self.column(base)]
        for name, juror in self.jurors.items():
            log.info(
                "judge jury: juror %s (%s): %s",
                name,
                juror.backend.judge_id,
                ", ".join(f"{k} {v}" for k, v in juror.engine.counters.items()),
            )
        unknown = int(out[JUDGE_FAILED].sum())
        if unknown:
            log.warning(
                "judge jury: %d of %d row(s) have no verdict: a juror could not judge them "
                "(judge_failed; the run is incomplete, and a re-run asks only those jurors "
                "those rows)",
                unknown,
                len(out),
            )
        return out

    def aggregate(self, scored: pd.DataFrame) -> dict[str, float]:
        """The jury's scores (`JudgeMetric.aggregate` of its verdicts) and each juror's own,
        as `<score>@<juror>` (`judge_failures@strict`: the rows that juror failed)."""
        out = super().aggregate(scored)
        for juror in self.jurors:
            own = {juror_column(self.column(b), juror): self.column(b) for b in _JUROR_BASES}
            view = scored[[ANSWER_TYPE, *own]].rename(columns=own)
            for key, value in super().aggregate(view).items():
                out[juror_column(key, juror)] = value
        return out

    def ci_columns(self) -> dict[str, tuple[str, str]]:
        out = super().ci_columns()
        for juror in self.jurors:
            for score, (column, answer_type) in super().ci_columns().items():
                out[juror_column(score, juror)] = (juror_column(column, juror), answer_type)
        return out

    @classmethod
    def score_info(cls, score: str) -> ScoreInfo:
        """A juror's score is what the jury's of the same name is (`judge_failures@x` a count)."""
        return super().score_info(score.partition(JUROR_SEP)[0])

    def counters(self) -> dict[str, float]:
        """The jury's `judge/<counter>` (summed over jurors), each juror's under
        `judge/<juror>/`, its self-check's `judge/<juror>/selfcheck_*`; the jury's
        `judge/selfcheck_reliable` (0 if any juror failed its check, unknown if any check is
        unknown, else 1) and the self-check items no juror could judge as the `selfcheck`
        split's failures."""
        out: dict[str, float] = dict.fromkeys((f"{self.name}/{k}" for k in COUNTERS), 0.0)
        checks: list[SelfCheck] = []
        for name, juror in self.jurors.items():
            for key, value in juror.engine.counters.items():
                out[f"{self.name}/{key}"] += value
                out[f"{self.name}/{name}/{key}"] = float(value)
            if juror.selfcheck is not None:
                checks.append(juror.selfcheck)
                out.update(juror.selfcheck.counters(f"{self.name}/{name}"))
        if checks:
            verdicts = [c.reliable for c in checks]
            reliable = 0.0 if False in verdicts else np.nan if None in verdicts else 1.0
            out[f"{self.name}/selfcheck_reliable"] = reliable
            out[f"{SELFCHECK_SPLIT}/{self.failures_key}"] = float(sum(c.failures for c in checks))
        return out

    def provenance(self) -> dict[str, Any]:
        jurors = {}
        for name, juror in self.jurors.items():
            config = self.configs.get(name)
            where = {k: getattr(config, k) for k in ("backend", "model", "base_url", "mode")}
            jurors[name] = {**juror.provenance(), **(where if config else {})}
        ids = ", ".join(f"{name}={juror.backend.judge_id}" for name, juror in self.jurors.items())
        return {
            "judge_id": f"jury({ids})",
            "rubrics": dict(sorted(self.rubric_ids().items())),
            "jury_verdict": dict(self.rules),
            "jurors": jurors,
        }

    def judge(self, items: Any, what: str) -> list[Judgment]:
        raise NotImplementedError("a jury judges through its jurors (JudgeJury.per_sample)")

    def close(self) -> None:
        for juror in self.jurors.values():
            juror.close()
