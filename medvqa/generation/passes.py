"""A job's evaluation passes as one declared list: which answers it generates (the untuned base's,
the trained model's, under each counterfactual image mode, with each reordering of the options),
where each goes, and the row it is in the summary and the report. Generation, scoring, the
views and the report walk this list once (`tasks.train_eval`); a new kind of pass is added
here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medvqa.training.spec import PARTNER_MODES, DataSchema

PREDICTIONS = "predictions"
ZERO_SHOT = "zero_shot/"
CHANCE = "chance/"


def mode_prefix(mode: str) -> str:
    """The metric prefix of the answers under a counterfactual image mode (`blank/`)."""
    return f"{mode}/"


def order_prefix(k: int) -> str:
    """The metric prefix of the answers with the closed options in the k-th other order."""
    return f"order{k}/"


def prediction_path(out_dir: Path, prefix: str) -> Path:
    """The predictions file of a pass (`predictions.jsonl`, `predictions_<mode>.jsonl`, ...);
    its scored table is `scoring.scores_path` of it."""
    stem = f"{PREDICTIONS}_{prefix.rstrip('/')}" if prefix else PREDICTIONS
    return Path(out_dir) / f"{stem}.jsonl"


@dataclass(frozen=True)
class EvalPass:
    """One generation pass over the job's evaluated splits."""

    prefix: str  # of its metrics: "" the main answers, zero_shot/, <mode>/, order<k>/
    label: str  # its row in summary.md and the report
    image_mode: str  # data.eval_image or a counterfactual mode (data.extra_eval_images)
    order: int = 0  # k > 0: the closed options in the k-th seeded other order
    base: bool = False  # the untuned base model's answers, generated before the method applies
    shared: bool = False  # cached under paths.cache_dir for a sweep's jobs (the untuned base's)

    def path(self, out_dir: Path) -> Path:
        """Its predictions file (`prediction_path`)."""
        return prediction_path(out_dir, self.prefix)

    @property
    def image_variant(self) -> bool:
        """Whether it asks the main questions under another image (image reliance's input)."""
        return bool(self.prefix) and not self.base and not self.order


def job_passes(
    label: str,
    eval_image: str,
    tuned: bool,
    zero_shot_label: str | None,
    extra_images: Sequence[str],
    option_orders: int = DataSchema.option_orders,
) -> list[EvalPass]:
    """The passes of a job, in the order they run: the untuned base's answers first (a `tuned`
    job with a `zero_shot_label`, None: no such reference row, before the method applies), then
    the main answers, each of `extra_images` (data.extra_eval_images) and each of
    `option_orders` reorderings."""
    passes = []
    if zero_shot_label is not None and tuned:
        passes.append(EvalPass(ZERO_SHOT, zero_shot_label, eval_image, base=True, shared=True))
    passes.append(EvalPass("", label, eval_image, shared=not tuned))
    passes += [EvalPass(mode_prefix(m), f"{label}, {m} image", m) for m in extra_images]
    passes += [
        EvalPass(order_prefix(k), f"{label}, options reordered ({k})", eval_image, order=k)
        for k in range(1, int(option_orders) + 1)
    ]
    return passes


def generation_groups(passes: Sequence[EvalPass]) -> list[list[EvalPass]]:
    """`passes` (of one model) in the groups generated together, in order of first
    appearance: the passes under one image mode (the main answers and their option orders)
    share each image's prompt prefix across passes. Alone: a pass shared with other jobs (its
    answers are keyed by its own batches), and a partner-image mode (its partners are drawn per
    pass)."""
    groups: dict[Any, list[EvalPass]] = {}
    for i, p in enumerate(passes):
        alone = p.shared or p.image_mode in PARTNER_MODES
        groups.setdefault(i if alone else (p.base, p.image_mode), []).append(p)
    return list(groups.values())


def report_rows(passes: Sequence[EvalPass], chance_label: str | None) -> list[tuple[str, str]]:
    """(label, metric prefix) of the summary's rows: the main answers, the references (the
    untuned base's, chance's where it has a label), then the other passes."""
    main = [p for p in passes if not p.prefix]
    references = [p for p in passes if p.base]
    rows = [(p.label, p.prefix) for p in (*main, *references)]
    if chance_label is not None:
        rows.append((chance_label, CHANCE))
    return rows + [(p.label, p.prefix) for p in passes if p.prefix and not p.base]
