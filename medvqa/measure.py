"""What a run measures of itself: per phase its wall time, the items it processed and this
rank's peak GPU memory, so a researcher can tell from results.json whether their cluster runs
as it should (docs/measurements.md has measured figures to compare with).

Phases are named by the code that runs them (`plan`, `data`, `load`, `fit`,
`generate/<file stem>`, `score`);
a phase entered again (a job's splits) adds to its time and items and keeps the higher peak.
Results go to `perf/<phase>/...` metrics next to the run's scores.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

GIB = 1024**3
# Its metrics' prefix: results.json keeps them apart from the scores (`perf`, not `metrics`),
# which the same seed reproduces and these timings never do.
PERF_PREFIX = "perf/"
# Set by VQAModule on each training batch while it is still on the host: its sample, token and
# image-patch counts (medvqa.models.flops.add_batch), which `medvqa.training.module.SampleCounter` sums without a GPU sync.
BATCH_COUNTS_KEY = "batch_counts"


@dataclass
class Phase:
    seconds: float = 0.0
    items: int = 0
    unit: str = ""
    peak_allocated: int = 0  # bytes, torch.cuda.max_memory_allocated on this rank's device
    peak_reserved: int = 0  # bytes held by the caching allocator (about nvidia-smi minus context)
    # (seconds since the phase began, items so far) at each step: the steady rate leaves out
    # the first half, where compilation, the allocator's growth and the first step's set-up fall
    marks: list[tuple[float, int]] = field(default_factory=list)
    start: float = 0.0
    sums: dict[str, float] = field(default_factory=dict)  # this rank's batch counts
    extra: dict[str, float] = field(default_factory=dict)  # derived afterwards (`note`: MFU)

    def mark(self, items: int) -> None:
        """Add `items` done by now (a training micro-batch)."""
        self.items += items
        self.marks.append((time.perf_counter() - self.start, self.items))

    @property
    def steady_rate(self) -> float:
        """Items per second over the second half of the marks (NaN with fewer than 4)."""
        if len(self.marks) < 4:
            return float("nan")
        (t0, n0), (t1, n1) = self.marks[len(self.marks) // 2 - 1], self.marks[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else float("nan")


_phases: dict[str, Phase] = {}


def split_perf(metrics: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the scores, the `perf/...` measurements) of a flat metrics mapping: results.json and a
    W&B run's record keep them apart."""
    scores = {k: v for k, v in metrics.items() if not str(k).startswith(PERF_PREFIX)}
    return scores, {k: v for k, v in metrics.items() if str(k).startswith(PERF_PREFIX)}


def reset() -> None:
    """Start a job's measurements afresh (a local multirun runs its jobs in one process)."""
    _phases.clear()


def _cuda() -> bool:
    """Whether this process uses a GPU; without importing torch (a console script that never
    did has none), so that recording a run's measurements stays cheap."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized()


@contextmanager
def measured(name: str, unit: str = "") -> Iterator[Phase]:
    """Time the block and take this rank's CUDA peak within it; the caller adds to the yielded
    `Phase.items` what the block processed (samples, rows)."""
    current = Phase(unit=unit)
    torch = sys.modules.get("torch")
    if _cuda():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = current.start = time.perf_counter()
    try:
        yield current
    finally:
        if _cuda():
            torch.cuda.synchronize()
            current.peak_allocated = torch.cuda.max_memory_allocated()
            current.peak_reserved = torch.cuda.max_memory_reserved()
        current.seconds = time.perf_counter() - start
        total = _phases.setdefault(name, Phase(unit=unit))
        total.seconds += current.seconds
        total.items += current.items
        total.peak_allocated = max(total.peak_allocated, current.peak_allocated)
        total.peak_reserved = max(total.peak_reserved, current.peak_reserved)
        total.marks = current.marks or total.marks  # the steady rate of the last entry
        for key, value in current.sums.items():
            total.sums[key] = total.sums.get(key, 0.0) + value
        log.info("measured %s: %s", name, _describe(current))


def note(name: str, values: dict[str, float]) -> None:
    """Add figures derived from a finished phase (the fit's MFU) to its `perf/<name>/...`."""
    if values:
        _phases.setdefault(name, Phase()).extra.update(values)
        log.info("measured %s: %s", name, ", ".join(f"{k} {v:.4g}" for k, v in values.items()))


def _describe(p: Phase) -> str:
    text = f"{p.seconds:.1f} s"
    if p.unit:
        rate = p.items / p.seconds if p.seconds > 0 else float("nan")
        text += f", {p.items} {p.unit} ({rate:.2f}/s)"
        if p.marks:
            text += f", {p.steady_rate:.2f}/s over the second half"
    if p.peak_reserved:
        text += (
            f", GPU peak {p.peak_allocated / GIB:.1f} GiB allocated, "
            f"{p.peak_reserved / GIB:.1f} GiB reserved"
        )
    return text


def metrics() -> dict[str, float]:
    """`perf/<phase>/seconds`, `.../<unit>_per_s` (NaN for a phase that processed nothing: a
    resumed split's), `.../steady_<unit>_per_s` where the phase marked its steps, and the peak
    GiB where a GPU was used."""
    out: dict[str, float] = {}
    for name, p in _phases.items():
        key = f"{PERF_PREFIX}{name}"
        out[f"{key}/seconds"] = p.seconds
        if p.unit:
            out[f"{key}/{p.unit}"] = float(p.items)
            ok = p.items > 0 and p.seconds > 0
            out[f"{key}/{p.unit}_per_s"] = p.items / p.seconds if ok else float("nan")
            if p.marks:
                out[f"{key}/steady_{p.unit}_per_s"] = p.steady_rate
        for name_, value in p.extra.items():
            out[f"{key}/{name_}"] = value
        if p.peak_reserved:
            out[f"{key}/peak_allocated_gib"] = p.peak_allocated / GIB
            out[f"{key}/peak_reserved_gib"] = p.peak_reserved / GIB
    return out
