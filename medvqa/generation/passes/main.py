"""The main answers (every job): each evaluated row under `data.eval_image`.

By the weights the job evaluates; the run's own row in the summary and the report."""

from __future__ import annotations

from dataclasses import dataclass

from medvqa.generation.passes.base import EvalPass, Job, ReportRow


@dataclass(frozen=True, kw_only=True)
class Main(EvalPass):
    name = "main"
    sequence = 10
    row_kind = "run"

    tuned: bool  # the weights are tuned; untuned ones' answers are shared by a sweep's jobs

    @classmethod
    def of_job(cls, job: Job) -> list[EvalPass]:
        return [cls(label=job.label, image_mode=job.eval_image, tuned=job.tuned)]

    @property
    def key(self) -> str:
        return ""

    def named(self, main: str) -> str:
        return main

    def report_rows(self) -> list[ReportRow]:
        return []  # the run's own row

    @property
    def shared(self) -> bool:
        return not self.tuned
