"""The closed questions again with their options reordered (`data.option_orders=k`).

Each of the k seeded other orders (never the original one) is a pass recorded as
`order<k>/...`: option-order flips' input (docs/metrics.md#option-order-invariance)."""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from medvqa.data import records as R
from medvqa.generation.passes.base import EvalPass, Job
from medvqa.training.spec import DataSchema
from medvqa.untrusted import config_get


@dataclass(frozen=True, kw_only=True)
class OptionOrder(EvalPass):
    name = "option_order"
    setting = "data.option_orders"
    sequence = 30
    row_kind = "extra order"

    k: int  # the k-th seeded other order (k >= 1)

    @classmethod
    def of_job(cls, job: Job) -> list[EvalPass]:
        orders = int(job.setting(cls.setting) or DataSchema.option_orders)
        return [cls.after(job.label, image_mode=job.eval_image, k=k) for k in range(1, orders + 1)]

    @classmethod
    def problems(cls, config: Any) -> list[str]:
        orders = config_get(config, cls.setting)
        prompt = config_get(config, "prompt")
        whole = isinstance(orders, int) and not isinstance(orders, bool)
        if whole and orders > 0 and prompt is not None and config_get(prompt, "options") is None:
            return [
                f"{cls.setting}={orders}: the prompt lists no options (prompt.options is "
                "unset), so their order cannot change an answer; use prompt=sure or a "
                "template with `options`"
            ]
        return []

    @classmethod
    def check(
        cls, passes: Sequence[EvalPass], frames: Mapping[str, pd.DataFrame], job: Job
    ) -> None:
        super().check(passes, frames, job)
        check_reorderable(frames, len(passes))

    @property
    def key(self) -> str:
        return f"order{self.k}"

    @property
    def suffix(self) -> str:
        return f"options reordered ({self.k})"

    def rows(self, frame: pd.DataFrame) -> pd.DataFrame:
        return reordered(frame, self.k)

    def planned(self, rows: int) -> tuple[str, float]:
        return f"{self.label}, all rows (closed ones only: at most)", rows * self.cost_factor


def reordered(frame: pd.DataFrame, k: int) -> pd.DataFrame:
    """`frame` with each closed question's candidates in the `k`-th seeded other order (a
    permutation drawn per row from `(k, crc32(id))`, never the original order; two candidates
    are swapped). Rows with fewer than two candidates, and open questions, are unchanged."""
    if R.CANDIDATES not in frame.columns:
        return frame

    def permute(rid: str, candidates: Any) -> Any:
        if not isinstance(candidates, list | tuple | np.ndarray) or len(candidates) < 2:
            return candidates
        items = list(candidates)
        rng = np.random.default_rng([int(k), zlib.crc32(str(rid).encode())])
        order = np.arange(len(items))
        while (order == np.arange(len(items))).all():
            order = rng.permutation(len(items))
        return [items[i] for i in order]

    permuted = [permute(r, c) for r, c in zip(frame[R.ID], frame[R.CANDIDATES], strict=True)]
    return frame.assign(**{R.CANDIDATES: permuted})


def check_reorderable(frames: Mapping[str, pd.DataFrame], orders: int) -> None:
    """Before the model loads: with `data.option_orders` > 0 every evaluated split needs a
    question with two or more candidates, else each reordering would generate the same answers
    again and the flip rate would be NaN."""
    if orders < 1:
        return
    bare = [
        split
        for split, frame in frames.items()
        if R.CANDIDATES not in frame.columns
        or not any(
            isinstance(c, list | tuple | np.ndarray) and len(c) >= 2 for c in frame[R.CANDIDATES]
        )
    ]
    if bare:
        raise ValueError(
            f"data.option_orders={orders}: split(s) {bare} hold no question with two or more "
            "candidate answers, so there is no option order to change. Set "
            "data.option_orders=0 for this dataset."
        )
