"""No pickles from anywhere (issue #44): `ckpt_path` is a local file, and every checkpoint a fit
resumes from is read weights-only (medvqa/training/checkpoints.py, strategies.py).

The payload is a real one: a checkpoint whose unpickling touches a marker file
(`test_the_payload_runs_when_unpickled` shows it does, with `weights_only=False`), so a marker
that stays absent means the code did not run.
"""

from __future__ import annotations

import http.server
import re
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel

from medvqa.training.checkpoints import (
    AtomicCheckpointIO,
    UnsafeCheckpointError,
    ckpt_path_problems,
    load_weights_only,
)
from tests.conftest import compose, run_main


class Payload:
    """Unpickled, it touches `marker`: what a malicious checkpoint would do, harmlessly."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))  # stdlib only: loads without this module


def write_payload(path: Path, marker: Path) -> Path:
    """A checkpoint-shaped file (`torch.save` of a dict) whose unpickling touches `marker`."""
    torch.save({"state_dict": {}, "epoch": 0, "hook": Payload(marker)}, path)
    return path


@dataclass
class Served:
    url: str
    marker: Path
    requests: list[str]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    """The payload served over HTTP on loopback, each request path recorded."""
    root = tmp_path / "www"
    root.mkdir()
    marker = tmp_path / "served-payload-ran"
    write_payload(root / "x.ckpt", marker)
    requests: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def do_GET(self) -> None:
            requests.append(self.path)
            super().do_GET()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Served(f"http://127.0.0.1:{server.server_address[1]}/x.ckpt", marker, requests)
    finally:
        server.shutdown()
        server.server_close()


def test_the_payload_runs_when_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = write_payload(tmp_path / "evil.ckpt", marker)
    torch.load(path, weights_only=False)
    assert marker.exists()


@pytest.mark.heavy
def test_lightning_alone_runs_a_served_pickle(
    served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why `ckpt_path` must be local: Lightning's default load of a URL unpickles it with
    weights_only=False (lightning/fabric/utilities/cloud_io.py `_load`, Lightning 2.6.6). Should a
    release stop doing so, drop this test and keep the check: a URL is still a file unchecked."""
    from lightning.fabric.utilities.cloud_io import _load

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch-home"))  # where torch.hub downloads
    _load(served.url)
    assert served.marker.exists()


# --- ckpt_path: a local file, checked with the config --------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "http://127.0.0.1:8000/x.ckpt",
        "https://example.org/last.ckpt",
        "s3://bucket/run/last.ckpt",
        "gs://bucket/last.ckpt",
        "hf://user/repo/last.ckpt",
        "simplecache::https://example.org/last.ckpt",
        "data:application/octet-stream;base64,gAJ9cQAu",
        "registry",
        "registry:my-model:v1",
    ],
)
def test_a_url_ckpt_path_is_refused_naming_the_key_value_and_fix(value: str) -> None:
    (problem,) = ckpt_path_problems(value)
    assert problem.startswith(f"ckpt_path={value!r}: ")
    assert "weights_only=False" in problem and "pass the local path" in problem


def test_a_file_url_is_refused_with_its_plain_path(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    path.touch()
    (problem,) = ckpt_path_problems(f"file://{path}")
    assert problem.startswith(f"ckpt_path='file://{path}'") and f"ckpt_path={path})" in problem


def test_local_ckpt_paths_pass(tmp_path: Path) -> None:
    (tmp_path / "last.ckpt").touch()
    (tmp_path / "deepspeed.ckpt").mkdir()  # DeepSpeed's checkpoint is a directory
    for value in (None, "last", "hpc", tmp_path / "last.ckpt", str(tmp_path / "deepspeed.ckpt")):
        assert ckpt_path_problems(value) == [], value


def test_a_missing_or_best_ckpt_path_is_refused_up_front(tmp_path: Path) -> None:
    (missing,) = ckpt_path_problems(str(tmp_path / "nope.ckpt"))
    assert "no such file or directory" in missing and "ckpt_path=last" in missing
    (best,) = ckpt_path_problems("best")
    assert best.startswith("ckpt_path='best'") and "ckpt_path=last" in best


@pytest.mark.heavy
def test_the_config_check_refuses_a_served_ckpt_path(served: Served) -> None:
    from medvqa.config import ConfigError, check_config

    cfg = compose([f"ckpt_path={served.url}"])
    with pytest.raises(ConfigError, match=re.escape(f"ckpt_path='{served.url}': a URL")):
        check_config(cfg)
    assert not served.requests and not served.marker.exists()


@pytest.mark.heavy
def test_the_entry_point_refuses_a_served_ckpt_path_before_any_work(
    served: Served, tmp_path: Path, cache_dir: Path
) -> None:
    run_dir = tmp_path / "run"
    job = run_main(
        ["debug=smoke", "logger=csv", "task.references=[]", f"ckpt_path={served.url}"],
        run_dir,
        cache_dir,
    )
    out = job.stderr + job.stdout
    assert job.returncode != 0
    assert f"ckpt_path='{served.url}': a URL" in out and "nothing was run" in out
    assert not served.requests, "the checkpoint was fetched"
    assert not served.marker.exists()
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "results.json").exists()


# --- resuming reads weights only ------------------------------------------------------------------


@pytest.mark.parametrize("force_unsafe", [False, True], ids=["default", "TORCH_FORCE_NO_WO"])
def test_the_checkpoint_io_refuses_a_local_pickle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, force_unsafe: bool
) -> None:
    """Even where the environment turns torch's weights-only default off."""
    if force_unsafe:
        monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    marker = tmp_path / "ran"
    path = write_payload(tmp_path / "evil.ckpt", marker)
    with pytest.raises(UnsafeCheckpointError, match=r"evil\.ckpt \(ckpt_path\): it holds "):
        AtomicCheckpointIO().load_checkpoint(path)
    with pytest.raises(UnsafeCheckpointError):
        load_weights_only(path)
    assert not marker.exists()


@pytest.mark.heavy
def test_the_checkpoint_io_reads_a_served_pickle_weights_only(
    served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the config check (a `last` resolving to a remote dirpath), a URL is still read
    weights-only."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch-home"))
    with pytest.raises(UnsafeCheckpointError, match="ckpt_path"):
        AtomicCheckpointIO().load_checkpoint(served.url)
    assert not served.marker.exists()


def test_a_fit_resuming_from_a_local_pickle_refuses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through Lightning's resume, with the CheckpointIO train_eval gives every Trainer."""
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    marker = tmp_path / "ran"
    path = write_payload(tmp_path / "evil.ckpt", marker)
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        plugins=[AtomicCheckpointIO()],
        default_root_dir=tmp_path,
    )
    with pytest.raises(UnsafeCheckpointError, match=r"evil\.ckpt"):
        trainer.fit(BoringModel(), ckpt_path=str(path))
    assert not marker.exists()


def test_a_lightning_checkpoint_resumes_weights_only(tmp_path: Path) -> None:
    """What a checkpoint holds (loops, callbacks' states with paths, optimizer and scheduler
    states, hyper-parameters) is all weights-only data: save, then resume through it."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    def trainer(steps: int) -> L.Trainer:
        return L.Trainer(
            accelerator="cpu",
            max_steps=steps,
            logger=False,
            callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)],
            enable_progress_bar=False,
            enable_model_summary=False,
            plugins=[AtomicCheckpointIO()],
            default_root_dir=tmp_path,
        )

    first = trainer(2)
    first.fit(BoringModel())
    last = tmp_path / "ckpt" / "last.ckpt"
    assert torch.serialization.get_unsafe_globals_in_checkpoint(last) == []
    second = trainer(4)
    second.fit(BoringModel(), ckpt_path="last")
    assert Path(second.ckpt_path) == last and second.global_step == 4


# --- DeepSpeed (ZeRO-2 on CPU) --------------------------------------------------------------------


@pytest.fixture(scope="module")
def zero2_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real ZeRO-2 checkpoint (a directory of shards) of a fit stopped after step 3."""
    pytest.importorskip("deepspeed", reason="deepspeed is in the dev extra")
    from tests.test_resume import _fit

    root = tmp_path_factory.mktemp("zero2")
    _fit(root, 2, 0, stop=3, zero2=True)
    return root / "last.ckpt"


def test_a_zero2_checkpoint_holds_only_allowed_classes(zero2_checkpoint: Path) -> None:
    """The allow-list is exactly what DeepSpeed writes beyond weights-only data: a new class in a
    DeepSpeed release fails here, by name, not mid-resume."""
    from medvqa.training.strategies import deepspeed_safe_globals

    allowed = {f"{c.__module__}.{c.__qualname__}" for c in deepspeed_safe_globals()}
    unsafe: set[str] = set()
    for path in (zero2_checkpoint / "checkpoint").glob("*.pt"):
        unsafe |= set(torch.serialization.get_unsafe_globals_in_checkpoint(path))
        load_weights_only(path, map_location="cpu", allowed=deepspeed_safe_globals())
    assert unsafe and unsafe <= allowed


@pytest.mark.parametrize(
    "planted",
    ["mp_rank_00_model_states.pt", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"],
    ids=["model-states", "optimizer-shard"],
)
def test_a_zero2_resume_refuses_a_planted_pickle(
    zero2_checkpoint: Path, tmp_path: Path, planted: str
) -> None:
    """DeepSpeed itself reads its shards with weights_only=False; medvqa's strategy does not."""
    from tests.test_resume import _fit

    run = tmp_path / "run"
    shutil.copytree(zero2_checkpoint.parent, run)
    target = run / "last.ckpt" / "checkpoint" / planted
    assert target.is_file()
    marker = tmp_path / "ran"
    write_payload(target, marker)
    with pytest.raises(UnsafeCheckpointError, match=planted):
        _fit(run, 2, 0, ckpt="last", zero2=True)
    assert not marker.exists()
