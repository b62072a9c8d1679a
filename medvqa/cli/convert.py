"""`medvqa-convert`: an original LLaVA-Med checkpoint into a transformers LLaVA directory."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path

from medvqa.cli.refusal import REFUSALS, refused
from medvqa.console import rich_logging
from medvqa.models.convert import CLIP_VIT_L14_336, ConversionError, convert_llava_med

log = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `medvqa-convert`; exit status 2 for a checkpoint it cannot convert."""
    rich_logging()
    parser = argparse.ArgumentParser(
        prog="medvqa-convert",
        description="Convert original checkpoints into transformers' format.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    llava = commands.add_parser(
        "llava-med",
        help="LLaVA-Med v1.5 (model_type llava_mistral) to LlavaForConditionalGeneration",
        epilog="Then run with model=llava_med model.pretrained=DST.",
    )
    llava.add_argument("src", type=Path, help="the original checkpoint directory")
    llava.add_argument("dst", type=Path, help="the directory to write (absent or empty)")
    llava.add_argument(
        "--vision-tower",
        type=Path,
        default=None,
        help=f"a local CLIP checkpoint (e.g. {CLIP_VIT_L14_336}), if SRC lacks the tower",
    )
    llava.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        default=None,
        help="dtype of the written weights (default: the source's)",
    )
    args = parser.parse_args(argv)
    try:
        convert_llava_med(args.src, args.dst, args.vision_tower, args.dtype)
    except (ConversionError, *REFUSALS) as err:
        return refused("medvqa-convert", err)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
