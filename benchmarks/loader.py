"""How fast the training loader prepares examples on this machine's CPUs (a benchmark, not a test).

The GPU trains ~10-15 LLaVA-Med samples/s on one H100 (docs/measurements.md); every one is
first decoded, resized and tokenised on the host by `VQADataset` (the image read by the
dataset's `load_image`, the prompt rendered and tokenised, the image through the processor) and
padded by the project's collate function. This times exactly that path, through `make_loader`,
on JPEG files of two sizes written here: SLAKE-like (512 x 512 colour) and MIMIC-CXR-like
(2544 x 3056 greyscale radiographs), with LLaVA's real image processing (CLIP: resize to 336,
centre crop, 576 image tokens; the tokenizer of an offline LLaVA twin). For 0 and N loader
processes it prints examples/s, so that `examples/s per process x processes` can be held
against the GPU's rate (`data.num_workers=null` gives a GPU rank its cores less one, at most 8).

    python benchmarks/loader.py                  # 0 and 2 processes (this machine has 2 cores)
    python benchmarks/loader.py --workers 0 1 2 --images 48
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd
from PIL import Image
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from medvqa.data import records as R  # noqa: E402
from medvqa.data.base import VQASource  # noqa: E402
from medvqa.models.loading import load_vlm  # noqa: E402
from medvqa.training.datamodule import VQADataset, make_loader  # noqa: E402

CACHE = Path(os.environ.get("MEDVQA_CACHE", ROOT / ".cache"))
SHAPES = {"slake (512x512 RGB)": ((512, 512), "RGB"), "mimic (2544x3056 L)": ((2544, 3056), "L")}
BATCH = 16


class JpegFolder(VQASource):
    """The JPEG files of one folder as a VQA table (one closed question each)."""

    name: ClassVar[str] = "bench_jpegs"
    real: ClassVar[bool] = False

    def table(self) -> pd.DataFrame:
        files = sorted(p.name for p in self.root.glob("*.jpg"))
        return pd.DataFrame(
            {
                R.ID: [f"q{i}" for i in range(len(files))],
                R.IMAGE: files,
                R.IMAGE_ID: files,
                R.QUESTION: ["Is there an abnormality in the left lung?"] * len(files),
                R.ANSWER: ["yes"] * len(files),
                R.ANSWER_TYPE: ["closed"] * len(files),
            }
        )


def write_jpegs(folder: Path, size: tuple[int, int], mode: str, n: int) -> None:
    """`n` JPEG files (quality 95) with structure and noise, as an X-ray or a photo has."""
    rng = np.random.default_rng(0)
    height, width = size
    ramp = np.linspace(0, 255, width, dtype=np.float32)[None, :].repeat(height, axis=0)
    for i in range(n):
        noise = rng.normal(0, 25, size=(height, width)).astype(np.float32)
        plane = np.clip(
            ramp * 0.6 + noise + 40 * np.sin(np.arange(height) / 37 + i)[:, None], 0, 255
        )
        array = plane.astype(np.uint8)
        image = Image.fromarray(array, "L")
        if mode == "RGB":
            image = Image.merge(
                "RGB", (image, image.transpose(Image.Transpose.FLIP_LEFT_RIGHT), image)
            )
        image.save(folder / f"{i:04d}.jpg", quality=95)


def examples_per_second(source: VQASource, processor: object, workers: int) -> float:
    """Examples/s through the training loader, after one warm-up batch (workers started)."""
    dataset = VQADataset(source.table(), source, processor, with_answer=True)
    loader = make_loader(dataset, BATCH, shuffle=False, padding_side="right", num_workers=workers)
    batches = iter(loader)
    next(batches)
    start, seen = time.perf_counter(), 0
    for batch in batches:
        seen += batch["input_ids"].shape[0]
    return seen / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--images", type=int, default=64, help="images per shape")
    args = parser.parse_args(argv)
    from medvqa.zoo.families import TinyFamilyBuilder

    model_dir = TinyFamilyBuilder("llava", CACHE / "models", image_size=336, patch_size=14).build()
    from omegaconf import OmegaConf

    _, processor = load_vlm(OmegaConf.create({"name": "llava-336", "pretrained": str(model_dir)}))
    console = Console()
    table = Table(title=f"training loader on {os.cpu_count()} CPU(s), batch {BATCH}")
    for column in ("images", *(f"{w} worker(s), examples/s" for w in args.workers)):
        table.add_column(column)
    measured: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, (size, mode) in SHAPES.items():
            folder = Path(tmp) / label.split()[0]
            folder.mkdir()
            write_jpegs(folder, size, mode, args.images)
            source = JpegFolder(folder)
            rates = [examples_per_second(source, processor, w) for w in args.workers]
            table.add_row(label, *(f"{r:.1f}" for r in rates))
            measured[label] = rates
    console.print(table)
    return measured


if __name__ == "__main__":
    main()
