"""Content hashes: the one place that decides how caches, fingerprints and ids are keyed.

Every cache key in medvqa (normalised tables, generated datasets, built models, judgments,
prediction files) is a SHA-256 over a canonical form of what determines the content, so the
same inputs always give the same key and any change gives a new one.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20


def _encodable(value: Any) -> Any:
    """A set as its sorted items (its iteration order changes with the process's string
    hashing, e.g. peft's `target_modules`), anything else JSON cannot encode as `str`."""
    if isinstance(value, set | frozenset):
        return sorted(value, key=canonical_json)
    return str(value)


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and sorted sets; values JSON cannot encode (paths, numpy scalars)
    as `str`: the same content gives the same text in every process."""
    return json.dumps(value, sort_keys=True, default=_encodable)


def content_hash(value: Any, length: int | None = 16) -> str:
    """Hex SHA-256 of `value`: bytes as they are, a string as UTF-8, anything else as
    canonical JSON. `length` truncates the hex digest (None: all 64 characters)."""
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
    elif isinstance(value, str):
        data = value.encode()
    else:
        data = canonical_json(value).encode()
    digest = hashlib.sha256(data).hexdigest()
    return digest if length is None else digest[:length]


def file_hash(path: Path, length: int | None = None) -> str:
    """Hex SHA-256 of a file's bytes, read in chunks (annotation files can be large)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        while block := fh.read(_CHUNK):
            digest.update(block)
    hexdigest = digest.hexdigest()
    return hexdigest if length is None else hexdigest[:length]


class Hasher:
    """An incremental content hash for keys built from several parts (files, parameters)."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256()

    def update(self, value: Any) -> Hasher:
        """Add one part; parts are length-prefixed, so ("ab", "c") and ("a", "bc") differ."""
        part = content_hash(value, length=None).encode()
        self._digest.update(len(part).to_bytes(4, "big") + part)
        return self

    def hexdigest(self, length: int | None = 16) -> str:
        hexdigest = self._digest.hexdigest()
        return hexdigest if length is None else hexdigest[:length]
