"""Runs of one table on the same test questions: paired differences with bootstrap CIs.

Two runs of one table and seed that answered the same questions are compared far more
precisely than their two scores' own intervals suggest: the questions' difficulty cancels out.
For every such pair this reads both runs' scored tables (`scores.parquet`, next to their
`results.json`) and reports the difference of each headline score (A − B) per split, with a
paired bootstrap CI that resamples cases once for both sides. Three kinds of pair:

- `method − method`: two fine-tuning methods (A before B in the paper's order);
- `condition − default`: the same weights asked other test questions (another wording,
  `rows.CONDITION_OPTIONS`) minus the run of the dataset's default questions, as the
  RoboSurg-VQA release reports `heldout_paraphrase_vs_canonical`;
- `method − baseline`: each method minus each sanity baseline of the table (no image, image
  only, most frequent answer, ...), as the release's `image_question_vs_<baseline>`.

The difference comes from the metric family that computes the score
(`MetricFamily.paired_delta`): a paired case bootstrap of the per-sample column for a score
that is a per-row mean (from the record's `ci_columns`, with the run's `evaluation.bootstrap`
samples, seed and level; 0 samples: no number), the family's own
rule otherwise (the closed-set headline, a mean of macro-F1s, is recomputed on each resample of
sequences, with the family's own B, seed and level). Such a family is the registered plug-in
the record names (`medvqa.plugins`), built with the record's plain options: a record's class
is a name looked up in the registry, never imported nor instantiated. A pair gets no number for a split whose
question ids differ between the two runs, where either side has an item without a score (a
judge that could not score it), or where no family can pair the score.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from medvqa import plugins
from medvqa.analysis.methods import method_sort_key
from medvqa.analysis.rows import as_number
from medvqa.analysis.tables import USABLE, role
from medvqa.data import records as R
from medvqa.record import RESULTS_FILE, read_record
from medvqa.scoring.pipeline import SCORES_FILE, RecordedMeans, paired_delta
from medvqa.statistics.bootstrap import Bootstrap
from medvqa.untrusted import CALL_KEYS, CLASS_KEY, config_get

log = logging.getLogger(__name__)

COLUMNS = [
    "table",
    "seed",
    "pair",
    "method_a",
    "method_b",
    "split",
    "score",
    "n",
    "value_a",
    "value_b",
    "diff",
    "ci_lo",
    "ci_hi",
]
SPLITS = (R.TEST_IID, R.TEST_OOD)
PAIR_KINDS = ("method − method", "condition − default", "method − baseline")


@dataclass
class _Run:
    """One run of a (table, seed) group with its scored table, and the metric families that
    can pair its scores (built from its recorded config only when needed)."""

    row: pd.Series
    scored: pd.DataFrame
    _families: list[Any] | None = field(default=None, repr=False)
    _record: Mapping[str, Any] | None = field(default=None, repr=False)

    def headlines(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((self.row["primary_closed"], self.row["primary_open"])))

    def record(self) -> Mapping[str, Any]:
        if self._record is None:
            self._record = read_record(Path(str(self.row["source"])))
        return self._record

    def bootstrap(self) -> dict[str, Any] | None:
        """The run's `evaluation.bootstrap` as paired-bootstrap options (None: turned off)."""
        return recorded_bootstrap(self.record())

    def families(self) -> list[Any]:
        """The recorded per-sample-mean scores, plus the families of the recorded config
        whose scores are not means (built only if a headline needs one: building every family
        would build a judge's backend)."""
        if self._families is not None:
            return self._families
        columns = self.row.get("score_columns")
        columns = columns if isinstance(columns, Mapping) else {}
        self._families = [RecordedMeans(columns)]
        if all(score in columns for score in self.headlines()):
            return self._families
        record = self.record()
        recorded = _mapping(record, "provenance.metrics")
        nodes = {
            name: node
            for name, node in _mapping(record, "config.metric").items()
            if isinstance(node, Mapping) and "ci_columns" not in _mapping(recorded, name)
        }
        bootstrap = _mapping(record, "config.evaluation.bootstrap")
        for name, node in nodes.items():
            try:
                self._families.append(registered_family(name, node, bootstrap))
            except Exception as err:  # a record's options the family refuses: no number
                log.warning(
                    "%s: metric %r: %s; its scores that are not per-sample means get no paired "
                    "difference",
                    self.row["source"],
                    name,
                    err,
                )
        return self._families


def registered_family(name: str, node: Mapping[str, Any], bootstrap: Any) -> Any:
    """The registered metric family `name` built with a record's plain options (`node`, read by
    `medvqa.record.read_record`) and the run's bootstrap setting: the class comes from the
    registry, never from the record, and must be the one the record names."""
    family = plugins.get("metric", name)
    recorded = node.get(CLASS_KEY)
    if recorded is not None and plugins.registered_class("metric", str(recorded)) is not family:
        raise ValueError(
            f"the record names class {recorded!r}, not the registered {plugins.target_of(family)}"
        )
    options = {k: v for k, v in node.items() if k != CLASS_KEY and k not in CALL_KEYS}
    options = _with_bootstrap(family, options, bootstrap)
    unknown = sorted(set(options) - set(plugins.parameters(family)))
    if unknown:
        raise ValueError(f"options {unknown} are not the family's ({plugins.target_of(family)})")
    return plugins.constructor(family)(**options)


def recorded_bootstrap(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """A record's `evaluation.bootstrap` as bootstrap options (B, seed, level; None: off),
    the defaults for the keys it lacks."""
    recorded = _mapping(record, "config.evaluation.bootstrap")
    try:
        return Bootstrap.of({**dataclasses.asdict(Bootstrap()), **recorded}).options()
    except (TypeError, ValueError) as err:  # not numbers: an edited record
        log.warning("evaluation.bootstrap=%r is no bootstrap setting (%s): no CI", recorded, err)
        return None


def _mapping(record: Mapping[str, Any], dotted: str) -> Mapping[str, Any]:
    """The mapping at `dotted` in a record, empty where there is none (or another value)."""
    node = config_get(record, dotted, {})
    return node if isinstance(node, Mapping) else {}


def scored_table(source: str, name: str = SCORES_FILE) -> pd.DataFrame | None:
    """The scored table `name` next to a local results.json (None for W&B runs or older runs);
    `scores_zero_shot.parquet` for the zero-shot base's."""
    path = Path(source)
    if path.name != RESULTS_FILE or not (path.parent / name).is_file():
        return None
    return pd.read_parquet(path.parent / name)


def split_rows(scored: pd.DataFrame, split: str) -> pd.DataFrame:
    return scored[scored[R.SPLIT] == split] if R.SPLIT in scored else scored.iloc[0:0]


def same_questions(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Whether two runs' rows of a split are the same questions (record ids, each once)."""
    if a.empty or R.ID not in a or R.ID not in b or a[R.ID].duplicated().any():
        return False
    return set(a[R.ID]) == set(b[R.ID]) and len(a) == len(b)


def _default_of(method_id: str, cond: Any) -> str | None:
    """The id of the run of the dataset's default questions a condition's row belongs to."""
    if not isinstance(cond, str):
        return None
    return method_id.replace(f" [{cond}]", "", 1)


def run_pairs(runs: Mapping[str, _Run], order: Mapping[str, int]) -> list[tuple[str, str, str]]:
    """(kind, id A, id B) of the runs of one table and seed, in the paper's order."""
    ids = sorted(runs, key=lambda m: method_sort_key(m, order))
    roles = {m: role(runs[m].row) for m in ids}
    methods = [m for m in ids if roles[m] == "method"]
    baselines = [
        m for m in ids if roles[m] == "baseline" and not isinstance(runs[m].row["condition"], str)
    ]
    pairs = [(PAIR_KINDS[0], a, b) for a, b in itertools.combinations(methods, 2)]
    for m in ids:
        default = _default_of(m, runs[m].row["condition"])
        if default in runs:
            pairs.append((PAIR_KINDS[1], m, default))
    pairs += [(PAIR_KINDS[2], m, b) for m in methods for b in baselines]
    return pairs


def paired_differences(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (table, seed, pair of runs, split, headline score) with both scored tables
    and the same questions; see the module docstring for which pairs."""
    if frame.empty:
        return pd.DataFrame(columns=COLUMNS)
    runs = frame[(frame["kind"] == "run") & frame["status"].isin(USABLE)]
    out: list[dict[str, Any]] = []
    for (table, run_seed), group in runs.groupby(["table", "seed"], sort=True):
        order = {m: i for i, m in enumerate(dict.fromkeys(group["method_id"]))}
        loaded: dict[str, _Run] = {}
        for _, row in group.iterrows():
            scored = scored_table(str(row["source"]))
            if scored is not None:
                loaded[row["method_id"]] = _Run(row, scored)
        for kind, id_a, id_b in run_pairs(loaded, order):
            a, b = loaded[id_a], loaded[id_b]
            # The side the pair is about (the method; a condition's default run) scores it.
            reference = b if kind == PAIR_KINDS[1] else a
            for score in reference.headlines():
                if score not in a.headlines() or score not in b.headlines():
                    continue
                for split in SPLITS:
                    rows_a, rows_b = split_rows(a.scored, split), split_rows(b.scored, split)
                    if not same_questions(rows_a, rows_b):
                        continue
                    boot = reference.bootstrap()
                    if boot is None:
                        continue
                    ci = paired_delta(reference.families(), rows_a, rows_b, score, **boot)
                    if ci is None or math.isnan(ci.point):
                        continue
                    out.append(
                        {
                            "table": table,
                            "seed": run_seed,
                            "pair": kind,
                            "method_a": a.row["method"],
                            "method_b": b.row["method"],
                            "split": split,
                            "score": score,
                            "n": len(rows_a),
                            "value_a": as_number(a.row.get(f"{split}/{score}")),
                            "value_b": as_number(b.row.get(f"{split}/{score}")),
                            "diff": ci.point,
                            "ci_lo": ci.lo,
                            "ci_hi": ci.hi,
                        }
                    )
    return pd.DataFrame(out, columns=COLUMNS)


_OLD_BOOTSTRAP_KEYS = {"B": "samples", "seed": "seed", "level": "level"}


def _with_bootstrap(
    family: type, node: Mapping[str, Any], run: Mapping[str, Any]
) -> dict[str, Any]:
    """A recorded family node as the family takes it now: a family with a `bootstrap` gets the
    run's `evaluation.bootstrap`; a record from before the families shared that one setting
    names its own `B`, `seed`, `level` instead, which still decide its resamples."""
    node = dict(node)
    takes = "bootstrap" in plugins.parameters(family)
    if not takes or "bootstrap" in node:
        return node
    old = {new: node.pop(key) for key, new in _OLD_BOOTSTRAP_KEYS.items() if key in node}
    node["bootstrap"] = {**dataclasses.asdict(Bootstrap()), **run, **old}
    return node
