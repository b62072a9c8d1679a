"""Checkpoints that cannot tear, and no stale ones beside a fresh run's.

Lightning's `TorchCheckpointIO` writes through an fsspec transaction whose temporary file is made
by `tempfile.mkstemp()`, i.e. in $TMPDIR; committing it is `shutil.move`, which across file
systems (a node's /tmp, the cluster's shared run directory) is a copy straight into the target:
a full disk or a kill mid-copy leaves a truncated `last.ckpt` that the next attempt tries to
resume from. `AtomicCheckpointIO` writes the temporary file next to the target and renames it,
so `last.ckpt` is always the previous complete checkpoint or the new complete one. DeepSpeed
writes a directory of per-rank shards instead (`medvqa.training.strategies.DeepSpeedStrategy`
saves it under a temporary name the same way).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint

from medvqa.atomic import write_file

log = logging.getLogger(__name__)

# Where a fresh (not resumed) fit puts the checkpoints a previous attempt left in its directory.
STALE_SUFFIX = ".stale-"


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, a quota); the previous one is intact."""


class AtomicCheckpointIO(TorchCheckpointIO):
    """`torch.save` into a sibling temporary file, flushed to disk, then renamed into place."""

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
