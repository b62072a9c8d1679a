"""Where a run's numbers came from, recorded in `results.json` under `provenance`.

Two tables can only be compared if they were computed by the same code on the same data with
the same model and judge. The runner starts the record with the environment (git commit and
whether the checkout had uncommitted changes, the versions of the packages that compute the
numbers, the device); the task adds what it loaded: the dataset's fingerprint, the model's
source, revision, config hash and weights fingerprint, and each metric family's identity (the
judge model and rubric hashes). `medvqa-report` lists them per table.
"""

from __future__ import annotations

import logging
import os
import platform
import subprocess
from collections.abc import Iterable, Mapping, MutableMapping
from importlib import metadata
from typing import Any

from medvqa import REPO_ROOT, numerics
from medvqa.hashing import content_hash
from medvqa.training.hardware import ALLOC_CONF_ENV

log = logging.getLogger(__name__)

# The distributions whose versions change the numbers (deepspeed: only when installed), after
# medvqa's own (recorded as `medvqa`, whatever its distribution is called).
PACKAGES = ("torch", "transformers", "peft", "lightning", "deepspeed")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state() -> dict[str, Any]:
    """The commit of the medvqa checkout and whether tracked files differ from it; both None
    for an installed package that is not a git checkout."""
    if not (REPO_ROOT / ".git").exists():
        return {"commit": None, "dirty": None}
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def versions(packages: Iterable[str] = PACKAGES) -> dict[str, str | None]:
    """Installed version of medvqa and of each distribution (None where it is not installed),
    and Python's."""
    own = metadata.packages_distributions().get(__name__.split(".")[0], [])
    out: dict[str, str | None] = {"python": platform.python_version(), "medvqa": None}
    if own:
        out["medvqa"] = metadata.version(own[0])
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def device() -> str:
    """The accelerator the run could use (CUDA device name), else the CPU."""
    try:
        import torch

        if torch.cuda.is_available():
            return f"cuda: {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
    except Exception:  # a broken CUDA setup must not stop the record
        log.debug("no CUDA device name", exc_info=True)
    return f"cpu: {platform.processor() or platform.machine()}"


# What nvidia-smi reports of each GPU beside its name (torch knows neither).
SMI_FIELDS = ("name", "driver_version", "memory.total")


def gpus() -> list[dict[str, str]] | None:
    """Each visible GPU's name, NVIDIA driver and memory (nvidia-smi's words: `81559 MiB`);
    None where nvidia-smi is absent or fails (a CPU machine). A figure measured on a GPU
    names the driver it ran under."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    rows = [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines() if line]
    return [dict(zip(SMI_FIELDS, r, strict=False)) for r in rows if len(r) == len(SMI_FIELDS)]


def environment() -> dict[str, Any]:
    """What the runner records before the task starts (the CUDA allocator's settings too: they
    change the memory a job reserves, docs/gpus.md#a-whole-job-on-one-gpu-make-gpu-check)."""
    return {
        "git": git_state(),
        "versions": versions(),
        "device": device(),
        "gpus": gpus(),
        "cuda_alloc_conf": os.environ.get(ALLOC_CONF_ENV),
        "numerics": numerics.state(),
    }


def add_data(provenance: MutableMapping[str, Any] | None, source: Any) -> None:
    """The dataset's name, root and content fingerprint (annotation files + loader options)."""
    if provenance is None:
        return
    provenance["data"] = {
        "dataset": getattr(source, "name", type(source).__name__),
        "root": str(getattr(source, "root", "")),
        "fingerprint": source.fingerprint(),
    }


def add_model(provenance: MutableMapping[str, Any] | None, model: Any) -> None:
    """Where the base model was loaded from (hub id or directory), its hub revision (when
    loaded from the hub), a hash of its config and a fingerprint of its weights as loaded."""
    if provenance is None:
        return
    from medvqa.models.saving import weights_fingerprint

    config = model.config.to_dict()
    provenance["model"] = {
        "source": getattr(model.config, "_name_or_path", None),
        "revision": getattr(model.config, "_commit_hash", None),
        "class": type(model).__name__,
        "config_hash": content_hash(
            {k: v for k, v in config.items() if not k.startswith("_") and k != "name_or_path"}
        ),
        "weights_fingerprint": weights_fingerprint(model),
    }


def add_trained(
    provenance: MutableMapping[str, Any] | None, manifest: Mapping[str, Any] | None
) -> None:
    """The manifest of the weights this run trained (method, sizes, the config fingerprint
    they were trained for, the step): `eval.from_run` checks its trained/ folder against it."""
    if provenance is not None and manifest is not None:
        provenance["trained"] = dict(manifest)


def add_metrics(provenance: MutableMapping[str, Any] | None, families: Iterable[Any]) -> None:
    """Each metric family's identity: what its own `provenance()` says (the judge: backend,
    model, mode and rubric hashes), and `ci_columns`, the per-sample column and answer type
    of each score that is a per-sample mean (how the report pairs two runs' scored tables)."""
    if provenance is None:
        return
    out = {}
    for family in families:
        entry = dict(family.provenance())
        if columns := family.ci_columns():
            entry["ci_columns"] = {k: list(v) for k, v in columns.items()}
        out[family.name] = entry
    provenance["metrics"] = out
