"""Save and reload what a fine-tuning method trained (adapter, projector, or the full LM).

One safetensors file of the trainable parameters, whatever the method: reloading is "load the
base, apply the same method, load this file", so the same code path serves LoRA, (IA)^3,
prompt tuning and full fine-tuning.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from medvqa.atomic import write_file
from medvqa.hashing import Hasher, content_hash, file_hash
from medvqa.untrusted import UntrustedDataError, read_plain_json

log = logging.getLogger(__name__)

WEIGHTS_FILE = "trainable.safetensors"
META_FILE = "trainable.json"
# A run directory's folder of the weights it trained (`task=eval eval.from_run=<run>` loads them).
TRAINED_DIR = "trained"


def save_trainable(
    model: torch.nn.Module,
    out_dir: Path,
    method: str,
    trained_for: str | None = None,
    global_step: int | None = None,
    trained_rows: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write the trainable parameters (contiguous CPU copies) and a small manifest; return the
    manifest (the run records it: `provenance.add_trained`).

    Both files are written under a temporary name and renamed, the manifest last: a manifest
    means complete weights. `trained_for` (the run config's fingerprint) and `global_step` let
    a re-run of the same job reuse them (`trained_before`) instead of training again. The
    weights file's size and SHA-256 let whoever loads them later (task=eval, a resumed run)
    check them before any other work (`verify_weights`); `trained_rows` (`rows_digest` of the
    training split) ties the run's splits.json to these weights.
    """
    state = {
        name: param.detach().to("cpu").contiguous()
        for name, param in model.named_parameters()
        if param.requires_grad
    }
    if not state:
        raise ValueError(f"method {method!r} trained no parameters; nothing to save")
    path = out_dir / WEIGHTS_FILE
    (out_dir / META_FILE).unlink(missing_ok=True)  # no manifest beside half-replaced weights
    write_file(path, lambda tmp: save_file(state, str(tmp), metadata={"method": method}))
    meta = {
        "method": method,
        "n_tensors": len(state),
        "n_params": sum(t.numel() for t in state.values()),
        "trained_for": trained_for,
        "global_step": global_step,
        "bytes": path.stat().st_size,
        "sha256": file_hash(path),  # a 7B model's LoRA: about a second
        **({"trained_rows": trained_rows} if trained_rows is not None else {}),
    }
    write_file(out_dir / META_FILE, lambda tmp: tmp.write_text(json.dumps(meta, indent=2)))
    log.info("saved %d trained tensors (%d parameters) to %s", len(state), meta["n_params"], path)
    return meta


def read_manifest(weights_dir: Path) -> dict[str, Any] | None:
    """The manifest of complete weights in `weights_dir` (both files there), else None (also
    for one that cannot be read). Read as plain values (`medvqa.untrusted`): a manifest that
    names code is refused with `UntrustedDataError`, naming the key."""
    meta_path = Path(weights_dir) / META_FILE
    if not meta_path.is_file() or not (Path(weights_dir) / WEIGHTS_FILE).is_file():
        return None
    try:
        meta = read_plain_json(meta_path, "weights manifest", "train again").value
    except UntrustedDataError:
        raise
    except ValueError:
        return None
    return meta if isinstance(meta, dict) else None


class WeightsMismatch(ValueError):
    """A weights file is not the one its manifest describes (damaged, truncated, replaced)."""


def verify_weights(weights_dir: Path, meta: dict[str, Any], where: str, fix: str) -> bool:
    """Check the weights file against the size and SHA-256 its manifest records, before any
    data or model work; False (and a warning) for a manifest from before they were recorded.
    A mismatch raises `WeightsMismatch` naming the file, what was expected and what was found."""
    path = Path(weights_dir) / WEIGHTS_FILE
    expected_size, expected_sha = meta.get("bytes"), meta.get("sha256")
    if not isinstance(expected_sha, str) or not isinstance(expected_size, int):
        log.warning(
            "%s: %s records no checksum (written before medvqa recorded them): %s is used "
            "unchecked",
            where,
            META_FILE,
            path,
        )
        return False
    size = path.stat().st_size
    if size != expected_size:
        raise WeightsMismatch(
            f"{where}: {path} has {size} bytes, its manifest {META_FILE} records "
            f"{expected_size}: the file is truncated or was replaced. {fix}"
        )
    found = file_hash(path)
    if found != expected_sha:
        raise WeightsMismatch(
            f"{where}: {path} has SHA-256 {found}, its manifest {META_FILE} records "
            f"{expected_sha}: the file is damaged or holds other weights. {fix}"
        )
    return True


def rows_digest(ids: Any) -> dict[str, Any]:
    """How many rows and a digest of their ids (order-free): what a manifest keeps of the rows
    its weights trained on, to tell that a splits.json is theirs."""
    keys = sorted({str(i) for i in ids})
    return {"n": len(keys), "sha256": content_hash(keys, length=None)}


def trained_before(weights_dir: Path, trained_for: str) -> dict[str, Any] | None:
    """The manifest of complete weights saved for the config `trained_for`, else None."""
    meta = read_manifest(weights_dir)
    if meta is None or meta.get("trained_for") != trained_for:
        return None
    return meta if isinstance(meta.get("global_step"), int) else None


def load_trainable(model: torch.nn.Module, weights_dir: Path, method: Any = None) -> None:
    """Load saved trainable parameters into a model that has the same method applied."""
    path = Path(weights_dir) / WEIGHTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; train with task=train_eval first")
    state = load_file(str(path))
    expected = {n for n, p in model.named_parameters() if p.requires_grad}
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(
            f"{path} does not match the model's trainable parameters (method {method!r}): "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}. Apply the same peft method "
            "and model before loading."
        )
    model.load_state_dict(state, strict=False)


def weights_fingerprint(model: torch.nn.Module, probe: int = 4096) -> str:
    """Identify the weights cheaply: shapes plus the first `probe` values of trainable tensors.

    Resuming must only reuse predictions of the same weights: a restarted job whose training
    re-ran (and may differ) must not mix its answers with the previous model's.
    """
    key = Hasher()
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    for name, param in params or list(model.named_parameters()):
        flat = param.detach().reshape(-1)[:probe].float().cpu()
        key.update(name).update(tuple(param.shape)).update(flat.numpy().tobytes())
    return key.hexdigest()
