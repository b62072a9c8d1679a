"""Architecture configs of the supported hub checkpoints, shipped so memory can be planned offline.

A pre-flight memory planner needs each model's exact shapes (to build it on the meta device and count
parameters, activations and KV cache) and how many LLM tokens one picture becomes. Both live in the
checkpoint's `config.json` / `preprocessor_config.json` / `processor_config.json`, which a machine
without hub access cannot download. This package ships them, one `<org>--<name>.json` per hub id:

    {"hub_id": ..., "source": <where every value came from>,
     "config": <the checkpoint's config.json>, "preprocessor": <the image-token fields>}

A local checkpoint directory always wins over the shipped copy: it is the real thing.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from medvqa.models.families.base import ImageSize, family_of

if TYPE_CHECKING:
    from transformers import PretrainedConfig

log = logging.getLogger(__name__)

HERE = Path(__file__).parent


def _hub_id(path: Path) -> str:
    # The file name is the hub id with its one "/" spelled "--" (hub names may contain "-" but not "--").
    return path.stem.replace("--", "/", 1)


SHIPPED: dict[str, Path] = {_hub_id(path): path for path in sorted(HERE.glob("*.json"))}

# The files of a checkpoint directory that hold the image-token facts, read in this order (later wins):
# transformers 5 may also nest the image processor's settings under processor_config.json.
PREPROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")
# The processor settings that decide how many tokens an image becomes; the rest (mean, std, ...) do not.
TOKEN_FIELDS = frozenset(
    {
        "size",
        "crop_size",
        "do_pad",
        "min_pixels",
        "max_pixels",
        "patch_size",
        "merge_size",
        "temporal_patch_size",
        "max_image_size",
        "do_image_splitting",
        "image_seq_len",
        "image_seq_length",
        "num_additional_image_tokens",
        "vision_feature_select_strategy",
        "do_pan_and_scan",
        "pan_and_scan_min_crop_size",
        "pan_and_scan_max_num_crops",
        "pan_and_scan_min_ratio_to_activate",
    }
)


class UnknownArchitectureError(KeyError):
    """No local checkpoint and no shipped config for a hub id; the message says how to fix it."""

    def __str__(self) -> str:  # KeyError would print the message with quotes around it
        return str(self.args[0])


# --- configs -------------------------------------------------------------------------------------


def load_architecture(pretrained: str | Path) -> tuple[PretrainedConfig, dict[str, Any]]:
    """(config, image-token preprocessor fields) of `pretrained`, without network or weights.

    A local directory with a config.json is read first: a real checkpoint beats the shipped copy
    (a fine-tune may change shapes). Otherwise `pretrained` must be a shipped hub id.
    """
    directory = Path(pretrained).expanduser()
    if (directory / "config.json").is_file():
        return _local_architecture(directory)
    hub_id = str(pretrained)
    if hub_id in SHIPPED:
        return _shipped_architecture(hub_id)
    where = (
        f"{directory} has no config.json"
        if directory.is_dir()
        else "it is not a local checkpoint directory"
    )
    raise UnknownArchitectureError(
        f"no architecture for {hub_id!r}: {where}, and it is not one of the shipped configs "
        f"({', '.join(SHIPPED)}). Fix: point model.pretrained at a local copy of the checkpoint "
        f"(a directory with its config.json), or add {hub_id.replace('/', '--')}.json (hub_id, source, "
        f"config, preprocessor) to {HERE}."
    )


def _local_architecture(directory: Path) -> tuple[PretrainedConfig, dict[str, Any]]:
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(directory, local_files_only=True)
    except (ValueError, KeyError) as err:
        raise ValueError(
            f"{directory / 'config.json'} is not a config transformers can read ({err}); an original "
            "LLaVA-Med release (model_type llava_mistral) must first be converted with "
            "`medvqa-convert llava-med SRC DST`."
        ) from err
    log.debug("architecture of %s read from the checkpoint itself", directory)
    return config, read_preprocessor(directory)


def read_preprocessor(directory: Path) -> dict[str, Any]:
    """The image-token fields of a checkpoint directory's preprocessor/processor configs ({} if none)."""
    fields: dict[str, Any] = {}
    for name in PREPROCESSOR_FILES:
        path = directory / name
        if not path.is_file():
            continue
        try:
            raw = json.loads(path.read_text())
        except ValueError as err:
            raise ValueError(
                f"{path} is not valid JSON ({err}); re-download the checkpoint"
            ) from err
        nested = raw.get("image_processor")
        for part in (raw, nested if isinstance(nested, Mapping) else {}):
            fields.update({key: value for key, value in part.items() if key in TOKEN_FIELDS})
    return fields


@cache
def _shipped_file(hub_id: str) -> dict[str, Any]:
    path = SHIPPED[hub_id]
    raw = json.loads(path.read_text())
    for key in ("hub_id", "source", "config", "preprocessor"):
        if key not in raw:
            raise ValueError(
                f"{path} lacks {key!r}: every shipped file has hub_id, source, config, preprocessor"
            )
    if raw["hub_id"] != hub_id:
        raise ValueError(f"{path} says hub_id {raw['hub_id']!r}; its file name says {hub_id!r}")
    return raw


def _shipped_architecture(hub_id: str) -> tuple[PretrainedConfig, dict[str, Any]]:
    raw = _shipped_file(hub_id)
    log.debug("architecture of %s from the shipped %s", hub_id, SHIPPED[hub_id].name)
    return config_from_dict(raw["config"]), copy.deepcopy(raw["preprocessor"])


def config_from_dict(raw: Mapping[str, Any]) -> PretrainedConfig:
    """A config.json's content as the config class transformers maps its model_type to (no network)."""
    from transformers import AutoConfig

    values = copy.deepcopy(dict(raw))
    model_type = values.pop("model_type", None)
    if model_type is None:
        raise ValueError(
            "the config has no model_type: it cannot be mapped to a transformers class"
        )
    return AutoConfig.for_model(model_type, **values)


def meta_model(config: PretrainedConfig, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    """The full vision-language model for `config` on the meta device: real shapes, no memory, no weights."""
    from transformers import AutoModelForImageTextToText

    # from_config may record dtype/attention choices on the config it is given; keep the caller's intact.
    with torch.device("meta"):
        return AutoModelForImageTextToText.from_config(copy.deepcopy(config), dtype=dtype)


def shrink(config: PretrainedConfig) -> PretrainedConfig:
    """`config` with two narrow layers per tower: the same classes, module names, processor
    and code paths at a CPU's size (`benchmarks/gpu.py --cpu`, `model.random_weights=shrunk`).
    The vocabulary, image size and image-token count stay the checkpoint's."""
    small = copy.deepcopy(config)
    kind = family_of(small.model_type, "shrinking a checkpoint")
    text = small.get_text_config(decoder=True)
    text.num_hidden_layers = 2
    if getattr(text, "layer_types", None):
        text.layer_types = list(text.layer_types)[:2]
    text.hidden_size, text.num_attention_heads, text.num_key_value_heads = kind.shrunk_text
    text.head_dim = text.hidden_size // text.num_attention_heads
    text.intermediate_size = 2 * text.hidden_size
    if hasattr(text, "query_pre_attn_scalar"):  # Gemma scales attention by the head size
        text.query_pre_attn_scalar = text.head_dim
    kind.shrink_vision(small, text)
    return small


# --- image tokens --------------------------------------------------------------------------------


def image_tokens(
    config: PretrainedConfig,
    preprocessor: Mapping[str, Any],
    image_size: ImageSize | None = None,
    *,
    with_markers: bool = False,
) -> int:
    """How many LLM tokens one image of `image_size` (height, width) becomes for this checkpoint.

    `image_size=None` gives the worst case: the largest count the processor can produce. The count
    is of the image placeholder tokens, the ones replaced by vision embeddings (LLaVA 576 for
    336/14, Gemma 3 and PaliGemma 256, Qwen one per 28x28 pixels, SmolVLM `image_seq_len` per
    tile). `with_markers=True` adds the special tokens that delimit them in the prompt: Qwen's
    <|vision_start|>/<|vision_end|> (written by the chat template), Gemma 3's
    <start_of_image>/<end_of_image> per image sequence, Idefics3's <fake_token_around_image> and
    <row_i_col_j> per tile plus <fake_token_around_image><global-img>...<fake_token_around_image>
    for the global view; LLaVA and PaliGemma have none. Newlines the processors add around images
    are plain text and not counted.
    """
    counter = family_of(config.model_type, "the image-token count").image_tokens
    if image_size is not None and min(image_size) <= 0:
        raise ValueError(f"image_size must be (height, width) in pixels, got {image_size}")
    placeholders, markers = counter(config, preprocessor, image_size)
    return placeholders + (markers if with_markers else 0)


__all__ = [
    "SHIPPED",
    "UnknownArchitectureError",
    "config_from_dict",
    "image_tokens",
    "load_architecture",
    "meta_model",
    "read_preprocessor",
    "shrink",
]
