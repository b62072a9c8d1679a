"""The rates task=plan ships (medvqa/planning/measured_rates.jsonl): every one read from a raw
measured row under benchmarks/results/ (file and line), the newest of a setup used, and a row
that failed or measured another method refused."""

from __future__ import annotations

import json

import pytest

from medvqa.planning import rates
from tests.test_training_speed import _bench

BENCH_ROW = {  # benchmarks/gpu.py's row as it writes it now: date, commit and rank recorded
    "model": "llava_med", "method": "lora", "data": "slake", "adapter_r": 128,
    "setup": "none-8-compile", "gpu": "NVIDIA H100 80GB HBM3", "samples_s": 20.5,
    "setup_fields": {"checkpoint_every": 0, "micro_batch": 8, "compile_layers": True,
                     "lora_dropout": None},
    "date": "2026-12-01", "git": {"commit": "abc1234", "dirty": False},
}  # fmt: skip


def test_the_shipped_rates_are_the_raw_rows_read_again() -> None:
    """benchmarks/measured_rates.py --check: the shipped file is what its list of raw rows gives
    (a rate edited by hand, or a raw row changed, fails here)."""
    script = _bench("measured_rates")
    assert script.main(["--check"]) == 0
    lines = script.build()
    assert len(lines) == len(rates.shipped())
    for line, row in zip(lines, rates.shipped(), strict=True):
        assert rates.loads(line) == row
        path, number = row.measured.source.rsplit(":", 1)
        raw = json.loads((script.ROOT / path).read_text().splitlines()[int(number) - 1])
        value = row.samples_per_s if isinstance(row, rates.TrainRow) else None
        if value is not None:
            assert value == raw["samples_s"]


def test_a_new_benchmark_row_carries_its_date_commit_and_rank() -> None:
    row = rates.train_row(BENCH_ROW, "benchmarks/results/gpu-h100-2026-12-01.jsonl:3")
    assert (row.rank, row.kernels, row.micro_batch, row.samples_per_s) == (128, "compiled", 8, 20.5)
    assert row.pretrained == "chaoyinshe/llava-med-v1.5-mistral-7b-hf"
    assert row.measured.cited == "benchmarks/results/gpu-h100-2026-12-01.jsonl:3 (commit abc1234)"
    assert "lora r128" in row.name


def test_of_one_setup_the_newest_row_is_used() -> None:
    """By date, then the later line; another setup (rank 128, not 16) is kept beside it."""
    old = rates.train_row(BENCH_ROW | {"date": "2026-11-30", "samples_s": 30.0}, "a.jsonl:1")
    new = rates.train_row(BENCH_ROW, "b.jsonl:1")
    later = rates.train_row(BENCH_ROW | {"samples_s": 21.0}, "b.jsonl:2")
    other = rates.train_row(BENCH_ROW | {"adapter_r": 16, "date": "2026-11-01"}, "c.jsonl:1")
    assert rates.newest((new, later, old, other)) == (later, other)
    # the shipped compiled LLaVA-Med row: 2026-11-28's 22.9, not 2026-11-26's 23.5
    compiled = [r for r in rates.rows(rates.TrainRow) if r.kernels == "compiled"]
    llava = [r for r in compiled if r.preset == "llava_med"]
    assert [(r.samples_per_s, r.measured.date) for r in llava] == [
        (pytest.approx(22.912, abs=1e-3), "2026-11-28")
    ]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"error": "out of memory", "samples_s": None}, "not a measured training rate"),
        ({"setup_fields": BENCH_ROW["setup_fields"] | {"lora_dropout": 0.0}}, "LoRA dropout 0.0"),
    ],
)
def test_a_failed_row_or_another_method_is_refused(change: dict, why: str) -> None:
    with pytest.raises(ValueError, match=why) as err:
        rates.train_row(BENCH_ROW | change, "x.jsonl:7")
    assert "x.jsonl:7" in str(err.value)


def test_a_job_without_a_steady_window_gives_no_compile_time() -> None:
    job = {"status": "finished", "device": "cuda: NVIDIA H100 80GB HBM3 x1",
           "overrides": {"model": "llava_med"}, "date": "2026-11-28",
           "metrics": {"perf/fit/seconds": 16.9, "perf/fit/samples": 24.0,
                       "perf/fit/steady_samples_per_s": None, "perf/fit/compiled_layers": 1.0}}  # fmt: skip
    with pytest.raises(ValueError, match="steady rate"):
        rates.job_row(job, "gpu-check.jsonl:3")
    steady = job | {"metrics": job["metrics"] | {"perf/fit/steady_samples_per_s": 4.0}}
    row = rates.job_row(steady, "gpu-check.jsonl:3")
    assert row.compile_s == pytest.approx(16.9 - 24 / 4) and row.kernels == "compiled"
    assert row.measured.gpu == "NVIDIA H100 80GB HBM3"
