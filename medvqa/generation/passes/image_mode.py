"""The main questions again under another image (`data.extra_eval_images=[blank,...]`).

Each mode (blank, none, shuffled, mismatched) is a pass recorded as `<mode>/...`, and
`delta_<mode>/... = main - <mode>`: image reliance's input (docs/metrics.md#image-reliance)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from medvqa.generation.passes.base import EvalPass, Job, ReportRow


@dataclass(frozen=True, kw_only=True)
class ImageMode(EvalPass):
    name = "image_mode"
    setting = "data.extra_eval_images"
    sequence = 20
    paired_delta = True
    row_kind = "extra image"

    @classmethod
    def of_job(cls, job: Job) -> list[EvalPass]:
        modes = job.setting(cls.setting) or ()
        if isinstance(modes, str) or not isinstance(modes, Sequence):
            raise ValueError(f"{cls.setting}={modes!r}: a list of image modes")
        return [cls.after(job.label, image_mode=str(mode)) for mode in modes]

    @property
    def key(self) -> str:
        return self.image_mode

    @property
    def suffix(self) -> str:
        return f"{self.image_mode} image"

    def report_rows(self) -> list[ReportRow]:
        delta = f"delta_{self.key}"
        return [
            *super().report_rows(),
            ReportRow("delta", delta, f"{delta}/", f"Δ sighted − {self.image_mode}"),
        ]
