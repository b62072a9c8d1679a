"""Collect run records (results.json, or W&B runs) into one tidy table: one row per run.

Everything is read from what a run logged (status, seed, Hydra's choices, the resolved config,
the flat metrics), never from directory names, so a sweep can be moved, merged or renamed.
Rows the run scored for context become rows of their own, marked by `kind`:

- `run`: the run itself;
- `reference`: the untuned base (`zero_shot/...`) and chance (`chance/...`) scored inside a
  run; the tables use them only when no run of that kind exists for the setting;
- `extra image`: evaluation with another image (`blank/...` for the blind ablation);
- `delta`: the paired difference the run recorded, sighted − other image per seed
  (`delta_blank/...`: the blind Δ of docs/metrics.md), so its mean ± std is over per-seed differences.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from medvqa import CONF_DIR, plugins
from medvqa.analysis.summary import COLUMNS
from medvqa.generation.passes import CHANCE, ZERO_SHOT
from medvqa.measure import split_perf
from medvqa.record import (
    DISPLAY_NAMES,
    RESULTS_FILE,
    SUMMARY_PREFIX,
    is_rehearsal,
    read_record,
)
from medvqa.scoring.pipeline import unreliable
from medvqa.untrusted import CALL_KEYS, CLASS_KEY, check_plain, current_class, plain_values

log = logging.getLogger(__name__)

# Every row has a `method_id` that says what it *is*, stable when labels are edited: the peft
# method's name, a sanity baseline's name (`<peft>+<baseline>` for a baseline that trains a
# method), or the label the user gave the run; `@<image>` marks an evaluation with another image
# and `@delta_<image>` the paired difference; ` [<option>=<value>]` a test condition (below).
# Rows are grouped and joined on it; the `method` column is its display name, read from the
# record (`label`, `peft.label`: the `label:` of conf/peft/*.yaml and conf/baseline/*.yaml, the
# paper's row names), or from the shipped configs for a record that names none (`shipped_label`).
PEFT_METHODS = ("none", "full", "prompt_tuning", "lora", "ia3")
BASELINES = ("most_frequent", "no_image", "no_image_eval", "random", "image_only")
# The paper's row order; other methods come after these, in the order they were first seen.
METHOD_ORDER = (*PEFT_METHODS, *BASELINES)
# Metric-name prefixes of the reference rows a run scores (its evaluation passes), and the
# method each row is: the untuned base is the `none` method, chance is the random baseline.
REFERENCES = {ZERO_SHOT: "none", CHANCE: "random"}
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


def find_records(dirs: Sequence[Path | str]) -> list[Path]:
    """Every results.json under the directories (recursively), in a stable order."""
    paths: list[Path] = []
    for d in map(Path, dirs):
        if d.is_file() and d.name == RESULTS_FILE:
            paths.append(d)
        elif d.is_dir():
            paths.extend(sorted(d.rglob(RESULTS_FILE)))
        else:
            raise FileNotFoundError(
                f"{d}: no such directory; pass the run or sweep directories that hold "
                f"{RESULTS_FILE} files (e.g. logs/multiruns/<date>/<time>)"
            )
    return paths


def config_get(config: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def as_number(value: Any) -> float:
    """JSON null (not measured) and non-numbers become NaN, never 0."""
    if isinstance(value, bool) or value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


@functools.cache
def shipped_label(group: str, option: str) -> str | None:
    """The `label:` of conf/<group>/<option>.yaml (a peft method or a baseline), where the name
    is declared once; None where the file or its label is absent."""
    path = CONF_DIR / group / f"{option}.yaml"
    if not path.is_file():
        return None
    label = (yaml.safe_load(path.read_text()) or {}).get("label")
    return str(label) if label else None


def method_name(method_id: str, label: str | None = None) -> str:
    """The display name of a method id: the label the run recorded (`label`, `peft.label`),
    else (a record without one, a reference row) the label the configs ship for the method or
    baseline, else the id; extra-image and variant suffixes kept."""
    head, bracket, variant = method_id.partition(" [")
    head, _, image = head.partition("@")
    peft, _, baseline = head.partition("+")
    if baseline:
        method = shipped_label("peft", peft) or peft
        name = label or shipped_label("baseline", baseline) or f"{method} ({baseline} baseline)"
    else:
        name = label or shipped_label("peft", head) or shipped_label("baseline", head) or head
    if image.startswith("delta_"):
        name = f"{name}, Δ sighted − {image[len('delta_') :]}"
    elif image.startswith("order") and image[len("order") :].isdigit():
        name = f"{name}, options reordered ({image[len('order') :]})"
    elif image:
        name = f"{name}, {image} image"
    return f"{name}{bracket}{variant}"


def method_sort_key(method_id: str, first_seen: Mapping[str, int] | None = None) -> tuple:
    """Known methods in the paper's order, derived rows right after theirs, then the rest."""
    head = method_id.split(" [")[0].split("@")[0]
    known = head.rpartition("+")[2]
    if known in METHOD_ORDER and (known == head or known in BASELINES):
        return (0, METHOD_ORDER.index(known), method_id != head, method_id)
    return (1, (first_seen or {}).get(method_id, 0), 0, method_id)


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
    closed = config_get(config, "evaluation.primary_closed", "closed_acc")
    open_ = config_get(config, "evaluation.primary_open", "open_f1")
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
    prefixes = {f"{p.split('/')[0]}/" for p in metrics if "/" in p}
    own_id = ident["method_id"]
    derived: list[tuple[str, str, str]] = [("run", own_id, "")]
    # A reference scored under a test condition is that condition's reference, not the default's.
    cond = f" [{ident['condition']}]" if ident["condition"] else ""
    for prefix, ref_id in REFERENCES.items():
        if prefix in prefixes:
            derived.append(("reference", f"{ref_id}{cond}", prefix))
    config = record.get("config") or {}
    for mode in config_get(config, "data.extra_eval_images", []) or []:
        if f"{mode}/" in prefixes:
            derived.append(("extra image", f"{own_id}@{mode}", f"{mode}/"))
        if f"delta_{mode}/" in prefixes:
            derived.append(("delta", f"{own_id}@delta_{mode}", f"delta_{mode}/"))
    for k in range(1, int(config_get(config, "data.option_orders", 0) or 0) + 1):
        if f"order{k}/" in prefixes:  # the closed options in the k-th other order
            derived.append(("extra order", f"{own_id}@order{k}", f"order{k}/"))
    taken = tuple(prefix for _, _, prefix in derived if prefix)
    flat = _flatten(config)
    what = _what_of(flat)
    rows = []
    for kind, method_id, prefix in derived:
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
                "method": method_name(method_id, name if kind != "reference" else None),
                "peft": {"zero_shot/": "none", "chance/": None}.get(prefix, base["peft"]),
                "_what": what,
                "_flat": flat,  # every key, for the variant labels (`_variant_labels`)
                **_headlines(own, closed, open_),
                **own,
            }
        )
    return rows


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


# Keys Hydra's `instantiate` reads (which class, how to call it): set by the configs, never
# a setting anyone picks, so a variant's label never names one (the identity still counts them).
INTERNAL_KEYS = (CLASS_KEY, *CALL_KEYS)
# Where a variant's label has no value: the run's config has no such key.
ABSENT = "∅"
# How many settings a variant's display name shows (its `method_id` names them all).
SHOWN_SETTINGS = 3
_WHOLE_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")


@functools.cache
def derived_nodes() -> dict[str, str]:
    """Config paths the shipped configs set to another node by interpolation, and that node:
    `cfg: ${judge}` of conf/metric/judge.yaml makes `metric.judge.cfg` a copy of `judge`. A
    value there is the source's, so a variant label names the source: the key a user sets."""
    out: dict[str, str] = {}
    for path in sorted(CONF_DIR.rglob("*.yaml")):
        group = path.parent.relative_to(CONF_DIR).as_posix()
        if group.split("/")[0] == "hydra":  # Hydra's own settings, never in a record
            continue
        text = path.read_text()
        header = re.search(r"^#\s*@package\s+(\S+)", text, re.MULTILINE)
        package = header.group(1) if header else group.replace("/", ".")
        package = package.replace("_group_", group.replace("/", "."))
        package = "" if package == "_global_" else package.removeprefix("_global_.")
        try:
            node = yaml.safe_load(text)
        except yaml.YAMLError:
            continue
        if not isinstance(node, dict):
            continue
        node.pop("defaults", None)
        for key, value in _plain_items(node, f"{package}." if package else ""):
            match = _WHOLE_INTERPOLATION.fullmatch(value) if isinstance(value, str) else None
            if match:
                out[key] = match.group(1)
    return out


def _plain_items(node: Mapping[str, Any], prefix: str) -> Iterable[tuple[str, Any]]:
    """(dotted key, value) of every leaf of a YAML mapping."""
    for k, v in node.items():
        if isinstance(v, Mapping):
            yield from _plain_items(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def _source_key(key: str) -> str | None:
    """The key `key` is copied from by a shipped interpolation (`metric.judge.cfg.model` ->
    `judge.model`), None where it is set in its own right."""
    for derived, source in derived_nodes().items():
        if key == derived or key.startswith(f"{derived}."):
            return source + key[len(derived) :]
    return None


def _nodes(flat: Mapping[str, str]) -> set[str]:
    """Every key and node of a flattened config (`a.b.c` holds `a`, `a.b` and `a.b.c`)."""
    out: set[str] = set()
    for key in flat:
        parts = key.split(".")
        out.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    return out


def _options_group(node: str, flats: Sequence[Mapping[str, str]]) -> bool:
    """Whether `node`'s children are options of a config group picked as a list
    (`metric=[traditional,judge]` makes `metric.traditional` and `metric.judge`)."""
    children = {
        k[len(node) + 1 :].split(".")[0] for f in flats for k in f if k.startswith(f"{node}.")
    }
    folder = CONF_DIR / node.replace(".", "/")
    return bool(children) and all((folder / f"{c}.yaml").is_file() for c in children)


def _label_settings(
    keys: Iterable[str], flats: Sequence[Mapping[str, str]], nodes: Sequence[set[str]]
) -> dict[str, str]:
    """What tells runs apart, as a user would say it: {shown name: how its value is read}.

    The identity keys that differ are named by the key a user sets: an interpolated copy by its
    source (`judge.api_key_env`, not `metric.judge.cfg.api_key_env`) where the source differs,
    else by the option list that adds its node (`metric=[traditional,judge]`); a class by its
    node (`model.builder=TinyLlavaBuilder`); never Hydra's own keys (a class, `_partial_`,
    ...) nor the sub-keys of a node the user did not set. `nodes`: `_nodes` of each of `flats`."""
    shown: dict[str, str] = {}
    for key in sorted(keys):
        source = _source_key(key)
        if source and len({f.get(source) for f in flats}) > 1:
            shown[source] = "value"
            continue
        parts = key.split(".")
        lacking = next(
            (
                node
                for node in (".".join(parts[: i + 1]) for i in range(len(parts)))
                if not all(node in held for held in nodes)
            ),
            None,
        )
        parent = lacking.rpartition(".")[0] if lacking else ""
        if parent and _options_group(parent, flats):
            shown[parent] = "options"  # a metric family some runs add
        elif source and lacking:
            shown[lacking] = "node"  # a copy some runs have: not what the user set
        elif parts[-1] == CLASS_KEY and len(parts) > 1:
            shown[".".join(parts[:-1])] = "class"
        elif not any(p in INTERNAL_KEYS for p in parts):
            shown[key] = "value"
    return shown


def _short_class(target: str) -> str:
    """`medvqa.zoo.tiny.TinyLlavaBuilder` -> `TinyLlavaBuilder`, `...JudgeMetric.from_config`
    -> `JudgeMetric.from_config`: from the last capitalised name on."""
    names = target.strip("'\"").split(".")
    first = max((i for i, n in enumerate(names) if n[:1].isupper()), default=len(names) - 1)
    return ".".join(names[first:])


def _setting_value(flat: Mapping[str, str], held: set[str], name: str, how: str) -> str:
    """A run's value of one label setting (`_label_settings`); `held`: `_nodes(flat)`."""
    if how == "value":
        return flat.get(name, ABSENT)
    if how == "options":
        children = dict.fromkeys(
            k[len(name) + 1 :].split(".")[0] for k in flat if k.startswith(f"{name}.")
        )
        return f"[{','.join(children)}]"
    if name not in held:
        return ABSENT
    if how == "node" and name in flat:  # a plain value
        return flat[name]
    if how == "node" and f"{name}.name" in flat:
        return flat[f"{name}.name"].strip("'\"")
    target = flat.get(f"{name}.{CLASS_KEY}")
    return _short_class(target) if target else "{…}"


def _variant_labels(
    keys: set[str], whats: Sequence[Mapping[str, str]], flats: Sequence[Mapping[str, str]]
) -> list[list[str]]:
    """Per run, its `name=value` settings among `keys` (the identity keys its runs differ in),
    named as a user sets them (`_label_settings`). Where those names would not part the runs
    as the identity keys do (two runs that differ with one label, or one setting with two),
    the identity keys themselves are shown: a label never merges nor splits runs."""
    nodes = [_nodes(f) for f in flats]
    shown = _label_settings(keys, flats, nodes)
    labels = [
        [f"{n}={_setting_value(f, held, n, how)}" for n, how in shown.items()]
        for f, held in zip(flats, nodes, strict=True)
    ]
    ordered = sorted(keys)
    identities = [tuple(w.get(k, ABSENT) for k in ordered) for w in whats]
    pairs = set(zip(map(tuple, labels), identities, strict=True))
    if shown and len(pairs) == len({label for label, _ in pairs}) == len(set(identities)):
        return labels
    return [[f"{k}={w.get(k, ABSENT)}" for k in ordered] for w in whats]


def rehearsals(frame: pd.DataFrame) -> pd.Series:
    """Which rows are of rehearsal runs (random weights: `medvqa.record.is_rehearsal`)."""
    if "rehearsal" not in frame:
        return pd.Series(False, index=frame.index)
    return frame["rehearsal"].fillna(False).astype(bool)


def _mark_variants(frame: pd.DataFrame) -> pd.DataFrame:
    """Runs of one method that differ in config (e.g. a learning-rate sweep) are not seeds of
    one cell: the keys whose values differ between runs of the *same seed* are appended to the
    method id (all of them) and name (the first `SHOWN_SETTINGS`), named as a user sets them,
    e.g. "LoRA [peft.lr=0.0001]" or "LoRA [data.limit.train=32, metric=[traditional,judge]]"
    (`_variant_labels`). Keys that vary only with the seed (a seed-derived value) are not
    variants. Rehearsals (random weights) are no variants of real runs: they never share a
    table (`medvqa.analysis.report.keep_apart`), so a real run's label never says
    `model.random_weights=False`."""
    frame = frame.copy()
    runs = frame[frame["kind"] != "reference"]
    for _, group in runs.groupby(["setting", "model", "method_id", rehearsals(runs)], sort=False):
        keys: set[str] = set()
        for _, same_seed in group.groupby("seed", dropna=False):
            whats = [w if isinstance(w, dict) else {} for w in same_seed["_what"]]
            for k in set().union(*whats):
                if len({w.get(k) for w in whats}) > 1:
                    keys.add(k)
        if not keys:
            continue
        whats = [w if isinstance(w, dict) else {} for w in group["_what"]]
        flats = (
            [f if isinstance(f, dict) else w for f, w in zip(group["_flat"], whats, strict=True)]
            if "_flat" in group
            else whats
        )
        labels = _variant_labels(keys, whats, flats)
        for idx, parts in zip(group.index, labels, strict=True):
            tail = ", …" if len(parts) > SHOWN_SETTINGS else ""
            shown = f"{', '.join(parts[:SHOWN_SETTINGS])}{tail}"
            frame.at[idx, "method_id"] = f"{frame.at[idx, 'method_id']} [{', '.join(parts)}]"
            frame.at[idx, "method"] = f"{frame.at[idx, 'method']} [{shown}]"
    return frame


def _newest_names(frame: pd.DataFrame) -> pd.DataFrame:
    """One display name per method id: records that name a method differently (a label edited
    between sweeps, an older record) show the newest run's name (reference rows, named from the
    configs, only where no run of the method names it)."""
    if frame.empty or "started_at" not in frame:
        return frame
    ranked = frame.assign(_run=frame["kind"] != "reference").sort_values(
        ["_run", "started_at"], kind="stable", na_position="first"
    )
    newest = ranked.drop_duplicates("method_id", keep="last").set_index("method_id")["method"]
    frame = frame.copy()
    frame["method"] = frame["method_id"].map(newest).fillna(frame["method"])
    return frame


def _distinct_names(frame: pd.DataFrame) -> pd.DataFrame:
    """Two methods never share a display name (e.g. LoRA and full fine-tuning, both run as the
    no-image baseline): a name several ids map to gets the id appended."""
    ids_per_name = frame.groupby("method")["method_id"].nunique()
    shared = frame["method"].isin(ids_per_name[ids_per_name > 1].index)
    frame.loc[shared, "method"] = frame["method"] + " (" + frame["method_id"] + ")"
    return frame


def records_frame(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Rows -> DataFrame with identity columns first and a `table` key per setting (× model).

    `table` is the setting, with the model appended only when several models were run, so a
    single-model study keeps short table names.
    """
    frame = pd.DataFrame.from_records(list(rows))
    if frame.empty:
        return pd.DataFrame(columns=[*ID_COLUMNS, *COLUMNS])
    frame = _newest_names(frame)
    if "_what" in frame:
        frame = _mark_variants(frame).drop(columns=["_what", "_flat"], errors="ignore")
    frame = _distinct_names(frame)
    # Skipped records (model "?") are no model of the study.
    several_models = frame.loc[frame["status"] != SKIPPED, "model"].nunique() > 1
    frame["table"] = (
        frame["setting"] + " · " + frame["model"].astype(str)
        if several_models
        else frame["setting"]
    )
    headline = [c for col in COLUMNS for c in (col, f"{col} ci_half")]
    for col in (*ID_COLUMNS, *headline):
        if col not in frame:
            frame[col] = None if col in ID_COLUMNS else math.nan
    rest = [c for c in frame.columns if c not in ID_COLUMNS]
    return frame[[*ID_COLUMNS, *rest]]


def collect(dirs: Sequence[Path | str]) -> pd.DataFrame:
    """Tidy table of every results.json under the directories.

    A record that cannot be read (not JSON, not a JSON object, no status or metrics) or not
    placed in a table (no config) is not skipped silently: a warning names the file, and it
    becomes an `unreadable` row with the reason, which the report lists among its issues.
    """
    rows: list[dict[str, Any]] = []
    for path in find_records(dirs):
        try:
            record = read_record(path)
        except ValueError as err:
            rows.append(skipped_row(str(path), str(err)))
            continue
        rows.extend(placed_rows(record, str(path)))
    return records_frame(rows)


# --- W&B as a source ---------------------------------------------------------------------

_WANDB_STATES = {
    "finished": "finished",
    "failed": "failed",
    "crashed": "failed",
    "killed": "failed",
    "running": "running",
}


def wandb_run_record(run: Any) -> dict[str, Any]:
    """A W&B run (from `wandb.Api().runs`) as a results.json-shaped record.

    W&B keeps the resolved config and the last value of each metric, but not Hydra's choices,
    so the setting falls back to the config (dataset/shift names). A diverged or incomplete
    run ends cleanly (W&B: `finished`); the status medvqa logged to the summary
    (`medvqa/status`, with `medvqa/diverged_step`, `medvqa/failed_items`) is used instead.
    """
    config = {k: v for k, v in dict(run.config).items() if not str(k).startswith("_")}
    # A W&B run is a record too: plain values only (medvqa.untrusted), as results.json is read.
    config = check_plain(plain_values(config, "config"), f"W&B run {getattr(run, 'id', '?')}")
    summary = dict(getattr(run.summary, "_json_dict", None) or run.summary)
    numbers = {
        str(k): v
        for k, v in summary.items()
        if not str(k).startswith(("_", SUMMARY_PREFIX))
        and isinstance(v, int | float)
        and not isinstance(v, bool)
    }
    metrics, perf = split_perf(numbers)  # as results.json keeps them
    state = str(getattr(run, "state", "finished"))
    # The run's own status (diverged, incomplete) where it logged one; W&B's state otherwise.
    status = str(summary.get(f"{SUMMARY_PREFIX}status") or _WANDB_STATES.get(state, state))
    return {
        "status": status,
        "seed": config.get("seed"),
        "choices": {},
        "config": config,
        "metrics": metrics,
        "perf": perf,
        "error": None if status == "finished" else f"{status} (W&B state {state!r})",
        "diverged_step": summary.get(f"{SUMMARY_PREFIX}diverged_step"),
        "failed_items": summary.get(f"{SUMMARY_PREFIX}failed_items"),
        "started_at": getattr(run, "created_at", None),
    }


def collect_wandb(path: str, api: Any = None) -> pd.DataFrame:
    """Tidy table of the runs of a W&B project `ENTITY/PROJECT` (needs network and a key)."""
    if path.count("/") != 1:
        raise ValueError(f"--wandb {path!r}: expected ENTITY/PROJECT, e.g. my-team/medvqa")
    try:
        if api is None:
            import wandb

            api = wandb.Api(timeout=30)
        runs = list(api.runs(path))
    except Exception as err:
        raise RuntimeError(
            f"could not read W&B runs of {path!r} ({type(err).__name__}: {err}). W&B needs "
            "network access and a key (`wandb login` or WANDB_API_KEY); offline, aggregate the "
            "local results.json records instead: medvqa-report <sweep dir> --out <dir>"
        ) from err
    rows: list[dict[str, Any]] = []
    for run in runs:
        source = f"wandb:{path}/{run.id}"
        try:
            record = wandb_run_record(run)
        except ValueError as err:  # a config naming code (medvqa.untrusted): listed, not read
            rows.append(skipped_row(source, str(err)))
            continue
        rows.extend(placed_rows(record, source))
    return records_frame(rows)


def merge(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Several sources in one table (the `table` key is recomputed over all of them)."""
    frames = [f for f in frames if not f.empty]
    if not frames:
        return records_frame([])
    rows = pd.concat(frames, ignore_index=True).drop(columns=["table"]).to_dict("records")
    return records_frame(rows)
