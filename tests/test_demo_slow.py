"""The demo as `make demo` runs it (default config, fresh cache): slow, run by `make test-slow`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def test_demo_beats_chance_and_the_untuned_base(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "MEDVQA_CACHE": str(tmp_path / "cache"), "WANDB_MODE": "offline"}
    proc = subprocess.run(
        [sys.executable, "run.py", "logger=csv", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = json.loads((tmp_path / "run" / "results.json").read_text())["metrics"]
    closed, open_ = m["test_iid/closed_acc"], m["test_iid/open_f1"]
    assert closed > m["chance/test_iid/closed_acc"] + 0.1
    assert closed > m["zero_shot/test_iid/closed_acc"] + 0.1
    assert open_ > m["zero_shot/test_iid/open_f1"] + 0.3
    assert m["robustness/rr_closed"] > 0.0 and m["robustness/rr_open"] > 0.0
