"""What every judged metric family shares (`judge`, `aspect_judge`): built from the `judge`
config node, judged by one engine (backend, cache, counters), self-checked before its first
scoring, failures counted and logged the same way. A family adds its items, rubrics and
columns (`medvqa.scoring.metrics.judge`, `...aspect_judge`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from medvqa.judge.backends import build_backend
from medvqa.judge.base import JudgeBackend
from medvqa.judge.cache import JudgeCache, cache_from_config
from medvqa.judge.config import JudgeConfigError, judge_config
from medvqa.judge.engine import JudgeItem
from medvqa.judge.replies import Judgment
from medvqa.judge.selfcheck import SELFCHECK_ID, SelfChecked, floors
from medvqa.scoring.metrics.base import COUNT, MetricFamily, ScoreInfo

log = logging.getLogger(__name__)


class JudgedFamily(SelfChecked, MetricFamily):
    """A metric family whose scores an LLM judge gives, through `self.engine`."""

    not_performance: ClassVar[dict[str, ScoreInfo]] = {"n": COUNT}
    config_factory = "from_config"  # built from the `judge` node: cfg: ${judge}
    can_fail = True

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> JudgedFamily:
        """Backend and cache from a `judge` config group (conf/judge/default.yaml)."""
        if judge_config(cfg).jury:
            # Only the answer judge grades with a jury (families/judge.py); grading with the
            # node's own judge instead would look like the jury's verdict.
            raise JudgeConfigError(
                f"metric={cls.name} does not grade with a jury (judge.jury); score it in a run "
                "of its own with judge.jury=[], or drop it from `metric`"
            )
        # Each family's constructor takes (backend, cache, ..., selfcheck_floors=...).
        backend, cache = build_backend(cfg), cache_from_config(cfg)
        return cls(backend, cache, selfcheck_floors=floors(cfg))  # type: ignore[call-arg]

    @property
    def backend(self) -> JudgeBackend:
        return self.engine.backend

    @property
    def cache(self) -> JudgeCache | None:
        return self.engine.cache

    def rubric_ids(self) -> dict[str, str]:
        """Each rubric the family judges with, by name: its id (a hash of its text)."""
        raise NotImplementedError

    def provenance(self) -> dict[str, Any]:
        return {
            "judge_id": self.backend.judge_id,
            "rubrics": dict(sorted(self.rubric_ids().items())),
            "selfcheck": SELFCHECK_ID if self.selfcheck_floors is not None else None,
        }

    def counters(self) -> dict[str, float]:
        """The engine's counters under the family's name (`<name>/calls`, `retries`,
        `cache_hits`, `shortcut_hits`, `failures`: one count per judgment, retries included),
        and the self-check's `<name>/selfcheck_*` once it ran, with its items that could not be
        judged as the `selfcheck` split's failures (the run is then incomplete)."""
        out: dict[str, float] = {f"{self.name}/{k}": v for k, v in self.engine.counters.items()}
        return {**out, **self.selfcheck_counters(self.name)}

    def judge(self, items: Sequence[JudgeItem], what: str) -> list[Judgment]:
        """The engine's judgments of `items` (`what` they are, for the log), after the
        self-check; those that failed are logged once (they are retried by the next run)."""
        self.check()
        judgments = self.engine.judge(list(items))
        failed = [j for j in judgments if j.status != "ok"]
        if failed:
            log.warning(
                "%s: %d of %d %s could not be judged (recorded in %s; retried on the next "
                "run). First error: %s",
                self.name,
                len(failed),
                len(judgments),
                what,
                self.column("failed"),
                failed[0].error,
            )
        log.info("%s %s: %s", self.name, self.backend.judge_id, self.counters())
        return judgments

    def close(self) -> None:
        self.engine.close()
