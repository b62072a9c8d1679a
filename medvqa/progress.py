"""Signs of life where nobody watches a terminal: a log line every few steps or seconds.

On a cluster stdout is a file: a progress bar there is either silent or one endless line of
carriage returns, and a 7B fit would show nothing for hours. Where stdout is not a terminal
(`when: auto`), fitting, generation and judging log a line through `logging` (Hydra's run.log
and stdout) every `every_n_steps` optimiser steps (fitting) or `every_s` seconds, whichever
comes first, and at the end: done / total, rate, ETA, and what the stage adds (loss, learning
rate, epoch). On a terminal the progress bars do that job and these lines stay off.

The settings are process-wide, like logging's level: the runner applies the run's `progress`
node once (`configure`); code that reports progress makes a `Ticker`.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("medvqa.progress")

WHEN = ("auto", "always", "never")


@dataclass
class ProgressSettings:
    """The `progress` node: when progress lines are logged, and how often."""

    # auto: where stdout is not a terminal (a batch job's log file); always; never.
    when: str = "auto"
    # A fit's line every this many optimiser steps ...
    every_n_steps: int = 50
    # ... or this many seconds since the last line (generation and judging: seconds only).
    every_s: float = 60.0


_settings = ProgressSettings()


def configure(node: Mapping[str, Any] | ProgressSettings | None) -> ProgressSettings:
    """Apply a run's `progress` node (None: the defaults) for this process; return it."""
    global _settings
    given = node if isinstance(node, ProgressSettings) else ProgressSettings(**dict(node or {}))
    _settings = given
    return _settings


def settings() -> ProgressSettings:
    """The settings `configure` applied (the defaults before)."""
    return _settings


def enabled(stream: Any = None) -> bool:
    """Whether progress lines are logged: `when`, and for `auto` whether `stream` (stdout)
    is a terminal."""
    when = _settings.when
    if when != "auto":
        return when == "always"
    stream = sys.stdout if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return not (callable(isatty) and isatty())


def duration(seconds: float) -> str:
    """`1h02m`, `3m05s`, `42s`: an ETA or an elapsed time, short enough for a log line."""
    if seconds != seconds or seconds == float("inf"):  # NaN, inf: no rate yet
        return "?"
    s = round(max(seconds, 0.0))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class Ticker:
    """Progress of one stage (`what`): `update(done)` logs a line when one is due.

    A line is due every `every_n` units (None: by time only), every `every_s` seconds, and
    when `done` reaches `total`. The rate and ETA count from the ticker's making, so the
    first steps' compiling slows the first lines' rate, as it slows the stage. `clock` is
    injectable for tests.
    """

    def __init__(
        self,
        what: str,
        total: int | None,
        unit: str,
        every_n: int | None = None,
        enabled_: bool | None = None,
        first: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what, self.total, self.unit = what, total, unit
        self.every_n = every_n
        self.every_s = float(_settings.every_s)
        self.on = enabled() if enabled_ is None else enabled_
        self.clock = clock
        self.start = clock()
        self.last_time = self.start
        # Where this process starts (a resumed fit's step): the rate counts what it does.
        self.first = self.last_done = int(first)
        self.lines = 0  # how many lines were logged (tests, callers)

    def due(self, done: int) -> bool:
        """Whether a line is due at `done` (without logging it)."""
        if not self.on or done <= self.last_done:
            return False
        if self.total is not None and done >= self.total:
            return True
        if self.every_n is not None and done // self.every_n > self.last_done // self.every_n:
            return True
        return self.clock() - self.last_time >= self.every_s

    def line(self, done: int, extra: Mapping[str, str] | None = None) -> str:
        """The line at `done`: `fit: 120/600 steps (20%), 1.3 steps/s, ETA 6m10s, loss 0.87`."""
        elapsed = self.clock() - self.start
        rate = (done - self.first) / elapsed if elapsed > 0 else float("nan")
        parts = [f"{done}/{self.total}" if self.total is not None else str(done)]
        parts[0] += f" {self.unit}"
        if self.total:
            parts[0] += f" ({100 * done / self.total:.0f}%)"
        parts.append(f"{rate:.3g} {self.unit}/s" if rate == rate else f"? {self.unit}/s")
        if self.total is not None:
            left = (self.total - done) / rate if rate and rate == rate else float("nan")
            parts.append(f"ETA {duration(left)}")
        parts.append(f"elapsed {duration(elapsed)}")
        parts += [f"{k} {v}" for k, v in (extra or {}).items()]
        return f"{self.what}: " + ", ".join(parts)

    def update(self, done: int, extra: Mapping[str, str] | None = None) -> bool:
        """Log the line at `done` if one is due; return whether it was logged."""
        if not self.due(done):
            return False
        log.info(self.line(done, extra))
        self.last_time, self.last_done = self.clock(), done
        self.lines += 1
        return True
