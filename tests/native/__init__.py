"""Writers of small datasets in each real dataset's native layout (annotation files + images).

No real data enters the repo: each writer builds a tiny, hand-designed copy of the layout with
every kind of row the loader and its cleaning must handle, and returns what it wrote (which rows
the cleaning keeps, per split) so tests can check the loader against an independent truth.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image


def write_image(path: Path, seed: int, size: int = 16, fmt: str | None = None) -> None:
    """A small deterministic RGB image (noise; its content does not matter to loaders)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, size=(size, size, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, format=fmt)


def edit_json_row(path: Path, index: int, **changes: object) -> None:
    """Change one row of a JSON-list annotation file; a value of None deletes the key."""
    import json

    rows = json.loads(path.read_text())
    rows[index].update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        del rows[index][key]
    path.write_text(json.dumps(rows))


def fixture_writer(dataset: str) -> Callable[[Path], Any] | None:
    """The fixture writer of a dataset config, found by name: `tests/native/<dataset>.py::write`.

    A new dataset gets its integration tests by dropping such a module here; nothing else in
    the tests names it.
    """
    if importlib.util.find_spec(f"tests.native.{dataset}") is None:
        return None
    return getattr(importlib.import_module(f"tests.native.{dataset}"), "write", None)
