"""Export one run folder: its record checked, its weights written in the asked format with their
model card, whole or not at all.

The run folder is read as `task=eval` reads it (`medvqa.tasks.from_run.adopt_run`: the
record's model and method with their targets checked, the manifest and the weights' SHA-256
checked before any work), by the caller that composed the config (`medvqa-export`, or the
runner for `task=export`). Refused here, before any model is loaded: a rehearsal (random
weights: nothing worth publishing), a method that trained nothing, and an `--out` folder that
holds anything but an earlier export (`medvqa.atomic.staged_dir`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from medvqa.atomic import staged_dir
from medvqa.data.shifts import SPLITS_FILE
from medvqa.export.card import ExportFacts, model_card
from medvqa.export.weights import (
    ExportError,
    adapter_model,
    has_adapter,
    load_trained,
    merged_model,
    set_generation,
    write_adapter,
    write_merged,
)
from medvqa.models.loading import resolve_pretrained
from medvqa.models.saving import TRAINED_DIR
from medvqa.record import REHEARSAL_NOTE, RESULTS_FILE, is_rehearsal, read_record
from medvqa.untrusted import read_plain_json

log = logging.getLogger(__name__)

# The `medvqa.atomic.staged_dir` tool name: only an earlier export is replaced.
TOOL = "medvqa-export"
CARD_FILE = "README.md"


def check_exportable(record: dict[str, Any], run_dir: Path) -> None:
    """Refuse a run whose weights are not worth exporting, before any work: a rehearsal, or a
    method that trains nothing (its model is the base itself)."""
    where = f"{run_dir / RESULTS_FILE}"
    if record.get("rehearsal") or is_rehearsal(record.get("config")):
        raise ExportError(
            f"{where}: a rehearsal ({REHEARSAL_NOTE}); its weights are not a model. Export a "
            "run trained from the checkpoint's weights (model.random_weights=false)."
        )
    if not OmegaConf.select(OmegaConf.create(record.get("config") or {}), "peft.fit"):
        raise ExportError(
            f"{where}: method {(record.get('config') or {}).get('peft', {}).get('name')!r} "
            "trains nothing; its model is the base checkpoint itself, which needs no export."
        )


def _splits(run_dir: Path) -> dict[str, Any] | None:
    """The run's splits.json as plain values, None where it is missing or unreadable (the card
    says so)."""
    try:
        return read_plain_json(
            run_dir / SPLITS_FILE, "splits.json", "restore the run's splits.json"
        ).value
    except (OSError, ValueError) as err:
        log.warning("the card lists no splits: %s", err)
        return None


def export_run(cfg: DictConfig, run_dir: Path, out: Path, merged: bool = False) -> Path:
    """Write the weights of the run in `run_dir` into `out`: a peft adapter folder, or with
    `merged` (always for full fine-tuning) a whole transformers checkpoint; its model card as
    README.md. `cfg`: composed with the run's model and method adopted (`adopt_run`)."""
    run_dir, out = Path(run_dir), Path(out)
    record = read_record(run_dir / RESULTS_FILE)
    check_exportable(record, run_dir)
    images = str(cfg.data.train_image) != "none"
    with staged_dir(out, TOOL) as staging:
        model, processor = load_trained(cfg.model, cfg.peft, run_dir / TRAINED_DIR, images)
        set_generation(model, (record.get("provenance") or {}).get("generation") or {})
        whole = merged or not has_adapter(model)
        base = resolve_pretrained(cfg.model)
        if whole:
            write_merged(merged_model(model, cfg.model), processor, staging)
        else:
            revision = ((record.get("provenance") or {}).get("model") or {}).get("revision")
            exported = adapter_model(model, processor, cfg.model, cfg.peft, images, base, revision)
            write_adapter(exported, processor, staging)
        facts = ExportFacts(out.name, whole, base, int(cfg.peft.virtual_tokens))
        model_card(record, _splits(run_dir), facts).save(staging / CARD_FILE)
    log.info(
        "exported %s as a %s to %s",
        run_dir,
        "merged checkpoint" if whole else "peft adapter folder",
        out,
    )
    return out
