"""`medvqa-list`: what this installation has, one line each, read from the registries and the
shipped configs themselves, so a plug-in (`MEDVQA_PLUGINS`, an entry point) or a new YAML file
appears without being listed anywhere: tasks, datasets, metric families, model families, views
and evaluation pass kinds (classes, found as a run finds them), and the config groups a run
composes (shifts, methods, models, experiments, sweeps, studies, baselines)."""

from __future__ import annotations

import argparse
import inspect
import re
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from medvqa import CONF_DIR, plugins

WIDTH = 100
# Words ending in a full stop that end no sentence ("i.i.d. test", "e.g. SLAKE", "et al. 2021").
_ABBREVIATIONS = {"e.g", "i.e", "vs", "cf", "al", "fig", "no", "approx", "etc"}
_STOP = re.compile(r"\.\s+(?=[A-Z(`'\"*])")


def _first_sentence(text: str) -> str:
    """The whole first sentence of `text`, on one line: it ends at a full stop before a
    capital, not at an abbreviation's (`i.i.d.`, `e.g.`)."""
    line = " ".join(text.split())
    for stop in _STOP.finditer(line):
        word = line[: stop.start()].rsplit(" ", 1)[-1].lower()
        if word in _ABBREVIATIONS or re.fullmatch(r"(?:[a-z]\.)+[a-z]", word):
            continue
        return line[: stop.start() + 1]
    return line


def _classes(kind: str) -> Iterator[tuple[str, str]]:
    """(name, what it is) of each registered plug-in of `kind`: the first sentence of its
    module's docstring (a plug-in is a module), else of the class's own."""
    for name, cls in sorted(plugins.registered(kind).items()):
        module = sys.modules.get(cls.__module__)
        own = cls.__doc__ and inspect.cleandoc(cls.__doc__)
        yield name, _first_sentence(inspect.getdoc(module) or own or cls.__qualname__)


def _yaml_comment(path: Path) -> str:
    """The first comment paragraph at the top of a config file (what it is, up to an
    indented example line), else its keys."""
    lines = []
    for line in path.read_text().splitlines():
        text = line.strip()
        if text.startswith("# @package"):
            continue
        if not text.startswith("#") or text.startswith("#  "):
            break
        lines.append(text.lstrip("#").strip())
    if lines:  # "... without training:" before its example reads as a sentence
        sentence = _first_sentence(" ".join(lines))
        return sentence[:-1] + "." if sentence.endswith(":") else sentence
    from omegaconf import OmegaConf

    node = OmegaConf.load(path)
    return ", ".join(f"{k}={node[k]}" for k in node if k != "defaults")  # type: ignore[union-attr]


def _group(name: str) -> Callable[[], Iterator[tuple[str, str]]]:
    def options() -> Iterator[tuple[str, str]]:
        for path in sorted((CONF_DIR / name).glob("*.yaml")):
            if not path.stem.endswith("_schema"):
                yield path.stem, _yaml_comment(path)

    return options


# What is listed, in order: kind -> (how a run picks one, where the entries come from).
KINDS: dict[str, tuple[str, Callable[[], Iterator[tuple[str, str]]]]] = {
    "tasks": ("task=<name>", _group("task")),
    "datasets": ("dataset=<name>", lambda: _classes("dataset")),
    "shifts": ("shift=<name>", _group("shift")),
    "methods": ("peft=<name>", _group("peft")),
    "models": ("model=<name>", _group("model")),
    "model families": ("a checkpoint's model_type", lambda: _classes("family")),
    "metric families": ("metric=[<name>,...]", lambda: _classes("metric")),
    "views": ("run where a job has their inputs", lambda: _classes("view")),
    "passes": ("each by its own key, e.g. data.extra_eval_images", lambda: _classes("pass")),
    "experiments": ("+experiment=<name>", _group("experiment")),
    "sweeps": ("-m sweep=<name>", _group("sweep")),
    "studies": ("study=<name>", _group("study")),
    "baselines": ("baseline=<name>", _group("baseline")),
}


def catalog(kinds: Sequence[str] = ()) -> str:
    """The listing of `kinds` (all when empty) as text."""
    out = []
    for kind in kinds or KINDS:
        how, entries = KINDS[kind]
        rows = list(entries())
        out.append(f"{kind} ({how}): {len(rows)}")
        width = max((len(name) for name, _ in rows), default=0)
        indent = " " * (width + 4)  # a long description wraps under itself, whole
        out += [
            textwrap.fill(f"  {name:<{width}}  {what}".rstrip(), WIDTH, subsequent_indent=indent)
            for name, what in rows
        ]
        out.append("")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `medvqa-list`."""
    parser = argparse.ArgumentParser(
        prog="medvqa-list",
        description="List what this installation has: tasks, datasets, shifts, methods, models, model "
        "and metric families, views, evaluation passes, experiments, sweeps, studies and "
        "baselines (plug-ins included).",
    )
    parser.add_argument("kinds", nargs="*", choices=[[], *KINDS], metavar="KIND",
                        help=f"what to list (default: everything): {', '.join(KINDS)}")  # fmt: skip
    args = parser.parse_args(argv)
    sys.stdout.write(catalog(args.kinds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
