# Code copied from HELM keeps its own idioms:
# ruff: noqa: SIM118
"""MedHELM's jury verdict, for the test that sets medvqa's `judge.jury_*=mean` beside it.

Copied (trimmed where marked: HELM's `Stat`, `MetricName`, `RequestState` and adapter types
are left out; the annotations are given as the dict HELM's annotators write) from
github.com/stanford-crfm/helm `src/helm/benchmark/metrics/llm_jury_metrics.py` at commit
23e586cb50755345d3d11682b95f2b42bb2c0370, `LLMJuryMetric.evaluate_generation`: the mean of
every juror's score on every criterion, skipping a juror whose annotation is None, and
`default_score` (0.0) when no juror answered.
"""

from __future__ import annotations

from typing import Any


class LLMJuryMetric:
    """Score metrics for LLM Jury."""

    def __init__(
        self,
        metric_name: str,
        scenario_name: str,
        annotator_models: dict[str, Any],
        default_score: float = 0.0,
    ):
        self.metric_name = metric_name
        self.scenario_name = scenario_name
        self.annotator_models = annotator_models
        self.default_score = default_score

    def evaluate_generation(self, annotations_of_request: dict[str, Any]) -> float:
        # trimmed: `request_state.annotations` is passed in; the Stat is the returned score
        annotations: dict[str, Any] = annotations_of_request[self.scenario_name]
        scores: list[int] = []
        score = self.default_score
        for annotation_key, annotation_dict in annotations.items():
            if annotation_key in self.annotator_models.keys() and annotation_dict is not None:
                for val in annotation_dict.values():
                    scores.append(int(val["score"]))
        if scores:
            score = sum(scores) / len(scores)
        return score
