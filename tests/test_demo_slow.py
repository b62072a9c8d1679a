"""The demo as `make demo` runs it (default config, portable numerics, fresh cache): slow, run
by `make test-slow`. One demo run serves both checks: it beats its references, and it prints
README.md's table on any x86-64 CPU (tests/test_demo_table.py)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from medvqa import numerics
from tests.conftest import DISTRIBUTED_ENV, ROOT
from tests.test_browser import browser, downloads  # noqa: F401  (fixtures)
from tests.test_demo_table import printed, readme_table

# One fixture for both tests, and one test module that pytest-xdist may split between workers:
# each worker would run its own demo, so the module's tests run in one worker (xdist_group,
# with --dist loadgroup) or, without it, one after the other.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("demo")]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`make demo`'s command: `python run.py` with defaults from an empty cache, under
    `MEDVQA_NUMERICS=portable` (run.py starts again with the rest of the portable settings)."""
    tmp_path = tmp_path_factory.mktemp("demo")
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_ENV} | {
        numerics.SWITCH: numerics.PORTABLE,
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
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip(f"the table is made on x86-64; {platform.machine()} has other kernels")
    made_under = json.loads((demo_run / "results.json").read_text())["provenance"]["numerics"]
    assert made_under["mode"] == numerics.PORTABLE, made_under
    assert (made_under["capability"], made_under["threads"], made_under["mkldnn"]) == (
        "DEFAULT",
        numerics.THREADS,
        False,
    ), made_under
    if not made_under.get("mkl_branch_supported", True):
        pytest.skip(f"{made_under['cpu']} has no AVX2/FMA: MKL cannot take the pinned branch")
    summary = pd.read_csv(demo_run / "summary.csv")
    columns = ["closed i.i.d.", "closed OoD", "closed RR", "open i.i.d.", "open OoD", "open RR"]
    made = {row["method"]: [printed(row[c]) for c in columns] for _, row in summary.iterrows()}
    assert made == readme_table(), (
        f"the demo from an empty cache on this CPU ({made_under['cpu']}) no longer prints "
        "README.md's table. If the change is meant, put these figures in its Quick start "
        f"section: {made}. If only this CPU differs, the portable numerics (medvqa/numerics.py) "
        "miss a CPU-specific code path."
    )


def test_the_demo_report_has_an_explorer_a_browser_filters(
    demo_run: Path,
    tmp_path: Path,
    browser: Any,  # noqa: F811  (the fixture of tests/test_browser.py)
) -> None:
    """`medvqa-report` on the demo: explorer.html holds every scored row of the run with the
    image it saw, and a filter clicked in headless Chromium keeps the rows it should."""
    from selenium.webdriver.common.by import By

    from medvqa.analysis.aggregate import collect
    from medvqa.analysis.explorer import ASSETS, THUMBS
    from medvqa.analysis.report import build_report
    from medvqa.scoring.metrics.traditional import binary_correct
    from tests.test_browser import _count, _select, shown_images

    report = build_report(collect([demo_run]), tmp_path / "report")
    scored = pd.read_parquet(demo_run / "scores.parquet")
    n = len(scored)
    ood = scored[scored["split"] == "test_ood"]
    wrong = int((binary_correct(ood) == 0).sum())
    assert len(list((tmp_path / "report" / ASSETS / THUMBS).iterdir())) == scored["image"].nunique()

    browser.get(report.files["html"].as_uri())
    browser.find_element(By.ID, "explorer").click()
    assert _count(browser) == f"{n} of {n} rows"
    _select(browser, "split", "test_ood")
    assert _count(browser) == f"{len(ood)} of {n} rows"
    _select(browser, "correct", "0")
    assert _count(browser) == f"{wrong} of {n} rows"
    images = shown_images(browser)  # a page of rows
    assert len(images) == 50
    assert all((tmp_path / "report" / src).is_file() and loaded != 0 for src, loaded in images)
    assert any(loaded > 0 for _, loaded in images)
