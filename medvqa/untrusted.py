"""The files of a run folder as plain values: the one way a record comes in.

A run folder travels (downloaded, copied between clusters, sent by a colleague), so its
`results.json`, `splits.json` and `trained/trainable.json` are data from a stranger. Every
command that reads one (task=eval, resuming a job, medvqa-report, medvqa-select, and through
them the paired differences and judge comparisons) reads it with `read_plain_json`, which
returns plain values only, whatever key or depth a value was planted at:

- **no `_target_`.** Hydra instantiates a node that has one, so none survives: in a record's
  config each becomes `CLASS_KEY`, the class's name as a string that tells runs apart in a
  report and that nothing builds; anywhere else (provenance, metrics, splits, the manifest:
  medvqa writes none there) it is refused. What a command builds comes from the installed
  conf/ (task=eval composes the run's model and method options) or from the plug-in registry
  by name (the report's metric families), never from a record;
- **no interpolation** (`${...}`): a record holds resolved values, so one would read this
  machine's environment or config into the run. Refused, naming the key; the free-text fields
  of a failed run (`error`, `traceback`) are text, never resolved, and may quote one;
- **no `trust_remote_code`**, in any node (`model.processor_kwargs` too): it would run a
  checkpoint's code. Taken out, and its keys returned, so that task=eval can refuse to
  evaluate such a run unless the user's own command line turns remote code on.

A leaf module: the manifest's reader (`medvqa.models.saving`) needs it as much as the report.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TARGET_KEY = "_target_"
# A record's `_target_` as the reader returns it: the name of a class, which no Hydra call reads.
CLASS_KEY = "_class_"
# Hydra's keys that say how to call a `_target_`: inert without one, and never merged from a
# record into a node that has one (`medvqa.tasks.from_run`).
CALL_KEYS = ("_args_", "_partial_", "_recursive_", "_convert_")
REMOTE_CODE_KEY = "trust_remote_code"
# A run's results.json is tens of kB, its splits.json a few MB for the largest dataset: a file
# far above this is not one, and reading it would take the machine's memory.
MAX_JSON_BYTES = 256 * 2**20
# Classes that moved (old -> new module prefix): a record written before the move names the old
# one and still means the class now found at the new place.
MOVED_CLASSES = {
    "medvqa.models.builders.tiny.": "medvqa.zoo.tiny.",
    "medvqa.models.builders.smollm2.": "medvqa.zoo.smollm2.",
    "medvqa.models.builders.families.": "medvqa.zoo.families.",
    # evaluation/ split into rooms of their own (0.2.0)
    "medvqa.evaluation.families.": "medvqa.scoring.metrics.",
    "medvqa.evaluation.judge.family.": "medvqa.scoring.metrics.judged.",
    "medvqa.evaluation.judge.": "medvqa.judge.",
    "medvqa.evaluation.views.": "medvqa.views.",
}


class UntrustedDataError(ValueError):
    """A run folder's file names code or reads the environment; nothing from it was built."""


@dataclass
class Plain:
    """What `plain_values` returns: the value, what it refused, and what it took out."""

    value: Any
    problems: list[str] = field(default_factory=list)  # `key=value: why`, each refused
    remote_code: list[str] = field(default_factory=list)  # `key=value` of each trust_remote_code


def current_class(name: str) -> str:
    """A recorded class under its current name (`MOVED_CLASSES`)."""
    for old, new in MOVED_CLASSES.items():
        if name.startswith(old):
            return new + name[len(old) :]
    return name


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def plain_values(node: Any, key: str = "", classes: bool = True, text: Sequence[str] = ()) -> Plain:
    """`node` (JSON-like) as plain values: each `_target_` as `CLASS_KEY` if `classes`, else
    refused; each interpolation refused (except below the top-level keys `text`: messages);
    each `trust_remote_code` taken out. Refusals are collected, not raised (`check_plain`)."""
    out = Plain(None)

    def walk(value: Any, path: str, resolvable: bool) -> Any:
        if isinstance(value, Mapping):
            kept: dict[Any, Any] = {}
            for name, child in value.items():
                where = f"{path}.{name}" if path else str(name)
                if name == TARGET_KEY:
                    if classes and isinstance(child, str):
                        kept[CLASS_KEY] = walk(child, where, resolvable)
                    else:
                        why = "a class to build, where medvqa writes none"
                        if classes:
                            why = "not a class name"
                        out.problems.append(f"{where}={_shown(child)}: {why}")
                elif name == REMOTE_CODE_KEY:
                    if child not in (False, None):
                        out.remote_code.append(f"{where}={_shown(child)}")
                else:
                    free = not path and name in text
                    kept[name] = walk(child, where, resolvable and not free)
            return kept
        if isinstance(value, list | tuple):
            return [walk(v, f"{path}[{i}]", resolvable) for i, v in enumerate(value)]
        if resolvable and isinstance(value, str) and "${" in value:
            out.problems.append(
                f"{path}={_shown(value)}: an interpolation (a record holds resolved values)"
            )
        return value

    try:
        out.value = walk(node, key, True)
    except RecursionError:
        out.problems.append(f"{key or 'the file'}: nested too deep to be a medvqa file")
    return out


def check_plain(plain: Plain, where: str) -> Any:
    """The plain value, or `UntrustedDataError` naming `where`, each key and value, and that
    nothing from it was built."""
    if plain.problems:
        raise UntrustedDataError(
            f"{where}: names code or reads the environment, which medvqa never takes from a run "
            "folder; nothing from it was built, imported or resolved:\n"
            + "\n".join(f"  - {p}" for p in plain.problems)
            + "\nThe file was edited or written by other code. Use a run folder medvqa wrote, "
            "or compose the config yourself (conf/, the command line)."
        )
    return plain.value


def read_plain_json(
    path: Path, what: str, fix: str, config_key: str | None = None, text: Sequence[str] = ()
) -> Plain:
    """Read a run folder's JSON file as plain values (`plain_values`): classes are kept as
    names only below the top-level `config_key` (a record's config); `text`: top-level keys
    that are messages. A file too large, unreadable or naming code is a ValueError naming the
    file, what is wrong and `fix`."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise ValueError(
                f"{path}: {size} bytes, more than a medvqa {what} ever holds ({MAX_JSON_BYTES}); "
                f"{fix}"
            )
        data = json.loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise ValueError(f"{path}: not a readable {what} ({type(err).__name__}: {err})") from err
    if not isinstance(data, dict):
        plain = plain_values(data, classes=False)
    else:
        plain = Plain({})
        for name, value in data.items():
            part = plain_values({name: value}, classes=name == config_key, text=text)
            plain.value.update(part.value)
            plain.problems += part.problems
            plain.remote_code += part.remote_code
    check_plain(plain, f"{path} ({what})")
    return plain


def config_get(config: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    """The value at `dotted` (`evaluation.primary_closed`) in a recorded config, `default`
    where a node on the way is missing or no mapping (an older or edited record). A setting's
    default is its schema's (`EvaluationSchema.primary_closed`), never a literal written again:
    tests/test_defaults_guard.py reads these calls."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node
