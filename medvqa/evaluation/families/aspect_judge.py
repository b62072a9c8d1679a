"""Temporary: the aspect judge family."""

from medvqa.evaluation.aspect_judge import AspectJudgeMetric

__all__ = ["AspectJudgeMetric"]
