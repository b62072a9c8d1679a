"""How a console script says no: its message and exit status 2, without a traceback.

A refusal (a file that cannot be read, a value that cannot work, an output folder that holds
something else, a record that names code) says what is wrong and the fix; a traceback above it
adds nothing for the user and hides it. `MEDVQA_TRACEBACK=1` logs the traceback too, for those
who debug medvqa itself. `run.py` says no the same way (`medvqa.runner`; its traceback goes to
the run's log file).
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("medvqa.cli")

# The exit status of a refused input or value (argparse's own, for a bad argument).
EXIT_REFUSED = 2
TRACEBACK_ENV = "MEDVQA_TRACEBACK"
# What a console script's inputs and options fail with when they are refused: the messages of
# medvqa's own checks (ValueError: ConfigError, ScoreInputError, RatingError, a record naming
# code...; OSError: a file or folder that is missing, unreadable or in the way).
REFUSALS = (ValueError, OSError)


def refused(prog: str, err: BaseException) -> int:
    """Log `prog: message` (the traceback too with MEDVQA_TRACEBACK=1); the exit status."""
    log.error("%s: %s", prog, err, exc_info=err if os.environ.get(TRACEBACK_ENV) else None)
    return EXIT_REFUSED
