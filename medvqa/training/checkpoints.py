"""Checkpoints that cannot tear, and no stale ones beside a fresh run's.

Lightning's `TorchCheckpointIO` writes through an fsspec transaction whose temporary file is made
by `tempfile.mkstemp()`, i.e. in $TMPDIR; committing it is `shutil.move`, which across file
systems (a node's /tmp, the cluster's shared run directory) is a copy straight into the target:
a full disk or a kill mid-copy leaves a truncated `last.ckpt` that the next attempt tries to
resume from. `AtomicCheckpointIO` writes the temporary file next to the target and renames it,
so `last.ckpt` is always the previous complete checkpoint or the new complete one. DeepSpeed
writes a directory of per-rank shards instead (`medvqa.training.strategies.DeepSpeedStrategy`
saves it under a temporary name the same way).

No pickles from anywhere: `torch.load` without `weights_only=True` unpickles whatever a file
names, i.e. runs its code. `ckpt_path` must be a local file (`ckpt_path_problems`, checked with
the config, before any data or model work): Lightning fetches a URL with
`torch.hub.load_state_dict_from_url(weights_only=False)` (lightning/fabric/utilities/cloud_io.py
`_load`). Every checkpoint medvqa resumes from is read weights-only: `AtomicCheckpointIO` for
Lightning's own files, `medvqa.training.strategies.DeepSpeedStrategy` for DeepSpeed's shards.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from fsspec.core import split_protocol
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint

from medvqa.atomic import write_file

log = logging.getLogger(__name__)

# Where a fresh (not resumed) fit puts the checkpoints a previous attempt left in its directory.
STALE_SUFFIX = ".stale-"


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, a quota); the previous one is intact."""


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint holds Python objects beyond tensors and plain data; it was not unpickled."""


# Lightning's `ckpt_path` words for a checkpoint it finds in this run's own directories: `last`
# (ModelCheckpoint's last.ckpt; the SURE sweeps set it) and `hpc` (the hpc_ckpt_<n>.ckpt its SLURM
# handler writes into the run directory). `best` is refused: a fit that starts has no best
# checkpoint yet, and `registry[:name]` downloads from Lightning's model registry.
LOCAL_CKPT_WORDS = ("last", "hpc")

FETCH_FIX = (
    "download it yourself, check where it came from, and pass the local path "
    "(ckpt_path=/path/to/last.ckpt)"
)


def ckpt_path_problems(value: Any) -> list[str]:
    """What makes `ckpt_path` unusable, as config-check lines (none: it can be resumed from).

    A URL (any `scheme://`, fsspec's `data:` and chained `a::b` URLs, Lightning's `registry:`) is
    refused: Lightning downloads an http(s) one and unpickles it with `weights_only=False`, i.e.
    runs any code the file holds, and the other schemes fetch what nobody checked. `file://` too,
    for one rule: a checkpoint is a plain path. A path that is not there is refused now rather
    than after the data and the model are loaded.
    """
    if value is None:
        return []
    text = str(value)
    if text in LOCAL_CKPT_WORDS:
        return []
    if text == "best":
        return [
            "ckpt_path='best': a fit that starts has no best checkpoint yet (Lightning looks it up "
            "in this Trainer's ModelCheckpoint); resume with ckpt_path=last or a checkpoint's path"
        ]
    protocol, rest = split_protocol(text)
    if protocol == "file":
        return [
            f"ckpt_path={text!r}: a file:// URL; medvqa resumes from plain local paths only, "
            f"pass it without the scheme (ckpt_path={rest})"
        ]
    if protocol is not None or "::" in text or re.match(r"(?i)registry(:|$)", text):
        return [
            f"ckpt_path={text!r}: a URL; medvqa resumes only from a local file (Lightning would "
            "fetch it, and unpickles an http(s) one with weights_only=False, running any code "
            "it holds); " + FETCH_FIX
        ]
    if not Path(text).exists():
        return [
            f"ckpt_path={text!r}: no such file or directory (relative paths start at {os.getcwd()}"
            "); pass a checkpoint's path (a DeepSpeed one is a directory), ckpt_path=last for this "
            "run's checkpoints/last.ckpt, or ckpt_path=null to start over"
        ]
    return []


def load_weights_only(
    path: Any, map_location: Any = None, allowed: Sequence[Callable[..., Any]] = ()
) -> Any:
    """`torch.load` of tensors and plain data only (and the `allowed` classes), whatever the
    caller or `TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD` says: unpickling anything else could run code."""
    try:
        with torch.serialization.safe_globals(list(allowed)):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        raise unsafe_checkpoint(path, err) from err


def unsafe_checkpoint(path: Any, err: BaseException) -> UnsafeCheckpointError:
    """The error for a checkpoint that `weights_only=True` refused, naming what it holds."""
    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(err))
    what = found.group(1) if found else str(err).strip().splitlines()[-1]
    return UnsafeCheckpointError(
        f"refused to unpickle the checkpoint {path} (ckpt_path): it holds {what}, beyond the "
        "tensors and plain data a checkpoint needs, and unpickling it could run code. Resume "
        "only from a checkpoint this project wrote (ckpt_path=last, or its path), or start over "
        "(ckpt_path=null); if this project wrote it, its objects need a precise allow-list entry "
        "(medvqa/training/checkpoints.py, strategies.py)."
    )


class AtomicCheckpointIO(TorchCheckpointIO):
    """`torch.save` into a sibling temporary file, flushed to disk, then renamed into place;
    loads are weights-only (`load_checkpoint`)."""

    def load_checkpoint(
        self,
        path: Any,
        map_location: Callable[..., Any] | None = lambda storage, loc: storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """Lightning's load with `weights_only=True` whatever it is asked: its default (None)
        unpickles a URL with weights_only=False and leaves a local file to torch's default,
        which `TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1` turns off. A Lightning checkpoint of medvqa
        holds tensors, numbers, strings and containers only (tests/test_no_pickles.py)."""
        try:
            return super().load_checkpoint(path, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as err:
            raise unsafe_checkpoint(path, err) from err

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None or "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options)  # remote: fsspec's way
            return

        def save(tmp: Path) -> None:
            with tmp.open("wb") as fh:
                torch.save(checkpoint, fh)
                fh.flush()
                os.fsync(fh.fileno())

        try:
            write_file(Path(path), save)
        except (OSError, RuntimeError) as err:  # torch.save reports a failed write as Runtime
            free = shutil.disk_usage(Path(path).parent).free / 2**20
            raise CheckpointWriteError(
                f"could not write the checkpoint {path} ({free:.0f} MiB free on its file "
                f"system): {err}. The previous checkpoint there is kept whole. Free space, or "
                "write checkpoints elsewhere (callbacks.model_checkpoint.dirpath=...)."
            ) from err


def set_aside_stale(callbacks: Iterable[Any], ckpt_path: str | None) -> list[Path]:
    """Before a fit that does not resume (`ckpt_path` unset), move the checkpoint directories of
    an earlier attempt in this run directory aside (`checkpoints.stale-<time>`), returning them.

    Left there, ModelCheckpoint would write `last-v1.ckpt` beside the old `last.ckpt`, and a
    later `ckpt_path=last` would resume from the old run's weights. Moved, not deleted: they may
    be the only copy of a long training.
    """
    if ckpt_path is not None:
        return []
    moved = []
    for callback in callbacks:
        dirpath = (
            getattr(callback, "dirpath", None) if isinstance(callback, ModelCheckpoint) else None
        )
        if dirpath is None or "://" in str(dirpath):
            continue
        folder = Path(dirpath)
        if folder.is_dir() and any(folder.iterdir()):
            aside = folder.with_name(f"{folder.name}{STALE_SUFFIX}{time.strftime('%Y%m%d-%H%M%S')}")
            shutil.move(folder, aside)
            log.warning(
                "%s held checkpoints of an earlier attempt and this fit does not resume "
                "(ckpt_path unset): moved them to %s",
                folder,
                aside,
            )
            moved.append(aside)
    return moved
