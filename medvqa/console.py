"""One console for the tables and log lines medvqa's commands print.

Off a terminal (a pipe, a SLURM `.out` file, CI) rich assumes 80 columns (or `COLUMNS`, which
pytest-xdist and some shells set to 80 too) and wraps a table mid-cell or a log line mid-word;
there nothing limits the width, so medvqa gives it at least `WIDTH_OFF_TERMINAL` columns. On a
terminal the terminal's width holds.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

from rich.console import Console

WIDTH_OFF_TERMINAL = 200  # the widest table (task=plan's sweep and layouts) stays on one line


def _on_a_terminal(stream: TextIO) -> bool:
    """The stream itself is a terminal (FORCE_COLOR, which CI sets for colours, does not count)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed file
        return False


def console(*, stderr: bool = False) -> Console:
    """A console: the terminal's width on a terminal, `WIDTH_OFF_TERMINAL` or more off one."""
    probe = Console(stderr=stderr)
    if _on_a_terminal(sys.stderr if stderr else sys.stdout):
        return probe
    return Console(stderr=stderr, width=max(probe.width, WIDTH_OFF_TERMINAL))


def rich_logging(level: int = logging.INFO) -> None:
    """Log through rich, at the width `console` gives."""
    from rich.logging import RichHandler

    handler = RichHandler(console=console())
    logging.basicConfig(level=level, format="%(message)s", handlers=[handler])
