"""The demo as `make demo` runs it (default config, fresh cache): slow, run by `make test-slow`.
One demo run serves both checks: it beats its references, and it prints README.md's table where
that table was made (tests/test_demo_table.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import DISTRIBUTED_ENV, ROOT
from tests.test_demo_table import DEMO_CPU, THREAD_ENV, printed, readme_table, this_cpu

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`python run.py` with defaults from an empty cache, with torch's default threads."""
    tmp_path = tmp_path_factory.mktemp("demo")
    env = {k: v for k, v in os.environ.items() if k not in (*DISTRIBUTED_ENV, *THREAD_ENV)} | {
        "MEDVQA_CACHE": str(tmp_path / "cache"),
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
    }
    proc = subprocess.run(
        [sys.executable, "run.py", "logger=csv", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp_path / "run"


def test_demo_beats_chance_and_the_untuned_base(demo_run: Path) -> None:
    m = json.loads((demo_run / "results.json").read_text())["metrics"]
    closed, open_ = m["test_iid/closed_acc"], m["test_iid/open_f1"]
    assert closed > m["chance/test_iid/closed_acc"] + 0.1
    assert closed > m["zero_shot/test_iid/closed_acc"] + 0.1
    assert open_ > m["zero_shot/test_iid/open_f1"] + 0.3
    assert m["robustness/rr_closed"] > 0.0 and m["robustness/rr_open"] > 0.0


def test_the_demo_prints_the_readme_table(demo_run: Path) -> None:
    cpu = this_cpu()
    if cpu != DEMO_CPU:
        pytest.skip(
            f"README's demo table was made on {DEMO_CPU}, this machine is {cpu}: other CPU "
            "kernels and thread counts train other weights, so its figures differ "
            "(tests/test_demo_table.py); re-measure the table on such a machine to compare here"
        )
    summary = pd.read_csv(demo_run / "summary.csv")
    columns = ["closed i.i.d.", "closed OoD", "closed RR", "open i.i.d.", "open OoD", "open RR"]
    made = {row["method"]: [printed(row[c]) for c in columns] for _, row in summary.iterrows()}
    assert made == readme_table(), (
        "the demo from an empty cache no longer prints README.md's table; if the change is "
        f"meant, put these figures in its Quick start section: {made}"
    )
