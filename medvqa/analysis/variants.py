"""Variants: runs of one method that differ in config (a learning-rate sweep) are told apart
by a label naming the settings they differ in, as a user sets them (`mark_variants`)."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd
import yaml

from medvqa import CONF_DIR
from medvqa.analysis.rows import rehearsals
from medvqa.untrusted import CALL_KEYS, CLASS_KEY

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


def mark_variants(frame: pd.DataFrame) -> pd.DataFrame:
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
