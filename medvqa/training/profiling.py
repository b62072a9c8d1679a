"""A profile of a few steady optimiser steps of a real fit, summarised where the next speed-up
should come from: the share of the device's time in GEMMs, attention, other kernels
(elementwise, norms, the optimiser), communication and memory copies, the share it sat idle,
and the top kernels.

Added to any job as a callback (Lightning's own PyTorchProfiler writes a report per action; this
one answers the question above and records the answer in the run):

    python run.py ... +callbacks.step_profile._target_=medvqa.training.profiling.StepProfile \\
        +callbacks.step_profile.start=45 +callbacks.step_profile.steps=3

It profiles optimiser steps `start` .. `start + steps - 1` (after the compiled layers have
warmed up; before the steady window `perf/fit/steady_*` measures, the second half of the fit,
where profiling would slow it), exports the Chrome trace (chrome://tracing, Perfetto) to
`profile/` in the run directory and records the summary as `perf/profile/...` metrics.
"""

from __future__ import annotations

import json
import logging
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch

from medvqa import measure

log = logging.getLogger(__name__)

# Kernel (GPU) or operator (CPU) name patterns, first match wins; anything else is "other".
CATEGORIES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("communication", re.compile(r"nccl|all_?reduce|all_?gather|reduce_?scatter", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|attn|sdpa|scaled_dot_product", re.I)),
    (
        "gemm",
        re.compile(
            r"gemm|xmma|cutlass|cublas|nvjet|wgmma|matmul|scaled_mm|aten::(add|b)?mm\b", re.I
        ),
    ),
)
MEMORY = "memory copies"
SHARES = ("gemm", "attention", "other", "communication", MEMORY)


def category(name: str) -> str:
    for label, pattern in CATEGORIES:
        if pattern.search(name):
            return label
    return "other"


@dataclass
class ProfileSummary:
    """Where a profiled window's device time went (`device`: "cuda" kernels, or "cpu" ops'
    self time where no kernel ran)."""

    device: str
    window_us: float
    busy_us: float
    by_category: dict[str, float]  # microseconds
    top: list[tuple[str, int, float]] = field(default_factory=list)  # name, calls, us

    @property
    def idle_share(self) -> float:
        return max(0.0, 1 - self.busy_us / self.window_us) if self.window_us else float("nan")

    def share(self, label: str) -> float:
        return self.by_category.get(label, 0.0) / self.window_us if self.window_us else float("nan")

    def metrics(self) -> dict[str, float]:
        out = {f"{label.replace(' ', '_')}_share": self.share(label) for label in SHARES}
        return out | {"idle_share": self.idle_share, "window_ms": self.window_us / 1e3}

    def table(self) -> str:
        """The summary as markdown (docs/gpus.md quotes it)."""
        lines = [
            f"{self.device} time over {self.window_us / 1e3:.1f} ms profiled:",
            "",
            "| where | share |",
            "|---|---|",
            *(f"| {label} | {100 * self.share(label):.1f} % |" for label in SHARES),
            f"| idle | {100 * self.idle_share:.1f} % |",
            "",
            "| kernel | calls | ms | share |",
            "|---|---|---|---|",
            *(
                f"| `{name[:90]}` | {calls} | {us / 1e3:.2f} | {100 * us / self.window_us:.1f} % |"
                for name, calls, us in self.top
            ),
        ]
        return "\n".join(lines)


def _union(intervals: Iterable[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _self_times(ops: list[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], float]]:
    """CPU ops nest (aten::linear calls aten::addmm): each op's time less its children's, per
    thread."""
    out = []
    by_thread: dict[Any, list[Mapping[str, Any]]] = defaultdict(list)
    for op in ops:
        by_thread[(op.get("pid"), op.get("tid"))].append(op)
    for thread in by_thread.values():
        thread.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[list[Any]] = []  # [event, end, children's time]
        for op in thread:
            while stack and op["ts"] >= stack[-1][1]:
                done = stack.pop()
                out.append((done[0], done[0]["dur"] - done[2]))
            if stack:
                stack[-1][2] += op["dur"]
            stack.append([op, op["ts"] + op["dur"], 0.0])
        out.extend((e, e["dur"] - children) for e, _, children in stack)
    return out


def summarise(events: list[Mapping[str, Any]], top: int = 12) -> ProfileSummary:
    """The summary of a Chrome trace's events (`traceEvents` of torch.profiler's export): GPU
    kernels and memory copies where there are any, else the CPU ops' self times."""
    complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
    kernels = [e for e in complete if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if kernels:
        device = "cuda"
        timed = [(e, float(e["dur"])) for e in kernels]
        busy = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in kernels]
    else:
        device = "cpu"
        ops = [e for e in complete if e.get("cat") == "cpu_op"]
        if not ops:
            raise ValueError("the trace has neither GPU kernels nor CPU ops: nothing was profiled")
        timed = _self_times(ops)
        busy = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in ops]
    # the wall window: profiler steps where marked, else every operator and kernel profiled
    steps = [e for e in complete if str(e.get("name", "")).startswith("ProfilerStep#")]
    span = steps or [e for e in complete if e.get("cat") in ("cpu_op", "kernel", "gpu_memcpy")]
    start = min(float(e["ts"]) for e in span)
    window = max(float(e["ts"]) + float(e["dur"]) for e in span) - start
    by_category: dict[str, float] = defaultdict(float)
    per_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for event, us in timed:
        name = str(event.get("name", ""))
        label = MEMORY if event.get("cat") in ("gpu_memcpy", "gpu_memset") else category(name)
        by_category[label] += us
        per_name[name][0] += 1
        per_name[name][1] += us
    ranked = sorted(per_name.items(), key=lambda kv: -kv[1][1])[:top]
    return ProfileSummary(
        device,
        window,
        _union(busy),
        dict(by_category),
        [(name, int(calls), float(us)) for name, (calls, us) in ranked],
    )


def summarise_file(path: str | Path, top: int = 12) -> ProfileSummary:
    """The summary of an exported Chrome trace; a file that is not one is refused by name."""
    try:
        trace = json.loads(Path(path).read_text())
        events = trace["traceEvents"] if isinstance(trace, dict) else trace
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a Chrome trace of torch.profiler ({err})") from err
    return summarise(events, top)


class StepProfile(L.Callback):
    """Profile optimiser steps `start` .. `start + steps - 1` of the fit (module docstring)."""

    def __init__(self, start: int = 45, steps: int = 3, dirpath: str | None = None) -> None:
        if start < 0 or steps < 1:
            raise ValueError(
                f"StepProfile: start={start}, steps={steps}: need start >= 0, steps >= 1"
            )
        self.start, self.steps, self.dirpath = start, steps, dirpath
        self._profiler: torch.profiler.profile | None = None
        self._first = 0  # the optimiser step the profile began at
        self.summary: ProfileSummary | None = None

    def _out(self, trainer: L.Trainer) -> Path:
        return Path(self.dirpath or Path(trainer.default_root_dir) / "profile")

    def on_train_batch_start(self, trainer: L.Trainer, module: Any, batch: Any, i: int) -> None:
        if self._profiler is None and self.summary is None and trainer.global_step >= self.start:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._profiler = torch.profiler.profile(activities=activities)
            self._profiler.__enter__()
            self._first = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, module: Any, *args: Any) -> None:
        if self._profiler is not None and trainer.global_step >= self._first + self.steps:
            self._finish(trainer)

    def on_train_end(self, trainer: L.Trainer, module: Any) -> None:
        if self._profiler is not None:  # the fit ended inside the window
            self._finish(trainer)

    def _finish(self, trainer: L.Trainer) -> None:
        profiler, self._profiler = self._profiler, None
        assert profiler is not None
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        profiler.__exit__(None, None, None)
        if not trainer.is_global_zero:
            return
        out = self._out(trainer)
        out.mkdir(parents=True, exist_ok=True)
        trace = out / "trace.json"
        profiler.export_chrome_trace(str(trace))
        self.summary = summarise_file(trace)
        (out / "summary.md").write_text(self.summary.table() + "\n")
        steps = trainer.global_step - self._first
        measure.note("profile", {**self.summary.metrics(), "steps": float(steps)})
        log.info("profile of %d optimiser steps: %s", steps, out / "summary.md")
