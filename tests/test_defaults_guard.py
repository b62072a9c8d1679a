"""Every default once, over the whole package: no module under medvqa/ restates a setting's
schema default as a literal (a signature default, a `.get`/`getattr`/`OmegaConf.select`/
`config_get` default on a config node). The YAML side (a YAML value that restates a schema's or a class's
default) is tests/test_config.py's."""

from __future__ import annotations

import ast
import dataclasses
import functools
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import pytest

import medvqa

# -- every default once: a schema's value is read from it, never written out again ------------
#
# The guard reads every module under medvqa/ from its source (`ast`; nothing is imported) and
# fails on a literal (what `ast.literal_eval` reads: `32`, `-1`, `"auto"`, `None`, `(64,)`) that
# restates a setting of the config tree: a field with a default of `medvqa.config.Config` or of
# a schema under it (`data`, `model`, `model.modules`, `peft`, `trainer`, `judge`, `shift`,
# `paths`, `evaluation`, `evaluation.bootstrap`: the tree Hydra's ConfigStore types, found from
# `Config`'s fields, not listed by hand). Equal or not: a copy equal today drifts tomorrow.
#
# - A parameter's literal default, where the parameter takes a setting: the package passes it
#   one at a call (`job_passes(..., int(job.data.option_orders))`, `VQADataModule(...,
#   seed=int(cfg.seed))`), wherever the function is defined; or the parameter is named like a
#   setting of a node its module reads: the module imports or names the node's schema
#   (`DataSchema`, `JudgeConfig`, `BootstrapSchema`) or the node (`cfg.model`, `model_cfg`,
#   `x.get("trainer")`). A setting is named by its key or by a parameter some function in the
#   package defaults from it (`image_mode: str = DataSchema.eval_image` makes `image_mode` the
#   eval image). Keys such as `seed`, `device`, `cache_dir` or `batch_size` are common words: a
#   plug-in's `seed=0` in a module that reads no schema, and that no call passes a setting to,
#   is its own setting (a plug-in's schema is made from that very signature).
# - `<node>.get("key", literal)`, `getattr(<node>, "key", literal)` and
#   `OmegaConf.select(x, "<node path>.key", default=literal)`, where `<node>` names a node with
#   that key (`model_cfg`, `cfg.trainer`, `x.get("evaluation")`, a variable `trainer`) or is a
#   config the code does not place (`cfg`, `config`, `r["config"]`: any node's key). `None`
#   counts as a literal; a read without a default (`.get("key")`) or with the schema's
#   (`ModelSchema.compile_layers`) does not.
# - `config_get(x, "<node path>.key", literal)` (medvqa.analysis's reader of a recorded config,
#   by that name wherever it lives), where the path places a setting; a record's own
#   `"config.<node path>.key"` likewise. As for `OmegaConf.select`, the path names the node.

# A composed config, or a node the code does not place: `cfg.get(key, literal)` is checked
# against every node's keys.
CONFIG_NAMES = frozenset({"cfg", "config", "conf", "job"})
# The words a name for a group's node adds to the group's name (`model_cfg`, `trainer_config`).
NODE_WORDS = frozenset({"cfg", "config", "conf", "node", "spec"})
# Parameters that share a setting's name but not its meaning, or cannot read it:
# (module, function's qualified name, parameter) -> why.
NOT_THE_SETTING = {
    ("medvqa.training.datamodule", "make_loader", "num_workers"): (
        "a resolved process count (DataLoader's own default)"
    ),
    ("medvqa.scoring.pipeline", "Scoring.score", "breakdown"): (
        "None: the scoring's configured breakdown"
    ),
    ("medvqa.scoring.pipeline", "score_frame", "breakdown"): (
        "(): no breakdown; a run passes evaluation.breakdown"
    ),
    ("medvqa.planning.setup", "build_setup", "devices"): "None: the trainer config's devices",
    ("medvqa.tasks.plan", "plan", "devices"): "None: the trainer config's devices",
    ("medvqa.tasks.common", "prepare_splits", "limit"): "a switch: whether data.limit applies",
    ("medvqa.data.shifts", "make_splits", "seed"): (
        "the run's seed where a task splits (it passes cfg.seed); medvqa.config imports this "
        "module, so Config.seed cannot be read here"
    ),
    ("medvqa.training.datamodule", "VQADataModule.__init__", "seed"): (
        "the run's seed where train_eval builds it (cfg.seed); Config.seed here would import "
        "medvqa.config, and with it plug-in discovery, wherever the data module is imported"
    ),
}
PACKAGE = Path(medvqa.__file__).resolve().parent


def setting(path: str, key: str) -> str:
    """`data.eval_batch_size=64`: a key of node `path` ("" the root) and its default."""
    return f"{path}.{key}={config_tree().defaults[path, key]!r}".lstrip(".")


class Finding(NamedTuple):
    """A literal that restates `settings`, at `module:line` in `function` (its qualified name,
    `Scoring.score`; "" at module level)."""

    module: str
    line: int
    function: str
    name: str  # the parameter or the key
    text: str  # `generate(batch_size=32)`, `model_cfg.get('compile_layers', False)`
    settings: tuple[tuple[str, str], ...]  # (node path, key) of each setting it restates

    def __str__(self) -> str:
        restated = ", ".join(setting(*s) for s in self.settings)
        return f"{self.module}:{self.line} {self.text} ({restated})"


@dataclasses.dataclass(frozen=True)
class ConfigTree:
    """The typed nodes under `medvqa.config.Config` and their settings."""

    nodes: dict[str, type]  # path ("" the root) -> schema
    defaults: dict[tuple[str, str], Any]  # (path, key) -> the default
    keys: dict[str, frozenset[str]]  # key -> the paths of the nodes it has a default in
    schemas: dict[str, frozenset[str]]  # a name code reads a schema by -> the node paths
    groups: dict[str, frozenset[str]]  # a node's own name (`bootstrap`) -> its paths


@functools.cache
def config_tree() -> ConfigTree:
    """`Config`'s typed nodes, recursively, with each key that has a default: not a required
    one (`dataclasses.MISSING`, OmegaConf's `???`), a nested node (checked key by key) or
    Hydra's `_target_`. A default_factory's value is its default."""
    import typing
    from collections import defaultdict

    from omegaconf import MISSING

    import medvqa.config as config

    nodes: dict[str, type] = {}

    def walk(schema: type, path: str) -> None:
        nodes[path] = schema
        hints = typing.get_type_hints(schema)
        for field in dataclasses.fields(schema):
            kind = hints.get(field.name)
            if isinstance(kind, type) and dataclasses.is_dataclass(kind):
                walk(kind, f"{path}.{field.name}".lstrip("."))

    walk(config.Config, "")
    defaults: dict[tuple[str, str], Any] = {}
    for path, schema in nodes.items():
        for field in dataclasses.fields(schema):
            if field.default is not dataclasses.MISSING:
                value = field.default
            elif field.default_factory is not dataclasses.MISSING:
                value = field.default_factory()
            else:
                continue
            if field.name == "_target_" or dataclasses.is_dataclass(value):
                continue
            if isinstance(value, str) and value == MISSING:
                continue
            defaults[path, field.name] = value
    keys: dict[str, set[str]] = defaultdict(set)
    for path, key in defaults:
        keys[key].add(path)
    # A schema is read by its class's name, the class a generated one is made from (its doc:
    # "Config of medvqa.data.shifts.Shift."), or a name medvqa.config gives it (BootstrapSchema).
    schemas: dict[str, set[str]] = defaultdict(set)
    for path, schema in nodes.items():
        schemas[schema.__name__].add(path)
        doc = schema.__doc__ or ""
        if doc.startswith("Config of "):
            schemas[doc.removeprefix("Config of ").rstrip(".").rsplit(".", 1)[-1]].add(path)
        for name, value in vars(config).items():
            if value is schema:
                schemas[name].add(path)
    groups: dict[str, set[str]] = defaultdict(set)
    for path in nodes:
        if path:
            groups[path.rsplit(".", 1)[-1]].add(path)
    return ConfigTree(
        nodes,
        defaults,
        {k: frozenset(v) for k, v in keys.items()},
        {k: frozenset(v) for k, v in schemas.items()},
        {k: frozenset(v) for k, v in groups.items()},
    )


def _literal(node: ast.AST | None) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return node is not None


def _defaults(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[str, ast.expr]]:
    """(parameter, default) for each parameter of `function` that has a default."""
    a = function.args
    positional = a.posonlyargs + a.args
    pairs = zip(positional[len(positional) - len(a.defaults) :], a.defaults, strict=True)
    keyword = zip(a.kwonlyargs, a.kw_defaults, strict=True)
    return [(arg.arg, d) for arg, d in [*pairs, *keyword] if d is not None]


def _walk(tree: ast.AST, where: str = "") -> Iterator[tuple[ast.AST, str]]:
    """Every node under `tree` with the qualified name of the innermost def or class it is in
    (a def or class: its own, `Scoring.score`)."""
    for child in ast.iter_child_nodes(tree):
        inner = where
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            inner = f"{where}.{child.name}".lstrip(".")
        yield child, inner
        yield from _walk(child, inner)


def _key(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _named(expr: ast.AST) -> tuple[str | None, ast.AST | None]:
    """The name an expression gives what it holds, and what it took it from: `cfg.model`,
    `x["model"]`, `x.get("model")`, `getattr(x, "model")` -> ("model", x); `model_cfg` ->
    ("model_cfg", None)."""
    if isinstance(expr, ast.Name):
        return expr.id, None
    if isinstance(expr, ast.Attribute):
        return expr.attr, expr.value
    if isinstance(expr, ast.Subscript):
        return _key(expr.slice), expr.value
    if isinstance(expr, ast.Call) and expr.args:
        f = expr.func
        if isinstance(f, ast.Attribute) and f.attr == "get":
            return _key(expr.args[0]), f.value
        if isinstance(f, ast.Name) and f.id == "getattr" and len(expr.args) > 1:
            return _key(expr.args[1]), expr.args[0]
    return None, None


def nodes_named(expr: ast.AST, *, bare: bool) -> frozenset[str]:
    """The config nodes `expr` holds, as far as its name tells: every node for a config the
    code does not place (`cfg`, `r["config"]`); a group's for `model_cfg`, or `model` taken
    from a config (`cfg.model`, `cfg.get("model")`) or, where `bare`, alone (`trainer.get(..)`);
    none otherwise (`processor`, `self.model`)."""
    tree = config_tree()
    name, parent = _named(expr)
    if name is None:
        return frozenset()
    if name in CONFIG_NAMES:
        return frozenset(tree.nodes)
    group = "_".join(w for w in name.split("_") if w not in NODE_WORDS)
    if group != name or bare or (parent is not None and nodes_named(parent, bare=False)):
        return tree.groups.get(group, frozenset())
    return frozenset()


# The helper medvqa.analysis reads a recorded config with: `config_get(config, dotted, default)`.
CONFIG_GET = "config_get"


def _config_get(call: ast.Call) -> tuple[frozenset[str], str, ast.expr] | None:
    """(the nodes read, the key, the literal default) of `config_get(x, "<path>.<key>",
    default)`: the path read from a config (`evaluation.primary_closed`) or from a record
    (`config.evaluation.primary_closed`)."""
    f, args = call.func, call.args
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
    if name != CONFIG_GET or len(args) < 2:
        return None
    default = args[2] if len(args) > 2 else {k.arg: k.value for k in call.keywords}.get("default")
    dotted = _key(args[1])
    if dotted is None or not _literal(default):
        return None
    node, _, key = dotted.rpartition(".")
    nodes = {node}
    if node == "config" or node.startswith("config."):  # a record: its `config` is the root
        nodes.add(node.removeprefix("config").removeprefix("."))
    return frozenset(nodes), key, default


def _read(call: ast.Call) -> tuple[frozenset[str], str, ast.expr] | None:
    """(the nodes read, the key, the literal default) of a read with a literal default:
    `<node>.get(key, default)`, `getattr(<node>, key, default)`, `OmegaConf.select(x,
    "<path>.<key>", default=...)` or `config_get(x, "<path>.<key>", default)`."""
    f, args = call.func, call.args
    given = {k.arg: k.value for k in call.keywords}
    if (found := _config_get(call)) is not None:
        return found
    if (
        isinstance(f, ast.Attribute)
        and f.attr == "select"
        and len(args) == 2
        and "default" in given
    ):
        path = _key(args[1])
        if path is None or not _literal(given["default"]):
            return None
        node, _, key = path.rpartition(".")
        return frozenset({node}), key, given["default"]
    if isinstance(f, ast.Attribute) and f.attr == "get" and args:
        receiver, key = f.value, _key(args[0])
        default = args[1] if len(args) > 1 else given.get("default_value")
    elif isinstance(f, ast.Name) and f.id == "getattr" and len(args) == 3:
        receiver, key, default = args[0], _key(args[1]), args[2]
    else:
        return None
    if key is None or not _literal(default):
        return None
    return nodes_named(receiver, bare=True), key, default


def _aliases(tree: ast.AST) -> dict[str, set[tuple[str, str]]]:
    """Parameter -> the settings some function defaults it from (`image_mode: str =
    DataSchema.eval_image`: `image_mode` is `data.eval_image`)."""
    config = config_tree()
    found: dict[str, set[tuple[str, str]]] = {}
    for node, _ in _walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for name, default in _defaults(node):
            if isinstance(default, ast.Attribute) and isinstance(default.value, ast.Name):
                paths = config.schemas.get(default.value.id, frozenset())
                settings = {
                    (p, default.attr) for p in config.keys.get(default.attr, frozenset()) & paths
                }
                if settings:
                    found.setdefault(name, set()).update(settings)
    return found


def _reads(tree: ast.AST) -> set[str]:
    """The nodes a module reads: it imports or names their schema, or names a node of theirs
    (`cfg.model`, `model_cfg`)."""
    config = config_tree()
    paths: set[str] = set()
    for node, _ in _walk(tree):
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
        if isinstance(node, ast.alias):  # `from medvqa.models.spec import ModelSchema`
            name = node.name.rsplit(".", 1)[-1]
        paths |= config.schemas.get(name, frozenset())
        named = nodes_named(node, bare=False)
        if named != frozenset(config.nodes):
            paths |= named
    return paths


# What a setting passes through on its way to a parameter (`int(cfg.seed)`).
CONVERSIONS = frozenset({"int", "float", "str", "bool", "list", "tuple", "dict"})


def _setting_read(expr: ast.AST) -> set[tuple[str, str]]:
    """The settings `expr` reads: `cfg.data.option_orders`, `int(cfg.seed)` (the run's or, for
    all `cfg` tells, the bootstrap's), `trainer_cfg.get("devices")`."""
    while (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Name)
        and expr.func.id in CONVERSIONS
        and len(expr.args) == 1
    ):
        expr = expr.args[0]
    if isinstance(expr, ast.Attribute):
        key, paths = expr.attr, nodes_named(expr.value, bare=False)
    elif (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Attribute)
        and expr.func.attr == "get"
        and expr.args
    ):
        key, paths = _key(expr.args[0]), nodes_named(expr.func.value, bare=True)
    else:
        return set()
    return {(p, key) for p in config_tree().keys.get(key or "", frozenset()) & paths}


def _callable(where: str) -> str:
    """The name a def is called by: its own, its class's for `__init__` (`VQADataModule`)."""
    parts = where.split(".")
    return parts[-2] if parts[-1] == "__init__" and len(parts) > 1 else parts[-1]


def _signatures(tree: ast.AST) -> dict[str, list[list[str]]]:
    """Name a def is called by -> each such def's positional parameters (`self`, `cls` left
    out)."""
    found: dict[str, list[list[str]]] = {}
    for node, where in _walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            params = [a.arg for a in node.args.posonlyargs + node.args.args]
            params = params[1:] if params[:1] in (["self"], ["cls"]) else params
            found.setdefault(_callable(where), []).append(params)
    return found


def _fed(
    tree: ast.AST, signatures: Mapping[str, list[list[str]]]
) -> dict[tuple[str, str], set[tuple[str, str]]]:
    """(name a def is called by, parameter) -> the settings calls in `tree` pass that parameter
    (`job_passes(..., int(job.data.option_orders))`), for a name one def in `signatures` has."""
    found: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for node, _ in _walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name, _ = (
            _named(node.func) if isinstance(node.func, ast.Name | ast.Attribute) else (None, None)
        )
        defs = signatures.get(name or "", [])
        if len(defs) != 1:
            continue
        positional = []
        for param, value in zip(defs[0], node.args, strict=False):
            if isinstance(value, ast.Starred):
                break
            positional.append((param, value))
        keywords = [(k.arg, k.value) for k in node.keywords if k.arg is not None]
        for param, value in positional + keywords:
            settings = _setting_read(value)
            if settings:
                found.setdefault((str(name), param), set()).update(settings)
    return found


class Known(NamedTuple):
    """What the whole package tells about parameters: the settings each is defaulted from
    (`_aliases`) and those calls pass it (`_fed`)."""

    aliases: dict[str, set[tuple[str, str]]]
    fed: dict[tuple[str, str], set[tuple[str, str]]]


def scan(source: str, module: str, known: Known | None = None) -> list[Finding]:
    """Every literal in `source` that restates a setting (the rule above), NOT_THE_SETTING's
    included; `known`: the package's, beside what the source itself tells."""
    config = config_tree()
    parsed = ast.parse(source)
    aliases = {k: set(v) for k, v in (known.aliases if known else {}).items()}
    for k, v in _aliases(parsed).items():
        aliases.setdefault(k, set()).update(v)
    fed = {k: set(v) for k, v in (known.fed if known else {}).items()}
    for k, v in _fed(parsed, _signatures(parsed)).items():
        fed.setdefault(k, set()).update(v)
    reads = _reads(parsed)
    found = []
    for node, where in _walk(parsed):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for name, default in _defaults(node):
                if not _literal(default):
                    continue
                named = {(p, name) for p in config.keys.get(name, frozenset())}
                named |= aliases.get(name, set())
                settings = {s for s in named if s[0] in reads}
                settings |= fed.get((_callable(where), name), set())
                text = f"{node.name}({name}={ast.unparse(default)})"
                if settings:
                    found.append(
                        Finding(module, default.lineno, where, name, text, tuple(sorted(settings)))
                    )
        elif isinstance(node, ast.Call) and (read := _read(node)) is not None:
            paths, key, default = read
            settings = tuple((p, key) for p in sorted(config.keys.get(key, frozenset()) & paths))
            if settings:
                found.append(Finding(module, node.lineno, where, key, ast.unparse(node), settings))
    return found


def package_modules(root: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package at `root` (each .py file under it), by its dotted name."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


@functools.cache
def _package_sources(root: Path = PACKAGE) -> tuple[dict[str, str], Known]:
    """The sources of the modules under `root`, and what they tell together."""
    sources = {m: p.read_text(encoding="utf-8") for m, p in package_modules(root).items()}
    trees = [ast.parse(source) for source in sources.values()]
    known = Known({}, {})
    signatures: dict[str, list[list[str]]] = {}
    for tree in trees:
        for name, settings in _aliases(tree).items():
            known.aliases.setdefault(name, set()).update(settings)
        for name, params in _signatures(tree).items():
            signatures.setdefault(name, []).extend(params)
    for tree in trees:
        for key, settings in _fed(tree, signatures).items():
            known.fed.setdefault(key, set()).update(settings)
    return sources, known


@functools.cache
def scan_package(root: Path = PACKAGE) -> tuple[Finding, ...]:
    """`scan` over every module under `root`, with what the whole package tells (once per
    worker: two tests read it)."""
    sources, known = _package_sources(root)
    return tuple(f for module, source in sources.items() for f in scan(source, module, known))


def restated_defaults(source: str, module: str = "planted") -> list[str]:
    """`scan`'s findings in `source` (with what the package tells), as text, less
    NOT_THE_SETTING's: what the guard fails on."""
    return [
        f.text
        for f in scan(source, module, _package_sources()[1])
        if (f.module, f.function, f.name) not in NOT_THE_SETTING
    ]


@pytest.mark.heavy
def test_no_module_restates_a_schema_default() -> None:
    """Every module under medvqa/ reads a setting's default from its schema (`batch_size: int
    = DataSchema.eval_batch_size`, `model_cfg.get(key, ModelSchema.compile_layers)`) or leaves
    it to the caller: `generate_predictions` once defaulted to 32 against the schema's 64,
    `compiles_layers` read a missing `compile_layers` as False against the schema's auto."""
    found = [
        str(f) for f in scan_package() if (f.module, f.function, f.name) not in NOT_THE_SETTING
    ]
    assert not found, "schema defaults written out again (read them from the schema):\n" + (
        "\n".join(found)
    )


def test_every_exception_to_the_defaults_guard_is_still_needed() -> None:
    """A NOT_THE_SETTING entry names a literal the guard finds (one left over would excuse the
    next literal of that name there)."""
    found = {(f.module, f.function, f.name) for f in scan_package()}
    assert not set(NOT_THE_SETTING) - found, sorted(set(NOT_THE_SETTING) - found)


def test_the_defaults_guard_scans_every_module(tmp_path: Path) -> None:
    """No hand-kept list: every .py file under medvqa/ is scanned, and a module added anywhere
    (here in a copy of the package's layout) is scanned as well."""
    import os

    files = {Path(d, f) for d, _, names in os.walk(PACKAGE) for f in names if f.endswith(".py")}
    assert set(package_modules().values()) == files
    assert {"medvqa.config", "medvqa.generation.predict", "medvqa"} <= set(package_modules())
    new = tmp_path / "medvqa" / "brand_new" / "deeper"
    new.mkdir(parents=True)
    (tmp_path / "medvqa" / "__init__.py").write_text("")
    (new / "planted.py").write_text(
        "from medvqa.training.spec import DataSchema\n\n\n"
        "def generate(frame, batch_size=32, eval_batch_size=DataSchema.eval_batch_size):\n"
        "    return cfg.model.get('compile_layers', False)\n"
    )
    found = scan_package(tmp_path / "medvqa")
    assert [(f.module, f.text) for f in found] == [
        ("medvqa.brand_new.deeper.planted", "generate(batch_size=32)"),
        ("medvqa.brand_new.deeper.planted", "cfg.model.get('compile_layers', False)"),
    ]


@pytest.mark.heavy
def test_the_guard_fails_on_a_planted_signature_default() -> None:
    """A literal default of a setting's parameter is found, equal to the schema's or not, in a
    module that reads the schema (by its field's name, or a parameter the package defaults from
    it: `image_mode`); one read from the schema, none, or a module that reads no schema (a
    plug-in's own `seed=0`) is not."""
    planted = (
        "from medvqa.models.spec import ModelSchema\n"
        "from medvqa.training.spec import DataSchema\n\n\n"
        "def generate_predictions(frame, batch_size: int = 32, num_workers=None, seed=0):\n"
        "    pass\n\n\n"
        "class GenerationData:\n"
        "    def __init__(self, image_mode='image', share_image_prefix=False, option_orders=0):\n"
        "        pass\n\n\n"
        "def fine(frame, batch_size: int = DataSchema.eval_batch_size, *, train_image):\n"
        "    pass\n\n\n"
        "def also(frame, *, eval_batch_size=(64,), max_new_tokens=-16):\n"
        "    pass\n"
    )
    assert restated_defaults(planted) == [
        "generate_predictions(batch_size=32)",
        "generate_predictions(num_workers=None)",
        "__init__(image_mode='image')",
        "__init__(share_image_prefix=False)",
        "__init__(option_orders=0)",
        "also(eval_batch_size=(64,))",
        "also(max_new_tokens=-16)",
    ]
    plugin = "class Dataset:\n    def __init__(self, seed=0, batch_size=64, cache_dir=None):\n"
    assert restated_defaults(plugin + "        pass\n") == []


def test_the_guard_fails_on_a_default_of_a_parameter_the_package_passes_a_setting() -> None:
    """A parameter a call passes a setting (`cfg.trainer.devices`, by position or by name) has
    no literal default wherever its function is defined, in a module that names no schema too
    (generation/passes.py's `option_orders: int = 0` before it read DataSchema); one passed
    something else is not."""
    planted_here = (
        "def resident(strategy, accelerator, devices=1, num_nodes=1):\n"
        "    pass\n\n\n"
        "def answer_pass(endpoint, source, frames, out_path, *, mismatch_field='modality'):\n"
        "    pass\n"
    )  # tasks/train_eval.py passes them the trainer's and the data node's settings
    assert restated_defaults(planted_here) == [
        "resident(devices=1)",
        "resident(num_nodes=1)",
        "answer_pass(mismatch_field='modality')",
    ]
    planted = (
        "def split(table, fraction=0.5, seed=0):\n    pass\n\n\n"
        "def rank(table, batch=8):\n    pass\n\n\n"
        "def task(cfg, table):\n"
        "    split(table, cfg.shift.val_fraction, seed=int(cfg.seed))\n"
        "    rank(table, batch=3)\n"
    )
    assert restated_defaults(planted) == ["split(fraction=0.5)", "split(seed=0)"]


def test_the_guard_fails_on_a_planted_get() -> None:
    """`.get(key, literal)` and `OmegaConf.select(x, path, default=literal)` on a config node
    with that key are found, equal to the schema's default or not, `None` too; a read without
    a default, with the schema's, or on what is no config node, is not."""
    planted = (
        "def compiles_layers(model_cfg, cfg, trainer, r, processor):\n"
        "    model_cfg.get('compile_layers', False)\n"  # the schema's: auto
        "    model_cfg.get('liger_kernels', False)\n"  # equal
        "    cfg.get('selfcheck', True)\n"  # a `cfg` whose node is not placed: any node's key
        "    cfg.trainer.get('max_steps', -1)\n"
        "    trainer.get('devices', None)\n"
        "    r['config'].get('evaluation', {}).get('primary_closed', 'closed_acc')\n"
        "    OmegaConf.select(cfg, 'model.trust_remote_code', default=False)\n"
        "    model_cfg.get('compile_layers')\n"
        "    model_cfg.get('compile_layers', ModelSchema.compile_layers)\n"
        "    OmegaConf.select(cfg, 'judge.api_key_env')\n"
        "    processor.get('chat_template', None)\n"
        "    trainer.get('no_such_key', 1)\n"
    )
    assert restated_defaults(planted) == [
        "model_cfg.get('compile_layers', False)",
        "model_cfg.get('liger_kernels', False)",
        "cfg.get('selfcheck', True)",
        "cfg.trainer.get('max_steps', -1)",
        "trainer.get('devices', None)",
        "r['config'].get('evaluation', {}).get('primary_closed', 'closed_acc')",
        "OmegaConf.select(cfg, 'model.trust_remote_code', default=False)",
    ]


def test_the_guard_fails_on_a_planted_getattr() -> None:
    """`getattr(<node>, key, literal)` likewise; `getattr` on a schema or on what is no config
    node (a processor's chat template) is not."""
    planted = (
        "def f(model_cfg, cfg, processor):\n"
        "    getattr(model_cfg, 'compile_layers', 'auto')\n"
        "    getattr(cfg.data, 'option_orders', 0)\n"
        "    getattr(cfg.evaluation.bootstrap, 'samples', 1000)\n"
        "    getattr(processor, 'chat_template', None)\n"
        "    getattr(ModelSchema, 'compile_layers')\n"
        "    getattr(model_cfg, 'compile_layers')\n"
    )
    assert restated_defaults(planted) == [
        "getattr(model_cfg, 'compile_layers', 'auto')",
        "getattr(cfg.data, 'option_orders', 0)",
        "getattr(cfg.evaluation.bootstrap, 'samples', 1000)",
    ]


def test_the_guard_fails_on_a_planted_config_get() -> None:
    """`config_get(x, path, literal)` (analysis's reader of a recorded config) is found where
    the path places a setting, from a config or from a record's `config`, equal to the schema's
    default or not, by keyword or through a module; one without a default, with the schema's,
    a path that places no setting, or a path the code computes is not: the restatements of
    evaluation.primary_closed and primary_open in the report's run labels hid here."""
    planted = (
        "from medvqa.analysis import rows\n"
        "from medvqa.untrusted import config_get\n"
        "from medvqa.config import EvaluationSchema\n\n\n"
        "def label(config, record, dotted):\n"
        "    config_get(config, 'evaluation.primary_closed', 'closed_acc')\n"  # equal
        "    config_get(config, 'evaluation.primary_open', 'f1')\n"  # not equal
        "    config_get(record, 'config.data.option_orders', 0)\n"  # a record's config
        "    config_get(record, 'config.seed', default=None)\n"  # the root's key
        "    rows.config_get(config, 'evaluation.bootstrap.samples', 10)\n"
        "    config_get(config, 'evaluation.primary_open')\n"
        "    config_get(config, 'evaluation.primary_open', EvaluationSchema.primary_open)\n"
        "    config_get(record, 'perf.seed', 0)\n"  # no config node
        "    config_get(config, 'evaluation.no_such_key', 1)\n"
        "    config_get(config, dotted, 'closed_acc')\n"
        "    config_get(config, f'evaluation.{dotted}', 'closed_acc')\n"
    )
    assert restated_defaults(planted) == [
        "config_get(config, 'evaluation.primary_closed', 'closed_acc')",
        "config_get(config, 'evaluation.primary_open', 'f1')",
        "config_get(record, 'config.data.option_orders', 0)",
        "config_get(record, 'config.seed', default=None)",
        "rows.config_get(config, 'evaluation.bootstrap.samples', 10)",
    ]


def test_the_defaults_guard_knows_every_schema_hydra_stores() -> None:
    """The guard's tree (found from `Config`'s fields) holds every schema `register` stores for
    a group, with the same keys; plug-in groups are made from their classes' signatures, which
    are the one declaration of their defaults."""
    from hydra.core.config_store import ConfigStore

    from medvqa import plugins

    tree = config_tree()
    repo = ConfigStore.instance().repo
    assert set(repo["config_schema.yaml"].node) == {
        f.name for f in dataclasses.fields(tree.nodes[""])
    }
    stored = {
        group: entries
        for group, entries in repo.items()
        if isinstance(entries, dict) and group not in plugins.GROUPS
    }
    checked = set()
    for group, entries in stored.items():
        for name, entry in entries.items():
            if name.endswith("_schema.yaml"):
                assert group in tree.nodes, group
                assert set(entry.node) == {f.name for f in dataclasses.fields(tree.nodes[group])}
                checked.add(group)
    assert {"model", "peft", "trainer", "judge", "shift", "paths"} <= checked
