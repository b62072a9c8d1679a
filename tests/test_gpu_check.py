"""`make gpu-check`'s dry run on the CPU (`benchmarks/gpu_check.sh --cpu`): the same stages as
shrunk rehearsals (the job with the study's defaults, ZeRO-2 through DeepSpeed's CPU test
strategy, trained, saved and resumed), so the script that a GPU machine runs once works."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def test_the_gpu_check_runs_every_stage_on_the_cpu(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    env = {
        **os.environ,
        "PYTHON": str(Path(os.sys.executable)),
        "GPU_CHECK_OUT": str(tmp_path / "out"),
        "MEDVQA_CACHE": str(tmp_path / "cache"),
    }
    proc = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--cpu"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert proc.returncode == 0, summary + proc.stdout[-2000:]
    for stage in ("job7b", "zero2", "zero2_resume", "headline"):
        assert f"{stage} rc=0" in summary, summary
    first = json.loads((tmp_path / "out" / "zero2_first_results.json").read_text())
    resumed = json.loads((tmp_path / "out" / "zero2" / "results.json").read_text())
    assert first["status"] == resumed["status"] == "finished"
    job = json.loads((tmp_path / "out" / "job7b" / "results.json").read_text())
    assert job["rehearsal"] is resumed["rehearsal"] is True
    assert (
        first["metrics"]["train/global_step"] == 2 and resumed["metrics"]["train/global_step"] == 3
    )
    assert resumed["perf"]["perf/fit/samples"] == 2  # one step after the checkpoint: resumed
    rows = (tmp_path / "out" / "gpu_rows.jsonl").read_text().splitlines()
    assert any(json.loads(r).get("setup") == "none-8" for r in rows)
    tables = (tmp_path / "out" / "tables.md").read_text()
    assert tables.count("| fit |") == 3
    # the job profiled its step (medvqa.training.profiling), recorded and quoted in the tables
    assert job["perf"]["perf/profile/steps"] == 1 and "| gemm |" in tables
