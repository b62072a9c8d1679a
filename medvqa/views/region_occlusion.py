"""Region occlusion: whether a model looks where the answer is. The rows with a region
(`medvqa.data.regions`) answered again with that region hidden and with an equal area
elsewhere hidden (`passes.region_occlusion`, docs/metrics.md#region-occlusion), against the
main answers, row by row (matched by split and id):

- per sample (columns of `scores.parquet`): `occluded_<where>_correct` (1/0, the traditional
  family's right/wrong) and `occluded_<where>_changed` (the normalised answer differs from
  the one given with the whole image) for `where` in region, elsewhere (NaN on rows without a
  region), and `right_without_evidence` (right with the whole image and still right with the
  region hidden);
- per split, and per value of every `evaluation.breakdown` field, over the rows with a region
  (`<split>/[<field>=<value>/]occlusion_<where>_<stat>`, each with a case-clustered bootstrap
  interval): `changed` (the share of answers that change), `acc_drop` (accuracy with the whole
  image minus accuracy with `where` hidden) and `still_right` (the share right both ways: with
  the region hidden, the "right without the evidence" rows); and `occlusion_n`, the rows.

A model that reads the region changes its answers under the region's occlusion and not under
the other; one that ignores the image changes neither. A row with a region whose answer under
either occlusion is missing makes its group's figures NaN, never a share of the others.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from medvqa.data import records as R
from medvqa.generation.passes import RegionOcclusion
from medvqa.generation.passes.region_occlusion import WHERE
from medvqa.scoring.metrics.base import breakdown_prefix, field_groups
from medvqa.scoring.metrics.traditional import binary_correct
from medvqa.statistics.bootstrap import cluster_bootstrap
from medvqa.views.base import CORRECT, JobRows, Presentation, View
from medvqa.views.reliance import PREFIX as RELIANCE_PREFIX
from medvqa.views.reliance import reliance_columns

PREFIX = "occlusion_"
RIGHT_WITHOUT_EVIDENCE = "right_without_evidence"
STATS = ("changed", "acc_drop", "still_right")


def occluded(where: str, what: str) -> str:
    """A per-sample column of the pass hiding `where` (`occluded_region_changed`)."""
    return f"occluded_{where}_{what}"


def occlusion_columns(main: pd.DataFrame, tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """`main` with the per-sample columns of each pass in `tables` (where -> its scored
    table) and `right_without_evidence` (see the module doc)."""
    columns = []
    for where, table in tables.items():
        made = reliance_columns(main, table, f"occluded_{where}")
        columns.append(made.rename(columns=lambda c: c.removeprefix(RELIANCE_PREFIX)))
    out = main.join(columns)
    under = out[occluded("region", "correct")].to_numpy(float)
    right = (binary_correct(main).to_numpy(float) == 1) & (under == 1)
    out[RIGHT_WITHOUT_EVIDENCE] = np.where(np.isnan(under), np.nan, right.astype(float))
    return out


def _mean(
    values: np.ndarray, cases: np.ndarray, bootstrap: Mapping[str, Any] | None, name: str
) -> dict[str, float]:
    """`{name: mean}`, with its case-clustered interval where `bootstrap` asks for one."""
    if bootstrap is None:
        return {name: float(values.mean()) if values.size else math.nan}
    ci = cluster_bootstrap(values, cases, **bootstrap)
    return {name: ci.point, **ci.entries(name)}


def _stats(rows: pd.DataFrame, bootstrap: Mapping[str, Any] | None) -> dict[str, float]:
    """One group's figures over its rows with a region (asked under either occlusion)."""
    asked = rows[[occluded(w, "changed") for w in WHERE]].notna().any(axis=1)
    region = rows[asked]
    out: dict[str, float] = {f"{PREFIX}n": float(len(region))}
    real = binary_correct(region).to_numpy(float)
    cases = region[R.CASE_ID].to_numpy(object)
    for where in WHERE:
        under = region[occluded(where, "correct")].to_numpy(float)
        changed = region[occluded(where, "changed")].to_numpy(float)
        names = [f"{PREFIX}{where}_{stat}" for stat in STATS]
        if region.empty or any(np.isnan(v).any() for v in (real, under, changed)):
            out.update(dict.fromkeys(names, math.nan))  # a missing answer: no share of the rest
            continue
        values = (changed, real - under, ((real == 1) & (under == 1)).astype(float))
        for name, v in zip(names, values, strict=True):
            out.update(_mean(v, cases, bootstrap, name))
    return out


def occlusion_metrics(
    scored: pd.DataFrame,
    breakdown: Sequence[str] = (),
    bootstrap: Mapping[str, Any] | None = None,
) -> dict[str, float]:
    """The figures of every split (`scored`'s `split` column), and per value of each
    `breakdown` field, keyed `<split>/[<field>=<value>/]occlusion_...` (`occlusion_columns`
    made `scored`'s columns). `bootstrap`: `cluster_bootstrap`'s options, None for none."""
    out: dict[str, float] = {}
    for split, rows in scored.groupby(R.SPLIT, sort=True):
        out.update({f"{split}/{k}": v for k, v in _stats(rows, bootstrap).items()})
        for field in breakdown:
            for value, group in field_groups(rows, field):
                prefix = f"{split}/{breakdown_prefix(field, value)}"
                out.update({f"{prefix}{k}": v for k, v in _stats(group, bootstrap).items()})
    return out


class RegionOcclusionView(View):
    name = "region occlusion"
    title = "Region occlusion"
    order = 15
    columns = CORRECT
    presentation = Presentation(
        r"^(?P<split>SPLIT)/occlusion_(?P<what>region|elsewhere)_"
        r"(?P<stat>changed|acc_drop|still_right)$",
        {"changed": "changed", "acc_drop": "acc. drop", "still_right": "still right"},
        "The rows whose question concerns a region the dataset marks (passes.region_occlusion), "
        "answered again with that region filled (region) and with an equal area elsewhere "
        "filled the same way (elsewhere). changed: the share of answers that change; acc. "
        "drop: accuracy with the whole image minus accuracy with the area filled; still right: "
        "the share right both ways (region: right without the evidence). A model that looks "
        "where the answer is changes under region, not under elsewhere; one that ignores the "
        "image changes under neither.",
    )

    def applies(self, rows: JobRows) -> bool:
        return {p.where for p in rows.of(RegionOcclusion)} == set(WHERE)

    def apply(self, rows: JobRows) -> tuple[pd.DataFrame, dict[str, float]]:
        tables = {p.where: rows.others[p.prefix] for p in rows.of(RegionOcclusion)}
        main = occlusion_columns(rows.main, tables)
        return main, occlusion_metrics(main, list(rows.breakdown), rows.bootstrap)
