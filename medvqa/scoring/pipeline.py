"""The one scoring pipeline: training runs, baselines and `medvqa-score` all score with it.

`metric=[traditional,judge]` selects families; each is a `MetricFamily` with `per_sample(preds)`
(score columns for every row) and `aggregate(scored)` (flat scores over any subset of rows),
built from its YAML's `_target_`. `Scoring` builds them, joins their columns, aggregates each
split and each value of every `evaluation.breakdown` field (list-valued fields such as Kvasir's
question classes count a row once in each of its values), adds relative robustness for the
scores the families declare performances, the headline intervals and the families' counters,
writes the scored table, and closes the families when it is done (also after an error).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import pandas as pd
from hydra.utils import instantiate

from medvqa import plugins
from medvqa.atomic import write_file
from medvqa.data import records as R
from medvqa.errors import ConfigError
from medvqa.scoring.metrics.base import (
    COUNT,
    MetricFamily,
    ScoreInfo,
    breakdown_prefix,
    field_groups,
    mean_paired_delta,
)
from medvqa.scoring.robustness import robustness_metrics
from medvqa.statistics.bootstrap import Bootstrap

log = logging.getLogger(__name__)

IID, OOD = R.TEST_IID, R.TEST_OOD
# The row counts the pipeline adds to every aggregate (`counts`), and what they are.
COUNTS = ("n", "n_open", "n_closed")


def build_families(metric_cfg: Mapping[str, Any]) -> list[MetricFamily]:
    """Instantiate every selected family (the `metric` node maps family name -> config)."""
    built = []
    for name, node in metric_cfg.items():
        if node is None:
            continue
        try:
            built.append(instantiate(node, _convert_="all"))
        except Exception as err:  # a typo'd option surfaces here, before any model is loaded
            refusal = _config_error(err)
            if refusal is not None:  # a family refused an option: its message, as such
                raise ConfigError(f"metric {name!r}: {refusal}") from err
            raise ValueError(f"metric {name!r}: cannot build it from its config: {err}") from err
    if not built:
        raise ValueError(
            "no metric selected; use e.g. metric=traditional or metric=[traditional,judge]"
        )
    return built


def _config_error(err: BaseException | None) -> ConfigError | None:
    """The ConfigError a family's constructor raised, from under Hydra's InstantiationException
    (`medvqa-score` reports it as a refusal, exit status 2, instead of a traceback)."""
    while err is not None and not isinstance(err, ConfigError):
        err = err.__cause__
    return err


def counts(frame: pd.DataFrame) -> dict[str, float]:
    return {
        "n": float(len(frame)),
        "n_open": float((frame[R.ANSWER_TYPE] == "open").sum()),
        "n_closed": float((frame[R.ANSWER_TYPE] == "closed").sum()),
    }


# Rows that have no answer at all (a served model that never answered them: prediction null):
# counted under this name, and every other aggregate over them is NaN.
UNANSWERED = "unanswered"


def unanswered(frame: pd.DataFrame) -> pd.Series:
    """Which rows of `frame` have no answer (a null prediction, not an empty one)."""
    if R.PREDICTION not in frame:
        return pd.Series(False, index=frame.index)
    return frame[R.PREDICTION].isna()


def _aggregate(
    scored: pd.DataFrame,
    metrics: Sequence[MetricFamily],
    owners: dict[str, MetricFamily] | None = None,
) -> dict[str, float]:
    out = counts(scored)
    for metric in metrics:
        scores = metric.aggregate(scored)
        if owners is not None:
            owners.update(dict.fromkeys(scores, metric))
        out.update(scores)
    missing = int(unanswered(scored).sum())
    if missing:  # never a score of the rows that happen to have an answer
        out = {k: v if k in COUNTS else math.nan for k, v in out.items()}
        out[UNANSWERED] = float(missing)
    return out


def score_frame(
    preds: pd.DataFrame,
    metrics: Sequence[MetricFamily],
    breakdown: Sequence[str] = (),
    owners: dict[str, MetricFamily] | None = None,
) -> tuple[pd.DataFrame, dict[str, float]]:
    """Per-sample scores joined to `preds`, and the split's scores (no split prefix).

    Breakdown keys are `<field>=<value>/<score>`. A score over zero rows is NaN, not 0.
    `owners` (if given) gets the family of every aggregate score. Rows without an answer
    (`unanswered`) are not scored (no judge is asked about them): their columns are empty, and
    every aggregate over them is NaN beside their count (`UNANSWERED`).
    """
    scored = preds.copy()
    missing = unanswered(preds)
    # With every row unanswered the families still see the rows (empty answers), so that their
    # columns exist; the aggregates are NaN all the same.
    asked = preds.loc[~missing] if not missing.all() else preds.fillna({R.PREDICTION: ""})
    for metric in metrics:
        columns = metric.per_sample(asked).reindex(preds.index)
        clash = [c for c in columns.columns if c in scored.columns]
        if clash:
            raise ValueError(f"metric {metric.name!r} would overwrite column(s) {clash}")
        scored = scored.join(columns)
    scores = _aggregate(scored, metrics, owners)
    for field in breakdown:
        if field not in scored.columns:
            raise ValueError(
                f"evaluation.breakdown field {field!r} is not a column of the predictions; "
                f"available: {sorted(scored.columns)}"
            )
        for value, group in field_groups(scored, field):
            for key, val in _aggregate(group, metrics).items():
                scores[f"{breakdown_prefix(field, value)}{key}"] = val
    return scored, scores


def _failing_families() -> dict[str, type[MetricFamily]]:
    """The registered families that can fail per item, by name (`MetricFamily.can_fail`)."""
    return {name: cls for name, cls in plugins.registered("metric").items() if cls.can_fail}


def failed_items(metrics: Mapping[str, float], prefix: str = "", score: str | None = None) -> int:
    """How many items of the flat `metrics` (keys starting with `prefix`) could not be scored:
    the sum of the per-split failure counts; with `score`, only those of the family the score
    belongs to (`judge_failures` for `judge_closed_acc`). Breakdown keys (`field=value/...`)
    and engine counters (`judge/failures`, which include retried calls) are not counted."""
    keys = {
        cls.failures_key for cls in _failing_families().values() if score is None or cls.owns(score)
    }
    keys.add(UNANSWERED)  # a row without an answer fails every score
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


def counters(metrics: Sequence[MetricFamily]) -> dict[str, float]:
    """Counters some families keep (e.g. `judge/calls`), for results.json."""
    return {k: float(v) for metric in metrics for k, v in metric.counters().items()}


def bootstrap_options(evaluation_cfg: Any) -> dict[str, Any] | None:
    """`evaluation.bootstrap` as keyword arguments; None when it is off (`samples: 0`)."""
    return Bootstrap.of(evaluation_cfg.bootstrap).options()


def ci_columns(metrics: Sequence[MetricFamily]) -> dict[str, tuple[str, str]]:
    """Score -> (per-sample column, answer type) of every family's per-sample-mean scores."""
    return {score: c for metric in metrics for score, c in metric.ci_columns().items()}


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
    Returns a `medvqa.statistics.bootstrap.BootstrapCI`."""
    for metric in metrics:
        ci = metric.paired_delta(scored_a, scored_b, score, **bootstrap)
        if ci is not None:
            return ci
    return None


def _headline_keys(evaluation_cfg: Any) -> tuple[tuple[str, str], ...]:
    return (("closed", evaluation_cfg.primary_closed), ("open", evaluation_cfg.primary_open))


def paired_delta_intervals(
    main: pd.DataFrame,
    other: pd.DataFrame,
    metrics: Sequence[MetricFamily],
    evaluation_cfg: Any,
    prefix: str,
) -> dict[str, float]:
    """CIs of the paired differences main − other of the headline scores, per split, for two
    evaluations of the same questions (e.g. sighted vs blank images: the blind Δ), from the
    family that computes each score (:func:`paired_delta`). Keys:
    `<prefix><split>/<score>_ci_{lo,hi,half}`. A split where a side has an unscored row, or
    where no family can pair the score, gets none."""
    opts = bootstrap_options(evaluation_cfg)
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
    metrics: Sequence[MetricFamily],
    evaluation_cfg: Any,
    iid: str = IID,
    ood: str = OOD,
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
    from medvqa.statistics.bootstrap import cluster_bootstrap, paired_bootstrap_diff, rr_ci

    opts = bootstrap_options(evaluation_cfg)
    if opts is None:
        return {}
    columns = ci_columns(metrics)
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


def prefixed(prefix: str, scores: Mapping[str, float]) -> dict[str, float]:
    return {f"{prefix}{k}": v for k, v in scores.items()}


def finite(metrics: Mapping[str, float]) -> dict[str, float]:
    """Drop NaN/inf (loggers reject them; results.json keeps them as null)."""
    return {
        k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)
    }


def _not_a_count(score: str) -> bool:
    return score.rsplit("/", 1)[-1] not in (*COUNTS, UNANSWERED)


def split_metrics(
    scores_by_split: Mapping[str, Mapping[str, float]],
    evaluation_cfg: Any,
    is_performance: Callable[[str], bool] = _not_a_count,
) -> dict[str, float]:
    """`split/metric` names plus `robustness/rr_*` for the performances (`is_performance`,
    by default every score but the row counts) when both test splits are present."""
    metrics: dict[str, float] = {}
    for split, scores in scores_by_split.items():
        metrics.update(prefixed(f"{split}/", scores))
    if IID in scores_by_split and OOD in scores_by_split:
        iid, ood = scores_by_split[IID], scores_by_split[OOD]
        keys = [k for k in iid if "/" not in k and is_performance(k)]
        primary = {
            name: key
            for name, key in (
                ("closed", evaluation_cfg.primary_closed),
                ("open", evaluation_cfg.primary_open),
            )
            if key in iid and key in ood
        }
        metrics.update(prefixed("robustness/", robustness_metrics(iid, ood, keys, primary)))
    return metrics


class Scoring:
    """The selected metric families and how a run's predictions are scored with them.

    Use it as a context manager: the families are closed (`MetricFamily.close`) when the block
    ends, also after an error. Build it with `from_config` first thing in a task, so a bad
    metric option fails before any data or model is loaded.
    """

    def __init__(self, families: Sequence[MetricFamily], evaluation_cfg: Any) -> None:
        self.families = list(families)
        self.evaluation = evaluation_cfg
        self._owners: dict[str, MetricFamily] = {}
        self._extra: dict[str, ScoreInfo] = {}
        self._closed = False

    @classmethod
    def from_config(cls, metric_cfg: Mapping[str, Any], evaluation_cfg: Any) -> Scoring:
        """The families the `metric` node selects, scored as `evaluation` says."""
        return cls(build_families(metric_cfg), evaluation_cfg)

    def __enter__(self) -> Scoring:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close every family once; one that fails to close does not keep the others open."""
        if self._closed:
            return
        self._closed = True
        for family in self.families:
            try:
                family.close()
            except Exception:
                log.exception("metric %s: closing it failed", family.name)

    def follow_selected_headline(self) -> dict[str, str]:
        """Where `evaluation.primary_<type>` is no score of the selected families (the default
        `closed_acc` under `metric=[mcq]`), make it the first selected family's headline score
        of that answer type (`mcq_acc`), in the evaluation node itself, so the record, the
        summary and RR show what was selected; return the changes. A key some family computes
        (its headline or a per-sample mean: `open_bleu1`) stays as set."""
        known = {key for f in self.families for key in (*f.headline().values(), *f.ci_columns())}
        changed = {}
        for kind in ("closed", "open"):
            key = f"primary_{kind}"
            offered = [f.headline()[kind] for f in self.families if kind in f.headline()]
            if self.evaluation[key] not in known and offered:
                log.info(
                    "evaluation.%s=%s is no score of the selected metric families: the "
                    "headline %s score is %s",
                    key,
                    self.evaluation[key],
                    kind,
                    offered[0],
                )
                self.evaluation[key] = changed[key] = offered[0]
        return changed

    def headline_scores(self) -> list[str]:
        """The scores a summary shows: the primary closed and open ones, then each selected
        family's headline (in `metric`'s order), once each."""
        keys = [str(self.evaluation.primary_closed), str(self.evaluation.primary_open)]
        keys += [key for f in self.families for key in f.headline().values()]
        return list(dict.fromkeys(keys))

    def score_info(self, score: str) -> ScoreInfo:
        """What `score` (a split's aggregate, `field=value/` breakdowns included) is, as the
        family that computed it declares (`MetricFamily.score_info`)."""
        base = score.rsplit("/", 1)[-1]
        if base in (*COUNTS, UNANSWERED):
            return COUNT
        if base in self._extra:
            return self._extra[base]
        owner = self._owners.get(base)
        return owner.score_info(base) if owner is not None else ScoreInfo()

    def is_performance(self, score: str) -> bool:
        """Whether relative robustness and deltas apply to `score`."""
        return self.score_info(score).performance

    def score(
        self,
        predictions: Mapping[str, pd.DataFrame],
        out: Path | None = None,
        breakdown: Sequence[str] | None = None,
        extra: Mapping[str, Mapping[str, float]] | None = None,
        extra_info: Mapping[str, ScoreInfo] | None = None,
    ) -> tuple[dict[str, float], pd.DataFrame]:
        """Scores, RR, headline intervals and counters of every split's predictions, and the
        scored table (a `split` column; written to `out` as Parquet when given).

        `breakdown` defaults to `evaluation.breakdown`; `extra` adds per-split scores the
        caller computed (a baseline's coverage), described by `extra_info` (default: not a
        performance). Counters (e.g. `judge/calls`) are added once, after all splits.
        """
        breakdown = list(self.evaluation.breakdown if breakdown is None else breakdown)
        scores: dict[str, dict[str, float]] = {}
        scored_by_split: dict[str, pd.DataFrame] = {}
        for split, preds in predictions.items():
            scored, scores[split] = score_frame(preds, self.families, breakdown, self._owners)
            for key, value in (extra or {}).get(split, {}).items():
                scores[split][key] = value
                self._extra[key] = (extra_info or {}).get(key, COUNT)
            scored_by_split[split] = scored.assign(**{R.SPLIT: split})
        results = {
            **split_metrics(scores, self.evaluation, self.is_performance),
            **headline_intervals(scored_by_split, scores, self.families, self.evaluation),
            **counters(self.families),
        }
        self._warn_missing_headline(scores)
        scored = pd.concat(scored_by_split.values(), ignore_index=True)
        if out is not None:
            write_scores(scored, out)
        return results, scored

    def deltas(
        self, main: Mapping[str, float], other: Mapping[str, float], prefix: str
    ) -> dict[str, float]:
        """`prefix + key` = main - other for the per-split performances both runs have."""
        return {
            f"{prefix}{key}": main[key] - other[key]
            for key in main
            if key in other and key.split("/", 1)[0] in (IID, OOD) and self.is_performance(key)
        }

    def paired_delta_intervals(
        self, main: pd.DataFrame, other: pd.DataFrame, prefix: str
    ) -> dict[str, float]:
        """CIs of the paired differences main − other of the headline scores, per split
        (:func:`paired_delta_intervals`)."""
        return paired_delta_intervals(main, other, self.families, self.evaluation, prefix)

    def _warn_missing_headline(self, scores: Mapping[str, Mapping[str, float]]) -> None:
        for name in ("closed", "open"):
            key = self.evaluation[f"primary_{name}"]
            if not any(name in f.headline() for f in self.families):
                continue  # no selected family scores this answer type: nothing to miss
            if not any(key in split_scores for split_scores in scores.values()):
                log.warning(
                    "evaluation.primary_%s=%s is not a score of the selected metric families, "
                    "so there is no headline %s score or RR: add the family that computes it "
                    "to `metric` (e.g. judge for judge_* scores) or pick another headline "
                    "(headline=tokens).",
                    name,
                    key,
                    name,
                )
