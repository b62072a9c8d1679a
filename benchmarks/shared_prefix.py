"""Generation's engines on this machine's CPU: the static decode (the default) against the
growing cache it replaced, both with shared image prefixes, and every prompt in full.

Not a test. The model has LLaVA-Med's real layout (its architecture file with random weights, as
`model.random_weights=shrunk` builds it: 576 image tokens per 336-px image, the real template and
vocabulary, a two-layer 64-wide vision tower) and a language model narrowed for a CPU but kept in
a 7B's proportions (`--layers` 4 x `--hidden` 512, MLP 3.5 x wide): there a prompt token's layers
cost ~60 times the vocabulary projection of one decoded token, as in the 7B. (The plain shrunk
model's 64-wide language model makes decoding's vocabulary projection dominate, which no real
checkpoint does.) float32, through `generate_predictions` as a job runs it (batch 64, 16 new
tokens at most, the log-probability recorder included). Rows: synthetic scans with SLAKE's 11
questions per image, and with one (no sharing possible). Prints rows/s of each engine, the
static decode's ratio to the growing cache's (today's against the engine before it) and shared to
unshared, and whether the answers are the same.

    python benchmarks/shared_prefix.py [--model llava_med] [--images 6] [--batch 64]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import medvqa.config  # noqa: E402,F401
from medvqa.data import records as R  # noqa: E402
from medvqa.data.sources.synthetic import SyntheticVQA  # noqa: E402
from medvqa.generation.predict import generate_predictions  # noqa: E402
from medvqa.generation.settings import resolve  # noqa: E402
from medvqa.models.loading import (  # noqa: E402
    architecture,
    attn_implementation,
    processor_kwargs,
    torch_dtype,
)
from medvqa.models.rehearsal import random_vlm  # noqa: E402

CACHE = Path(os.environ.get("MEDVQA_CACHE", ROOT / ".cache"))


ENGINES = {  # name: (shared image prefixes, model.decode)
    "static": (True, "static"),
    "dynamic": (True, "dynamic"),
    "unshared": (False, "dynamic"),
}


def rate(model, processor, source, out: Path, engine: str, batch: int) -> tuple[float, list[str]]:
    """Rows/s of one generation pass, and its answers in row order."""
    frame = source.table()
    share, decode = ENGINES[engine]
    settings = resolve(
        model,
        processor,
        batch_size=batch,
        max_new_tokens=16,
        share_image_prefix=share,
        merge_adapters=False,
        decode=decode,
    )
    start = time.perf_counter()
    preds = generate_predictions(model, processor, frame, source, out, "bench", settings)
    seconds = time.perf_counter() - start
    answers = preds.set_index(R.ID).loc[frame[R.ID], R.PREDICTION].tolist()
    return len(frame) / seconds, answers


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llava_med")
    parser.add_argument("--images", type=int, default=6, help="images asked 11 questions each")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4, help="language model decoder layers")
    parser.add_argument("--hidden", type=int, default=512, help="language model width")
    args = parser.parse_args(argv)
    overrides = [
        f"model={args.model}",
        "model.random_weights=shrunk",
        "model.dtype=float32",
        f"paths.cache_dir={CACHE}",
    ]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    config, preprocessor = architecture(cfg.model)
    text = config.get_text_config(decoder=True)
    text.num_hidden_layers = args.layers
    if getattr(text, "layer_types", None):
        text.layer_types = [text.layer_types[0]] * args.layers
    heads = args.hidden // text.head_dim  # the shrunk head size (Qwen's M-RoPE needs its own)
    text.hidden_size, text.intermediate_size = args.hidden, args.hidden * 7 // 2
    text.num_attention_heads = text.num_key_value_heads = heads
    model, processor = random_vlm(
        args.model,
        str(cfg.model.pretrained),
        (config, preprocessor),
        torch_dtype(cfg.model),
        attn_implementation(cfg.model),
        processor_kwargs(cfg.model),
    )
    model.eval()
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for per_image in (11, 1):
            images = args.images if per_image > 1 else args.images * 11
            source = SyntheticVQA(
                Path(tmp) / f"q{per_image}",
                n_cases=images,
                image_size=64,
                questions_per_image=per_image,
            )
            source.table()  # rendered before the clock starts
            rate(model, processor, source, Path(tmp) / "warm.jsonl", "static", 4)  # warm-up
            answers = {}
            p = f"{per_image}_per_image/"
            for engine in ENGINES:
                out = Path(tmp) / f"{engine}{per_image}.jsonl"
                results[p + engine], answers[engine] = rate(
                    model, processor, source, out, engine, args.batch
                )
            results[p + "static_vs_dynamic"] = results[p + "static"] / results[p + "dynamic"]
            results[p + "shared_vs_unshared"] = results[p + "static"] / results[p + "unshared"]
            results[p + "same_answers"] = float(len({tuple(a) for a in answers.values()}) == 1)
    title = (
        f"generation engines, {args.model} layout, {args.layers} x {args.hidden} language "
        f"model, float32, batch {args.batch} "
        f"({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    )
    table = Table(title=title)
    columns = ["questions per image", *(f"{e} rows/s" for e in ENGINES)]
    for column in (*columns, "static / dynamic", "static / unshared", "same answers"):
        table.add_column(column, justify="right")
    for per_image in (11, 1):
        p = f"{per_image}_per_image/"
        table.add_row(
            str(per_image),
            *(f"{results[p + e]:.2f}" for e in ENGINES),
            f"{results[p + 'static_vs_dynamic']:.2f}x",
            f"{results[p + 'shared_vs_unshared']:.2f}x",
            "yes" if results[p + "same_answers"] else "NO",
        )
    Console().print(table)
    Console().print_json(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
