"""Scoring with several metric families at once, broken down by any metadata field.

`metric=[traditional,judge]` selects families; each is a class with `per_sample(preds)` (score
columns for every row) and `aggregate(scored)` (flat scores over any subset of rows), built from
its YAML's `_target_`. This module joins their columns, aggregates each split and each value of
every `evaluation.breakdown` field (list-valued fields such as Kvasir's question classes count a
row once in each of its values), and collects counters such as the judge's call counts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import pandas as pd
from hydra.utils import instantiate

from medvqa import plugins
from medvqa.atomic import write_file
from medvqa.data import records as R


class Metric(Protocol):
    name: str

    def per_sample(self, preds: pd.DataFrame) -> pd.DataFrame: ...

    def aggregate(self, scored: pd.DataFrame) -> dict[str, float]: ...


def build_metrics(metric_cfg: Mapping[str, Any]) -> list[Metric]:
    """Instantiate every selected family (the `metric` node maps family name -> config)."""
    built = []
    for name, node in metric_cfg.items():
        if node is None:
            continue
        try:
            built.append(instantiate(node, _convert_="all"))
        except Exception as err:  # a typo'd option surfaces here, before any model is loaded
            raise ValueError(f"metric {name!r}: cannot build it from its config: {err}") from err
    if not built:
        raise ValueError(
            "no metric selected; use e.g. metric=traditional or metric=[traditional,judge]"
        )
    return built


def counts(frame: pd.DataFrame) -> dict[str, float]:
    return {
        "n": float(len(frame)),
        "n_open": float((frame[R.ANSWER_TYPE] == "open").sum()),
        "n_closed": float((frame[R.ANSWER_TYPE] == "closed").sum()),
    }


def _aggregate(scored: pd.DataFrame, metrics: Sequence[Metric]) -> dict[str, float]:
    out = counts(scored)
    for metric in metrics:
        out.update(metric.aggregate(scored))
    return out


def _groups(scored: pd.DataFrame, field: str):
    """(value, rows) per value of `field`; a list cell puts its row in each of its values."""
    if scored[field].map(lambda v: isinstance(v, list | tuple)).any():
        exploded = scored.assign(_value=scored[field]).explode("_value")
        for value, group in exploded.groupby("_value", dropna=False, sort=True):
            yield value, group.drop(columns="_value")
    else:
        yield from scored.groupby(field, dropna=False, sort=True)


def score_frame(
    preds: pd.DataFrame, metrics: Sequence[Metric], breakdown: Sequence[str] = ()
) -> tuple[pd.DataFrame, dict[str, float]]:
    """Per-sample scores joined to `preds`, and the split's scores (no split prefix).

    Breakdown keys are `<field>=<value>/<score>`. A score over zero rows is NaN, not 0.
    """
    scored = preds.copy()
    for metric in metrics:
        columns = metric.per_sample(preds)
        clash = [c for c in columns.columns if c in scored.columns]
        if clash:
            raise ValueError(f"metric {metric.name!r} would overwrite column(s) {clash}")
        scored = scored.join(columns)
    scores = _aggregate(scored, metrics)
    for field in breakdown:
        if field not in scored.columns:
            raise ValueError(
                f"evaluation.breakdown field {field!r} is not a column of the predictions; "
                f"available: {sorted(scored.columns)}"
            )
        for value, group in _groups(scored, field):
            for key, val in _aggregate(group, metrics).items():
                scores[f"{field}={value}/{key}"] = val
    return scored, scores


def _failing_families() -> dict[str, type]:
    """The registered families that can fail per item, by name (`MetricFamily.failures_key`)."""
    return {
        name: cls
        for name, cls in plugins.registered("metric").items()
        if getattr(cls, "failures_key", None)
    }


def failed_items(metrics: Mapping[str, float], prefix: str = "", score: str | None = None) -> int:
    """How many items of the flat `metrics` (keys starting with `prefix`) could not be scored:
    the sum of the per-split failure counts; with `score`, only those of the family the score
    belongs to (`judge_failures` for `judge_closed_acc`). Breakdown keys (`field=value/...`)
    and engine counters (`judge/failures`, which include retried calls) are not counted."""
    keys = {
        cls.failures_key for cls in _failing_families().values() if score is None or cls.owns(score)
    }
    counts = [
        float(value)
        for key, value in metrics.items()
        if key.startswith(prefix) and "=" not in key and key.rsplit("/", 1)[-1] in keys
    ]
    return int(sum(c for c in counts if not math.isnan(c)))


def unreliable(metrics: Mapping[str, float], score: str) -> bool:
    """Whether `score` comes from a judge that failed its self-check in `metrics`: the family
    `<name>` that owns the score (`MetricFamily.owns`) has `<name>/selfcheck_reliable` 0."""
    for name, cls in _failing_families().items():
        if cls.owns(score) and any(
            key.rsplit("/", 2)[-2:] == [name, "selfcheck_reliable"] and value == 0
            for key, value in metrics.items()
        ):
            return True
    return False


SCORES_FILE = "scores.parquet"  # the scored table of a run's predictions.jsonl


def scores_path(predictions: Path) -> Path:
    """Where the scored table of a predictions file goes: `predictions.jsonl` ->
    `scores.parquet`, `predictions_zero_shot.jsonl` -> `scores_zero_shot.parquet`."""
    return predictions.with_name(predictions.stem.replace("predictions", "scores", 1) + ".parquet")


def write_scores(scored: pd.DataFrame, path: Path) -> Path:
    """The scored table (every prediction with every metric's per-sample columns, the judge's
    score and reason among them) as Parquet, written atomically.

    A column Arrow cannot type as it is (mixed scalars and containers, dicts with values of
    several types) is stored as JSON text instead of failing the run at its last step.
    """
    import pyarrow as pa

    table = scored.reset_index(drop=True).copy()
    for column in table.columns:
        if table[column].dtype == object:
            try:
                pa.array(table[column], from_pandas=True)
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                table[column] = [
                    None if v is None else json.dumps(v, default=str) for v in table[column]
                ]
    return write_file(path, lambda tmp: table.to_parquet(tmp, index=False))


def counters(metrics: Sequence[Metric]) -> dict[str, float]:
    """Counters some families keep (e.g. `judge/calls`), for results.json."""
    out: dict[str, float] = {}
    for metric in metrics:
        get = getattr(metric, "counters", None)
        if callable(get):
            out.update({k: float(v) for k, v in get().items()})
    return out


def _bootstrap_options(evaluation_cfg: Any) -> dict[str, Any] | None:
    """`evaluation.bootstrap` as keyword arguments; None when it is off (`samples: 0`)."""
    boot = evaluation_cfg.bootstrap
    if not boot.samples:
        return None
    return {"B": int(boot.samples), "seed": int(boot.seed), "level": float(boot.level)}


def _ci_columns(metrics: Sequence[Metric]) -> dict[str, tuple[str, str]]:
    """Score -> (per-sample column, answer type) of every family that declares `ci_columns`."""
    columns: dict[str, tuple[str, str]] = {}
    for metric in metrics:
        get = getattr(metric, "ci_columns", None)
        if callable(get):
            columns.update(get())
    return columns


class RecordedMeans:
    """The per-sample-mean scores a run recorded (results.json `provenance.metrics.<family>.
    ci_columns`: score -> per-sample column, answer type), as a family that can only pair
    them: comparing two recorded runs needs no family built (a judge would build a backend)."""

    name = "recorded_means"

    def __init__(self, columns: Mapping[str, Sequence[str]]) -> None:
        self.columns = {score: (str(c[0]), str(c[1])) for score, c in columns.items()}

    def paired_delta(
        self, scored_a: pd.DataFrame, scored_b: pd.DataFrame, score: str, **bootstrap: Any
    ) -> Any:
        from medvqa.evaluation.families.base import mean_paired_delta

        if score not in self.columns:
            return None
        return mean_paired_delta(scored_a, scored_b, *self.columns[score], **bootstrap)


def paired_delta(
    metrics: Sequence[Any],
    scored_a: pd.DataFrame,
    scored_b: pd.DataFrame,
    score: str,
    **bootstrap: Any,
) -> Any:
    """`score` of a minus `score` of b (two scored tables of the same questions) with a paired
    interval, from the first family that can pair it (`MetricFamily.paired_delta`: a paired
    case bootstrap for per-sample means, the family's own rule otherwise); None if none can.
    Returns a `medvqa.evaluation.statistics.BootstrapCI`."""
    for metric in metrics:
        get = getattr(metric, "paired_delta", None)
        ci = get(scored_a, scored_b, score, **bootstrap) if callable(get) else None
        if ci is not None:
            return ci
    return None


def _headline_keys(evaluation_cfg: Any) -> tuple[tuple[str, str], ...]:
    return (("closed", evaluation_cfg.primary_closed), ("open", evaluation_cfg.primary_open))


def paired_delta_intervals(
    main: pd.DataFrame,
    other: pd.DataFrame,
    metrics: Sequence[Metric],
    evaluation_cfg: Any,
    prefix: str,
) -> dict[str, float]:
    """CIs of the paired differences main − other of the headline scores, per split, for two
    evaluations of the same questions (e.g. sighted vs blank images: the blind Δ), from the
    family that computes each score (:func:`paired_delta`). Keys:
    `<prefix><split>/<score>_ci_{lo,hi,half}`. A split where a side has an unscored row, or
    where no family can pair the score, gets none."""
    opts = _bootstrap_options(evaluation_cfg)
    if opts is None:
        return {}
    out: dict[str, float] = {}
    for _, key in _headline_keys(evaluation_cfg):
        for split in dict.fromkeys(main[R.SPLIT]):
            a, b = (f.loc[f[R.SPLIT] == split] for f in (main, other))
            ci = paired_delta(metrics, a, b, key, **opts)
            if ci is not None:
                out.update(ci.entries(f"{prefix}{split}/{key}"))
    return out


def headline_intervals(
    scored_by_split: Mapping[str, pd.DataFrame],
    scores_by_split: Mapping[str, Mapping[str, float]],
    metrics: Sequence[Metric],
    evaluation_cfg: Any,
    iid: str = "test_iid",
    ood: str = "test_ood",
) -> dict[str, float]:
    """Case-clustered bootstrap CIs of the headline scores, of RR and of OoD − i.i.d.

    Keys: `<split>/<score>_ci_{lo,hi,half}`, `robustness/rr_<alias>_ci_*`, and
    `robustness/diff_<alias>` (OoD − i.i.d.) with its CI; alias is closed/open. Only scores that
    are per-sample means (a family's `ci_columns()`) get one here; families with other
    aggregates report their own (e.g. `mcq_acc_ci_half`). `evaluation.bootstrap.samples: 0`
    turns this off. A split whose score is NaN (e.g. a judge that could not score every row)
    gets no interval, and nor do RR and the difference: an interval around the rows that were
    scored would describe the survivors, not the split.
    """
    from medvqa.evaluation.statistics import cluster_bootstrap, paired_bootstrap_diff, rr_ci

    opts = _bootstrap_options(evaluation_cfg)
    if opts is None:
        return {}
    columns = _ci_columns(metrics)
    out: dict[str, float] = {}
    for alias, key in _headline_keys(evaluation_cfg):
        if key not in columns:
            continue
        column, answer_type = columns[key]
        sides = {}
        for split, scored in scored_by_split.items():
            rows = scored.loc[scored[R.ANSWER_TYPE] == answer_type]
            point = scores_by_split.get(split, {}).get(key, math.nan)
            if rows[column].notna().sum() == 0 or not math.isfinite(point):
                continue
            sides[split] = (rows[column].to_numpy(float), rows[R.CASE_ID].to_numpy(object))
            out.update(cluster_bootstrap(*sides[split], **opts).entries(f"{split}/{key}"))
        if iid in sides and ood in sides:
            out.update(rr_ci(*sides[iid], *sides[ood], **opts).entries(f"robustness/rr_{alias}"))
            diff = paired_bootstrap_diff(*sides[ood], *sides[iid], paired=False, **opts)
            out[f"robustness/diff_{alias}"] = diff.point
            out.update(diff.entries(f"robustness/diff_{alias}"))
    return out
