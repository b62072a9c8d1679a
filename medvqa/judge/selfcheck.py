"""The judge's self-check: items with known verdicts, answered before any score is trusted.

A judge that says "correct" to everything still produces plausible-looking accuracies. Before a
judge metric scores a run, its judge answers this fixed set (written for this project; none of
its predictions equals its ground truth after normalisation, so the exact-match shortcut never
answers for the judge):

* closed (0/1): right answers phrased verbosely, and wrong ones, including negations of the
  ground truth ("There is no mass." for "yes");
* closed multilabel (0 / 0.5 / 1): exact, partial and wrong choices between two options;
* open (1-5): predictions graded from a contradiction (1) to a synonym of the ground truth (5);
* aspect (0/1, the per-aspect judge): one aspect of a combined answer right or wrong, whatever
  the other aspects say.

Reported under the metric's counters (`judge/selfcheck_*`): `closed_acc` (share of closed and
multilabel items scored exactly as expected), `open_tau` (Kendall tau-b between the judge's
open scores and the expected grades), `false_correct` (share of known-wrong closed items the
judge called correct), `failures`, and `reliable` (1/0: closed_acc and open_tau at or above
their floors). The judgments go through the judge's cache like any other, so the check costs
calls only once per judge. `SELFCHECK_ID` changes whenever an item does.

An item the judge could not answer (a server error, an unreadable reply) is unknown, not
wrong, as in any other judge metric: every number it enters is NaN, and so is `reliable`
(neither trusted nor flagged). It is also counted like a split's unscored items, as
`selfcheck/<failures_key>` (`selfcheck/judge_failures`), so the run is recorded `incomplete`
(`medvqa.scoring.pipeline.failed_items`) and a re-run judges only those items (the cache
keeps failures for inspection but never answers with one).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from medvqa.hashing import content_hash
from medvqa.judge.config import JudgeConfig
from medvqa.judge.engine import JudgeEngine, JudgeItem
from medvqa.judge.rubrics import ASKED_CLASS, Rubric

log = logging.getLogger(__name__)

# (rubric, question, ground truth, prediction, expected score)
ITEMS: tuple[tuple[str, str, str, str, float], ...] = (
    ("closed", "Is there a mass in the liver?", "yes", "Yes, a mass is seen in the liver.", 1),
    ("closed", "Is there a mass in the liver?", "yes", "No.", 0),
    ("closed", "Is there a mass in the liver?", "yes", "There is no mass in the liver.", 0),
    ("closed", "Is the heart enlarged?", "no", "The heart size is normal, not enlarged.", 1),
    ("closed", "Is the heart enlarged?", "no", "Yes, the heart is enlarged.", 0),
    ("closed", "Does the image show a fracture?", "no", "No fracture is visible.", 1),
    ("closed", "Does the image show a fracture?", "no", "A fracture is visible.", 0),
    ("closed", "Is this a CT or an MRI scan?", "MRI", "It is a magnetic resonance image.", 1),
    ("closed", "Is this a CT or an MRI scan?", "MRI", "This is a CT scan.", 0),
    ("closed", "Is the lesion on the left side?", "yes", "It is on the right side.", 0),
    ("closed", "Is there pleural effusion?", "yes", "Pleural effusion is present.", 1),
    ("closed", "Is there pleural effusion?", "yes", "I cannot tell from the image.", 0),
    ("closed_multilabel", "Which lung is affected, left or right?", "both", "both lungs", 1),
    ("closed_multilabel", "Which lung is affected, left or right?", "both", "the left lung", 0.5),
    ("closed_multilabel", "Which lung is affected, left or right?", "left", "the right lung", 0),
    ("closed_multilabel", "Which lung is affected, left or right?", "left", "neither lung", 0),
    ("open", "What imaging modality is used?", "MRI", "magnetic resonance imaging", 5),
    ("open", "What imaging modality is used?", "MRI", "CT", 1),
    ("open", "Which organ is abnormal?", "liver", "the liver shows the abnormality", 5),
    ("open", "Which organ is abnormal?", "liver", "spleen", 1),
    ("open", "Where is the nodule?", "right upper lobe", "in the right lung", 3),
    ("open", "Where is the nodule?", "right upper lobe", "left lower lobe", 1),
    ("open", "What organs are visible?", "heart, lungs and liver", "heart and lungs", 3),
    ("open", "What organs are visible?", "heart, lungs and liver", "kidneys", 1),
    ("open", "What is the main finding?", "pneumothorax on the left", "left pneumothorax", 5),
    ("open", "What is the main finding?", "pneumothorax on the left", "a pneumothorax", 3),
)
# (question, aspect, ground truth, prediction, expected score) for the per-aspect rubric
CLASS_ITEMS: tuple[tuple[str, str, str, str, float], ...] = (
    (
        "What type of polyp is it and is an instrument visible?",
        "polyp_type",
        "A pedunculated polyp; no instrument is visible.",
        "The polyp is pedunculated, and forceps are visible.",
        1,
    ),
    (
        "What type of polyp is it and is an instrument visible?",
        "instrument_presence",
        "A pedunculated polyp; no instrument is visible.",
        "The polyp is pedunculated, and forceps are visible.",
        0,
    ),
    (
        "How many polyps are there?",
        "polyp_count",
        "Two polyps.",
        "There are 2 polyps.",
        1,
    ),
    (
        "How many polyps are there?",
        "polyp_count",
        "Two polyps.",
        "A single polyp.",
        0,
    ),
    (
        "What colour is the abnormality and where is it?",
        "abnormality_color",
        "Red, in the lower left.",
        "A pale white area at the top.",
        0,
    ),
    (
        "What colour is the abnormality and where is it?",
        "abnormality_location",
        "Red, in the lower left.",
        "Reddish, located lower-left.",
        1,
    ),
)
SELFCHECK_ID = f"selfcheck-{content_hash([ITEMS, CLASS_ITEMS], length=12)}"
# The self-check's items count as a split of their own when items that could not be scored are
# counted: `selfcheck/judge_failures` beside `test_iid/judge_failures`.
SELFCHECK_SPLIT = "selfcheck"


@dataclass(frozen=True)
class SelfCheck:
    """How the judge did on the known verdicts, and whether that meets the floors. With
    failed items the numbers they enter are NaN and `reliable` is None (not known)."""

    closed_acc: float
    open_tau: float
    false_correct: float
    failures: int
    reliable: bool | None

    def counters(self, prefix: str) -> dict[str, float]:
        return {
            f"{prefix}/selfcheck_closed_acc": self.closed_acc,
            f"{prefix}/selfcheck_open_tau": self.open_tau,
            f"{prefix}/selfcheck_false_correct": self.false_correct,
            f"{prefix}/selfcheck_failures": float(self.failures),
            f"{prefix}/selfcheck_reliable": math.nan
            if self.reliable is None
            else float(self.reliable),
        }


def selfcheck_items(rubrics: Mapping[str, Rubric]) -> list[tuple[JudgeItem, float]]:
    """The answer judge's known items (open, closed, closed multilabel) with their scores."""
    return [(JudgeItem(rubrics[r], q, a, p), float(v)) for r, q, a, p, v in ITEMS]


def aspect_selfcheck_items(rubric: Rubric) -> list[tuple[JudgeItem, float]]:
    """The per-aspect judge's known items with their scores."""
    return [
        (JudgeItem(rubric, q, a, p, {ASKED_CLASS: aspect}), float(v))
        for q, aspect, a, p, v in CLASS_ITEMS
    ]


def floors(cfg: Mapping[str, Any]) -> tuple[float, float] | None:
    """(minimum closed accuracy, minimum open tau) from a `judge` config; None: no check."""
    defaults = {f.name: f.default for f in fields(JudgeConfig)}
    if not cfg.get("selfcheck", defaults["selfcheck"]):
        return None
    return (
        float(cfg.get("selfcheck_min_closed_acc", defaults["selfcheck_min_closed_acc"])),
        float(cfg.get("selfcheck_min_open_tau", defaults["selfcheck_min_open_tau"])),
    )


class SelfChecked:
    """For a judge metric family: the self-check, run once before its first scoring, on its
    engine's backend and cache (its calls are not counted in the family's counters)."""

    engine: JudgeEngine
    selfcheck_floors: tuple[float, float] | None = None
    selfcheck: SelfCheck | None = None
    failures_key: ClassVar[str | None]  # the family's (MetricFamily.failures_key)

    def selfcheck_pairs(self) -> list[tuple[JudgeItem, float]]:
        raise NotImplementedError

    def check(self) -> SelfCheck | None:
        if self.selfcheck is None and self.selfcheck_floors is not None:
            engine = JudgeEngine(self.engine.backend, self.engine.cache)
            self.selfcheck = run_selfcheck(engine, self.selfcheck_pairs(), *self.selfcheck_floors)
        return self.selfcheck

    def selfcheck_counters(self, prefix: str) -> dict[str, float]:
        """`<prefix>/selfcheck_*`, and the items the check could not judge as the family's
        failures of the `selfcheck` split, which leave the run incomplete."""
        if self.selfcheck is None:
            return {}
        out = self.selfcheck.counters(prefix)
        failures_key = getattr(self, "failures_key", None)
        if failures_key:
            out[f"{SELFCHECK_SPLIT}/{failures_key}"] = float(self.selfcheck.failures)
        return out


def run_selfcheck(
    engine: JudgeEngine,
    pairs: Sequence[tuple[JudgeItem, float]],
    min_closed_acc: float,
    min_open_tau: float,
) -> SelfCheck:
    """Judge the known items with `engine` and compare with the expected scores. A failed
    judgment is unknown, not wrong: every number it enters is NaN and `reliable` is None, so a
    server hiccup neither condemns nor clears a judge. Without open items there is no tau to
    meet."""
    judgments = engine.judge([item for item, _ in pairs])
    closed_hits: list[float] = []
    false_correct: list[float] = []
    open_scores: list[float] = []
    open_expected: list[float] = []
    for (item, expected), judgment in zip(pairs, judgments, strict=True):
        score = float(judgment.score) if judgment.status == "ok" else math.nan
        if item.rubric.name == "open":
            open_scores.append(score)
            open_expected.append(expected)
            continue
        closed_hits.append(math.nan if math.isnan(score) else float(math.isclose(score, expected)))
        if expected == item.rubric.min_value:
            false_correct.append(
                math.nan if math.isnan(score) else float(score == item.rubric.max_value)
            )
    failed = [j for j in judgments if j.status != "ok"]
    tau = _tau(open_scores, open_expected) if open_scores else math.nan
    closed_acc = _mean(closed_hits)
    reliable = None
    if not failed:
        tau_ok = not open_scores or (not math.isnan(tau) and tau >= min_open_tau)
        reliable = closed_acc >= min_closed_acc and tau_ok
    result = SelfCheck(
        closed_acc=closed_acc,
        open_tau=tau,
        false_correct=_mean(false_correct),
        failures=len(failed),
        reliable=reliable,
    )
    if failed:
        log.warning(
            "judge self-check (%s, %s): %d of %d item(s) could not be judged, so its accuracy "
            "and verdict are unknown (NaN) and the run is recorded incomplete; a re-run judges "
            "only those items. First error: %s",
            engine.backend.judge_id,
            SELFCHECK_ID,
            len(failed),
            len(judgments),
            failed[0].error,
        )
        return result
    level = logging.INFO if result.reliable else logging.WARNING
    log.log(
        level,
        "judge self-check (%s, %s): closed %.2f (floor %.2f), open tau %.2f (floor %.2f), "
        "'correct' on %.0f%% of wrong closed answers: %s",
        engine.backend.judge_id,
        SELFCHECK_ID,
        result.closed_acc,
        min_closed_acc,
        result.open_tau,
        min_open_tau,
        100 * result.false_correct,
        "reliable" if result.reliable else "UNRELIABLE: its scores are marked in the results",
    )
    return result


def _mean(values: Sequence[float]) -> float:
    """The mean, NaN if any value is (an unknown item) or there are none."""
    if not values or any(math.isnan(v) for v in values):
        return math.nan
    return sum(values) / len(values)


def _tau(scores: Sequence[float], expected: Sequence[float]) -> float:
    """Kendall tau-b over the items that were judged; NaN if any failed or all tie."""
    if any(math.isnan(s) for s in scores) or len(set(scores)) < 2:
        return math.nan
    from scipy import stats  # here: importing the judge families stays quick (medvqa-list)

    return float(stats.kendalltau(scores, expected).statistic)
