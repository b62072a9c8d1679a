"""Progress lines where stdout is not a terminal (medvqa.progress, medvqa.training.progress)."""

from __future__ import annotations

import io
import logging

import pytest
import torch

from medvqa import progress
from medvqa.progress import ProgressSettings, Ticker, duration


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def _defaults():
    yield
    progress.configure(None)


def test_a_line_every_n_steps_every_s_seconds_and_at_the_end(caplog) -> None:
    progress.configure(ProgressSettings(when="always", every_n_steps=10, every_s=30.0))
    clock = Clock()
    ticker = Ticker("fit", 25, "steps", every_n=10, clock=clock)
    logged = []
    with caplog.at_level(logging.INFO, logger="medvqa.progress"):
        for step in range(1, 26):
            clock.now += 1.0 if step != 13 else 40.0  # one slow step: a line by time
            if ticker.update(step, {"loss": "0.5"}):
                logged.append(step)
    assert logged == [10, 13, 20, 25]
    last = caplog.records[-1].getMessage()
    assert last.startswith("fit: 25/25 steps (100%), ")
    assert "ETA 0s" in last and "loss 0.5" in last


def test_rate_and_eta_count_this_process_only() -> None:
    clock = Clock()
    ticker = Ticker("fit", 200, "steps", every_n=50, enabled_=True, clock=clock, first=100)
    clock.now = 10.0
    line = ticker.line(150)
    # 50 steps in 10 s: 5 steps/s, 50 left: 10 s
    assert "150/200 steps (75%)" in line and "5 steps/s" in line and "ETA 10s" in line


def test_auto_follows_whether_stdout_is_a_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    progress.configure({"when": "auto"})
    assert progress.enabled(io.StringIO()) and not progress.enabled(Tty())
    progress.configure({"when": "never"})
    assert not progress.enabled(io.StringIO())
    progress.configure({"when": "always"})
    assert progress.enabled(Tty())
    assert not Ticker("x", 3, "rows", enabled_=False).update(3)


@pytest.mark.parametrize(
    ("seconds", "shown"), [(5, "5s"), (65, "1m05s"), (3725, "1h02m"), (float("nan"), "?")]
)
def test_duration(seconds: float, shown: str) -> None:
    assert duration(seconds) == shown


def test_bad_settings_are_refused_by_name() -> None:
    from medvqa.config import check_config
    from medvqa.errors import ConfigError
    from tests.conftest import compose

    cfg = compose(["progress.when=sometimes", "progress.every_s=0"])
    with pytest.raises(ConfigError) as err:
        check_config(cfg, fields=False)
    assert "progress.when=sometimes: needs one of auto" in str(err.value)
    assert "progress.every_s=0.0: needs a number of seconds > 0" in str(err.value)


def test_a_lightning_fit_logs_step_loss_lr_and_eta(caplog, tmp_path) -> None:
    """FitProgress in a real Lightning fit of a small module."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from medvqa.training.progress import FitProgress

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            loss = self.layer(batch["input_ids"].float()).pow(2).mean()
            self.log("train/loss", loss)
            return loss

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Rows(TensorDataset):
        def __getitem__(self, i):  # type: ignore[no-untyped-def]
            return {"input_ids": self.tensors[0][i]}

    progress.configure(ProgressSettings(when="always", every_n_steps=4))
    data = DataLoader(Rows(torch.randn(24, 2)), batch_size=2)
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[FitProgress()],
        default_root_dir=tmp_path,
    )
    with caplog.at_level(logging.INFO, logger="medvqa.progress"):
        trainer.fit(Tiny(), data)
    lines = [r.getMessage() for r in caplog.records if r.name == "medvqa.progress"]
    assert [line.split(",")[0] for line in lines] == [
        f"fit: {s}/24 steps ({100 * s / 24:.0f}%)" for s in (4, 8, 12, 16, 20, 24)
    ]
    assert all("train loss" in x and "lr 0.01" in x and "samples/s" in x for x in lines)
    assert "epoch 2/2" in lines[-1] and "ETA 0s" in lines[-1]
