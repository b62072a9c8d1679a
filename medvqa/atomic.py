"""Build a directory once, atomically: the one cache pattern of medvqa; replace a file
atomically (`write_file`), for records and tables that readers may open at any time; and write a
command's multi-file output folder whole (`staged_dir`): the report, a rescoring, a rater sheet.

Normalised dataset tables, generated synthetic datasets and offline-built models are all
directories that are expensive to make and shared by concurrent jobs (a multirun, a SLURM
array). Each is built into a private temporary sibling and renamed into place only when its
completion marker exists, so a crash or a second job building at the same time can never
leave a half-built directory that looks complete, and a finished one is never rebuilt. While one
process builds an entry, the others wait for it (`hold_lock`) and then reuse it: a sweep's jobs
starting on an empty cache pre-train the tiny model once, not once each.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

log = logging.getLogger(__name__)


# What group and world may never do to a folder or file medvqa makes: cache entries hold compiled
# code and model builds, run and report folders hold records other commands read. Removed from
# the process umask by every entry point (`restrict_umask`), and from the modes of the folders
# made here (`make_dir`), whatever umask the user runs with.
NO_GROUP_WORLD_WRITE = 0o022
DIR_MODE = 0o755


def restrict_umask() -> int:
    """Add group and world write to the process umask (a stricter one is kept), before anything
    is made: whatever medvqa, Hydra, Lightning or torch creates from here on is writable by its
    owner alone. Returns the umask now in force."""
    current = os.umask(0)
    os.umask(current | NO_GROUP_WORLD_WRITE)
    return current | NO_GROUP_WORLD_WRITE


def make_dir(path: Path) -> Path:
    """`path` and its missing parents, with `DIR_MODE` (never group- or world-writable, whatever
    the umask)."""
    missing, folder = [], Path(path)
    while not folder.exists() and folder != folder.parent:  # mkdir(parents=True) ignores mode
        missing.append(folder)
        folder = folder.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile by another process
            folder.mkdir(mode=DIR_MODE)
    return Path(path)


class CacheWriteError(OSError):
    """The cache location cannot be written; the message says which setting to change."""


def write_file(path: Path, write: Callable[[Path], None]) -> Path:
    """Write `path` through `write(tmp)` into a sibling, then rename it into place: a reader
    (or a crash) never sees a half-written file."""
    path = Path(path)
    make_dir(path.parent)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return path


class LockHeld(RuntimeError):
    """Another live process holds the lock; `owner` says which (pid, host, since)."""

    def __init__(self, path: Path, owner: dict[str, object]) -> None:
        self.path = path
        self.owner = owner
        super().__init__(f"{path} is held by {describe_owner(owner)}")


def describe_owner(owner: dict[str, object]) -> str:
    if not owner:
        return "another process"
    return f"pid {owner.get('pid')} on {owner.get('host')} (since {owner.get('since')})"


@contextlib.contextmanager
def hold_lock(path: Path, wait: bool = True) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if needed) for the block.

    An OS lock (`flock`), not a file's existence: a process that dies, even by kill -9, releases
    it, so nothing is ever left locked. The holder's pid, host and start time are written into
    the file for whoever waits or is refused. `wait=False` raises `LockHeld` at once instead of
    waiting. (On network file systems flock is as good as their lock support: NFSv4 and Lustre
    with `flock` mounted have it.)
    """
    path = Path(path)
    make_dir(path.parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read_owner(fd)
            if not wait:
                raise LockHeld(path, owner) from None
            log.info("waiting for %s, held by %s", path, describe_owner(owner))
            fcntl.flock(fd, fcntl.LOCK_EX)
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _read_owner(fd: int) -> dict[str, object]:
    try:
        owner = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return owner if isinstance(owner, dict) else {}


def replace_dir(new: Path, target: Path, keep: Sequence[str] = ()) -> None:
    """Put the complete directory `new` in the place of `target` (which may exist); the entries
    of the old `target` named in `keep` are merged into the new one (`_merge`).

    A directory cannot be renamed over a non-empty one, so the old copy is renamed aside to
    `.<name>.old-<pid>`, `new` renamed into place, and only then are the `keep` entries moved
    over and the rest of the old copy removed: no step puts them in a folder that could be
    deleted as an unfinished build. A kill at any step leaves a state `recover` (run first here,
    and by `staged_dir` before every build) turns into the whole old or the whole new folder:
    between the two renames, the one instant with no `target`, it renames the old copy back;
    later, it finishes moving `keep` over and removing the old copy.
    """
    new, target = Path(new), Path(target)
    recover(target, keep, builds=False)  # `new` may be a `.building-<pid>`: left alone
    old = _sibling(target, "old")
    if target.exists():
        os.replace(target, old)
    os.replace(new, target)
    _settle(old, target, keep)


def recover(target: Path, keep: Sequence[str] = (), builds: bool = True) -> None:
    """Repair what a `replace_dir`/`staged_dir` of `target` killed midway left beside it: after
    this `target` is a whole folder (the old or the new one) holding every `keep` entry, and no
    `.<name>.old-*` or `.<name>.building-*` of a dead process is left.

    Touches the leftovers of processes that no longer run (`_pid_alive`, this host) and of this
    one: call it when this process is not itself swapping `target`. An `.old-<pid>` while
    `target` is missing is whole (only the instant between the two renames leaves this state):
    it is renamed back, so the old output wins over a finished build that was never swapped in
    (removed; the re-run rebuilds it). Any other leftover, an `.old-<pid>` beside `target` or a
    `.building-<pid>` (an unfinished build, or one that older versions had moved `keep` entries
    into before the swap), gives `target` the `keep` entries it lacks and is removed.
    `builds=False` leaves `.building-*` alone.
    """
    target = Path(target)
    for kind in ("old", "building") if builds else ("old",):
        prefix = f".{target.name}.{kind}-"
        for leftover in sorted(target.parent.glob(glob.escape(prefix) + "*")):
            pid = leftover.name[len(prefix) :]
            if pid != str(os.getpid()) and _pid_alive(pid):
                continue
            if kind == "old" and not target.exists():
                log.warning("restoring %s from %s, left by a swap killed midway", target, leftover)
                os.replace(leftover, target)
            else:
                _settle(leftover, target, keep)


def _sibling(target: Path, kind: str) -> Path:
    """This process's `.<name>.<kind>-<pid>` beside `target` (`recover` parses the pid)."""
    return target.with_name(f".{target.name}.{kind}-{os.getpid()}")


def _settle(leftover: Path, target: Path, keep: Sequence[str]) -> None:
    """Merge the `keep` entries of `leftover` into `target`, then delete the rest of it."""
    if target.is_dir():
        for name in keep:
            if (leftover / name).exists():
                _merge(leftover / name, target / name)
    shutil.rmtree(leftover, ignore_errors=True)


def _merge(src: Path, dst: Path) -> None:
    """Move into `dst` what it lacks of `src`, descending into folders both have (W&B's offline
    runs are one folder each). Each move is one rename: killed midway, what is not moved yet is
    still in `src`, which `recover` merges again."""
    if not os.path.lexists(dst):
        os.replace(src, dst)
    elif src.is_dir() and not src.is_symlink() and dst.is_dir():
        for child in sorted(src.iterdir()):
            _merge(child, dst / child.name)


class OutputDirError(FileExistsError):
    """An output folder that holds something else; the message names it and the fix."""


# Written into every `staged_dir` output, naming the command: only such a folder is replaced.
OUTPUT_MARKER = ".medvqa-output"


@contextlib.contextmanager
def staged_dir(
    target: Path, tool: str, keep: Sequence[str] = (), legacy: str | None = None
) -> Iterator[Path]:
    """Yield a hidden sibling of `target` to write `tool`'s output into; swap it in whole
    (`replace_dir`) when the block ends normally. Killed or failed midway, `target` stays as it
    was (never new tables beside old figures); what a killed run left behind is put right
    (`recover`) by the next, and what a failed one did at once. Entries named in `keep` (e.g.
    W&B's offline runs) are merged from the old folder into the new one after the swap (what
    the new one holds wins), never moved into a build that a kill could leave to be deleted.

    Only an empty folder or an earlier output of `tool` (its `OUTPUT_MARKER`, or the file
    `legacy` that outputs from before the marker hold) is replaced: pointed at a run directory or
    any other folder, it refuses before any work instead of deleting what is there.
    """
    target = Path(target)
    recover(target, keep)
    if target.exists() and not _replaceable(target, tool, legacy):
        raise OutputDirError(
            f"{target} exists and is not a {tool} output (it has no {OUTPUT_MARKER}"
            f"{f' or {legacy}' if legacy else ''}); its contents would be replaced. Choose "
            "another output folder, or empty or remove this one."
        )
    staging = _sibling(target, "building")
    make_dir(staging.parent)
    staging.mkdir(mode=DIR_MODE)
    try:
        yield staging
        (staging / OUTPUT_MARKER).write_text(tool + "\n")
        replace_dir(staging, target, keep)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        recover(target, keep)  # an exception mid-swap: roll it back, or finish it, now


def _replaceable(target: Path, tool: str, legacy: str | None) -> bool:
    if not target.is_dir():
        return False
    marker = target / OUTPUT_MARKER
    if marker.is_file():
        return marker.read_text().strip() == tool
    return not any(target.iterdir()) or (legacy is not None and (target / legacy).is_file())


def _pid_alive(pid: str) -> bool:
    """Whether the process that named a staging folder still runs (on this host)."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def is_built(target: Path, marker: str) -> bool:
    """True if `target` was completed by `build_once` (its marker file exists)."""
    return (Path(target) / marker).is_file()


def build_once(
    target: Path,
    build_into: Callable[[Path], None],
    marker: str,
    what: str = "cache entry",
) -> bool:
    """Make `target` with `build_into(tmp)` unless it is already complete; True if built here.

    `build_into` writes everything into `tmp`, the file named `marker` last (it is how a
    complete entry is recognised). If another process completes `target` first, its copy is
    kept and ours discarded: equal inputs give equal content, so either is valid.
    """
    target = Path(target)
    if is_built(target, marker):
        return False
    lock = target.with_name(f".{target.name}.lock")
    try:
        make_dir(target.parent)
        lock.touch(mode=0o644)
    except OSError as err:
        raise _unwritable(what, target, err) from err
    with hold_lock(lock):  # another process building it: wait, then reuse its copy
        try:
            if is_built(target, marker):
                log.info("%s was built by another process meanwhile; reusing it", target)
                return False
            return _build(target, build_into, marker, what)
        finally:
            # Removed while held: a process still waiting on it then finds the entry built (or
            # builds it, racing at most one newcomer to an equally valid copy: see `_build`).
            lock.unlink(missing_ok=True)


def _unwritable(what: str, target: Path, err: OSError) -> CacheWriteError:
    return CacheWriteError(
        f"cannot write the {what} under {target.parent}: {err}. Set paths.cache_dir (or "
        "the MEDVQA_CACHE environment variable) to a writable directory."
    )


def _build(target: Path, build_into: Callable[[Path], None], marker: str, what: str) -> bool:
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    except OSError as err:
        raise _unwritable(what, target, err) from err
    start = time.perf_counter()
    try:
        build_into(tmp)
        if not is_built(tmp, marker):
            raise RuntimeError(f"building {target} wrote no {marker!r}: the build is incomplete")
        if is_built(target, marker):
            log.info("another process finished %s first; using its copy", target)
            return False
        if target.exists():  # an incomplete leftover of a crashed build
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.replace(tmp, target)
        except OSError:
            if not is_built(target, marker):
                raise
            return False  # lost a race to an equally valid copy
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("built %s in %.1fs", target, time.perf_counter() - start)
    return True
