"""GPU-hours of a sweep before it runs (`task=plan` with a sweep): its jobs enumerated as Hydra's
basic sweeper would run them, the jobs that differ only in `seed` estimated once
(`cost.job_cost`), and a base pass several jobs share counted once."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from medvqa.planning.cost import Planner, describe_cost, job_cost
from medvqa.planning.job_rates import Composer
from medvqa.planning.memory import TEXT_TOKENS
from medvqa.planning.phases import JobCost, label


def sweep_jobs(hydra_cfg: DictConfig) -> list[list[str]]:
    """Every job's overrides of the sweep `hydra_cfg` describes (`hydra.sweeper.params` and the
    command line's, combined as Hydra's basic sweeper combines them for `-m`); [] without a
    grid."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    sweeper = hydra_cfg.sweeper
    params = sweeper.get("params") or {}
    if not params:
        return []
    basic = f"{BasicSweeper.__module__}.{BasicSweeper.__name__}"
    if str(sweeper.get("_target_")) != basic:
        raise ValueError(f"only Hydra's basic sweeper is enumerated, not {sweeper._target_}")
    arguments = [f"{k}={v}" for k, v in params.items()] + list(hydra_cfg.overrides.task)
    overrides = OverridesParser.create().parse_overrides(arguments)
    return [list(job) for job in BasicSweeper.split_arguments(overrides, None)[0]]


def job_overrides(overrides: Iterable[str]) -> list[str]:
    """A `task=plan` command line's overrides without those of its task: the job it plans."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    return [
        str(o.input_line)
        for o in parsed
        if o.key_or_group != "task" and not o.key_or_group.startswith("task.")
    ]


@dataclass(frozen=True)
class Group:
    """Jobs of a sweep that differ only in their seed: the same rows, the same estimate."""

    overrides: tuple[str, ...]  # the values of the grid's varying keys
    jobs: int
    cost: JobCost


@dataclass(frozen=True)
class SweepCost:
    """A sweep's jobs, grouped, and the GPU-seconds its jobs share (the base's cached answers,
    counted once per key)."""

    groups: tuple[Group, ...]
    shared_s: float = 0.0

    @property
    def jobs(self) -> int:
        return sum(g.jobs for g in self.groups)

    @property
    def without_estimate(self) -> int:
        return sum(g.jobs for g in self.groups if g.cost.missing is not None)

    @property
    def gpu_hours(self) -> float:
        each = sum(g.jobs * g.cost.gpu_hours for g in self.groups if g.cost.missing is None)
        return each - self.shared_s / 3600

    @property
    def label(self) -> str:
        return label(m for g in self.groups for m in g.cost.measured)

    @property
    def sources(self) -> list[str]:
        """Each measured row any job's estimate used: file:line and commit."""
        return sorted({s for g in self.groups for s in g.cost.sources})


def seed_groups(jobs: Sequence[Sequence[str]]) -> dict[tuple[str, ...], list[Sequence[str]]]:
    """A sweep's jobs grouped by their overrides without `seed` (and without the task's): the
    jobs of one group have the same rows, method and settings."""
    groups: dict[tuple[str, ...], list[Sequence[str]]] = {}
    for overrides in jobs:
        key = tuple(o for o in job_overrides(overrides) if o.split("=", 1)[0] != "seed")
        groups.setdefault(key, []).append(overrides)
    return groups


def sweep_cost(
    jobs: Sequence[Sequence[str]],
    grid_keys: Iterable[str],
    compose: Composer,
    plan: Planner,
    splits: str | Path | None = None,
    text_tokens: int = TEXT_TOKENS,
) -> SweepCost:
    """The estimate of every job of a sweep (`sweep_jobs`): jobs whose overrides differ only in
    `seed` are composed and estimated once; a base pass several jobs share counts once. Each
    group is named by the values of the `grid_keys` that vary over the sweep."""
    groups = seed_groups(jobs)
    values: dict[str, set[str]] = {k: set() for k in grid_keys if k != "seed"}
    for overrides in jobs:
        for o in overrides:
            values.get(o.split("=", 1)[0], set()).add(o)
    named = {k for k, v in values.items() if len(v) > 1}  # what tells the groups apart
    out = []
    uses: dict[tuple[Any, ...], list[float]] = {}
    for key, members in groups.items():
        cost = job_cost(compose(job_overrides(members[0])), plan, compose, splits, text_tokens)
        out.append(Group(tuple(o for o in key if o.split("=", 1)[0] in named), len(members), cost))
        for phase in cost.phases if cost.missing is None else ():
            if phase.shared is not None:
                uses.setdefault(phase.shared, []).extend([phase.gpu_s] * len(members))
    return SweepCost(tuple(out), sum(sum(s) - s[0] for s in uses.values()))


def sweep_metrics(sweep: SweepCost) -> dict[str, float]:
    """The sweep's estimate as `plan/...` metrics: its GPU-hours sum the jobs that have one
    (none where no job has)."""
    metrics = {
        "plan/sweep_jobs": float(sweep.jobs),
        "plan/sweep_jobs_without_estimate": float(sweep.without_estimate),
    }
    if sweep.without_estimate < sweep.jobs:
        metrics["plan/sweep_gpu_hours"] = sweep.gpu_hours
    return metrics


def describe_sweep(sweep: SweepCost) -> dict[str, Any]:
    """The sweep's estimate, group by group (results.json's provenance)."""
    return {
        "label": sweep.label,
        "jobs": sweep.jobs,
        "without_estimate": sweep.without_estimate,
        "gpu_hours": sweep.gpu_hours,
        "shared_gpu_hours_counted_once": sweep.shared_s / 3600,
        "rows": sweep.sources,
        "groups": [
            {"overrides": list(g.overrides), "jobs": g.jobs, **describe_cost(g.cost)}
            for g in sweep.groups
        ],
    }
