"""Sanity baselines scored without a model (the model-based ones are run configurations)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from medvqa.data import records as R


def expected_chance_accuracy(candidates: Sequence[Sequence[str] | None]) -> float:
    """Expected accuracy of a uniform guess among each question's k candidates: mean of 1/k."""
    ks = [len(c) for c in candidates if c is not None and len(c) > 0]
    return float(np.mean([1.0 / k for k in ks])) if ks else float("nan")


def chance_scores(frames: Mapping[str, pd.DataFrame]) -> dict[str, dict[str, float]]:
    """Per split, the random baseline on closed questions (open questions have no chance level)."""
    out = {}
    for split, frame in frames.items():
        closed = frame.loc[frame[R.ANSWER_TYPE] == "closed", R.CANDIDATES]
        out[split] = {"closed_acc": expected_chance_accuracy(closed.tolist())}
    return out
