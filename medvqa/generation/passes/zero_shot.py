"""The untuned base's answers (`task.references=[zero_shot,...]`, in a tuned job).

Generated before the method applies, shared by a sweep's jobs: the zero-shot reference row."""

from __future__ import annotations

from dataclasses import dataclass

from medvqa.generation.passes.base import EvalPass, Job, ReportRow

ZERO_SHOT = "zero_shot/"


@dataclass(frozen=True, kw_only=True)
class ZeroShot(EvalPass):
    name = "zero_shot"
    setting = "task.references"
    sequence = 0
    base = True
    row_kind = "reference"

    @classmethod
    def of_job(cls, job: Job) -> list[EvalPass]:
        if not job.tuned or job.base_label is None:
            return []
        return [cls(label=job.base_label, image_mode=job.eval_image)]

    @property
    def key(self) -> str:
        return ZERO_SHOT.rstrip("/")

    def named(self, main: str) -> str:
        return self.label  # a reference row of its own, not named after the run

    def report_rows(self) -> list[ReportRow]:
        return []  # the report's reference rows (`analysis.methods.REFERENCES`)

    @property
    def shared(self) -> bool:
        return True
