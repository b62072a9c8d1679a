"""The views beyond accuracy: a plug-in kind (`base.View`, one module per view here, or any
module named in `MEDVQA_PLUGINS`), run over a job's scored answers by `run_views` /
`score_job` (`train_eval` and `medvqa-score` alike) and shown by the report (`presentation`)."""

from medvqa.views.base import (
    SPLIT_LABELS,
    JobRows,
    Presentation,
    View,
    presented,
    views,
)
from medvqa.views.run import run_views, score_job

__all__ = [
    "SPLIT_LABELS",
    "JobRows",
    "Presentation",
    "View",
    "presented",
    "run_views",
    "score_job",
    "views",
]
