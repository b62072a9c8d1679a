"""What fits on 80 GB GPUs: task=plan's figures for every real-model preset and method.

Not a test (tests/test_plan.py checks the numbers against hand computations). For each preset
(conf/model/*.yaml with a hub checkpoint) and method, at the SURE study's settings (batch 32 per
optimiser step, the preset's `auto` layout: the split of the step into micro-batches and the
checkpointing the time model ranks fastest among those that fit), the plan's peak GiB per
GPU on one GPU under trainer=gpu and, where that does not fit, the first change task=plan names
(10 % to spare); plus the activations one decoder layer keeps per token (measured on this
machine: on the CPU an upper bound of a GPU's). Prints a
Markdown table (docs/gpus.md#what-fits). About a minute on 2 cores (layer measurements are
cached under --cache).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from medvqa.planning.memory import GIB, checkpointing_label, estimate, fixes  # noqa: E402
from medvqa.planning.setup import build_setup  # noqa: E402
from tests.conftest import compose  # noqa: E402

PRESETS = ("llava_med", "llava", "qwen2_vl", "qwen2_5_vl", "medgemma", "paligemma", "smolvlm")
METHODS = ("lora", "ia3", "prompt_tuning", "full")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpu-gib", type=float, default=79.2, help="each GPU's memory")
    parser.add_argument("--cache", type=Path, default=None, help="layer measurements' cache")
    args = parser.parse_args()
    cache = args.cache or Path(tempfile.mkdtemp(prefix="medvqa-plan-"))
    print(
        "| model | params | tokens/sample | method | trained | KiB/token/layer "
        "| auto: micro-batch x accumulation, checkpointing | 1 GPU, GiB | fits | else |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model in PRESETS:
        for method in METHODS:
            cfg = compose(
                [
                    f"model={model}",
                    f"peft={method}",
                    "trainer=gpu",
                    "study=sure_vqa",
                    f"paths.cache_dir={cache}",
                ]
            )
            plan = estimate(build_setup(cfg, gpu_gib=args.gpu_gib))
            s = plan.setup
            instead = "—"
            if not plan.fits:
                found = fixes(s)
                instead = (
                    f"{found[0].what}: {found[0].plan.peak / GIB:.0f} GiB" if found else "nothing"
                )
            print(
                f"| {model} | {s.params / 1e9:.2f} B | {s.tokens} | {method} "
                f"| {s.trainable / 1e6:.0f} M | {s.layer.per_token / 1024:.0f} "
                f"| {s.micro_batch} x {s.accumulate}, {checkpointing_label(s.checkpoint_every)} "
                f"| {plan.peak / GIB:.1f} | {'yes' if plan.fits else 'no'} | {instead} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
