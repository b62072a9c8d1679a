"""A job's phases of GPU time (`Phase`) and their sum (`JobCost`), and the overhead phases a job
spends beside its samples and rows: loading the weights, compiling the decoder layers, writing
checkpoints."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from medvqa.models.loading import resolve_pretrained
from medvqa.planning.job_rates import family_of, kernels_of, row_family
from medvqa.planning.memory import Setup
from medvqa.planning.rates import JobRow, Measured, rows

# A job's kinds of phase; "load", "compile" and "checkpoint" are what a job spends beside its
# samples and rows (`OVERHEADS`).
PHASE_KINDS = ("load", "compile", "train", "checkpoint", "val", "generate")
OVERHEADS = ("load", "compile", "checkpoint")


@dataclass(frozen=True)
class Phase:
    """One phase of a job: `items` samples or rows at `per_s` per GPU."""

    kind: str  # one of PHASE_KINDS
    name: str
    items: float
    per_s: float
    basis: str
    # Where other jobs of a sweep share the pass (the untuned base's cached answers): its key.
    shared: tuple[Any, ...] | None = None

    @property
    def gpu_s(self) -> float:
        return self.items / self.per_s if self.items else 0.0


@dataclass(frozen=True)
class JobCost:
    """The GPU time of one job by phase; `missing` says why there is no estimate, `note` what
    else the reader should know (e.g. a task that needs no GPU)."""

    phases: tuple[Phase, ...] = ()
    gpus: int = 1
    sizes: str = ""
    measured: tuple[Measured, ...] = ()
    missing: str | None = None
    note: str = ""

    @property
    def gpu_hours(self) -> float:
        return self.hours(*PHASE_KINDS)

    @property
    def wall_hours(self) -> float:
        return self.gpu_hours / self.gpus

    @property
    def sources(self) -> list[str]:
        """Each measured row the estimate used: file:line and commit."""
        return sorted({m.cited for m in self.measured})

    @property
    def label(self) -> str:
        return label(self.measured)

    def hours(self, *kinds: str) -> float:
        return sum(p.gpu_s for p in self.phases if p.kind in kinds) / 3600


def label(measured: Iterable[Measured]) -> str:
    """'estimate, from <GPU> measured <dates>' for each GPU the figures come from."""
    dates: dict[str, set[str]] = {}
    for m in measured:
        dates.setdefault(m.gpu, set()).add(m.date)
    labels = [f"estimate, from {gpu} measured {', '.join(sorted(d))}" for gpu, d in dates.items()]
    return "; ".join(sorted(labels)) if labels else "no estimate"


# -- the overhead phases ----------------------------------------------------------------------


# Reading the weights and writing checkpoints: assumed, not measured (a node's local NVMe; a
# network file system can be slower). The estimate's basis says so where it uses them.
READ_GIB_PER_S = 2.0
WRITE_GIB_PER_S = 1.0
# AdamW's two moments in float32 per trained parameter, in every Lightning checkpoint.
ADAM_BYTES = 8


def _gib(n_bytes: float) -> float:
    return n_bytes / 2**30


def load_phase(setup: Setup) -> Phase:
    """Each GPU reads the model's weights once (assumed rate, `READ_GIB_PER_S`)."""
    gib = _gib(setup.params * setup.dtype_bytes)
    return Phase(
        "load", f"loading the weights, {gib:.1f} GiB per GPU", gib * setup.world_size,
        READ_GIB_PER_S, f"assumed {READ_GIB_PER_S:g} GiB/s read (not measured)",
    )  # fmt: skip


def compile_phase(job: DictConfig, setup: Setup) -> tuple[Phase, Measured] | str | None:
    """The seconds a measured job's fit spent beyond its steady rate (compiling the decoder
    layers, warming up), on every GPU, and where it was measured: the whole job of the same
    checkpoint (else family) and kernels. None for eager layers, a note where none was
    measured."""
    kernels, family = kernels_of(job), family_of(job.model)
    if kernels != "compiled":
        return None
    found = [r for r in rows(JobRow) if r.kernels == kernels and row_family(r) == family]
    if not found:
        return f"not counted: no whole job with compiled layers was measured for {job.model.name}"
    pretrained = resolve_pretrained(job.model)
    row = min(found, key=lambda r: r.pretrained != pretrained)
    phase = Phase(  # items: the seconds on every GPU
        "compile", "compiling the decoder layers, first steps (s)",
        row.compile_s * setup.world_size, 1.0,
        f"{row.compile_s:.0f} s beyond the steady rate in {row.preset}'s measured job "
        f"({row.measured.cited})",
    )  # fmt: skip
    return phase, row.measured


def checkpoint_phases(job: DictConfig, setup: Setup, samples: float, epochs: int) -> list[Phase]:
    """The fit's checkpoints as `callbacks.model_checkpoint` saves them (every epoch, or every
    `every_n_train_steps` optimiser steps; a top-k file and last.ckpt each time), each holding
    the trained weights and AdamW's moments, and the trained weights saved at the end; written
    while every GPU waits (assumed rate, `WRITE_GIB_PER_S`)."""
    saver = (job.get("callbacks") or {}).get("model_checkpoint")
    trained = _gib(setup.trainable * setup.trainable_bytes)
    out = [
        Phase(
            "checkpoint", f"saving the trained weights, {trained:.2f} GiB",
            trained * setup.world_size, WRITE_GIB_PER_S,
            f"assumed {WRITE_GIB_PER_S:g} GiB/s write (not measured)",
        )
    ]  # fmt: skip
    if saver is None:
        return out
    every = saver.get("every_n_train_steps")
    saves = int(samples // setup.global_batch) // int(every) if every else epochs
    files = int(saver.get("save_top_k", 1) != 0) + int(bool(saver.get("save_last")))
    each = _gib(setup.trainable * (setup.trainable_bytes + ADAM_BYTES))
    if saves * files:
        out.insert(
            0,
            Phase(
                "checkpoint", f"checkpoints, {saves} x {files} files of {each:.2f} GiB",
                saves * files * each * setup.world_size, WRITE_GIB_PER_S,
                f"assumed {WRITE_GIB_PER_S:g} GiB/s write (not measured)",
            ),
        )  # fmt: skip
    return out
