"""Worst subgroups under shift: which values of a metadata field a model fails on
(docs/metrics.md#worst-subgroups-metricsubgroups).

A split's mean can hide a subgroup (one modality, one sex, one site) on which the model is much
worse, and a shift can move exactly that subgroup. For every metadata field (``fields``) and
every value of it in the split, this family reports the group's mean of another family's
per-sample score (``column``, default the traditional family's ``closed_correct``) with a
case-clustered interval, its gap to the rest of the split, a permutation p-value for that gap
and Benjamini-Hochberg q-values over all groups of all fields of the split.

Rows where ``column`` is NaN (open questions for ``closed_correct``) do not count anywhere. A
list-valued cell (Kvasir's question classes) puts its row in each of its values, as
``evaluation.breakdown`` does; a missing value is the group ``nan``.

Permutation test. Questions of one case are not independent, so group labels are permuted
among **blocks**, never among single rows: a block is the rows of one case inside the group or
the rows of one case outside it. For a field that is constant within each case (modality, sex,
site) the blocks are the cases, so this is the plain case-level permutation test; for a field
that varies within a case (question type), a case is split into its in-group and out-of-group
parts, each kept whole. Each permutation draws which blocks are "in the group" (as many as
observed) uniformly; p = (1 + #{|gap*| >= |gap|}) / (1 + permutations), two-sided. Draws come
from ``numpy.random.default_rng([seed, crc32(field), crc32(value)])``, so a group's p-value
does not depend on which other groups or fields are examined.

Keys (prefix ``subgroups_``, no "/": scoring uses it for splits and breakdowns), per group
``<field>=<value>`` (a "/" in a value is written "_"): ``_score`` with ``_score_ci_lo/_ci_hi/
_ci_half``, ``_gap``, ``_p``, ``_q``, ``_n``; per field ``<field>_worst_gap`` and
``<field>_groups``; per split ``significant`` (groups with q < ``alpha``) and ``tested``.
"""

from __future__ import annotations

import logging
import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from medvqa import plugins
from medvqa.data.records import CASE_ID, QUESTION_TYPE
from medvqa.scoring.metrics.base import COUNT, MetricFamily, ScoreInfo, field_groups
from medvqa.scoring.metrics.traditional import CLOSED_CORRECT
from medvqa.statistics.bootstrap import Bootstrap, BootstrapCI, cluster_bootstrap

log = logging.getLogger(__name__)

__all__ = [
    "DOCUMENTED_FIELDS",
    "SubgroupsMetric",
    "bh_q_values",
    "block_labels",
    "group_masks",
    "permutation_p",
    "permuted_block_labels",
]

# The fields examined when neither `fields` nor the dataset's declared `metadata_fields` say
# which: those of these the table has (docs/metrics.md#worst-subgroups-metricsubgroups).
DOCUMENTED_FIELDS: tuple[str, ...] = (
    "modality",
    "body_part",
    "organ",
    "image_organ",
    "location",
    QUESTION_TYPE,
    "content_type",
    "question_class",
    "complexity",
    "sex",
    "gender",
    "age_group",
    "ethnicity",
    "site",
)
# A p or q value, and the count of significant groups: not performances, lower is "more".
_LOWER = ScoreInfo(performance=False, higher_is_better=False)
# Permutation labels held in memory at once (a chunk of permutations x blocks).
_CHUNK_ELEMENTS = 1 << 22


# --------------------------------------------------------------------------------------------
# Groups
# --------------------------------------------------------------------------------------------


def group_masks(cells: pd.Series) -> list[tuple[Any, np.ndarray]]:
    """(value, boolean row mask) per value of a column, grouped as `evaluation.breakdown`
    groups them (`field_groups`)."""
    frame = pd.DataFrame({"_cell": cells.to_numpy(dtype=object)})
    out = []
    for value, group in field_groups(frame, "_cell"):
        mask = np.zeros(len(cells), dtype=bool)
        mask[group.index.to_numpy()] = True
        out.append((value, mask))
    return out


# --------------------------------------------------------------------------------------------
# Case-level permutation test
# --------------------------------------------------------------------------------------------


def block_labels(in_group: np.ndarray, cases: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Block code per row and in-group label per block: a block is the rows of one case
    inside the group, or the rows of one case outside it (see the module docstring)."""
    case_codes, _ = pd.factorize(pd.Series(cases, dtype=object), sort=False)
    codes, keys = pd.factorize(case_codes * 2 + in_group.astype(np.intp), sort=False)
    return codes, (np.asarray(keys) % 2 == 1)


def permuted_block_labels(
    labels: np.ndarray, permutations: int, rng: np.random.Generator
) -> np.ndarray:
    """`permutations` x blocks: each row a uniform shuffle of the blocks' in-group labels
    (the number of in-group blocks stays the observed one)."""
    return rng.permuted(np.tile(labels, (permutations, 1)), axis=1)


def _gap(s_in: Any, n_in: Any, s_total: float, n_total: float) -> Any:
    """Group mean minus the mean of the other rows, from sums and counts."""
    return s_in / n_in - (s_total - s_in) / (n_total - n_in)


def permutation_p(
    values: np.ndarray,
    in_group: np.ndarray,
    cases: np.ndarray,
    permutations: int,
    rng: np.random.Generator,
) -> float:
    """Two-sided p-value of mean(group) - mean(rest), group labels permuted among the blocks
    of `block_labels`: (1 + #{|gap*| >= |gap|}) / (1 + permutations).

    `values` must have no NaN; NaN when the group or the rest is empty."""
    values = np.asarray(values, dtype=float)
    in_group = np.asarray(in_group, dtype=bool)
    if not in_group.any() or in_group.all():
        return math.nan
    codes, labels = block_labels(in_group, np.asarray(cases, dtype=object))
    sums = np.bincount(codes, weights=values, minlength=len(labels))
    counts = np.bincount(codes, minlength=len(labels)).astype(float)
    s_total, n_total = float(sums.sum()), float(counts.sum())
    observed = float(_gap(sums[labels].sum(), counts[labels].sum(), s_total, n_total))
    # Equal gaps computed from other sums differ in the last bits; they count as equal.
    threshold = abs(observed) - 1e-12 * max(1.0, abs(observed))
    hits = 0
    rows = max(1, _CHUNK_ELEMENTS // len(labels))
    for start in range(0, permutations, rows):
        drawn = permuted_block_labels(labels, min(rows, permutations - start), rng)
        chosen = drawn.astype(float)
        gaps = _gap(chosen @ sums, chosen @ counts, s_total, n_total)
        hits += int(np.count_nonzero(np.abs(gaps) >= threshold))
    return (1.0 + hits) / (1.0 + permutations)


def bh_q_values(p: Sequence[float]) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (q-values) of `p`, in its order, by
    `scipy.stats.false_discovery_control(p, method="bh")`; empty for no p-value."""
    p = np.asarray(p, dtype=float)
    from scipy.stats import false_discovery_control  # here: registering the family stays quick

    return false_discovery_control(p, method="bh") if p.size else np.array([])


def _rng(seed: int, field: str, label: str) -> np.random.Generator:
    """The draws of one group: fixed by the seed, the field and the value alone."""
    return np.random.default_rng([seed, zlib.crc32(field.encode()), zlib.crc32(label.encode())])


# --------------------------------------------------------------------------------------------
# The family
# --------------------------------------------------------------------------------------------


@dataclass
class _Group:
    """One group's numbers before the q-values are known."""

    key: str
    n: int
    ci: BootstrapCI
    gap: float
    p: float


def _declared_fields(dataset: str | None) -> tuple[str, tuple[str, ...] | None]:
    """The name of the dataset class `dataset` (its `_target_`) and the metadata fields it
    declares; None for the fields when it is not a registered dataset or declares none."""
    if dataset is None:
        return "", None
    for cls in plugins.registered("dataset").values():
        if plugins.target_of(cls) == dataset:
            return cls.name, getattr(cls, "metadata_fields", None)
    log.info("subgroups: dataset %s is not a registered dataset; no declared fields", dataset)
    return dataset, None


class SubgroupsMetric(MetricFamily):
    """`metric=subgroups`: per value of each metadata field, the group's score, its gap to the
    rest of the split, a case-level permutation p-value and BH q-values (module docstring).

    It writes no per-sample column: it reads another family's (`column`) from the joined
    table, so that family must be selected too (`metric=[traditional,subgroups]`).
    """

    name = "subgroups"
    not_performance: ClassVar[Mapping[str, ScoreInfo]] = {
        "n": COUNT,
        # A signed difference: a ratio of two of them (relative robustness) means nothing.
        "gap": ScoreInfo(performance=False),
        "p": _LOWER,
        "q": _LOWER,
        "groups": COUNT,
        "tested": COUNT,
        "significant": _LOWER,
    }

    def __init__(
        self,
        fields: Sequence[str] | None = None,
        column: str = CLOSED_CORRECT,
        min_rows: int = 10,
        permutations: int = 2000,
        alpha: float = 0.05,
        max_groups: int = 50,
        dataset: str | None = None,
        cluster_field: str = CASE_ID,
        *,
        bootstrap: Bootstrap | Mapping[str, Any],
    ) -> None:
        for key, value, low in (
            ("min_rows", min_rows, 1),
            ("permutations", permutations, 1),
            ("max_groups", max_groups, 1),
        ):
            if isinstance(value, bool) or int(value) != value or value < low:
                raise ValueError(
                    f"{self.name}: {key} must be a whole number >= {low}, got {value!r} "
                    f"(metric.{self.name}.{key})."
                )
        if not 0.0 < alpha < 1.0:
            raise ValueError(
                f"{self.name}: alpha must be in (0, 1), got {alpha!r} (metric.{self.name}.alpha)."
            )
        if fields is not None and (isinstance(fields, str) or not fields):
            raise ValueError(
                f"{self.name}: fields must be a non-empty list of column names, got {fields!r}; "
                f"e.g. metric.{self.name}.fields=[modality], or null for the dataset's own."
            )
        self.column_name = column
        self.min_rows = int(min_rows)
        self.permutations = int(permutations)
        self.alpha = float(alpha)
        self.max_groups = int(max_groups)
        self._too_many: set[str] = set()  # fields already reported as too fine-grained
        self.cluster_field = cluster_field
        # conf/metric/subgroups.yaml: ${evaluation.bootstrap}, the run's one setting; its seed
        # also seeds the permutations.
        self.bootstrap = Bootstrap.of(bootstrap)
        self.dataset = dataset
        source, declared = _declared_fields(dataset) if fields is None else ("", None)
        self.fields: list[str] | None = (
            [str(f) for f in fields]
            if fields is not None
            else list(declared)
            if declared is not None
            else None
        )
        self._origin = (
            f"metric.{self.name}.fields"
            if fields is not None
            else f"the metadata_fields dataset {source!r} declares, as fields is null"
            if declared is not None
            else None
        )

    # ---- per sample ----------------------------------------------------------------------

    def per_sample(self, preds: pd.DataFrame) -> pd.DataFrame:
        """No columns of its own: the score examined is another family's (`column`)."""
        return pd.DataFrame(index=preds.index)

    # ---- aggregate -----------------------------------------------------------------------

    def _fields_of(self, scored: pd.DataFrame) -> list[str]:
        """The fields to examine, each checked to be a column of `scored`."""
        if self.fields is None:
            found = [f for f in DOCUMENTED_FIELDS if f in scored.columns]
            if not found:
                raise ValueError(
                    f"{self.name}: the table has none of the default fields "
                    f"{list(DOCUMENTED_FIELDS)}; name the metadata columns to examine with "
                    f"metric.{self.name}.fields=[...] (the table has {sorted(scored.columns)})."
                )
            return found
        missing = [f for f in self.fields if f not in scored.columns]
        if missing:
            raise ValueError(
                f"{self.name}: field(s) {missing} are not columns of the predictions (fields "
                f"from {self._origin}); set metric.{self.name}.fields to columns the table has "
                f"({sorted(scored.columns)})."
            )
        return list(self.fields)

    def _values(self, scored: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """The score per row (NaN: does not count) and the case per row."""
        if self.column_name not in scored.columns:
            raise ValueError(
                f"{self.name}: the scored table has no column {self.column_name!r} to examine; "
                f"select the family that writes it (e.g. metric=[traditional,{self.name}] for "
                f"{CLOSED_CORRECT!r}) or set metric.{self.name}.column to another family's "
                "per-sample column."
            )
        if self.cluster_field not in scored.columns:
            raise ValueError(
                f"{self.name}: the scored table has no case column {self.cluster_field!r}; "
                "rows of one case are permuted together, so give the records a case id or set "
                f"metric.{self.name}.cluster_field."
            )
        try:
            values = np.asarray(scored[self.column_name], dtype=float)
        except (TypeError, ValueError) as err:
            raise ValueError(
                f"{self.name}: column {self.column_name!r} is not numeric ({err}); set "
                f"metric.{self.name}.column to a per-sample score column."
            ) from err
        cases = scored[self.cluster_field].to_numpy(dtype=object)
        no_case = ~np.isnan(values) & pd.isna(cases)
        if no_case.any():
            raise ValueError(
                f"{self.name}: {int(no_case.sum())} scored row(s) have no {self.cluster_field!r}; "
                "fill it (e.g. with the image id) so every question belongs to a case."
            )
        return values, cases

    def aggregate(self, scored: pd.DataFrame) -> dict[str, float]:
        """The keys of the module docstring over the rows of `scored` (a split, or a
        breakdown's subset of it)."""
        values, cases = self._values(scored)
        valid = ~np.isnan(values)
        by_field: dict[str, tuple[int, list[_Group]]] = {}
        for field in self._fields_of(scored):
            masks = group_masks(scored[field])
            if len(masks) > self.max_groups:
                if field in self._too_many:  # once per field, not per split and subset
                    by_field[field] = (len(masks), [])
                    continue
                self._too_many.add(field)
                log.warning(
                    "%s: field %r has %d values (> max_groups=%d), so it is not examined; "
                    "leave fine-grained columns out of metric.%s.fields or raise max_groups",
                    self.name,
                    field,
                    len(masks),
                    self.max_groups,
                    self.name,
                )
                by_field[field] = (len(masks), [])
            else:
                by_field[field] = (len(masks), self._field(field, masks, values, cases, valid))
        tested = [g for _, groups in by_field.values() for g in groups if not math.isnan(g.p)]
        q = bh_q_values([g.p for g in tested])
        q_of = {id(g): float(v) for g, v in zip(tested, q, strict=True)}
        out: dict[str, float] = {}
        for field, (levels, groups) in by_field.items():
            for g in groups:
                out[self.column(f"{g.key}_score")] = g.ci.point
                out.update(g.ci.entries(self.column(f"{g.key}_score")))
                out[self.column(f"{g.key}_gap")] = g.gap
                out[self.column(f"{g.key}_p")] = g.p
                out[self.column(f"{g.key}_q")] = q_of.get(id(g), math.nan)
                out[self.column(f"{g.key}_n")] = float(g.n)
            gaps = [g.gap for g in groups if not math.isnan(g.gap)]
            out[self.column(f"{field}_worst_gap")] = min(gaps) if gaps else math.nan
            out[self.column(f"{field}_groups")] = float(levels)
        out[self.column("tested")] = float(len(tested))
        out[self.column("significant")] = (
            float(np.count_nonzero(q < self.alpha)) if tested else math.nan
        )
        return out

    def _field(
        self,
        field: str,
        masks: list[tuple[Any, np.ndarray]],
        values: np.ndarray,
        cases: np.ndarray,
        valid: np.ndarray,
    ) -> list[_Group]:
        """Score, interval, gap and p-value of every group of `field` (NaN for small ones)."""
        nan_ci = BootstrapCI(math.nan, math.nan, math.nan, math.nan)
        opts = self.bootstrap.options()
        found: list[_Group] = []
        taken: set[str] = set()
        for value, mask in masks:
            label = _label(value, taken)
            key = f"{field}={label}"
            members = mask & valid
            n = int(members.sum())
            if n < self.min_rows:
                found.append(_Group(key, n, nan_ci, math.nan, math.nan))
                continue
            point = float(values[members].mean())
            if opts is None:
                ci = BootstrapCI(point, math.nan, math.nan, math.nan)
            else:
                ci = cluster_bootstrap(values[members], cases[members], **opts)
            rest = valid & ~mask
            if not rest.any():  # every scored row is in the group: no rest to compare with
                found.append(_Group(key, n, ci, math.nan, math.nan))
                continue
            gap = point - float(values[rest].mean())
            p = permutation_p(
                values[valid],
                mask[valid],
                cases[valid],
                self.permutations,
                _rng(self.bootstrap.seed, field, label),
            )
            found.append(_Group(key, n, ci, gap, p))
        return found

    def provenance(self) -> dict[str, Any]:
        """The fields examined (null: those of DOCUMENTED_FIELDS the table has)."""
        return {"fields": self.fields}


def _label(value: Any, taken: set[str]) -> str:
    """The value as it appears in a key: "/" (scoring's separator) written "_", and a suffix
    where two values would read the same."""
    label = str(value).replace("/", "_")
    base, k = label, 2
    while label in taken:
        label = f"{base}~{k}"
        k += 1
    if label != base:
        log.warning(
            "subgroups: value %r is written %r (another value reads %r)", value, label, base
        )
    taken.add(label)
    return label
