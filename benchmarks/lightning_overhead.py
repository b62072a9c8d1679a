"""Lightning's overhead against a bare PyTorch loop on the same model and the same batches.

Not a test. Both loops train the tiny LLaVA with LoRA on identical pre-collated batches, with
the same optimiser and schedule; the ratio Lightning time / bare time is the cost of the
framework around the step (logging, hooks, progress bar off).
"""

from __future__ import annotations

import copy
import os
import sys
import time
from pathlib import Path

import lightning as L
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import medvqa.config  # noqa: E402,F401
from medvqa.models.adapters import apply_method  # noqa: E402
from medvqa.models.loading import load_vlm, roles  # noqa: E402
from medvqa.training.datamodule import VQADataset, make_loader  # noqa: E402
from medvqa.training.module import VQAModule  # noqa: E402

STEPS = 40
CACHE = Path(os.environ.get("MEDVQA_CACHE", ROOT / ".cache"))


class _Replay:
    """An iterable over fixed batches (a plain list would be read as several dataloaders)."""

    def __init__(self, batches: list) -> None:
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def main() -> None:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"paths.cache_dir={CACHE}", *sys.argv[1:]])
    source = instantiate(cfg.dataset)
    base, processor = load_vlm(cfg.model)
    base = apply_method(base, cfg.peft, roles(cfg.model), processor)
    batch_size = int(cfg.data.batch_size)
    loader = make_loader(
        VQADataset(source.table().head(STEPS * batch_size), source, processor, with_answer=True),
        batch_size,
        shuffle=False,
        padding_side="right",
    )
    batches = list(loader)  # the same tensors for both loops; no data loading in the timing

    bare_model = copy.deepcopy(base)
    bare_module = VQAModule(bare_model, lr=cfg.peft.lr, projector_lr=None)
    params = [p for p in bare_model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.peft.lr)
    bare_model.train()
    start = time.perf_counter()
    for batch in batches:
        loss = bare_module._loss(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad()
    bare = time.perf_counter() - start

    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=len(batches),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        gradient_clip_val=1.0,
        limit_val_batches=0,
    )
    start = time.perf_counter()
    trainer.fit(
        VQAModule(base, lr=cfg.peft.lr, projector_lr=None), train_dataloaders=_Replay(batches)
    )
    lightning = time.perf_counter() - start

    Console().print(
        f"{len(batches)} steps, batch {batch_size}: bare {bare:.2f}s "
        f"({len(batches) * batch_size / bare:.1f} samples/s), Lightning {lightning:.2f}s "
        f"({len(batches) * batch_size / lightning:.1f} samples/s); ratio {lightning / bare:.3f}"
    )


if __name__ == "__main__":
    main()
