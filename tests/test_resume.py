"""Resuming a fit is exact: a run stopped at a checkpoint and resumed with `ckpt_path=last` trains
the same batches in the same order, with the same dropout masks, as one never stopped, mid-epoch
included, and ends with the same weights (medvqa/training/datamodule.py).

What Lightning 2.6.6 does alone with a plain shuffled DataLoader, measured: resumed at batch k of
an epoch of n, it runs n - k more batches drawn from the *start* of a fresh iterator (rows trained
twice, the epoch's last rows never), and the loader's new generator replays the first epochs'
orders in the later epochs; nor does it restore the random state (dropout).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from medvqa.training.datamodule import EpochSampler, ResumableLoader, VQADataModule, epoch_order
from tests.conftest import run_main


class RecordBatches(L.Callback):
    """Appends the record ids of every training batch, with its step, to `path` (one per rank)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        line = {
            "step": trainer.global_step,
            "epoch": trainer.current_epoch,
            "ids": batch["record_ids"],
        }
        rank_file = self.path.with_suffix(f".rank{trainer.global_rank}.jsonl")
        with rank_file.open("a") as fh:
            fh.write(json.dumps(line) + "\n")


class KillAtStep(L.Callback):
    """SIGKILL, a preemption without warning (or `signum`: SIGTERM, a scheduler's notice), once
    `step` optimiser steps are done (every rank)."""

    def __init__(self, step: int, signum: int = signal.SIGKILL) -> None:
        self.step = step
        self.signum = signum

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


# --- the order: (seed, epoch) alone, sharded over ranks -----------------------------------------


@pytest.mark.parametrize("seed", [0, 7])
def test_epoch_order_is_a_function_of_seed_and_epoch(seed: int) -> None:
    """The orders an uninterrupted run trained on with the old loader (one generator across
    epochs, num_workers=0, and Lightning taking len(loader) batches an epoch), now computed per
    epoch: a resumed run's epoch 2 is epoch 2's order, not epoch 0's again."""
    rows = list(range(23))
    old = DataLoader(rows, shuffle=True, generator=torch.Generator().manual_seed(seed))
    seen = []
    for _ in range(3):
        batches = iter(old)
        seen.append([int(next(batches)) for _ in range(len(old))])
    assert [epoch_order(len(rows), seed, e) for e in range(3)] == seen
    assert len({tuple(o) for o in seen}) == 3 and all(sorted(o) == rows for o in seen)
    fresh = EpochSampler(rows, seed)
    fresh.set_epoch(2)
    assert list(fresh) == seen[2]


@pytest.mark.parametrize("size", [24, 23])
def test_two_ranks_share_each_epoch(size: int) -> None:
    """Rank r takes every 2nd row of the epoch's order from the r-th (padded as Lightning's
    DistributedSampler pads), so each shard of epoch e depends on (seed, e) alone."""
    rows = list(range(size))
    for epoch in range(2):
        order = epoch_order(size, 3, epoch)
        shards = []
        for rank in range(2):
            sampler = EpochSampler(rows, 3, num_replicas=2, rank=rank)
            sampler.set_epoch(epoch)
            shards.append(list(sampler))
        padded = order + order[: 2 * math.ceil(size / 2) - size]
        assert shards == [padded[0::2], padded[1::2]]
        assert sorted(set(shards[0]) | set(shards[1])) == rows
        assert len(shards[0]) == len(shards[1]) == math.ceil(size / 2)


def test_lightning_keeps_the_sampler_on_several_ranks() -> None:
    """A plain shuffled loader gets Lightning's own DistributedSampler (seeded PL_GLOBAL_SEED +
    epoch); an EpochSampler is a DistributedSampler already, so it stays."""
    from lightning.pytorch.trainer.states import RunningStage

    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False)
    connector = trainer._data_connector
    rows = list(range(10))
    ours = ResumableLoader(rows, sampler=EpochSampler(rows, 0, num_replicas=2, rank=1))
    kept = connector._prepare_dataloader(ours, shuffle=True, mode=RunningStage.TRAINING)
    assert kept is ours
    plain = DataLoader(rows, shuffle=True)
    replaced = connector._prepare_dataloader(plain, shuffle=True, mode=RunningStage.TRAINING)
    assert type(replaced.sampler).__name__ == "DistributedSampler"


@pytest.mark.parametrize("ranks", [1, 2])
def test_the_loader_continues_its_epoch_from_its_state(ranks: int) -> None:
    rows = list(range(22))

    def loaders() -> list[ResumableLoader]:
        return [
            ResumableLoader(rows, batch_size=3, sampler=EpochSampler(rows, 5, ranks, r))
            for r in range(ranks)
        ]

    before = loaders()
    states = []
    for loader in before:
        loader.sampler.set_epoch(1)
        batches = iter(loader)
        for _ in range(2):
            next(batches)
        states.append(loader.state_dict())
    assert states[0] == states[-1]  # the same for every rank: rank 0's checkpoint serves all
    for rank, loader in enumerate(loaders()):
        loader.load_state_dict(states[0])
        loader.sampler.set_epoch(1)  # as Lightning does before the epoch goes on
        uninterrupted = EpochSampler(rows, 5, ranks, rank)
        uninterrupted.set_epoch(1)
        rest = list(uninterrupted)[2 * 3 :]
        assert [int(i) for b in loader for i in b] == rest
        loader.sampler.set_epoch(2)  # the next epoch in full
        assert len([int(i) for b in loader for i in b]) == len(uninterrupted)


def test_a_changed_layout_cannot_resume_mid_epoch() -> None:
    rows = list(range(20))
    loader = ResumableLoader(rows, batch_size=4, sampler=EpochSampler(rows, 0))
    state = {**loader.state_dict(), "epoch": 1, "batches": 2, "ranks": 2}
    with pytest.raises(ValueError, match=r"ranks 2 -> 1.*trainer\.devices x trainer\.num_nodes"):
        loader.load_state_dict(state)
    loader.load_state_dict({**state, "batches": 5})  # an epoch's end: any layout may go on


# --- Lightning, in process: a toy model with dropout, our DataModule and loaders ------------------


class Rows(Dataset):
    """Rows with an id, in the shape `make_loader`'s collate expects."""

    processor = SimpleNamespace(tokenizer=SimpleNamespace(pad_token_id=0))

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": torch.tensor([i]), "record_ids": f"r{i}"}


class RowsModule(VQADataModule):
    def __init__(self, n: int, batch_size: int, num_workers: int) -> None:
        super().__init__(
            {}, None, None, batch_size, eval_batch_size=4, num_workers=num_workers, seed=11
        )
        self.n = n

    def _dataset(self, split: str) -> Rows:
        return Rows(self.n if split == "train" else 6)


class Dropped(L.LightningModule):
    """A linear map behind dropout, with VQAModule's schedule (which asks Lightning for the
    number of steps before any checkpoint is read: Lightning issue #20550)."""

    def __init__(self) -> None:
        super().__init__()
        self.dropout = torch.nn.Dropout(0.5)
        self.linear = torch.nn.Linear(4, 1)
        self.seen: list[tuple[int, list[str]]] = []

    def _loss(self, batch: dict[str, Any]) -> torch.Tensor:
        x = (batch["input_ids"].repeat(1, 4) / 10).to(self.linear.weight.dtype)
        return self.linear(self.dropout(x)).pow(2).mean()

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.seen.append((self.global_step, batch["record_ids"]))
        return self._loss(batch)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.log("val/loss", self._loss(batch))

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=0.1)
        total = int(self.trainer.estimated_stepping_batches)
        cosine = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 - s / (total + 1))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": cosine, "interval": "step"}}


class Stop(L.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            raise InterruptedError(f"stopped before step {self.step + 1}")


def _fit(
    root: Path,
    every_n_train_steps: int | None,
    num_workers: int,
    stop: int | None = None,
    ckpt: str | None = None,
    zero2: bool = False,
) -> Dropped:
    from lightning.pytorch.callbacks import ModelCheckpoint

    L.seed_everything(0, verbose=False)
    model = Dropped()
    callbacks: list[L.Callback] = [
        ModelCheckpoint(  # as conf/callbacks/default.yaml, with the study's step settings
            dirpath=root,
            save_last=True,
            save_top_k=0 if every_n_train_steps else 1,
            every_n_train_steps=every_n_train_steps,
        )
    ]
    if stop is not None:
        callbacks.append(Stop(stop))
    strategy: Any = "auto"
    if zero2:  # restores the checkpoint after the strategy's setup, loaders built already
        from tests.zero2_cpu import CPUZero2Strategy

        strategy = CPUZero2Strategy()
    trainer = L.Trainer(
        accelerator="cpu",
        strategy=strategy,
        precision="bf16-mixed" if zero2 else "32-true",
        max_epochs=3,
        logger=False,
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    with contextlib.suppress(InterruptedError):
        trainer.fit(model, datamodule=RowsModule(20, 4, num_workers), ckpt_path=ckpt)
    return model


@pytest.mark.parametrize(
    ("every_n_train_steps", "stop", "resumed_at", "num_workers"),
    [
        (2, 7, 6, 0),  # a step checkpoint inside epoch 1 (5 batches an epoch)
        (2, 7, 6, 2),  # the same with worker processes (they take indices ahead)
        (5, 6, 5, 0),  # a step checkpoint at epoch 0's last batch, before its validation
        (None, 7, 5, 0),  # an epoch-end checkpoint (the default callbacks)
    ],
)
def test_lightning_resumes_exactly(
    tmp_path: Path, every_n_train_steps: int | None, stop: int, resumed_at: int, num_workers: int
) -> None:
    whole = _fit(tmp_path / "whole", every_n_train_steps, num_workers)
    stopped = _fit(tmp_path / "stopped", every_n_train_steps, num_workers, stop=stop)
    resumed = _fit(tmp_path / "stopped", every_n_train_steps, num_workers, ckpt="last")
    assert len(whole.seen) == 15 and len(stopped.seen) == stop
    assert resumed.seen[0][0] == resumed_at
    assert stopped.seen[:resumed_at] + resumed.seen == whole.seen
    for a, b in zip(whole.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)  # dropout masks too: the random state came back


def test_lightning_resumes_exactly_under_zero2(tmp_path: Path) -> None:
    """DeepSpeed ZeRO-2 (on CPU) reads the checkpoint after it has built the loaders."""
    whole = _fit(tmp_path / "whole", 2, 0, zero2=True)
    _fit(tmp_path / "stopped", 2, 0, stop=7, zero2=True)
    resumed = _fit(tmp_path / "stopped", 2, 0, ckpt="last", zero2=True)
    assert resumed.seen[0][0] == 6 and whole.seen[6:] == resumed.seen
    for a, b in zip(whole.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)


# --- the main job on the tiny model, with the study's checkpoint settings -------------------------

# 8 rows a rank (2 batches an epoch), 3 epochs, a checkpoint every 3 steps (the study's
# callbacks, smaller): killed before step 5, the job resumes from step 3, after epoch 1's first
# batch.
RESUME_JOB = [
    "study=sure_vqa",
    "model=tiny",  # the study trains LLaVA-Med; the pipeline check, the tiny one
    "debug=smoke",
    "logger=csv",
    "task.references=[]",
    "task.eval_splits=[val]",
    "trainer.max_steps=-1",
    "trainer.max_epochs=3",
    "callbacks.model_checkpoint.every_n_train_steps=3",
]


def _record(path: Path) -> list[str]:
    return [
        f"+callbacks.record._target_={__name__}.RecordBatches",
        f"+callbacks.record.path={path}",
    ]


def _batches(path: Path, rank: int = 0) -> list[tuple[int, list[str]]]:
    lines = path.with_suffix(f".rank{rank}.jsonl").read_text().splitlines()
    return [(r["step"], r["ids"]) for r in map(json.loads, lines)]


def _trained(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(run_dir / "trained" / "trainable.safetensors")


def _kill_and_resume(
    tmp_path: Path,
    cache_dir: Path,
    extra: list[str],
    ranks: int = 1,
    signum: int = signal.SIGKILL,
    whole_dir: Path | None = None,
) -> None:
    """The job uninterrupted (or `whole_dir`, where it ran), then killed after a mid-epoch step
    checkpoint and run again in its run directory (as a requeued SLURM job is): same batches per
    step, same weights."""
    job = [*RESUME_JOB, f"data.limit.train={8 * ranks}", *extra]
    if whole_dir is None:
        whole_dir = tmp_path
        whole = run_main([*job, *_record(tmp_path / "whole")], tmp_path / "a", cache_dir)
        assert whole.returncode == 0, whole.stderr[-3000:]
    kill = [
        f"+callbacks.kill._target_={__name__}.KillAtStep",
        "+callbacks.kill.step=4",
        f"+callbacks.kill.signum={int(signum)}",
    ]
    killed = run_main([*job, *_record(tmp_path / "killed"), *kill], tmp_path / "b", cache_dir)
    if signum == signal.SIGKILL:  # nothing can record it: the record still says running
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    else:  # recorded, with where it stopped, and the shell's exit code for the signal
        assert killed.returncode == 128 + signum, killed.stderr[-3000:]
        record = json.loads((tmp_path / "b" / "results.json").read_text())
        assert record["status"] == "interrupted" and record["signal"] == "SIGTERM"
        assert record["stage"] == "fit" and record["global_step"] == 4
    resumed = run_main([*job, *_record(tmp_path / "resumed")], tmp_path / "b", cache_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming epoch 1 at batch 1 of 2" in resumed.stderr + resumed.stdout
    for rank in range(ranks):
        first, rest = _batches(tmp_path / "killed", rank), _batches(tmp_path / "resumed", rank)
        assert rest[0][0] == 3 and len(first) == 5  # resumed at the checkpoint, mid-epoch
        assert first[:3] + rest == _batches(whole_dir / "whole", rank)
    a, b = _trained(whole_dir / "a"), _trained(tmp_path / "b")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    record = json.loads((tmp_path / "b" / "results.json").read_text())
    assert record["status"] == "finished" and record["metrics"]["train/global_step"] == 6


@pytest.fixture(scope="module")
def whole_job(
    tmp_path_factory: pytest.TempPathFactory, cache_dir: Path, tiny_model_dir: Path
) -> Path:
    """The resume job run once, uninterrupted: what every interrupted variant must equal."""
    root = tmp_path_factory.mktemp("whole")
    job = [*RESUME_JOB, "data.limit.train=8", *_record(root / "whole")]
    whole = run_main(job, root / "a", cache_dir)
    assert whole.returncode == 0, whole.stderr[-3000:]
    return root


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
@pytest.mark.slow
def test_a_killed_job_resumes_exactly(
    tmp_path: Path, cache_dir: Path, whole_job: Path, signum: int
) -> None:
    """LoRA (dropout 0.05) with the study's gradient checkpointing, on one process: killed
    without warning, or told to stop (SIGTERM: recorded `interrupted`, exit 143)."""
    _kill_and_resume(tmp_path, cache_dir, [], signum=signum, whole_dir=whole_job)


@pytest.mark.slow
def test_a_killed_two_rank_job_resumes_exactly(
    tmp_path: Path, cache_dir: Path, tiny_model_dir: Path
) -> None:
    """Two gloo ranks: each rank's batches per step and the weights as uninterrupted."""
    _kill_and_resume(tmp_path, cache_dir, ["trainer.devices=2", "trainer.strategy=ddp"], ranks=2)
