"""Temporary: the judge families (moved here by the judge package refactor)."""

from medvqa.evaluation.judge import JudgeMetric

__all__ = ["JudgeMetric"]
