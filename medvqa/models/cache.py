"""Build a model directory once and share it between runs (and concurrent jobs)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from medvqa.data.base import DataError

log = logging.getLogger(__name__)

DONE_FILE = "medvqa_build.json"


def build_cached(
    target: Path, build_into: Callable[[Path], None], manifest: Mapping[str, Any]
) -> Path:
    """Return `target`, building it first if it has no done-marker.

    The model is built into a temporary directory beside `target`, the marker (the build's
    parameters) is written last and the directory is then renamed: a crash or a second job
    building at the same time can never leave a half-built model that looks complete.
    """
    if (target / DONE_FILE).is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    except OSError as err:
        raise DataError(
            f"cannot write the model cache {target.parent}: {err}. Set paths.cache_dir "
            "(or the MEDVQA_CACHE environment variable) to a writable directory."
        ) from err
    start = time.perf_counter()
    log.info("building %s (cached for later runs)", target.name)
    try:
        build_into(tmp)
        (tmp / DONE_FILE).write_text(json.dumps(dict(manifest), indent=2, default=str))
        if (target / DONE_FILE).is_file():  # another job finished first
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            shutil.rmtree(target, ignore_errors=True)
            os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("%s ready in %.1fs at %s", target.name, time.perf_counter() - start, target)
    return target
