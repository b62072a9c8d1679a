"""One objective per optimiser step: however a step of 16 rows is split over micro-batches,
accumulation and ranks, it trains the same tensors (float32, dropout 0, clipping on, two
epochs of 40 rows: every epoch ends with a shorter step)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tests.conftest import sampled
from tests.split_training import train

TOLERANCE = 1e-4  # relative difference of each trained tensor


def _trained(path: Path) -> tuple[dict[str, torch.Tensor], int]:
    saved = torch.load(path, weights_only=True)
    return saved["tensors"], saved["global_step"]


def _largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).norm() / a[k].norm().clamp(min=1e-12)) for k in a)


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path, cache_dir: Path, tmp_path_factory) -> dict[str, torch.Tensor]:
    out = tmp_path_factory.mktemp("split") / "16x1.pt"
    train(str(tiny_model_dir), str(cache_dir), str(out), 16, 1)
    tensors, steps = _trained(out)
    assert steps == 6  # 2 epochs of 16, 16, 8
    return tensors


@pytest.mark.parametrize(
    ("batch_size", "accumulate"), sampled([(8, 2), (4, 4)], keep=1, unpack=True)
)
def test_accumulation_trains_what_one_batch_trains(
    reference,
    tiny_model_dir: Path,
    cache_dir: Path,
    tmp_path: Path,
    batch_size: int,
    accumulate: int,
) -> None:
    out = tmp_path / "split.pt"
    train(str(tiny_model_dir), str(cache_dir), str(out), batch_size, accumulate)
    tensors, steps = _trained(out)
    assert steps == 6
    assert _largest_difference(reference, tensors) < TOLERANCE


@pytest.mark.slow
def test_the_test_tells_the_old_objective_apart(
    reference, tiny_model_dir: Path, cache_dir: Path, tmp_path: Path
) -> None:
    """Each micro-batch's own token mean, averaged over the accumulation (the objective before
    the step count): 4 x 4 then trains other tensors, by far more than the tolerance."""
    out = tmp_path / "old.pt"
    train(str(tiny_model_dir), str(cache_dir), str(out), 4, 4, step_tokens=False)
    assert _largest_difference(reference, _trained(out)[0]) > 100 * TOLERANCE


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_gloo_ranks_train_what_one_batch_trains(
    reference, tiny_model_dir: Path, cache_dir: Path, tmp_path: Path
) -> None:
    """2 ranks x 8 rows: the ranks' label tokens differ, and the step's mean is over both."""
    out = tmp_path / "2x8.pt"
    kwargs = {
        "tiny_model_dir": str(tiny_model_dir),
        "cache_dir": str(cache_dir),
        "out": str(out),
        "batch_size": 8,
        "accumulate": 1,
        "ranks": 2,
        "port": _free_port(),
    }
    mp.start_processes(
        __import__("tests.split_training", fromlist=["spawned"]).spawned,
        args=(kwargs,),
        nprocs=2,
        start_method="spawn",
    )
    tensors, steps = _trained(out)
    assert steps == 6
    assert _largest_difference(reference, tensors) < TOLERANCE


def test_zero2_with_accumulation_trains_what_one_batch_trains(
    tiny_model_dir: Path, cache_dir: Path, tmp_path: Path
) -> None:
    """DeepSpeed divides by its accumulation steps once more than Lightning does; ZeRO-2's CPU
    test strategy, 16 x 1 against 8 x 2 in one epoch of two whole steps (DeepSpeed counts
    micro-steps across epochs, so a shorter last step would run into the next epoch's)."""
    pytest.importorskip("deepspeed")
    outs = {}
    for batch_size, accumulate in ((16, 1), (8, 2)):
        out = tmp_path / f"{batch_size}x{accumulate}.pt"
        train(
            str(tiny_model_dir),
            str(cache_dir),
            str(out),
            batch_size,
            accumulate,
            deepspeed=True,
            epochs=1,
            rows=32,
        )
        outs[accumulate] = _trained(out)
    assert outs[1][1] == outs[2][1] == 2
    assert _largest_difference(outs[1][0], outs[2][0]) < TOLERANCE
