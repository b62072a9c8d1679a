"""Signals that end a job, and where in the job they arrived.

A cluster ends jobs with SIGTERM (preemption, a time limit, `scancel`, `timeout`), a user with
SIGINT (Ctrl-C); submitit's requeue ends a job with `sys.exit(-1)`, Lightning turns a signal it
caught into `SIGTERMException` (a `SystemExit` whose code is None, i.e. 0). Left alone, each of
these leaves a record that says `running` and an exit status that can be 0. Inside
`interrupts_job()` both signals raise `Interrupted`, which the runner records as `interrupted`
with the stage and optimiser step (`where()`), and the process exits with 128 + the signal.

`Interrupted` is a BaseException (as KeyboardInterrupt is), so that `except Exception` blocks
on the way (a judge's retry loop, a best-effort cleanup) cannot swallow it. Files are written to
a temporary name and renamed (`medvqa.atomic`), so a signal mid-write tears nothing.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(BaseException):
    """The job was told to stop by a signal (`signum`) or a scheduler's exit (`signum` None)."""

    def __init__(self, signum: int | None, reason: str = "") -> None:
        self.signum = signum
        self.reason = reason or (signal.Signals(signum).name if signum else "stopped")
        super().__init__(self.reason)

    @property
    def exit_code(self) -> int:
        """The shell's convention for a process ended by a signal: 128 + its number."""
        return 128 + (self.signum or signal.SIGTERM)


def as_interrupted(err: BaseException) -> Interrupted | None:
    """`err` as an interruption, or None if it is something else (a crash, a divergence).

    A `SystemExit` that reaches a job is an interruption: Lightning's `SIGTERMException`
    (a rank of a multi-GPU job was signalled), submitit's `sys.exit(-1)` after it requeued a
    preempted or timed-out job, Lightning's `sys.exit(1)` after a KeyboardInterrupt.
    """
    if isinstance(err, Interrupted):
        return err
    if isinstance(err, KeyboardInterrupt):
        return Interrupted(signal.SIGINT)
    if isinstance(err, SystemExit):
        received = _state.get("signum")
        name = type(err).__name__
        return Interrupted(received or signal.SIGTERM, f"{name}({err.code!r})")
    return None


_state: dict[str, Any] = {}


def _raise(signum: int, frame: FrameType | None) -> None:
    name = signal.Signals(signum).name
    if "signum" in _state:  # the job is already stopping: let it record how it ended
        log.warning("received %s again: the job is already stopping (kill -9 ends it now)", name)
        return
    _state["signum"] = signum
    log.warning("received %s: stopping the job", name)
    raise Interrupted(signum)


@contextmanager
def interrupts_job() -> Iterator[None]:
    """Within: SIGTERM and SIGINT raise `Interrupted` (the previous handlers come back after).

    Only a signal still at its default handler is taken: a launcher that installed its own
    keeps it. submitit ignores SIGTERM because requeueing a job (its answer to SLURM's USR2
    before a time limit or preemption) makes SLURM send one; it then leaves with
    `sys.exit(-1)`, which the runner records as `interrupted` (`as_interrupted`).

    Lightning, when it runs, chains its own SIGTERM handler before this one (it forwards the
    signal to the ranks it started), so a signal mid-training still reaches every rank.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    before = {s: signal.getsignal(s) for s in SIGNALS}
    _state.clear()
    for s, handler in before.items():
        if handler in (signal.SIG_DFL, signal.default_int_handler):
            signal.signal(s, _raise)
        else:  # e.g. submitit's: its requeue sends SIGTERM, which it ignores on purpose
            log.info("%s keeps the handler installed before the job", signal.Signals(s).name)
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


@contextmanager
def stage(name: str, trainer: Any = None) -> Iterator[None]:
    """Name what the job is doing (and the trainer whose step counts) for `where()`; an error
    or signal leaving the block keeps the innermost stage it left."""
    previous = _state.get("where")
    _state["where"] = {"stage": name, "trainer": trainer}
    try:
        yield
    except BaseException:
        _state.setdefault("left", _describe(_state["where"]))
        raise
    finally:
        _state["where"] = previous


def _describe(at: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if at and at.get("stage"):
        out["stage"] = at["stage"]
    trainer = (at or {}).get("trainer")
    if trainer is not None:
        out["global_step"] = int(trainer.global_step)
    return out


def where() -> dict[str, Any]:
    """The stage the job was in when it was stopped (else the current one), with the optimiser
    step if a trainer was training."""
    return _state.get("left") or _describe(_state.get("where"))
