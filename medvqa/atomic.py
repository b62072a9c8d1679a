"""Build a directory once, atomically: the one cache pattern of medvqa; and replace a file
atomically (`write_file`), for records and tables that readers may open at any time.

Normalised dataset tables, generated synthetic datasets and offline-built models are all
directories that are expensive to make and shared by concurrent jobs (a multirun, a SLURM
array). Each is built into a private temporary sibling and renamed into place only when its
completion marker exists, so a crash or a second job building at the same time can never
leave a half-built directory that looks complete, and a finished one is never rebuilt.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)


class CacheWriteError(OSError):
    """The cache location cannot be written; the message says which setting to change."""


def write_file(path: Path, write: Callable[[Path], None]) -> Path:
    """Write `path` through `write(tmp)` into a sibling, then rename it into place: a reader
    (or a crash) never sees a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return path


def is_built(target: Path, marker: str) -> bool:
    """True if `target` was completed by `build_once` (its marker file exists)."""
    return (Path(target) / marker).is_file()


def build_once(
    target: Path,
    build_into: Callable[[Path], None],
    marker: str,
    what: str = "cache entry",
) -> bool:
    """Make `target` with `build_into(tmp)` unless it is already complete; True if built here.

    `build_into` writes everything into `tmp`, the file named `marker` last (it is how a
    complete entry is recognised). If another process completes `target` first, its copy is
    kept and ours discarded: equal inputs give equal content, so either is valid.
    """
    target = Path(target)
    if is_built(target, marker):
        return False
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    except OSError as err:
        raise CacheWriteError(
            f"cannot write the {what} under {target.parent}: {err}. Set paths.cache_dir (or "
            "the MEDVQA_CACHE environment variable) to a writable directory."
        ) from err
    start = time.perf_counter()
    try:
        build_into(tmp)
        if not is_built(tmp, marker):
            raise RuntimeError(f"building {target} wrote no {marker!r}: the build is incomplete")
        if is_built(target, marker):
            log.info("another process finished %s first; using its copy", target)
            return False
        if target.exists():  # an incomplete leftover of a crashed build
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.replace(tmp, target)
        except OSError:
            if not is_built(target, marker):
                raise
            return False  # lost a race to an equally valid copy
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("built %s in %.1fs", target, time.perf_counter() - start)
    return True
