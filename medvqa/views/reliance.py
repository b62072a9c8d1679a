"""Image reliance: which answers need the image, per sample and per split.

A run with `data.extra_eval_images=[blank,shuffled,...]` answers every test question again with
the image withheld or replaced. Row by row against the answer with the real image, that says
(after LoRA fine-tuning, many correct answers survive without the image: arXiv 2603.20985):

- per sample (columns of `scores.parquet`): `reliance_<mode>_correct`, the answer under `mode`
  correct (1/0; closed questions: the traditional family's `closed_correct`, open questions its
  `open_exact_match`), and `reliance_<mode>_changed`, the normalised answer differs from the one
  given with the real image (1/0);
- per split, mode and answer type (results.json, `<split>/reliance_<mode>_<type>_<stat>`):
  `survive`, the share of the answers correct with the real image that are still correct
  under `mode` (a case-clustered bootstrap interval); `changed`, the share of answers that
  change; and the quadrant table, correct (with the real image) × image-dependent (the answer
  changes under `mode`): `correct_dependent`, `correct_independent` (right without looking),
  `wrong_dependent`, `wrong_independent`, shares of the rows that sum to 1.

A row whose counterfactual answer is missing makes its split's figures NaN (never a share of
the rows that happen to have one). The same figures per value of every `evaluation.breakdown`
field (`<split>/<field>=<value>/reliance_...`), where an image-independent subgroup shows.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from medvqa.data import records as R
from medvqa.data.answers import normalize_answer
from medvqa.scoring.metrics.base import breakdown_prefix, field_groups
from medvqa.scoring.metrics.traditional import BINARY_CORRECT, binary_correct
from medvqa.statistics.bootstrap import cluster_bootstrap

log = logging.getLogger(__name__)

# The image modes that withhold or replace the image (`image` is the real one).
COUNTERFACTUAL_MODES = ("none", "blank", "shuffled", "mismatched")
QUADRANTS = ("correct_dependent", "correct_independent", "wrong_dependent", "wrong_independent")
PREFIX = "reliance_"


def reliance_columns(real: pd.DataFrame, other: pd.DataFrame, mode: str) -> pd.DataFrame:
    """`reliance_<mode>_correct` and `reliance_<mode>_changed` for every row of `real` (the
    scored table with the real image), from `other` (the same questions scored under `mode`),
    matched by split and id; NaN where `other` has no answer for the row."""
    mine = pd.Series(range(len(other)), index=R.prediction_index(other))
    if mine.index.has_duplicates:
        raise ValueError(f"the {mode!r} predictions hold a question twice; cannot pair them")
    at = mine.reindex(R.prediction_index(real)).to_numpy()
    found = ~pd.isna(at)
    rows = at[found].astype(int)
    correct = np.full(len(real), np.nan)
    changed = np.full(len(real), np.nan)
    correct[found] = binary_correct(other).to_numpy(float)[rows]
    theirs = other[R.PREDICTION].to_numpy(object)[rows]
    ours = real[R.PREDICTION].to_numpy(object)[found]
    changed[found] = [
        float(normalize_answer(str(a)) != normalize_answer(str(b)))
        for a, b in zip(ours, theirs, strict=True)
    ]
    return pd.DataFrame(
        {f"{PREFIX}{mode}_correct": correct, f"{PREFIX}{mode}_changed": changed},
        index=real.index,
    )


def _stats(rows: pd.DataFrame, mode: str, bootstrap: Mapping[str, Any] | None) -> dict[str, float]:
    """One group's figures for `mode`, per answer type (see the module doc)."""
    out: dict[str, float] = {}
    correct_real = binary_correct(rows).to_numpy(float)
    under = rows[f"{PREFIX}{mode}_correct"].to_numpy(float)
    changed = rows[f"{PREFIX}{mode}_changed"].to_numpy(float)
    cases = rows[R.CASE_ID].to_numpy(object)
    types = rows[R.ANSWER_TYPE].to_numpy(object)
    for answer_type in BINARY_CORRECT:
        of_type = types == answer_type
        if not of_type.any():
            continue
        name = f"{PREFIX}{mode}_{answer_type}"
        missing = np.isnan(changed[of_type]).any()  # no counterfactual answer for some row
        real_t, under_t, changed_t = correct_real[of_type], under[of_type], changed[of_type]
        if missing or np.isnan(real_t).any():
            out.update({f"{name}_{s}": math.nan for s in ("survive", "changed", *QUADRANTS)})
            out[f"{name}_n_correct"] = math.nan
            continue
        survive = np.where(real_t == 1, under_t, np.nan)  # a share of the correct ones
        out[f"{name}_n_correct"] = float((real_t == 1).sum())
        for stat, values in (("survive", survive), ("changed", changed_t)):
            if bootstrap is None:
                valid = values[~np.isnan(values)]
                out[f"{name}_{stat}"] = float(valid.mean()) if valid.size else math.nan
            else:
                ci = cluster_bootstrap(values, cases[of_type], **bootstrap)
                out[f"{name}_{stat}"] = ci.point
                out.update(ci.entries(f"{name}_{stat}"))
        right, moved = real_t == 1, changed_t == 1
        for quadrant, member in zip(
            QUADRANTS, (right & moved, right & ~moved, ~right & moved, ~right & ~moved), strict=True
        ):
            out[f"{name}_{quadrant}"] = float(member.mean())
    return out


def reliance_metrics(
    scored: pd.DataFrame,
    modes: Sequence[str],
    breakdown: Sequence[str] = (),
    bootstrap: Mapping[str, Any] | None = None,
) -> dict[str, float]:
    """The figures of every split (`scored`'s `split` column) and counterfactual mode, and per
    value of each `breakdown` field, keyed `<split>/[<field>=<value>/]reliance_...`.
    `bootstrap`: `cluster_bootstrap`'s options (B, seed, level), None for no intervals."""
    out: dict[str, float] = {}
    for split, rows in scored.groupby(R.SPLIT, sort=True):
        for mode in modes:
            out.update({f"{split}/{k}": v for k, v in _stats(rows, mode, bootstrap).items()})
            for field in breakdown:
                for value, group in field_groups(rows, field):
                    stats = _stats(group, mode, bootstrap)
                    prefix = f"{split}/{breakdown_prefix(field, value)}"
                    out.update({f"{prefix}{k}": v for k, v in stats.items()})
    return out


def add_reliance(
    main: pd.DataFrame, others: Mapping[str, pd.DataFrame]
) -> tuple[pd.DataFrame, list[str]]:
    """`main` (scored with the real image) with the per-sample columns of every counterfactual
    mode in `others` (mode -> its scored table); the modes used. Other modes are left out."""
    modes = [m for m in others if m in COUNTERFACTUAL_MODES]
    columns = [reliance_columns(main, others[m], m) for m in modes]
    return (main.join(columns) if columns else main), modes
