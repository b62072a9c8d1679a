"""Build a model directory once and share it between runs (and concurrent jobs)."""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from functools import cached_property, partial
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from medvqa.atomic import CacheWriteError, build_once
from medvqa.errors import DataError
from medvqa.hashing import content_hash
from medvqa.models.builders import shipped

log = logging.getLogger(__name__)

DONE_FILE = "medvqa_build.json"


def build_cached(
    target: Path, build_into: Callable[[Path], None], manifest: Mapping[str, Any]
) -> Path:
    """Return `target`, building it once (atomically, see `medvqa.atomic`) if it is absent.

    The done-marker holds the build's parameters and is written last, after the model.
    """

    def write(tmp: Path) -> None:
        log.info("making %s in the cache (later runs reuse it)", target.name)
        build_into(tmp)
        (tmp / DONE_FILE).write_text(json.dumps(dict(manifest), indent=2, default=str))

    try:
        build_once(target, write, marker=DONE_FILE, what="model cache")
    except CacheWriteError as err:
        raise DataError(str(err)) from err
    return target


def plain(value: Any) -> Any:
    """A Hydra node as plain Python (so it can be hashed and written as JSON)."""
    if isinstance(value, DictConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value


def hashable(value: Any) -> Any:
    """Drop cache locations from hashed parameters: moving the cache must not rebuild."""
    if isinstance(value, Mapping):
        return {k: hashable(v) for k, v in sorted(value.items()) if k != "cache_dir"}
    if isinstance(value, list | tuple):
        return [hashable(v) for v in value]
    return value


class CachedModelBuilder(ABC):
    """An offline model builder: `params` (and, with `params["pretrain"]`, the pre-training
    data's content) decide a cache key; `build()` makes `<cache>/models/<name>-<key>` once."""

    def __init__(self, cache_dir: str | Path, params: Mapping[str, Any]) -> None:
        self.cache_dir = Path(cache_dir).expanduser()
        self.params: dict[str, Any] = dict(params)

    @property
    @abstractmethod
    def name(self) -> str:
        """Directory name prefix, e.g. `tiny-llava`."""

    @abstractmethod
    def _build_into(self, out: Path) -> None:
        """Create the model and processor and `save_pretrained` them into `out`."""

    def key_extra(self) -> dict[str, Any]:
        """Further inputs of the build that are not parameters (e.g. a weights file)."""
        return {}

    @property
    def key(self) -> str:
        """Hash of the parameters, `key_extra()` and the pre-training data's content, so a
        changed data generator rebuilds the model instead of reusing a stale one."""
        data = self._pretrain_source.fingerprint() if self.params.get("pretrain") else None
        blob = {"params": hashable(self.params), "data": data, **self.key_extra()}
        return content_hash(blob)

    def build(self, use_shipped: bool = True) -> Path:
        """Return the model directory, building it if absent: copied from the package where a
        build with this key ships (`medvqa.models.builders.shipped`), else made here."""
        target = self.cache_dir / "models" / f"{self.name}-{self.key}"
        found = shipped.find(target.name) if use_shipped else None
        build_into = self._build_into if found is None else partial(shipped.copy_into, found)
        return build_cached(target, build_into, {**self.params, **self.key_extra()})

    @cached_property
    def _pretrain_source(self) -> Any:
        data = dict(self.params["pretrain"]["data"])
        data.setdefault("cache_dir", str(self.cache_dir))
        return instantiate(data)


def builder_from_yaml(
    path: Path, cache_dir: str | Path, overrides: Mapping[str, Any] | None = None
) -> CachedModelBuilder:
    """A model YAML's `builder` node (conf/model/<name>.yaml) instantiated with `cache_dir`
    in place of its `${paths.cache_dir}` and `overrides` merged: the builder alone, without
    composing the whole config (seconds of imports), for the shipping command and the tests."""
    node = OmegaConf.merge(
        OmegaConf.load(path).builder, overrides or {}, {"cache_dir": str(cache_dir)}
    )
    return instantiate(node)
