"""Throughput of the tiny model on this machine: training and evaluation samples/s.

Not a test: numbers depend on the machine. Run with `make bench`; pass Hydra-style overrides
to measure another configuration, e.g. `python benchmarks/throughput.py peft=full`.
Reports training samples/s per method (Lightning, the same module the main job uses) and greedy
generation samples/s (the evaluation path, batched).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import lightning as L
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import medvqa.config  # noqa: E402,F401
from medvqa.data.shifts import Shift, make_splits  # noqa: E402
from medvqa.generation.predict import generate_predictions  # noqa: E402
from medvqa.models.adapters import apply_method  # noqa: E402
from medvqa.models.loading import load_vlm, roles  # noqa: E402
from medvqa.tasks.generation import from_config  # noqa: E402
from medvqa.training.datamodule import VQADataModule  # noqa: E402
from medvqa.training.module import VQAModule  # noqa: E402

TRAIN_STEPS = 40
EVAL_SAMPLES = 256


CACHE = Path(os.environ.get("MEDVQA_CACHE", ROOT / ".cache"))


def _cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=[f"paths.cache_dir={CACHE}", *overrides])


def train_rate(method: str) -> float:
    cfg = _cfg([f"peft={method}", *sys.argv[1:]])
    source = instantiate(cfg.dataset)
    splits = make_splits(source.table(), Shift.from_config(dict(cfg.shift)), seed=0)
    model, processor = load_vlm(cfg.model)
    model = apply_method(model, cfg.peft, roles(cfg.model), processor)
    dm = VQADataModule(splits.frames, source, processor, batch_size=int(cfg.data.batch_size))
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=TRAIN_STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    # warm-up: the first steps pay for allocations and lazy imports
    L.Trainer(
        accelerator="cpu",
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    ).fit(VQAModule(model, projector_lr=None), datamodule=dm)
    start = time.perf_counter()
    trainer.fit(VQAModule.for_method(model, cfg.peft, roles(cfg.model)["projector"]), datamodule=dm)
    return TRAIN_STEPS * int(cfg.data.batch_size) / (time.perf_counter() - start)


def eval_rate(tmp: Path) -> float:
    cfg = _cfg(list(sys.argv[1:]))
    source = instantiate(cfg.dataset)
    frame = source.table().head(EVAL_SAMPLES)
    model, processor = load_vlm(cfg.model)
    out = tmp / "bench_predictions.jsonl"
    out.unlink(missing_ok=True)
    start = time.perf_counter()
    generate_predictions(
        model,
        processor,
        frame,
        source,
        out,
        "bench",
        from_config(cfg, model, processor, source),  # no memory plan: unmerged, as on a CPU
    )
    rate = len(frame) / (time.perf_counter() - start)
    out.unlink(missing_ok=True)
    return rate


def main() -> None:
    results = {
        f"train_samples_per_s/{m}": train_rate(m) for m in ("lora", "full", "ia3", "prompt_tuning")
    }
    results["eval_samples_per_s/greedy"] = eval_rate(CACHE)
    table = Table(title=f"tiny model throughput ({torch.get_num_threads()} threads)")
    table.add_column("measure")
    table.add_column("samples/s", justify="right")
    for key, value in results.items():
        table.add_row(key, f"{value:.1f}")
    Console().print(table)
    Console().print_json(json.dumps(results))


if __name__ == "__main__":
    main()
