"""The tidy rows of one run record: the run's row (setting, method, status, headline scores,
provenance, what the job measured of itself), and a row for each reference and pass it scored.

Everything is read from what a run logged (status, seed, Hydra's choices, the resolved config,
the flat metrics), never from directory names, so a sweep can be moved, merged or renamed.
Rows the run scored for context become rows of their own, marked by `kind`:

- `run`: the run itself;
- `reference`: the untuned base (`zero_shot/...`) and chance (`chance/...`) scored inside a
  run; the tables use them only when no run of that kind exists for the setting;
- a row per other pass the record lists (`generation.passes`, its kind names the row):
  `extra image`, evaluation with another image (`blank/...` for the blind ablation), `extra
  order`, the options reordered (`order1/...`), `extra pass` for a plug-in's;
- `delta`: the paired difference the run recorded, sighted − other image per seed
  (`delta_blank/...`: the blind Δ of docs/metrics.md), so its mean ± std is over per-seed
  differences.

A record that cannot be placed in a table becomes one `unreadable` row naming why
(`placed_rows`).
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from medvqa import plugins
from medvqa.analysis.methods import REFERENCES, method_name
from medvqa.analysis.summary import COLUMNS
from medvqa.generation.passes import CHANCE, ZERO_SHOT, recorded_passes
from medvqa.record import DISPLAY_NAMES, is_rehearsal
from medvqa.scoring.pipeline import unreliable
from medvqa.untrusted import CLASS_KEY, config_get, current_class

log = logging.getLogger(__name__)


# Dataset options that change the test questions but not their ids (RoboSurg-VQA's
# `test_wording`): a run whose value is not the dataset class's default is a condition of its
# own, `<method id> [test_wording=heldout_paraphrase]`, paired question by question with the
# run of the default (analysis.paired). Told apart by the recorded config, never by paths.
CONDITION_OPTIONS = ("test_wording",)
# Tasks that load no model: a baseline run by them is not tied to the composed peft method.
MODEL_FREE_TASKS = ("most_frequent", "chance")
# The headline keys per table column; `{closed}`/`{open}` are the run's primary scores.
HEADLINE_KEYS = dict(
    zip(
        COLUMNS,
        (
            "test_iid/{closed}",
            "test_ood/{closed}",
            "robustness/rr_closed",
            "test_iid/{open}",
            "test_ood/{open}",
            "robustness/rr_open",
        ),
        strict=True,
    )
)
ID_COLUMNS = (
    "table",
    "setting",
    "experiment",
    "dataset",
    "shift",
    "shift_kind",
    "model",
    "method",
    "method_id",
    "label",
    "peft",
    "baseline",
    "kind",
    "condition",
    "seed",
    "status",
    "rehearsal",
    "error",
    "diverged_step",
    "primary_closed",
    "primary_open",
    "started_at",
    "source",
)
# What a run's numbers depend on besides its config (results.json `provenance`), one column
# each; a table whose runs differ in one of them mixes code, versions, data or judges.
PROVENANCE_COLUMNS = ("code", "versions", "data", "model_weights", "judge")
# The status of a row standing for a record the tables cannot use (not a record, or one that
# does not say which setting, model and method it ran): listed among the report's issues,
# never a table or a cell of its own.
SKIPPED = "unreadable"


def as_number(value: Any) -> float:
    """JSON null (not measured) and non-numbers become NaN, never 0."""
    if isinstance(value, bool) or value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


@functools.cache
def _option_default(target: str, option: str) -> Any:
    """`option`'s default in the signature of the registered dataset class named `target`
    (defaults are written once, there; a record's class name is looked up in the registry,
    never imported); a sentinel matching no value where no registered dataset is that class
    (a record from other code), so every value then names a condition."""
    found = plugins.registered_class("dataset", target)
    parameter = plugins.parameters(found).get(option) if found is not None else None
    if parameter is None or parameter.default is inspect.Parameter.empty:
        return object()
    return parameter.default


def condition(config: Mapping[str, Any]) -> str | None:
    """The test condition a run's config sets (`test_wording=heldout_paraphrase`), None for
    the dataset's default questions."""
    dataset = config.get("dataset")
    if not isinstance(dataset, Mapping):
        return None
    target = str(dataset.get(CLASS_KEY) or "")
    parts = [
        f"{option}={dataset[option]}"
        for option in CONDITION_OPTIONS
        if option in dataset and dataset[option] != _option_default(target, option)
    ]
    return ", ".join(parts) or None


def _identity(record: Mapping[str, Any]) -> dict[str, Any]:
    """Setting and method of a record, from its choices with the config as fallback."""
    config = record.get("config") or {}
    choices = record.get("choices") or {}
    target = str(config_get(config, f"dataset.{CLASS_KEY}", "") or "")
    dataset = (
        choices.get("dataset")
        or config_get(config, "dataset.name")
        or (target.rsplit(".", 2)[-2] if target.count(".") >= 2 else None)
        or "?"
    )
    shift = config_get(config, "shift.name") or choices.get("shift") or "?"
    experiment = choices.get("experiment")
    setting = str(experiment) if experiment else f"{dataset}_{shift}"
    # A shift with variants under one experiment (corruption strength) keeps them apart.
    if experiment and choices.get("shift") and shift != choices.get("shift"):
        setting = f"{setting} ({shift})"
    peft = config_get(config, "peft.name") or choices.get("peft")
    baseline = choices.get("baseline")
    task = choices.get("task") or config_get(config, "task.name")
    label = config.get("label") or config_get(config, "peft.label") or peft or "?"
    if baseline and baseline != "zero_shot":
        # e.g. the blind ablation: a LoRA run that is a baseline, not the LoRA row itself.
        method_id = baseline if task in MODEL_FREE_TASKS else f"{peft}+{baseline}"
        name = config.get("label")  # the baseline's own (none: the method's, "... baseline")
    else:
        method_id = config.get("label") or peft or "?"
        name = config.get("label") or config_get(config, "peft.label")
    cond = condition(config)
    if cond:
        method_id = f"{method_id} [{cond}]"
    # A record written without an evaluation node was scored with the schema's headlines
    # (imported here, as medvqa.config registers every schema and plug-in on import).
    from medvqa.config import EvaluationSchema

    closed = config_get(config, "evaluation.primary_closed", EvaluationSchema.primary_closed)
    open_ = config_get(config, "evaluation.primary_open", EvaluationSchema.primary_open)
    return {
        "setting": setting,
        "experiment": experiment,
        "dataset": str(dataset),
        "shift": str(shift),
        "shift_kind": "corruption" if str(shift).startswith("corruption") else "realistic",
        "model": config_get(config, "model.name") or choices.get("model") or "?",
        "label": str(label),
        "name": str(name) if name else None,
        "method_id": str(method_id),
        "peft": peft,
        "baseline": baseline,
        "condition": cond,
        "primary_closed": closed,
        "primary_open": open_,
    }


def _provenance(prov: Mapping[str, Any]) -> dict[str, str | None]:
    """The record's provenance as short strings (None where the record has none)."""
    git = prov.get("git") or {}
    versions = prov.get("versions") or {}
    judges = {
        str(m["judge_id"]): ",".join(f"{k}={v}" for k, v in sorted(m.get("rubrics", {}).items()))
        for m in (prov.get("metrics") or {}).values()
        if isinstance(m, Mapping) and m.get("judge_id")
    }
    commit = git.get("commit")
    return {
        "code": f"{commit[:12]}{' (dirty)' if git.get('dirty') else ''}" if commit else None,
        "versions": ", ".join(f"{k} {v}" for k, v in versions.items() if v) or None,
        "data": config_get(prov, "data.fingerprint"),
        "model_weights": config_get(prov, "model.weights_fingerprint"),
        "judge": "; ".join(f"{j} [{r}]" for j, r in sorted(judges.items())) or None,
    }


def _headlines(metrics: Mapping[str, float], closed: str, open_: str) -> dict[str, Any]:
    """The six headline numbers, their CI half-widths, and whether each comes from a judge
    that failed its self-check (`<column> unreliable`)."""
    out: dict[str, Any] = {}
    for column, key in HEADLINE_KEYS.items():
        name = key.format(closed=closed, open=open_)
        out[column] = as_number(metrics.get(name))
        out[f"{column} ci_half"] = as_number(metrics.get(f"{name}_ci_half"))
        out[f"{column} unreliable"] = unreliable(metrics, closed if "closed" in column else open_)
    return out


# The config values a report names rows, tables and scores by: a name each (or nothing).
NAME_KEYS = (
    "label",
    "peft.name",
    "peft.label",
    "model.name",
    "shift.name",
    "dataset.name",
    "task.name",
    "evaluation.primary_closed",
    "evaluation.primary_open",
)


def unplaceable(record: Mapping[str, Any]) -> str | None:
    """Why a record cannot be placed in a table (None if it can): without its config, or
    with neither config nor choices naming the setting, model and method, it would become a
    row labelled `?_? · ?` that no reader can attribute."""
    if not record.get("config"):
        return (
            "the record has no 'config' (the resolved config every run records), so its "
            "setting, method and config variants cannot be told"
        )
    config, choices = record["config"], record.get("choices") or {}
    not_names = [f"config.{key}" for key in NAME_KEYS
                 if not isinstance(config_get(config, key), str | int | float | None)]  # fmt: skip
    not_names += [f"choices.{k}" for k, v in choices.items() if not isinstance(v, str | None)]
    if not_names:
        return f"{', '.join(not_names)} hold(s) no name (the record was edited)"
    ident = _identity(record)
    unknown = [
        name
        for name, missing in (
            ("dataset", not ident["experiment"] and ident["dataset"] == "?"),
            ("shift", not ident["experiment"] and ident["shift"] == "?"),
            ("model", ident["model"] == "?"),
            ("method", ident["method_id"].startswith("?")),
        )
        if missing
    ]
    if unknown:
        return (
            f"neither the record's 'config' nor its 'choices' name its {', '.join(unknown)}, "
            "so it cannot be placed in a table"
        )
    return None


def skipped_row(source: str, error: str, seed: Any = None) -> dict[str, Any]:
    """The row of a record the tables cannot use: the report lists it (with `error`) among
    the runs that did not finish, so a bad file is named rather than dropped unseen."""
    log.warning("%s; skipped (listed in the report's issues)", error)
    return {
        "source": source,
        "status": SKIPPED,
        "error": error,
        "seed": seed,
        "setting": "?",
        "model": "?",
        "method": "?",
        "method_id": "?",
        "label": "?",
        "kind": "run",
    }


def placed_rows(record: Mapping[str, Any], source: str) -> list[dict[str, Any]]:
    """`record_rows`, or one skipped row (with a warning naming `source`) when the record
    cannot be placed in a table."""
    why = unplaceable(record)
    if why is None:
        return record_rows(record, source)
    error = (
        f"{source}: {why}; run the job again with run.py (it records its config and Hydra's "
        "choices), or delete the file"
    )
    return [skipped_row(source, error, record.get("seed"))]


def record_rows(record: Mapping[str, Any], source: str) -> list[dict[str, Any]]:
    """The run's row, plus one row per reference or extra-image evaluation it scored."""
    ident = _identity(record)
    name = ident.pop("name")  # what the record calls the run (None: the configs' name)
    metrics = {k: as_number(v) for k, v in (record.get("metrics") or {}).items()}
    error = record.get("error")
    base = {
        **ident,
        "seed": record.get("seed"),
        "status": record.get("status", "?"),
        "error": str(error).strip().splitlines()[-1] if error else None,
        "diverged_step": record.get("diverged_step"),
        "started_at": record.get("started_at"),
        "duration_s": as_number(record.get("duration_s")),
        "source": source,
        # random weights: its scores mean nothing (the report keeps it out of real tables)
        "rehearsal": is_rehearsal(record.get("config")),
        "device": (record.get("provenance") or {}).get("device"),
        # what the job measured of itself (medvqa.measure): the report's speed table
        **{k: as_number(v) for k, v in (record.get("perf") or {}).items()},
    }
    base.update(_provenance(record.get("provenance") or {}))
    # score -> [per-sample column, answer type], for pairing scored tables (analysis.paired)
    families = (record.get("provenance") or {}).get("metrics") or {}
    base["score_columns"] = {
        k: v
        for f in families.values()
        if isinstance(f, Mapping)
        for k, v in f.get("ci_columns", {}).items()
    }
    closed, open_ = ident["primary_closed"], ident["primary_open"]
    config = record.get("config") or {}
    flat = _flatten(config)
    what = _what_of(flat)
    rows = []
    derived = _derived_rows(record, metrics, ident, name)
    taken = tuple(prefix for _, _, _, prefix in derived if prefix)
    for kind, method_id, display, prefix in derived:
        own = (
            {k[len(prefix) :]: v for k, v in metrics.items() if k.startswith(prefix)}
            if prefix
            else {k: v for k, v in metrics.items() if not k.startswith(taken)}
        )
        rows.append(
            {
                **base,
                "kind": kind,
                "method_id": method_id,
                "method": display,
                "peft": {"zero_shot/": "none", "chance/": None}.get(prefix, base["peft"]),
                "_what": what,
                "_flat": flat,  # every key, for the variant labels (`_variant_labels`)
                **_headlines(own, closed, open_),
                **own,
            }
        )
    return rows


def _derived_rows(
    record: Mapping[str, Any], metrics: Mapping[str, float], ident: Mapping[str, Any], name: Any
) -> list[tuple[str, str, str, str]]:
    """(kind, method id, display name, metric prefix) of the run's row and of a row for each
    reference and pass it scored (the passes its record lists, `generation.passes`), where the
    record holds their metrics."""
    prefixes = {f"{p.split('/')[0]}/" for p in metrics if "/" in p}
    own_id = ident["method_id"]
    derived = [("run", own_id, method_name(own_id, name), "")]
    # A reference scored under a test condition is that condition's reference, not the default's.
    cond = f" [{ident['condition']}]" if ident["condition"] else ""
    passes = recorded_passes(record, method_name(REFERENCES[ZERO_SHOT]))
    scored = {p.prefix for p in passes} | {CHANCE}  # chance is scored, never generated
    for prefix, ref_id in REFERENCES.items():
        if prefix in prefixes and prefix in scored:
            derived.append(("reference", f"{ref_id}{cond}", method_name(f"{ref_id}{cond}"), prefix))
    head, bracket, variant = own_id.partition(" [")
    run = method_name(head, name)  # a pass's row is named `<run>, <pass> [<variant>]`
    for p in passes:
        for row in p.report_rows():
            if row.prefix in prefixes:
                display = f"{row.name(run)}{bracket}{variant}"
                derived.append((row.kind, f"{own_id}@{row.key}", display, row.prefix))
    return derived


# Config keys that say how or where a job ran, not what it computed: never a variant
# (`task.references` only adds reference rows; the run's own numbers do not depend on it).
_HOW_TO_RUN = (
    "seed",
    "force",
    "ckpt_path",
    "logger.",
    "paths.",
    "callbacks.",
    "hydra.",
    "data.num_workers",
    "trainer.devices",
    "trainer.accelerator",
    "trainer.strategy",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "judge.",
    # `task=eval` of a run's weights computes what that run computed unless the config differs
    "eval.",
    "task.name",
    "task.from_run",
    "model.family",  # retired (the architecture's model_type says it); older records carry it
    *DISPLAY_NAMES,  # the report reads them, but they are not what a run computed
)


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, Mapping):
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    if prefix.endswith(f"{CLASS_KEY}.") and isinstance(node, str):
        node = current_class(node)  # a record from before a class moved is the same run
    return {prefix[:-1]: repr(node)}


def run_identity(config: Mapping[str, Any]) -> dict[str, str]:
    """The config keys that define what a run computed (paths, loggers, devices left out;
    moved classes under their current names)."""
    return _what_of(_flatten(config))


def _what_of(flat: Mapping[str, str]) -> dict[str, str]:
    """`run_identity` of an already flattened config."""
    return {
        k: v
        for k, v in flat.items()
        if not k.startswith(_HOW_TO_RUN)
        and f"{k}." not in _HOW_TO_RUN  # a group that is null (`eval: null` when training)
        and not k.rsplit(".", 1)[-1].endswith(("dir", "_path", "root"))
    }


def rehearsals(frame: pd.DataFrame) -> pd.Series:
    """Which rows are of rehearsal runs (random weights: `medvqa.record.is_rehearsal`)."""
    if "rehearsal" not in frame:
        return pd.Series(False, index=frame.index)
    return frame["rehearsal"].fillna(False).astype(bool)
