"""Portable CPU numerics (medvqa/numerics.py): `MEDVQA_NUMERICS=portable` restarts run.py with
the CPU-independent kernels before numpy and torch load, sets one thread and no oneDNN, and the
run's record says what its figures were computed with. Whether the bits then agree across CPUs
is tests/test_tiny_fingerprint.py's and tests/test_demo_slow.py's question."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from medvqa import numerics
from tests.conftest import DISTRIBUTED_ENV, ROOT


def _env(**extra: str) -> dict[str, str]:
    """This environment without the portable settings, a launcher's ranks, or the switch."""
    drop = {*numerics.PORTABLE_ENV, *DISTRIBUTED_ENV, numerics.SWITCH}
    return {k: v for k, v in os.environ.items() if k not in drop} | extra


def test_the_mode_is_native_unless_asked_and_a_typo_is_refused() -> None:
    assert numerics.mode({}) == numerics.NATIVE
    assert numerics.mode({numerics.SWITCH: " Portable "}) == numerics.PORTABLE
    with pytest.raises(numerics.NumericsError, match="MEDVQA_NUMERICS='portible': use portable"):
        numerics.mode({numerics.SWITCH: "portible"})


def test_the_switch_restarts_the_process_with_the_portable_kernels() -> None:
    """The environment before the libraries load, then one thread and no oneDNN; torch really
    runs its default (non-SIMD) kernels."""
    probe = (
        "import sys; from medvqa import numerics; numerics.reexec_if_requested(); "
        "numerics.apply(); import json; "
        "print(json.dumps({'argv': sys.argv[1:], 'missing': numerics.missing(), "
        "**numerics.state()}))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe, "an", "argument"],
        cwd=ROOT,
        env=_env(**{numerics.SWITCH: "portable"}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    state = json.loads(proc.stdout.strip().splitlines()[-1])
    assert state["argv"] == ["an", "argument"]  # the same command line, started again
    assert state["missing"] == {}
    assert (state["mode"], state["capability"], state["threads"], state["mkldnn"]) == (
        "portable",
        "DEFAULT",
        numerics.THREADS,
        False,
    )
    assert state["mkl_cbwr"] == "AVX2"


def test_without_the_switch_nothing_changes() -> None:
    probe = (
        "from medvqa import numerics; numerics.reexec_if_requested(); numerics.apply(); "
        "import json; print(json.dumps(numerics.state()))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=_env(), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    state = json.loads(proc.stdout.strip().splitlines()[-1])
    assert state["mode"] == "native" and state["mkl_cbwr"] is None
    assert state["capability"] != "DEFAULT" or os.environ.get("ATEN_CPU_CAPABILITY") == "default"


def test_too_late_to_restart_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a process that already loaded numpy and torch (this one), the settings they read at
    load time can no longer take effect: both calls say how to start the command instead."""
    import numpy  # noqa: F401  (loaded here whatever ran before)
    import torch  # noqa: F401

    def no_restart(*args: object) -> None:  # never restart the test session itself
        raise AssertionError(f"restarted: {args}")

    monkeypatch.setattr(os, "execve", no_restart)
    for name in numerics.PORTABLE_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(numerics.SWITCH, "portable")
    with pytest.raises(numerics.NumericsError, match="came after numpy, torch loaded"):
        numerics.reexec_if_requested()
    with pytest.raises(numerics.NumericsError, match="ATEN_CPU_CAPABILITY=default"):
        numerics.apply()


@pytest.mark.slow
def test_a_run_records_its_numerics(tmp_path: Path) -> None:
    """`python run.py` under the switch: the record's provenance says portable, with the
    kernels, threads and oneDNN the figures were computed with (task=splits: no model)."""
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "run.py", "task=splits", "logger=csv", f"hydra.run.dir={run_dir}"],
        cwd=ROOT,
        env=_env(**{numerics.SWITCH: "portable", "MEDVQA_CACHE": str(tmp_path / "cache")}),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    made = json.loads((run_dir / "results.json").read_text())["provenance"]["numerics"]
    assert (made["mode"], made["capability"], made["threads"], made["mkldnn"]) == (
        "portable",
        "DEFAULT",
        numerics.THREADS,
        False,
    )
