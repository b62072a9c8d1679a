"""The test tiers' own machinery: what `make test-slow` relies on to run a shared expensive
fixture once (tests/test_demo_slow.py runs the demo once for three tests)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import os
import pytest

pytestmark = pytest.mark.xdist_group("shared")


@pytest.mark.parametrize("case", range(4))
def test_case(case):
    with open(os.environ["PROBE_LOG"], "a") as log:
        log.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
"""


@pytest.mark.heavy
def test_an_xdist_group_runs_in_one_worker(tmp_path: Path) -> None:
    """pytest-xdist's `--dist loadgroup` sends a module's `xdist_group` to one worker. Under
    pytest 9.2 it silently does not (pytest-xdist#1386: the group rides on a node id pytest no
    longer reads), and each worker of the slow tier ran its own demo: constraints.txt keeps
    pytest below 9.2 until xdist follows."""
    (tmp_path / "test_probe.py").write_text(PROBE)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    log = tmp_path / "workers.txt"
    command = "-m pytest -p no:cacheprovider -n 2 --dist loadgroup -q test_probe.py"
    proc = subprocess.run(
        [sys.executable, *command.split()],
        cwd=tmp_path,
        env={"PROBE_LOG": str(log), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    workers = log.read_text().split()
    assert len(workers) == 4, workers
    assert len(set(workers)) == 1, (
        f"the group's tests ran on workers {sorted(set(workers))}: --dist loadgroup does not "
        f"hold with pytest {pytest.__version__} (pytest-xdist#1386); install constraints.txt's "
        "pytest"
    )
