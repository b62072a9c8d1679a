"""GPU throughput of the training and generation paths the main job uses (a benchmark, not a test).

On a CUDA machine: for each model (tiny, smollm2_llava), trainer (`trainer=gpu`,
`trainer=deepspeed_zero2` on 1 device) and method, fine-tune for a few steps and generate, then
print train samples/s, generation samples/s, peak GPU memory and model FLOPs utilisation
(MFU = 6 * parameters * trained tokens/s over the GPU's peak dense bf16 FLOP/s). It also checks
that the parameters are on CUDA while training and generating. Without CUDA it stops with a
message; `--cpu` runs the same code with `trainer=cpu` to check the script itself.

    python benchmarks/gpu.py                        # everything (minutes on an H100)
    python benchmarks/gpu.py --models tiny --methods lora --steps 20
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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
from medvqa.evaluation import generation  # noqa: E402
from medvqa.models.adapters import apply_method  # noqa: E402
from medvqa.models.loading import load_vlm, roles  # noqa: E402
from medvqa.training.datamodule import VQADataModule  # noqa: E402
from medvqa.training.module import VQAModule  # noqa: E402

CACHE = Path(os.environ.get("MEDVQA_CACHE", ROOT / ".cache"))
# Dense bf16 tensor-core peak, FLOP/s (vendor data sheets, without sparsity).
PEAK_BF16 = {"H100 SXM": 989e12, "H100 NVL": 835e12, "H100 PCIe": 756e12, "H200": 989e12,
             "A100": 312e12, "L40S": 362e12}  # fmt: skip
METHODS = ("full", "lora", "prompt_tuning", "ia3")


def peak_flops(name: str, override: float | None) -> float | None:
    if override:
        return override * 1e12
    for key, value in PEAK_BF16.items():
        if all(part in name for part in key.split()):
            return value
    if "H100" in name:  # the SXM part is the common one in clusters
        return PEAK_BF16["H100 SXM"]
    return None


class Meter(L.Callback):
    """Counts trained samples and tokens after a warm-up and checks where the weights are."""

    def __init__(self, warmup: int, device_type: str) -> None:
        self.warmup, self.device_type = warmup, device_type
        self.samples = self.tokens = 0
        self.start: float | None = None

    def on_train_batch_start(self, trainer: L.Trainer, module: Any, batch: Any, i: int) -> None:
        if i == self.warmup:
            _sync(self.device_type)
            self.start = time.perf_counter()
        where = {p.device.type for p in module.parameters() if p.requires_grad}
        if where != {self.device_type}:
            raise RuntimeError(f"trainable parameters on {where}, expected {self.device_type}")

    def on_train_batch_end(self, trainer: L.Trainer, module: Any, out: Any, batch: Any, i: int):
        if self.start is not None:
            self.samples += int(batch["input_ids"].shape[0])
            self.tokens += int(batch["attention_mask"].sum())

    def rates(self) -> tuple[float, float]:
        _sync(self.device_type)
        elapsed = time.perf_counter() - (self.start or time.perf_counter())
        return self.samples / max(elapsed, 1e-9), self.tokens / max(elapsed, 1e-9)


def _sync(device_type: str) -> None:
    if device_type == "cuda":
        torch.cuda.synchronize()


def _cfg(model: str, trainer: str, method: str, extra: list[str]) -> Any:
    overrides = [f"paths.cache_dir={CACHE}", f"model={model}", f"trainer={trainer}",
                 f"peft={method}", "trainer.devices=1", *extra]  # fmt: skip
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=overrides)


def measure(model_name: str, trainer_name: str, method: str, args: argparse.Namespace) -> dict:
    device_type = "cpu" if args.cpu else "cuda"
    extra = [] if args.cpu else ["model.dtype=bfloat16"]
    cfg = _cfg(model_name, trainer_name, method, extra + args.overrides)
    source = instantiate(cfg.dataset)
    splits = make_splits(source.table(), Shift.from_config(dict(cfg.shift)), seed=0)
    model, processor = load_vlm(cfg.model)
    model = apply_method(model, cfg.peft, roles(cfg.model), processor)
    n_params = sum(p.numel() for p in model.parameters())
    batch = int(args.batch_size or cfg.data.batch_size)
    data = VQADataModule(splits.frames, source, processor, batch_size=batch)
    meter = Meter(warmup=3, device_type=device_type)
    trainer = instantiate(cfg.trainer, max_steps=args.steps + 3, max_epochs=None,
                          limit_val_batches=0, logger=False, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False,
                          callbacks=[meter])  # fmt: skip
    if device_type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    trainer.fit(
        VQAModule.for_method(model, cfg.peft, roles(cfg.model)["projector"]), datamodule=data
    )
    train_sps, train_tps = meter.rates()

    seen: set[str] = set()
    original = generation.GenerationModule.predict_step

    def spy(self: Any, batch: Any, i: int) -> Any:
        seen.update(p.device.type for p in self.model.parameters())
        return original(self, batch, i)

    generation.GenerationModule.predict_step = spy  # type: ignore[method-assign]
    frame = splits["test_iid"].head(args.eval_samples)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        generation.generate_predictions(
            model, processor, frame, source, Path(tmp) / "p.jsonl", "bench",
            batch_size=int(cfg.data.eval_batch_size), max_new_tokens=int(cfg.model.max_new_tokens),
            trainer_cfg=cfg.trainer,
        )  # fmt: skip
        gen_sps = len(frame) / (time.perf_counter() - start)
    generation.GenerationModule.predict_step = original  # type: ignore[method-assign]
    if seen != {device_type}:
        raise RuntimeError(f"generation ran with parameters on {seen}, expected {device_type}")
    peak = torch.cuda.max_memory_allocated() / 2**30 if device_type == "cuda" else float("nan")
    return {"params": n_params, "train": train_sps, "tokens": train_tps, "gen": gen_sps,
            "mem": peak}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2_llava"])
    parser.add_argument("--trainers", nargs="+", default=["gpu", "deepspeed_zero2"])
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--steps", type=int, default=30, help="timed training steps")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--eval-samples", type=int, default=256)
    parser.add_argument("--peak-tflops", type=float, default=None, help="GPU peak bf16 TFLOP/s")
    parser.add_argument("--cpu", action="store_true", help="trainer=cpu: check the script only")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. dataset.n_cases=200")
    args = parser.parse_args()
    console = Console(width=160)
    if args.cpu:
        args.trainers = ["cpu"]
        gpu, peak = "cpu (script check, no MFU)", None
    elif not torch.cuda.is_available():
        console.print("benchmarks/gpu.py needs CUDA (torch.cuda.is_available() is False); "
                      "--cpu checks the script on this machine.")  # fmt: skip
        sys.exit(2)
    else:
        gpu = torch.cuda.get_device_name()
        peak = peak_flops(gpu, args.peak_tflops)
    table = Table(title=f"medvqa on {gpu}; torch {torch.__version__}")
    for col in ("model", "trainer", "method", "params (M)", "train samples/s", "train tokens/s",
                "gen samples/s", "peak GPU mem (GiB)", "MFU"):  # fmt: skip
        table.add_column(col)
    for model_name in args.models:
        for trainer_name in args.trainers:
            for method in args.methods:
                try:
                    r = measure(model_name, trainer_name, method, args)
                except Exception as err:  # one failing combination must not hide the rest
                    console.print(f"[red]{model_name}/{trainer_name}/{method}: {err!r}")
                    continue
                mfu = 6 * r["params"] * r["tokens"] / peak if peak else float("nan")
                table.add_row(model_name, trainer_name, method, f"{r['params'] / 1e6:.1f}",
                              f"{r['train']:.1f}", f"{r['tokens']:.0f}", f"{r['gen']:.1f}",
                              f"{r['mem']:.2f}", f"{mfu:.2%}")  # fmt: skip
    console.print(table)


if __name__ == "__main__":
    main()
