"""`task=export`: a finished run's weights as a peft adapter folder or a merged transformers
checkpoint, with a model card (`medvqa.export`; `medvqa-export` does the same from a shell)."""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig

from medvqa.export.job import export_run


def export(
    cfg: DictConfig,
    out_dir: Path,
    loggers: Sequence[Logger] = (),
    provenance: MutableMapping[str, Any] | None = None,
    *,
    from_run: str,
    out: str,
    merged: bool,
) -> dict[str, float]:
    """Export the run `from_run` (its model and method adopted by the runner, as for task=eval)
    into `out`; nothing is scored, so no metrics."""
    written = export_run(cfg, Path(from_run), Path(out), merged=merged)
    if provenance is not None:
        provenance["export"] = {"from_run": str(from_run), "out": str(written), "merged": merged}
    return {}
