"""Plug-ins register themselves: a dataset, metric family, model family, view beyond accuracy
or evaluation pass kind is a class, found, never listed.

A dataset source (subclass of `medvqa.data.base.VQASource`), a metric family (subclass of
`medvqa.scoring.metrics.base.MetricFamily`) or a model family (subclass of
`medvqa.models.families.base.ModelFamily`, named by its architecture's `model_type`) that sets a
`name` class attribute is registered under that name when its module is imported. A dataset's
or metric family's config schema is *generated* from the signature of its constructor (or of
the classmethod named by `config_factory`): every parameter becomes a typed field with the
parameter's default, so a parameter and its default are written exactly once, in the code, and
a misspelled key still fails when Hydra composes the config.

Discovery imports every module of a kind's built-in package, then the modules named in the
`MEDVQA_PLUGINS` environment variable (comma-separated) and those of the `medvqa.plugins`
entry-point group, so code outside this repository adds a plug-in without editing any file
here (its YAML comes in through `hydra.searchpath`).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
import os
import pkgutil
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar

from omegaconf import MISSING

from medvqa.hashing import content_hash

log = logging.getLogger(__name__)

# Plug-in kind -> the package whose modules are its built-in plug-ins.
PACKAGES: dict[str, str] = {
    "dataset": "medvqa.data.sources",
    "metric": "medvqa.scoring.metrics",
    "family": "medvqa.models.families",  # model families, keyed by model_type; no config group
    "view": "medvqa.views",  # views beyond accuracy; no config group
    "pass": "medvqa.generation.passes",  # evaluation passes; set by their own keys
}
# The kinds that are config groups too: each plug-in's schema is stored under its name there.
GROUPS = ("dataset", "metric")
ENV_VAR = "MEDVQA_PLUGINS"
ENTRY_POINT_GROUP = "medvqa.plugins"

_REGISTRY: dict[str, dict[str, type]] = {kind: {} for kind in PACKAGES}
_imported: set[str] = set()


class PluginError(ValueError):
    """A plug-in cannot be registered or found; the message names it and the fix."""


class Plugin:
    """Mix-in: a subclass that defines `name` is registered under `plugin_kind`."""

    plugin_kind: ClassVar[str]
    name: ClassVar[str]
    # The constructor Hydra calls, if not the class itself (e.g. "from_config").
    config_factory: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The base class of a kind (it sets `plugin_kind`) is not a plug-in itself.
        if "name" in cls.__dict__ and "plugin_kind" not in cls.__dict__:
            register(cls.plugin_kind, cls)


def register(kind: str, cls: type) -> None:
    """Register `cls` under its `name`; two different classes may not share a name."""
    name = cls.__dict__["name"]
    known = _REGISTRY[kind].get(name)
    if known is not None and _path(known) != _path(cls):
        raise PluginError(
            f"{kind} plug-in name {name!r} is taken by {_path(known)}; rename {_path(cls)}."
        )
    _REGISTRY[kind][name] = cls


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _import(module: str, why: str) -> None:
    if module in _imported:
        return
    try:
        importlib.import_module(module)
    except ImportError as err:
        raise PluginError(f"cannot import plug-in module {module!r} ({why}): {err}") from err
    _imported.add(module)


_DISCOVERED: dict[str, str] = {}  # kind -> the $MEDVQA_PLUGINS value its last discovery saw


def discover(kind: str) -> None:
    """Import the built-in plug-in modules of `kind` and every module named in MEDVQA_PLUGINS
    or by an entry point, once per value of MEDVQA_PLUGINS: scanning packages and entry points
    costs ~10 ms, and the registry is asked per record and per table cell. Only `kind`'s
    package is scanned: asking for a model family imports no dataset or metric module."""
    wanted = os.environ.get(ENV_VAR, "")
    if _DISCOVERED.get(kind) == wanted:
        return
    package = PACKAGES[kind]
    pkg = importlib.import_module(package)
    for info in pkgutil.iter_modules(pkg.__path__, prefix=f"{package}."):
        _import(info.name, f"built-in, in {package}")
    for module in filter(None, (m.strip() for m in os.environ.get(ENV_VAR, "").split(","))):
        _import(module, f"named in ${ENV_VAR}")
    for point in entry_points(group=ENTRY_POINT_GROUP):
        _import(point.value, f"entry point {point.name!r} of group {ENTRY_POINT_GROUP}")
    _DISCOVERED[kind] = wanted


def registered(kind: str) -> dict[str, type]:
    """Every plug-in of `kind` by name (after discovery)."""
    discover(kind)
    return dict(sorted(_REGISTRY[kind].items()))


def get(kind: str, name: str) -> type:
    """The plug-in class of `kind` called `name`, with the known names if there is none."""
    plugins = registered(kind)
    if name not in plugins:
        raise PluginError(f"no {kind} plug-in named {name!r}; known: {sorted(plugins)}")
    return plugins[name]


# -- schemas from signatures ------------------------------------------------------------------

_PRIMITIVES = (str, int, float, bool)


def _config_type(annotation: Any) -> Any:
    """The OmegaConf-compatible type for a parameter annotation (Any where none fits)."""
    if annotation in _PRIMITIVES:
        return annotation
    if annotation is Path:
        return str
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        types_ = {_config_type(a) for a in rest}
        inner = types_.pop() if len(types_) == 1 else Any
        return inner if len(rest) == len(args) or inner is Any else typing.Optional[inner]  # noqa: UP045 (OmegaConf reads typing.Optional)
    if origin is typing.Literal:
        kinds = {type(a) for a in args}
        return kinds.pop() if len(kinds) == 1 and kinds <= set(_PRIMITIVES) else Any
    if origin in (list, tuple, set, frozenset, Sequence) or annotation in (list, tuple):
        items = [a for a in args if a is not Ellipsis]
        item = _config_type(items[0]) if len(set(items)) == 1 else Any
        return list[item if item in _PRIMITIVES else Any]
    # Mappings stay untyped: a value may be another typed node (e.g. `cfg: ${judge}`).
    return Any


def _config_default(value: Any) -> Any:
    """A parameter default as config data (paths as strings, sequences as lists)."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple | list | set | frozenset):
        return [_config_default(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _config_default(v) for k, v in value.items()}
    return value


def constructor(cls: type) -> Callable[..., Any]:
    """What Hydra calls to build the plug-in: the class, or its `config_factory` method."""
    factory = getattr(cls, "config_factory", None)
    return getattr(cls, factory) if factory else cls


def target_of(cls: type) -> str:
    """The `_target_` string of the plug-in's constructor."""
    factory = getattr(cls, "config_factory", None)
    return f"{_path(cls)}.{factory}" if factory else _path(cls)


def registered_class(kind: str, target: str) -> type | None:
    """The registered plug-in of `kind` that `target` (a `_target_` string, read as a name and
    never imported) constructs, where one does: its own `target_of`, or that name re-exported
    by a package above its module (`medvqa.data.sources.synthetic.SyntheticVQA`)."""
    for cls in registered(kind).values():
        own = target_of(cls)
        if target == own:
            return cls
        tail = own[len(cls.__module__) + 1 :]  # the class (and its factory), after the module
        head = target[: -len(tail) - 1]
        if target.endswith(f".{tail}") and cls.__module__.startswith(f"{head}."):
            return cls
    return None


def parameters(cls: type) -> dict[str, inspect.Parameter]:
    """The constructor's named parameters (its config keys), in order."""
    func = constructor(cls)
    return {
        name: p
        for name, p in inspect.signature(func).parameters.items()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and name not in ("self", "cls")
    }


# Generated schema classes by name. They are pickled by reference (the SLURM launcher sends
# Hydra's config store to the job), so a class is reachable only once its home module gives it
# an importable name: `medvqa.config.schemas` (see `medvqa.config.schema`).
GENERATED: dict[str, type] = {}


def schema(cls: type, target: bool = True) -> type:
    """A dataclass whose fields are the constructor's parameters (plus `_target_`); one per
    (class, target), kept in `GENERATED` under its name."""
    key = f"{cls.__name__}Schema"
    if not target:  # e.g. the shift and judge schemas, which name no class to instantiate
        key = f"{cls.__name__}NoTargetSchema"
    made = GENERATED.get(key)
    if made is not None and made.__doc__ == f"Config of {_path(cls)}.":
        return made
    if made is not None:  # the same class name elsewhere: keep both apart
        key = f"{key}_{content_hash(_path(cls), length=8)}"
    made = _make_schema(cls, target, key)
    GENERATED[key] = made
    return made


def _make_schema(cls: type, target: bool, name: str) -> type:
    func = constructor(cls)
    init = func.__init__ if inspect.isclass(func) else func
    try:
        hints = typing.get_type_hints(init)
    except Exception:  # an annotation that cannot be resolved here is typed Any
        hints = {}
    fields: list[tuple[str, Any, Any]] = []
    if target:
        fields.append(("_target_", str, dataclasses.field(default=target_of(cls))))
    for key, param in parameters(cls).items():
        kind = _config_type(hints.get(key, Any))
        if param.default is inspect.Parameter.empty:
            default = dataclasses.field(default=MISSING)
        else:
            value = _config_default(param.default)
            if isinstance(value, list | dict):
                default = dataclasses.field(default_factory=lambda v=value: _config_default(v))
            else:
                default = dataclasses.field(default=value)
        fields.append((key, kind, default))
    return dataclasses.make_dataclass(
        name, fields, namespace={"__doc__": f"Config of {_path(cls)}."}
    )
