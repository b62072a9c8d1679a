"""A job's evaluation passes: a plug-in kind (`base.EvalPass`, one module per kind here, or any
module named in `MEDVQA_PLUGINS`) whose instances are the answers a job generates (the untuned
base's, the main ones, under each other image mode, with each reordering of the options, ...),
listed once per job (`job_passes`), recorded in results.json and read back (`recorded_passes`)
by scoring, the views, the plan and the report."""

from medvqa.generation.passes.base import (
    CHANCE,
    PREDICTIONS,
    RECORD_KEY,
    EvalPass,
    Job,
    ReportRow,
    Unregistered,
    check_passes,
    from_record,
    generation_groups,
    job_passes,
    kinds,
    main_label,
    pass_problems,
    prediction_path,
    recorded_passes,
    report_rows,
)
from medvqa.generation.passes.image_mode import ImageMode
from medvqa.generation.passes.main import Main
from medvqa.generation.passes.option_order import OptionOrder
from medvqa.generation.passes.region_occlusion import RegionOcclusion
from medvqa.generation.passes.zero_shot import ZERO_SHOT, ZeroShot

__all__ = [
    "CHANCE",
    "PREDICTIONS",
    "RECORD_KEY",
    "ZERO_SHOT",
    "EvalPass",
    "ImageMode",
    "Job",
    "Main",
    "OptionOrder",
    "RegionOcclusion",
    "ReportRow",
    "Unregistered",
    "ZeroShot",
    "check_passes",
    "from_record",
    "generation_groups",
    "job_passes",
    "kinds",
    "main_label",
    "pass_problems",
    "prediction_path",
    "recorded_passes",
    "report_rows",
]
