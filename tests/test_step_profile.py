"""The steady-step profile (medvqa.training.profiling): a Chrome trace summarised into the shares
of GEMM / attention / other / communication / memory copies and idle time, checked by hand on a
planted trace, and the callback run inside a real (CPU) fit."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch

from medvqa import measure
from medvqa.training.profiling import StepProfile, category, summarise, summarise_file


def _kernel(name: str, ts: float, dur: float, cat: str = "kernel") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7}


def test_a_planted_trace_gives_the_shares_computed_by_hand() -> None:
    """100 us window: a GEMM 0-40, flash attention 40-60 overlapped by an elementwise kernel on
    another stream 50-70, a copy 80-90; idle = 100 - busy (0-70, 80-90) = 20 us."""
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "ts": 0, "dur": 100, "pid": 1, "tid": 1},
        _kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 0, 40),
        _kernel("flash_fwd_kernel", 40, 20),
        _kernel("vectorized_elementwise_kernel", 50, 20),
        _kernel("Memcpy HtoD (Pageable -> Device)", 80, 10, cat="gpu_memcpy"),
    ]  # fmt: skip
    s = summarise(events)
    assert s.device == "cuda" and s.window_us == 100 and s.busy_us == 80
    shares = s.metrics()
    assert shares == pytest.approx({
        "gemm_share": 0.4, "attention_share": 0.2, "other_share": 0.2,
        "communication_share": 0.0, "memory_copies_share": 0.1, "idle_share": 0.2,
        "window_ms": 0.1})  # fmt: skip
    assert [name for name, _, _ in s.top][:2] == [
        "sm90_xmma_gemm_bf16bf16_bf16f32",
        "flash_fwd_kernel",
    ]
    assert "| gemm | 40.0 % |" in s.table() and "| idle | 20.0 % |" in s.table()


def test_cpu_ops_count_their_self_time() -> None:
    """aten::linear (0-10) calls aten::addmm (2-9): the GEMM is addmm's 7 us, linear keeps 3."""
    ops = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "ts": 0, "dur": 10, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "ts": 2, "dur": 7, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::gelu", "ts": 10, "dur": 5, "pid": 1, "tid": 1},
    ]  # fmt: skip
    s = summarise(ops)
    assert s.device == "cpu" and s.window_us == 15
    assert s.by_category == pytest.approx({"gemm": 7.0, "other": 8.0})
    assert category("nccl:all_reduce") == "communication" and category("aten::bmm") == "gemm"


def test_a_file_that_is_not_a_trace_is_refused_by_name(tmp_path: Path) -> None:
    bad = tmp_path / "trace.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=r"trace\.json: not a Chrome trace"):
        summarise_file(bad)
    bad.write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(ValueError, match="nothing was profiled"):
        summarise_file(bad)


class _Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1)
        )

    def training_step(self, batch: torch.Tensor, i: int) -> torch.Tensor:
        return self.net(batch).square().mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_the_callback_profiles_its_steps_in_a_fit_and_records_them(tmp_path: Path) -> None:
    measure.reset()
    profile = StepProfile(start=2, steps=3)
    trainer = L.Trainer(
        max_steps=8, accumulate_grad_batches=2, accelerator="cpu", logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[profile], default_root_dir=str(tmp_path),
    )  # fmt: skip
    data = torch.utils.data.DataLoader(torch.randn(64, 32), batch_size=4)
    trainer.fit(_Tiny(), train_dataloaders=data)
    assert (tmp_path / "profile" / "trace.json").is_file()
    assert (tmp_path / "profile" / "summary.md").read_text().startswith("cpu time over")
    summary = profile.summary
    assert summary is not None and summary.share("gemm") > 0
    perf = measure.metrics()
    assert perf["perf/profile/steps"] == 3 and 0 < perf["perf/profile/gemm_share"] < 1
    measure.reset()
