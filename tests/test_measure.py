"""A run's measurements of itself (medvqa.measure) and the CUDA allocator setting it runs with."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from medvqa import measure
from medvqa.training.hardware import (
    ALLOC_CONF_ENV,
    COMPILE_CACHE,
    INDUCTOR_CACHE_ENV,
    configure_compile_cache,
    configure_cuda_allocator,
)


@pytest.fixture(autouse=True)
def fresh() -> None:
    measure.reset()


def test_a_phase_entered_twice_adds_its_time_and_items() -> None:
    for rows in (3, 5):
        with measure.measured("generate/predictions", "rows") as phase:
            time.sleep(0.01)
            phase.items = rows
    m = measure.metrics()
    assert m["perf/generate/predictions/rows"] == 8
    assert m["perf/generate/predictions/seconds"] >= 0.02
    rate = m["perf/generate/predictions/rows_per_s"]
    assert rate == pytest.approx(8 / m["perf/generate/predictions/seconds"])
    assert "perf/generate/predictions/steady_rows_per_s" not in m  # no steps were marked


def test_a_phase_that_did_nothing_has_no_rate() -> None:
    """A split resumed to the end generated nothing: its rate is NaN, not 0 or a survivor's."""
    with measure.measured("generate/predictions_zero_shot", "rows"):
        pass
    with measure.measured("score"):
        pass
    m = measure.metrics()
    assert m["perf/generate/predictions_zero_shot/rows"] == 0
    assert math.isnan(m["perf/generate/predictions_zero_shot/rows_per_s"])
    assert set(m) >= {"perf/score/seconds"} and "perf/score/_per_s" not in m


def test_the_steady_rate_leaves_out_the_slow_first_half() -> None:
    """Compilation makes the first steps slow; the steady rate is that of the second half."""
    with measure.measured("fit", "samples") as phase:
        time.sleep(0.2)  # a first step that compiles
        phase.mark(4)
        for _ in range(5):
            time.sleep(0.01)
            phase.mark(4)
    m = measure.metrics()
    assert m["perf/fit/samples"] == 24
    whole, steady = m["perf/fit/samples_per_s"], m["perf/fit/steady_samples_per_s"]
    assert steady > 3 * whole
    assert steady < 4 / 0.01 * 1.01  # never faster than the steps themselves


def test_too_few_steps_give_no_steady_rate() -> None:
    with measure.measured("fit", "samples") as phase:
        for _ in range(3):
            phase.mark(2)
    assert math.isnan(measure.metrics()["perf/fit/steady_samples_per_s"])


def test_the_allocator_setting_applies_unless_the_user_exported_one() -> None:
    env: dict[str, str] = {}
    configure_cuda_allocator("expandable_segments:True", env)
    assert env == {ALLOC_CONF_ENV: "expandable_segments:True"}
    mine = {ALLOC_CONF_ENV: "max_split_size_mb:512"}
    configure_cuda_allocator("expandable_segments:True", mine)
    assert mine[ALLOC_CONF_ENV] == "max_split_size_mb:512"
    untouched: dict[str, str] = {}
    configure_cuda_allocator(None, untouched)
    assert untouched == {}


def test_compile_caches_live_under_the_sweeps_cache_dir_unless_exported(tmp_path: Path) -> None:
    env: dict[str, str] = {}
    assert configure_compile_cache(tmp_path, env) == tmp_path / COMPILE_CACHE
    assert env == {INDUCTOR_CACHE_ENV: str(tmp_path / COMPILE_CACHE)}
    mine = {INDUCTOR_CACHE_ENV: "/scratch/inductor"}
    assert configure_compile_cache(tmp_path, mine) == Path("/scratch/inductor")
    assert mine == {INDUCTOR_CACHE_ENV: "/scratch/inductor"}
    # a later job of a local multirun (one process) with another cache_dir gets its own
    assert configure_compile_cache(tmp_path / "other", env) == tmp_path / "other" / COMPILE_CACHE


@pytest.mark.heavy  # one process compiling one function: seconds
@pytest.mark.slow
def test_kernels_land_under_the_cache_dir_when_lightning_was_imported_first(
    tmp_path: Path,
) -> None:
    """`import lightning` imports torch._dynamo, which writes torch's own default cache folder
    (/tmp/torchinductor_<user>) into TORCHINDUCTOR_CACHE_DIR: that is no user's export, and the
    compiled kernels still go under paths.cache_dir/inductor."""
    code = (
        "import sys, os, lightning, torch\n"
        f"assert os.environ.get({INDUCTOR_CACHE_ENV!r}), 'torch set no default: nothing tested'\n"
        "from medvqa.training.hardware import configure_compile_cache\n"
        "print(configure_compile_cache(sys.argv[1]))\n"
        "torch.compile(lambda x: torch.sin(x) * 2 + x.cos())(torch.randn(8))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != INDUCTOR_CACHE_ENV}  # none exported
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == str(tmp_path / COMPILE_CACHE)
    assert (tmp_path / COMPILE_CACHE / "fxgraph").is_dir()  # the compiled graph is there


@pytest.mark.slow  # two processes compiling: ~20 s
def test_the_second_job_of_a_sweep_compiles_from_the_first_ones_cache(tmp_path: Path) -> None:
    """Two processes (two jobs) with one paths.cache_dir: the first compiles (a cache miss),
    the second loads the compiled graph (a hit)."""
    code = (
        "import sys, torch\n"
        "from medvqa.training.hardware import configure_compile_cache\n"
        "configure_compile_cache(sys.argv[1])\n"
        "from torch._dynamo.utils import counters\n"
        "f = torch.compile(lambda x: torch.sin(x) * 2 + x.cos())\n"
        "f(torch.randn(8))\n"
        "print(dict(counters['inductor']))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != INDUCTOR_CACHE_ENV}  # none exported
    runs = [
        subprocess.run(
            [sys.executable, "-c", code, str(tmp_path)],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        ).stdout
        for _ in range(2)
    ]
    assert "fxgraph_cache_miss" in runs[0] and "fxgraph_cache_hit" in runs[1], runs
    assert (tmp_path / COMPILE_CACHE / "fxgraph").is_dir()
