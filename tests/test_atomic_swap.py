"""The staged-output swap (`medvqa.atomic.staged_dir`, `replace_dir`, `recover`) killed at every
file-system step: a reader after `recover`, and a plain re-run, find the whole old or the whole
new output, W&B's offline runs (`keep`) are never lost, and no hidden sibling is left.

A kill -9 is simulated by `Killer`: `os.replace` and `shutil.rmtree` are the swap's steps; at the
chosen one it raises `Killed`, and every later step of that run raises again, so no cleanup code
of the killed run touches the disk. The killed run has a fake pid that no process holds, as a
real killed process's leftovers would.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from medvqa.atomic import OUTPUT_MARKER, OutputDirError, recover, replace_dir, staged_dir

REAL_REPLACE = os.replace
REAL_RMTREE = shutil.rmtree
DEAD_PIDS = (999_999_999, 999_999_998)  # no such processes: the killed runs
TOOL = "tool"
KEEP = ("wandb",)
OLD = {"a.md": "old", "figs/fig.png": "old figure", "old-only.csv": "x"}
NEW = {"a.md": "new", "figs/fig.png": "new figure", "new-only.csv": "y"}
WANDB = {"wandb/offline-run-1/run-1.wandb": "upload 1", "wandb/debug.log": "log"}


class Killed(BaseException):
    """Stands in for kill -9 (a BaseException: no `except Exception` of the code catches it)."""


class Killer:
    """Counts the run's file-system steps, each `os.replace` one and each `shutil.rmtree` two
    (before it, and halfway through: half of its files gone), and kills the run at step `at`."""

    def __init__(self, at: int | None) -> None:
        self.at, self.steps, self.dead = at, 0, False

    def _hit(self) -> bool:
        if self.dead:
            raise Killed("a step after the kill")
        hit = self.steps == self.at
        self.steps += 1
        self.dead = hit
        return hit

    def replace(self, src: Any, dst: Any) -> None:
        if self._hit():
            raise Killed(f"before os.replace({src}, {dst})")
        REAL_REPLACE(src, dst)

    def rmtree(self, path: Any, ignore_errors: bool = False, **kwargs: Any) -> None:
        if self._hit():
            raise Killed(f"before shutil.rmtree({path})")
        if self._hit():
            found = sorted(p for p in Path(path).rglob("*") if p.is_file())
            for file in found[: (len(found) + 1) // 2]:
                file.unlink()
            raise Killed(f"halfway through shutil.rmtree({path})")
        REAL_RMTREE(path, ignore_errors=ignore_errors, **kwargs)


def files(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): p.read_text() for p in folder.rglob("*") if p.is_file()
    }


def output(content: dict[str, str], wandb: bool = True) -> dict[str, str]:
    """The files of `tool`'s output folder holding `content` (and W&B's runs)."""
    return {**content, OUTPUT_MARKER: TOOL + "\n", **(WANDB if wandb else {})}


def command(out: Path, content: dict[str, str]) -> None:
    """The command under test: `content` as `tool`'s output in `out`, keeping `wandb/`."""
    with staged_dir(out, TOOL, keep=KEEP) as staging:
        for name, text in content.items():
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            (staging / name).write_text(text)


def run(
    monkeypatch: pytest.MonkeyPatch, out: Path, at: int | None, pid: int, content: Any = NEW
) -> bool:
    """Run `command` as process `pid`, killed at step `at`: True if it finished."""
    killer = Killer(at)
    with monkeypatch.context() as m:
        m.setattr(os, "replace", killer.replace)
        m.setattr(shutil, "rmtree", killer.rmtree)
        m.setattr(os, "getpid", lambda: pid)
        try:
            command(out, content)
        except Killed:
            return False
    return True


def old_output(folder: Path) -> Path:
    """`folder/out`: an earlier output of `tool`, with W&B's offline runs logged into it."""
    out = folder / "out"
    command(out, OLD)
    for name, text in WANDB.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    return out


def check_killed(out: Path, what: str) -> None:
    """Right after a kill: `out` is the whole old output, or the whole new one (W&B's runs in it
    or still in the old copy beside it), or, killed between the swap's two renames, missing
    with the whole copy it had (old, or new from a run killed earlier) beside it; no file of
    W&B's is lost."""
    siblings = {p.name: files(p) for p in out.parent.iterdir() if p != out}
    for name, text in WANDB.items():
        where = [out, *(out.parent / sibling for sibling in siblings)]
        assert any((f / name).is_file() and (f / name).read_text() == text for f in where), (
            f"{what}: {name} lost"
        )
    if not out.exists():
        olds = [n for n in siblings if n.startswith(".out.old-")]
        assert len(olds) == 1 and siblings[olds[0]] in (output(OLD), output(NEW)), what
        return
    now = files(out)
    assert now in (output(OLD), output(NEW), output(NEW, wandb=False)), f"{what}: {now}"


def check_whole(out: Path, what: str, content: dict[str, str] | None = None) -> None:
    """After `recover` or a finished run: the whole old or new output (`content` if given),
    W&B's runs in it, nothing beside it."""
    now = files(out)
    expected = [output(content)] if content else [output(OLD), output(NEW)]
    assert now in expected, f"{what}: {now}"
    assert [p.name for p in out.parent.iterdir()] == ["out"], what


def test_a_swap_killed_at_any_step_is_recovered_whole_with_its_wandb_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For every step k of a swap over an earlier output: killed at k, a reader that calls
    `recover` finds the whole old or new folder with W&B's runs in it; a plain re-run then
    leaves the whole new output, and nothing beside it."""
    k = 0
    while True:
        case = tmp_path / f"k{k}"
        out = old_output(case)
        if run(monkeypatch, out, at=k, pid=DEAD_PIDS[0]):
            break
        what = f"killed at step {k}"
        check_killed(out, what)
        recover(out, KEEP)  # what a reader would do
        check_whole(out, f"{what}, recovered")
        assert run(monkeypatch, out, at=None, pid=os.getpid())
        check_whole(out, f"{what}, re-run", NEW)
        k += 1
    check_whole(out, "not killed", NEW)
    assert k >= 6, f"only {k} steps: the swap was not exercised"


def test_a_rerun_killed_again_at_any_step_still_ends_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed at step k, then the re-run (its recovery included) killed at step j: whatever
    (k, j), each kill leaves a recoverable state and a third, plain run the whole new output
    with W&B's runs."""
    cases = 0
    for k in range(64):
        first = old_output(tmp_path / f"probe{k}")
        if run(monkeypatch, first, at=k, pid=DEAD_PIDS[0]):
            break
        for j in range(64):
            out = old_output(tmp_path / f"k{k}-j{j}")
            assert not run(monkeypatch, out, at=k, pid=DEAD_PIDS[0])
            finished = run(monkeypatch, out, at=j, pid=DEAD_PIDS[1])
            what = f"killed at step {k}, re-run killed at step {j}"
            if not finished:
                check_killed(out, what)
            assert run(monkeypatch, out, at=None, pid=os.getpid())
            check_whole(out, what, NEW)
            cases += 1
            if finished:
                break
    assert cases > 30


def test_a_kill_mid_build_leaves_the_old_output_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed while writing its output, the command has not touched the earlier one; its
    half-built folder is removed by the next run, which leaves the whole new output."""
    out = old_output(tmp_path)
    killer = Killer(at=None)
    with monkeypatch.context() as m:
        m.setattr(os, "replace", killer.replace)
        m.setattr(shutil, "rmtree", killer.rmtree)
        m.setattr(os, "getpid", lambda: DEAD_PIDS[0])
        with pytest.raises(Killed), staged_dir(out, TOOL, keep=KEEP) as staging:
            (staging / "a.md").write_text("half")
            killer.dead = True  # kill -9: not even the staged_dir cleanup runs
            raise Killed("mid-build")
    assert files(out) == output(OLD)
    assert (tmp_path / f".out.building-{DEAD_PIDS[0]}" / "a.md").read_text() == "half"
    command(out, NEW)
    check_whole(out, "re-run after a kill mid-build", NEW)


def test_a_rerun_restores_the_old_output_before_it_builds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed between the swap's two renames (the one state with no output folder), the old
    output is back in place as soon as the re-run starts, not only once its build (minutes
    for a report) is done."""
    for k in range(8):
        out = old_output(tmp_path / f"k{k}")
        if not run(monkeypatch, out, at=k, pid=DEAD_PIDS[0]) and not out.exists():
            break
    case = out.parent
    assert (case / f".out.building-{DEAD_PIDS[0]}" / "a.md").read_text() == "new"
    with staged_dir(out, TOOL, keep=KEEP) as staging:
        assert files(out) == output(OLD)
        assert sorted(p.name for p in case.iterdir()) == sorted(["out", staging.name])
        (staging / "a.md").write_text("rebuilt")
    check_whole(out, "re-run after a kill between the renames", {"a.md": "rebuilt"})


def test_leftovers_of_dead_processes_are_put_right_and_live_ones_left_alone(
    tmp_path: Path,
) -> None:
    """A dead process's `.old-*` beside the output gives it the W&B runs it lacks and goes; so
    does a `.building-*` into which earlier versions moved `wandb/` before the swap; a live
    process's (pid 1) are its own business."""
    out = tmp_path / "out"
    command(out, NEW)
    old = tmp_path / f".out.old-{DEAD_PIDS[0]}"
    legacy = tmp_path / f".out.building-{DEAD_PIDS[1]}"
    for folder, name in ((old, "wandb/offline-run-1/run-1.wandb"), (legacy, "wandb/debug.log")):
        (folder / name).parent.mkdir(parents=True)
        (folder / name).write_text(WANDB[name])
        (folder / "a.md").write_text("stale")
    live = [tmp_path / ".out.old-1", tmp_path / ".out.building-1"]
    for folder in live:
        folder.mkdir()
    recover(out, KEEP)
    assert files(out) == output(NEW)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out", *(p.name for p in live)])
    for folder in live:
        folder.rmdir()
    (tmp_path / f".out.old-{DEAD_PIDS[0]}").mkdir()  # no keep entries: just removed
    command(out, NEW)
    check_whole(out, "a stale .old beside the output", NEW)


@pytest.mark.parametrize("failing", [1, 2], ids=["renaming-new-in", "moving-wandb-over"])
def test_an_error_mid_swap_is_put_right_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: int
) -> None:
    """An exception (not a kill) inside the swap, in a process that lives on: the output is
    whole again, with its W&B runs, when the error reaches the caller."""
    out = old_output(tmp_path)
    calls = []

    def replace(src: Any, dst: Any) -> None:
        calls.append((src, dst))
        if len(calls) == failing + 1:
            raise OSError(f"simulated failure of os.replace({src}, {dst})")
        REAL_REPLACE(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="simulated"):
        command(out, NEW)
    check_whole(out, f"error at os.replace #{failing}", OLD if failing == 1 else NEW)


def test_only_an_output_of_the_same_command_is_replaced(tmp_path: Path) -> None:
    """A folder of something else (a run directory, another command's output) is refused
    before any work, nothing is left beside it."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "results.json").write_text("{}")
    out = old_output(tmp_path / "o")
    for target, tool in ((run_dir, TOOL), (out, "another-tool")):
        with (
            pytest.raises(OutputDirError, match=r"not a .* output.*Choose another"),
            staged_dir(target, tool),
        ):
            raise AssertionError("the block must not run")
    assert files(run_dir) == {"results.json": "{}"} and files(out) == output(OLD)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o", "run"]


def test_kept_folders_are_merged_what_the_new_output_holds_wins(tmp_path: Path) -> None:
    """A block that writes into `wandb/` itself: the earlier runs are merged in beside its
    own, and where both hold the same file the new one's is kept."""
    out = old_output(tmp_path)
    with staged_dir(out, TOOL, keep=KEEP) as staging:
        (staging / "wandb" / "offline-run-2").mkdir(parents=True)
        (staging / "wandb" / "offline-run-2" / "run-2.wandb").write_text("upload 2")
        (staging / "wandb" / "debug.log").write_text("new log")
    assert files(out) == {
        **output({}),
        **WANDB,
        "wandb/offline-run-2/run-2.wandb": "upload 2",
        "wandb/debug.log": "new log",
    }
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_replace_dir_alone_killed_at_any_step_is_recovered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`replace_dir` as DeepSpeed's checkpoint save uses it (no marker, no keep): killed at any
    step, `recover` leaves the whole old or new folder; the next `replace_dir` removes what a
    dead process left."""
    k = 0
    while True:
        case = tmp_path / f"k{k}"
        final, tmp = case / "last.ckpt", case / ".last.ckpt.tmp"
        for folder, text in ((final, "old"), (tmp, "new")):
            (folder / "shard").mkdir(parents=True)
            (folder / "shard" / "rank0.pt").write_text(text)
            (folder / "latest").write_text(text)
        killer = Killer(k)
        with monkeypatch.context() as m:
            m.setattr(os, "replace", killer.replace)
            m.setattr(shutil, "rmtree", killer.rmtree)
            m.setattr(os, "getpid", lambda: DEAD_PIDS[0])
            try:
                replace_dir(tmp, final)
            except Killed:
                pass
            else:
                break
        recover(final)
        assert files(final) in ({"shard/rank0.pt": t, "latest": t} for t in ("old", "new"))
        assert not list(case.glob(".last.ckpt.old-*")), f"killed at step {k}"
        k += 1
    assert files(final) == {"shard/rank0.pt": "new", "latest": "new"} and k >= 3
