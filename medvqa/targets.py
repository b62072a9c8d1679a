"""Which `_target_`s medvqa builds from a config it did not compose itself.

A run folder travels, and its `results.json` is data from a stranger: its config's `_target_`s
must never choose what code runs. Everything medvqa instantiates (or merely imports) from a
record passes `check_targets` first: task=eval's adopted model and method, the report's rebuilt
metric families, the dataset class whose defaults name a condition. A target must be a
registered plug-in (found by discovery, which the user configured), or a class of the project's
own or of its libraries' that is one of the kinds of object a config here builds (`KINDS`).
The string is read before anything is imported, so a record cannot even make medvqa import a
module outside `PACKAGES`; functions (`pandas.read_pickle`, `torch.hub.load_state_dict_from_url`,
`shutil.rmtree`) and other classes (`pathlib.Path`) are refused by name.

The config the user composes (the installed conf/, their own files, the command line) is theirs
and is not checked here.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator, Mapping
from typing import Any

from medvqa import plugins

# The packages a record's target may be looked up in (the first dotted parts); torch only for
# its optimisers and schedulers.
PACKAGES = ("medvqa.", "peft.", "transformers.", "torch.optim.", "lightning.")
# Hydra's own keys beside `_target_` say how to call it, never what: they are not checked.
TARGET_KEY = "_target_"


class UntrustedTargetError(ValueError):
    """A record names a `_target_` medvqa does not build from a record."""


@functools.cache
def kinds() -> tuple[type, ...]:
    """The kinds of object a config here builds: a record's target must be one of them."""
    from lightning.pytorch import Callback, Trainer
    from lightning.pytorch.loggers import Logger
    from lightning.pytorch.strategies import Strategy
    from peft.config import PeftConfigMixin
    from torch.optim import Optimizer
    from torch.optim.lr_scheduler import LRScheduler
    from transformers import GenerationConfig, PretrainedConfig

    from medvqa.data.base import VQASource
    from medvqa.evaluation.families.base import MetricFamily
    from medvqa.models.builders.cache import CachedModelBuilder
    from medvqa.models.prompting import PromptTemplate

    return (
        VQASource,
        MetricFamily,
        CachedModelBuilder,
        PromptTemplate,
        PeftConfigMixin,
        PretrainedConfig,
        GenerationConfig,
        Optimizer,
        LRScheduler,
        Callback,
        Logger,
        Strategy,
        Trainer,
    )


def _registered() -> set[str]:
    return {
        plugins.target_of(cls)
        for kind in plugins.GROUPS
        for cls in plugins.registered(kind).values()
    }


def refusal(target: Any) -> str | None:
    """Why `target` may not be built from a record (None: it may)."""
    if not isinstance(target, str) or not target.strip():
        return f"{target!r} is not a class name"
    if target in _registered():
        return None
    if not target.startswith(PACKAGES):
        return f"{target!r} is outside the packages a record may name ({', '.join(PACKAGES)})"
    from hydra._internal.utils import _locate

    try:
        found = _locate(target)
    except Exception as err:  # an unknown name: nothing to build
        return f"{target!r} cannot be found ({type(err).__name__})"
    if not inspect.isclass(found):
        return f"{target!r} is not a class (a function or module is never built from a record)"
    if not issubclass(found, kinds()):
        names = ", ".join(k.__name__ for k in kinds())
        return f"{target!r} is not one of the kinds of object a config builds ({names})"
    return None


def leaves(node: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """Every (`dotted.key`, value) below a config node that is not a mapping or a list, and
    every `_target_` whatever its value (a mapping there is no class name either)."""
    if isinstance(node, Mapping):
        for name, value in node.items():
            path = f"{key}.{name}" if key else str(name)
            if name == TARGET_KEY:
                yield path, value
            else:
                yield from leaves(value, path)
    elif isinstance(node, list | tuple):
        for i, value in enumerate(node):
            yield from leaves(value, f"{key}[{i}]")
    else:
        yield key, node


def problems_in(node: Any, key: str = "", targets: bool = True) -> list[str]:
    """Each `_target_` below `node` that `refusal` rejects (unless not `targets`), and each
    interpolation (`${...}`: a record holds resolved values, so one there would read this
    machine's environment or config into the run), as `key=value: why` lines."""
    out = []
    for path, value in leaves(node, key):
        is_target = path.rpartition(".")[2] == TARGET_KEY
        if is_target and targets and (why := refusal(value)) is not None:
            out.append(f"{path}={value!r}: {why}")
        elif isinstance(value, str) and "${" in value:
            out.append(f"{path}={value!r}: an interpolation (a record holds resolved values)")
    return out


def check_targets(node: Any, where: str, key: str = "", targets: bool = True) -> None:
    """Refuse a record-derived config node with any `_target_` that `refusal` rejects (unless
    not `targets`: a part of the record nothing builds), or any interpolation; the error names
    `where` (the file), each key and value, and says nothing was run."""
    from omegaconf import OmegaConf

    if OmegaConf.is_config(node):
        node = OmegaConf.to_container(node, resolve=False)
    problems = problems_in(node, key, targets)
    if problems:
        raise UntrustedTargetError(
            f"{where}: the record names code medvqa does not run from a record; nothing from it "
            "was built or imported:\n"
            + "\n".join(f"  - {p}" for p in problems)
            + "\nThe record was edited or written by other code. Use a run folder medvqa wrote, "
            "or compose the config yourself (conf/, the command line)."
        )
