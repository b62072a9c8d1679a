"""Faults a cluster deals a job, recorded and survived: signals, a second launch into the same
run directory, concurrent cache builds, a full disk under the checkpoints, stale checkpoints and
answers of an earlier attempt; and the same seed giving the same weights whatever the cache held.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from medvqa.atomic import LockHeld, build_once, hold_lock
from medvqa.runner import RUN_LOCK
from tests.conftest import ROOT, SMALL, run_main


class SignalAtStep(L.Callback):
    """Send `signum` to this process once `step` optimiser steps are done, the first time only
    (the `marker` file remembers), as a scheduler's SIGTERM or a user's Ctrl-C would."""

    def __init__(self, step: int, marker: str, signum: int = signal.SIGTERM) -> None:
        self.step, self.marker, self.signum = step, Path(marker), signum

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step and not self.marker.exists():
            self.marker.write_text(str(os.getpid()))
            os.kill(os.getpid(), self.signum)


def _signal_at(step: int, marker: Path, signum: int = signal.SIGTERM) -> list[str]:
    return [
        f"+callbacks.signal._target_={__name__}.SignalAtStep",
        f"+callbacks.signal.step={step}",
        f"+callbacks.signal.marker={marker}",
        f"+callbacks.signal.signum={int(signum)}",
    ]


FAST = ["debug=smoke", "logger=csv", "task.references=[]", "task.eval_splits=[val]"]


def _record(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "results.json").read_text())


@pytest.mark.slow
def test_a_sigterm_stops_a_local_sweep_after_recording_the_running_job(
    tmp_path: Path, cache_dir: Path, tiny_model_dir: Path
) -> None:
    """Whoever sends a local sweep SIGTERM (`timeout`, a shutdown) wants it to stop: the running
    job is recorded `interrupted`, no further job starts, the sweep exits 143 (128 + SIGTERM).
    (A single run: tests/test_resume.py::test_a_killed_job_resumes_exactly[SIGTERM].)"""
    proc = run_main(
        ["-m", *FAST, "seed=0,1", *_signal_at(1, tmp_path / "sent"), f"hydra.sweep.dir={tmp_path}"],
        tmp_path / "unused",
        cache_dir,
    )
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    records = {
        r["seed"]: r for r in map(json.loads, map(Path.read_text, tmp_path.rglob("results.json")))
    }
    assert records[0]["status"] == "interrupted" and records[0]["global_step"] == 1
    assert 1 not in records  # the next job never started


@pytest.mark.slow
def test_a_second_launch_into_a_busy_run_dir_refuses_and_names_the_first(
    tmp_path: Path, cache_dir: Path
) -> None:
    run_dir = tmp_path / "run"
    with hold_lock(run_dir / RUN_LOCK):
        proc = run_main(["task=splits", "logger=csv"], run_dir, cache_dir)
    assert proc.returncode != 0
    assert f"pid {os.getpid()} on {os.uname().nodename}" in proc.stderr, proc.stderr[-2000:]
    assert not (run_dir / "results.json").exists()  # the running job's record is untouched
    again = run_main(["task=splits", "logger=csv"], run_dir, cache_dir)  # released: it runs
    assert again.returncode == 0, again.stderr[-2000:]


def test_the_run_lock_dies_with_its_process(tmp_path: Path) -> None:
    """kill -9 leaves no lock behind: the OS releases it."""
    code = f"from medvqa.atomic import hold_lock; import time\nwith hold_lock({str(tmp_path / 'l')!r}):\n    print('held', flush=True); time.sleep(60)"
    holder = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    with pytest.raises(LockHeld, match=f"pid {holder.pid}"), hold_lock(tmp_path / "l", wait=False):
        pass
    holder.kill()
    holder.wait()
    with hold_lock(tmp_path / "l", wait=False):
        pass


def _build(target: str, log: str) -> bool:
    def write(tmp: Path) -> None:
        with open(log, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        time.sleep(1.0)  # a slow build: the other process arrives meanwhile
        (tmp / "done").write_text("x")

    return build_once(Path(target), write, marker="done")


@pytest.mark.heavy
@pytest.mark.slow
def test_concurrent_builds_of_one_cache_entry_build_it_once(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        built = pool.starmap(_build, [(str(tmp_path / "entry"), str(tmp_path / "log"))] * 2)
    assert sorted(built) == [False, True]  # one built it, the other waited and reused it
    assert len((tmp_path / "log").read_text().splitlines()) == 1
    assert (tmp_path / "entry" / "done").is_file()


# --- a full disk under the checkpoints --------------------------------------------------------

_FULL_DISK = """
import json, os, sys, torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from medvqa.training.checkpoints import AtomicCheckpointIO
io = {"lightning": TorchCheckpointIO, "medvqa": AtomicCheckpointIO}[sys.argv[2]]()
path = os.path.join(sys.argv[1], "last.ckpt")
io.save_checkpoint({"step": 1, "w": torch.zeros(100_000)}, path)  # 400 kB: fits
out = {"first_size": os.path.getsize(path), "error": None, "step": None}
try:  # 1.6 MB on a 1 MB file system: the disk fills mid-write
    io.save_checkpoint({"step": 2, "w": torch.zeros(400_000)}, path)
except Exception as err:
    out["error"] = type(err).__name__
try:
    out["step"] = torch.load(path, weights_only=True)["step"]
except Exception as err:
    out["step"] = "unreadable: " + type(err).__name__
out["size"] = os.path.getsize(path)
out["leftovers"] = sorted(f for f in os.listdir(sys.argv[1]) if f != "last.ckpt")
print(json.dumps(out))
"""


def _on_a_small_disk(
    command: str, disk: Path, size: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run `command` with `disk` a tmpfs of `size` of its own (a mount namespace: no root
    needed where user namespaces are allowed), $TMPDIR elsewhere, as a node's /tmp and a
    cluster's run directory are."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux) to mount a small file system")
    disk.mkdir(parents=True, exist_ok=True)
    mount = f"mount -t tmpfs -o size={size} tmpfs {disk} || exit 99; {command}"
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", mount],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=600,
    )
    if proc.returncode == 99:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()[:200]}")
    return proc


def _on_a_full_disk(io: str, tmp_path: Path) -> dict[str, Any]:
    script = tmp_path / "full_disk.py"
    script.write_text(_FULL_DISK)
    disk = tmp_path / "disk"
    proc = _on_a_small_disk(f"{sys.executable} {script} {disk} {io}", disk, "1m")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.slow
@pytest.mark.heavy
def test_lightning_tears_a_checkpoint_on_a_full_disk(tmp_path: Path) -> None:
    """What the fix is for: Lightning's commit copies from $TMPDIR into the full disk, over the
    previous checkpoint."""
    out = _on_a_full_disk("lightning", tmp_path)
    assert out["error"] is not None
    assert str(out["step"]).startswith("unreadable") and out["size"] != out["first_size"]


@pytest.mark.heavy
def test_a_full_disk_leaves_the_previous_checkpoint_whole(tmp_path: Path) -> None:
    out = _on_a_full_disk("medvqa", tmp_path)
    assert out["error"] == "CheckpointWriteError", out
    assert out["step"] == 1 and out["size"] == out["first_size"]  # the previous one, whole
    assert out["leftovers"] == []  # the temporary file is gone too


@pytest.mark.slow
def test_a_full_disk_fails_the_run_with_its_record_and_no_torn_checkpoint(
    tmp_path: Path, cache_dir: Path, tiny_model_dir: Path
) -> None:
    """The smoke job with its run directory on a 2 MB disk: the epoch checkpoint (1.2 MB) fits,
    `last.ckpt` does not. The record says `failed` with the reason (before: a torn last.ckpt
    filled the disk and the record could not leave `running`), every checkpoint loads."""
    disk = tmp_path / "disk"
    run = [sys.executable, "run.py", *FAST, *SMALL, f"hydra.run.dir={disk}/run"]
    copy = f"cp -r {disk}/run {tmp_path}/run"  # the tmpfs goes with the namespace
    env = {"MEDVQA_CACHE": str(cache_dir), "WANDB_MODE": "offline"}
    proc = _on_a_small_disk(f"{' '.join(run)}; rc=$?; {copy}; exit $rc", disk, "2m", env)
    assert proc.returncode == 1, proc.stderr[-3000:]
    record = _record(tmp_path / "run")
    assert record["status"] == "failed", record["status"]
    assert record["error"].startswith("CheckpointWriteError: could not write the checkpoint")
    checkpoints = list((tmp_path / "run" / "checkpoints").iterdir())
    assert [p.name for p in checkpoints] == ["epoch=0-step=3.ckpt"]  # no torn last.ckpt
    torch.load(checkpoints[0], weights_only=False)  # whole


# --- an earlier attempt in the same run directory, and the caches' state ---------------------


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_same_seed_same_weights_cold_or_warm_and_a_forced_rerun_leaves_nothing_stale(
    tmp_path: Path, cache_dir: Path, tiny_model_dir: Path
) -> None:
    """Run A generates the untuned base's answers (cold shared cache), run B reuses them: the
    same trained weights and numbers. A re-run of A with force=true trains again: the same
    weights, and its checkpoints beside nothing stale. (A re-run of an `incomplete` job reuses
    its weights: tests/test_judge_run.py.)"""
    shared = tmp_path / "cache"
    shutil.copytree(cache_dir, shared, ignore=shutil.ignore_patterns("predictions"))
    args = ["debug=smoke", "logger=csv"]
    a = run_main(args, tmp_path / "a", shared)
    assert a.returncode == 0, a.stderr[-3000:]
    b = run_main(args, tmp_path / "b", shared)
    assert b.returncode == 0, b.stderr[-3000:]
    assert "reusing the answers of the same weights" in b.stderr + b.stdout
    weights = {run: _sha(tmp_path / run / "trained" / "trainable.safetensors") for run in "ab"}
    assert weights["a"] == weights["b"]
    assert _record(tmp_path / "a")["metrics"] == _record(tmp_path / "b")["metrics"]

    forced = run_main([*args, "force=true"], tmp_path / "a", shared)
    assert forced.returncode == 0, forced.stderr[-3000:]
    checkpoints = sorted(p.name for p in (tmp_path / "a" / "checkpoints").iterdir())
    assert "last.ckpt" in checkpoints and not any("-v1" in name for name in checkpoints)
    assert len(list((tmp_path / "a").glob("checkpoints.stale-*"))) == 1
    assert _sha(tmp_path / "a" / "trained" / "trainable.safetensors") == weights["a"]


def test_a_staged_output_is_swapped_in_whole_and_replaces_only_its_own_kind(
    tmp_path: Path,
) -> None:
    """`staged_dir` (the report, medvqa-score, the rater sheet): a block that fails leaves the
    earlier output as it was; a folder a dead build left behind is removed; a folder of
    something else (a run directory, another command's output) is refused, not emptied."""
    from medvqa.atomic import OUTPUT_MARKER, OutputDirError, staged_dir

    out = tmp_path / "out"
    with staged_dir(out, "tool", keep=("wandb",)) as staging:
        assert staging.parent == tmp_path and staging.name.startswith(".out.building-")
        (staging / "a.md").write_text("first")
        (staging / "fig.png").write_text("old figure")
    assert (out / OUTPUT_MARKER).read_text() == "tool\n"
    (out / "wandb").mkdir()
    (out / "wandb" / "upload").write_text("kept")
    with pytest.raises(KeyboardInterrupt), staged_dir(out, "tool") as staging:
        (staging / "a.md").write_text("second")
        raise KeyboardInterrupt
    assert (out / "a.md").read_text() == "first" and (out / "fig.png").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    dead = tmp_path / ".out.building-999999999"  # no such process
    dead.mkdir()
    with staged_dir(out, "tool", keep=("wandb",)) as staging:
        (staging / "a.md").write_text("second")
    assert sorted(p.name for p in out.iterdir()) == [OUTPUT_MARKER, "a.md", "wandb"]
    assert (out / "a.md").read_text() == "second" and not dead.exists()
    assert (out / "wandb" / "upload").read_text() == "kept"

    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text("{}")
    for foreign, tool in ((run, "tool"), (out, "another-tool")):
        with (
            pytest.raises(OutputDirError, match=r"not a .* output.*Choose another"),
            staged_dir(foreign, tool),
        ):
            raise AssertionError("the block must not run")
    assert (run / "results.json").read_text() == "{}" and (out / "a.md").is_file()
    (tmp_path / "empty").mkdir()
    with staged_dir(tmp_path / "empty", "tool") as staging:
        (staging / "x").write_text("")
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "report.html").write_text("from before the marker")
    with staged_dir(legacy, "tool", legacy="report.html") as staging:
        (staging / "report.html").write_text("new")
    assert (legacy / "report.html").read_text() == "new"
