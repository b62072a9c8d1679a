"""`python run.py` for the tests, started from a process that has the libraries imported.

A run.py subprocess spends about 8 of its 13 seconds importing torch, Lightning, transformers
and the rest before the first line of medvqa's work; the suite starts dozens. The zygote is a
process (one per test worker) that imports those libraries once and waits; each run is a child
forked from it, which sets the run's environment, working directory, argv and output files and
then runs `run.py` as `__main__`, importing medvqa afresh (so medvqa's import-time steps, the
numerics re-exec among them, see the run's own environment). A child is a process of its own:
its exit status, its files and its crash are its own, as with `subprocess.run`.

What a fresh interpreter would read at import time from the environment is read once by the
zygote, from the test worker's environment: a test whose run needs another value of such a
variable, or signals to the process, starts a real subprocess (`run_main(..., fresh=True)`).

Protocol (one JSON line each way on stdin/stdout): {argv, env, cwd, out, err, timeout} ->
{returncode, timed_out}.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import signal
import sys
import time
import traceback

# Imported once, before any fork: the libraries a run imports (not medvqa: the child imports it).
PRELOAD = (
    "torch",
    "lightning.pytorch",
    "transformers",
    "peft",
    "hydra",
    "omegaconf",
    "pandas",
    "scipy.stats",
    "PIL.Image",
    "sklearn.metrics",
)


def _child(request: dict) -> None:
    """In the forked child: become the run and exit with its status (never returns)."""
    os.setsid()  # its own process group: a timeout kills the run and whatever it started
    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for fd, path, mode in ((0, os.devnull, os.O_RDONLY), (1, request["out"], None),
                               (2, request["err"], None)):  # fmt: skip
            flags = mode if mode is not None else os.O_WRONLY | os.O_CREAT | os.O_TRUNC
            target = os.open(path, flags, 0o644)
            os.dup2(target, fd)
            os.close(target)
        sys.stdout = sys.__stdout__  # fd 1, now the run's file (serve() pointed it at stderr)
        sys.argv = list(request["argv"][1:])
        script = sys.argv[0]
        # sys.path as a fresh `python script` would have it: the script's folder, then
        # PYTHONPATH's entries (a test's plug-in modules), then the interpreter's own.
        extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:1] = [os.path.dirname(os.path.abspath(script)), *extra]
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as err:
            code = err.code if isinstance(err.code, int) else (0 if err.code is None else 1)
            if err.code is not None and not isinstance(err.code, int):
                sys.stderr.write(f"{err.code}\n")
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed stream has nothing left to flush
                stream.flush()
    # The interpreter's own exit (atexit handlers: logging's flush, W&B's teardown), as a
    # process that ran run.py ends.
    sys.exit(code)


def _wait(pid: int, timeout: float) -> tuple[int, bool]:
    """The child's exit status (a signal's as -signum), and whether it was killed at timeout."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), False
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                os.killpg(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(status), True
        time.sleep(0.02)


def serve() -> None:
    for name in PRELOAD:
        with contextlib.suppress(ImportError):  # not installed: the child imports what it needs
            __import__(name)
    reply = sys.stdout
    sys.stdout = sys.stderr  # nothing the libraries print may reach the protocol's stream
    reply.write("ready\n")
    reply.flush()
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        code, timed_out = _wait(pid, float(request["timeout"]))
        reply.write(json.dumps({"returncode": code, "timed_out": timed_out}) + "\n")
        reply.flush()


if __name__ == "__main__":
    serve()
