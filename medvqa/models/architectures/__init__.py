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
import math
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

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
    text = small.get_text_config(decoder=True)
    text.num_hidden_layers = 2
    if getattr(text, "layer_types", None):
        text.layer_types = list(text.layer_types)[:2]
    qwen = small.model_type.startswith("qwen")
    # Qwen's M-RoPE sections must add up to half the head size: keep 128-wide heads there.
    text.hidden_size, text.num_attention_heads, text.num_key_value_heads = (
        (128, 1, 1) if qwen else (64, 4, 2)
    )
    text.head_dim = text.hidden_size // text.num_attention_heads
    text.intermediate_size = 2 * text.hidden_size
    if hasattr(text, "query_pre_attn_scalar"):  # Gemma scales attention by the head size
        text.query_pre_attn_scalar = text.head_dim
    vision = small.vision_config
    if small.model_type == "qwen2_vl":  # its vision `hidden_size` is the merger's output
        vision.embed_dim, vision.hidden_size, vision.depth, vision.num_heads = (
            64,
            text.hidden_size,
            2,
            4,
        )
    elif qwen:
        vision.hidden_size, vision.intermediate_size = 64, 128
        vision.depth, vision.num_heads, vision.out_hidden_size = 2, 4, text.hidden_size
        vision.fullatt_block_indexes = [1]
    else:
        vision.hidden_size, vision.intermediate_size = 64, 128
        vision.num_hidden_layers, vision.num_attention_heads = 2, 4
    if small.model_type == "paligemma":  # the projector maps into the text width
        small.projection_dim = vision.projection_dim = text.hidden_size
    return small


# --- image tokens --------------------------------------------------------------------------------

# transformers 5.23's processor defaults, used when a checkpoint's processor files omit a field.
QWEN_MIN_PIXELS = 56 * 56  # Qwen2VLImageProcessor.size["shortest_edge"]
QWEN_MAX_PIXELS = 28 * 28 * 1280  # Qwen2VLImageProcessor.size["longest_edge"]
IDEFICS3_MAX_IMAGE_SIZE = 4096  # image_processing_idefics3.MAX_IMAGE_SIZE
IDEFICS3_TILE = 364  # Idefics3ImageProcessor.max_image_size["longest_edge"]
IDEFICS3_LONGEST_EDGE = 4 * 364  # Idefics3ImageProcessor.size["longest_edge"]
PAN_AND_SCAN = {  # Gemma3Processor.images_kwargs (the checkpoints' preprocessor files say null)
    "pan_and_scan_min_crop_size": 256,
    "pan_and_scan_max_num_crops": 4,
    "pan_and_scan_min_ratio_to_activate": 1.2,
}

ImageSize = tuple[int, int]
# (config, preprocessor fields, (height, width) or None) -> (placeholder tokens, marker tokens)
Counter = Callable[[Any, Mapping[str, Any], ImageSize | None], tuple[int, int]]


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
    model_type = config.model_type
    if model_type not in COUNTERS:
        raise ValueError(
            f"no image-token rule for model_type {model_type!r} (known: {', '.join(sorted(COUNTERS))}); "
            f"add one to {__name__} following that family's processor in transformers."
        )
    if image_size is not None and min(image_size) <= 0:
        raise ValueError(f"image_size must be (height, width) in pixels, got {image_size}")
    placeholders, markers = COUNTERS[model_type](config, preprocessor, image_size)
    return placeholders + (markers if with_markers else 0)


def _height_width(size: Any) -> ImageSize:
    """(height, width) of a processor `size`/`crop_size`: {height, width}, {shortest_edge} or an int."""
    if isinstance(size, Mapping):
        if "height" in size and "width" in size:
            return int(size["height"]), int(size["width"])
        if "shortest_edge" in size:
            return int(size["shortest_edge"]), int(size["shortest_edge"])
    if isinstance(size, int):
        return size, size
    raise ValueError(f"cannot read an image size from {size!r}")


def _llava(config: Any, pre: Mapping[str, Any], image_size: ImageSize | None) -> tuple[int, int]:
    # LlavaProcessor: every picture is resized and centre-cropped to crop_size, so its own size does
    # not matter; CLIP adds one CLS token that the "default" feature strategy drops again.
    vision = config.vision_config
    height, width = _height_width(pre.get("crop_size") or vision.image_size)
    patch = int(pre.get("patch_size") or vision.patch_size)
    strategy = pre.get("vision_feature_select_strategy") or config.vision_feature_select_strategy
    extra = int(pre.get("num_additional_image_tokens", 1))
    tokens = (height // patch) * (width // patch) + extra - (1 if strategy == "default" else 0)
    return tokens, 0


def smart_resize(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """Qwen2-VL's resize: sides multiples of `factor`, pixels in [min_pixels, max_pixels], aspect kept.

    A copy of transformers.models.qwen2_vl.image_processing_qwen2_vl.smart_resize (5.23), which cannot
    be imported without torchvision; tests/test_architectures.py checks the two agree.
    """
    if max(height, width) / min(height, width) > 200:
        raise ValueError(
            f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def qwen_resize(
    config: Any, pre: Mapping[str, Any]
) -> tuple[int, int, int, Callable[[int, int], ImageSize]]:
    """Qwen2-VL's image processing for `config`/`pre`: (patch, merge, max_pixels, resize), where
    resize(height, width) is the (height, width) the processor resizes a picture to.

    Qwen2VLImageProcessor: min_pixels/max_pixels (older files) override size's
    shortest/longest_edge."""
    vision = config.vision_config
    size = pre.get("size") or {}
    min_pixels = int(pre.get("min_pixels") or size.get("shortest_edge") or QWEN_MIN_PIXELS)
    max_pixels = int(pre.get("max_pixels") or size.get("longest_edge") or QWEN_MAX_PIXELS)
    patch = int(pre.get("patch_size") or vision.patch_size)
    merge = int(pre.get("merge_size") or vision.spatial_merge_size)
    factor = patch * merge  # one LLM token per merge x merge patches

    def resize(height: int, width: int) -> ImageSize:
        return smart_resize(height, width, factor, min_pixels, max_pixels)

    return patch, merge, max_pixels, resize


def _qwen(config: Any, pre: Mapping[str, Any], image_size: ImageSize | None) -> tuple[int, int]:
    patch, merge, max_pixels, resize = qwen_resize(config, pre)
    factor = patch * merge
    if image_size is None:
        # smart_resize keeps h*w <= max_pixels with both sides multiples of factor: this bound is
        # reached by a square of side sqrt(max_pixels) when that is a multiple of factor.
        return max_pixels // factor**2, 2
    height, width = resize(*image_size)
    return (height // factor) * (width // factor), 2


def pan_and_scan_crops(
    height: int, width: int, min_crop_size: int, max_num_crops: int, min_ratio_to_activate: float
) -> int:
    """Number of extra crops Gemma 3's pan-and-scan cuts from an image (0: none).

    A copy of the crop count of Gemma3ImageProcessor.pan_and_scan_batched in transformers 5.23.
    """
    if width >= height:
        if width / height < min_ratio_to_activate:
            return 0
        crops_w = min(math.floor(width / min_crop_size), math.floor(width / height + 0.5))
        crops_w, crops_h = min(max_num_crops, max(2, crops_w)), 1
    else:
        if height / width < min_ratio_to_activate:
            return 0
        crops_h = min(math.floor(height / min_crop_size), math.floor(height / width + 0.5))
        crops_w, crops_h = 1, min(max_num_crops, max(2, crops_h))
    if min(math.ceil(width / crops_w), math.ceil(height / crops_h)) < min_crop_size:
        return 0
    return crops_w * crops_h


def _gemma3(config: Any, pre: Mapping[str, Any], image_size: ImageSize | None) -> tuple[int, int]:
    # Gemma3Processor: each image (and each pan-and-scan crop, when enabled) becomes
    # <start_of_image> + mm_tokens_per_image soft tokens + <end_of_image>.
    per_image = int(config.mm_tokens_per_image)
    crops = 0
    if pre.get("do_pan_and_scan"):
        settings = {key: pre.get(key) or default for key, default in PAN_AND_SCAN.items()}
        if image_size is None:
            crops = int(settings["pan_and_scan_max_num_crops"])
        else:
            crops = pan_and_scan_crops(
                *image_size,
                min_crop_size=int(settings["pan_and_scan_min_crop_size"]),
                max_num_crops=int(settings["pan_and_scan_max_num_crops"]),
                min_ratio_to_activate=float(settings["pan_and_scan_min_ratio_to_activate"]),
            )
    sequences = 1 + crops
    return sequences * per_image, sequences * 2


def _paligemma(
    config: Any, pre: Mapping[str, Any], image_size: ImageSize | None
) -> tuple[int, int]:
    # PaliGemmaProcessor: image_seq_length copies of <image> before the prompt, whatever the picture.
    vision = config.vision_config
    tokens = pre.get("image_seq_length") or (vision.image_size // vision.patch_size) ** 2
    return int(tokens), 0


def idefics3_tiles(
    height: int, width: int, longest_edge: int, tile: int, do_image_splitting: bool
) -> tuple[int, int]:
    """(rows, cols) of the tiles Idefics3/SmolVLM cut an image into; (0, 0) when it stays whole.

    A copy of Idefics3ImageProcessor.get_number_of_image_patches in transformers 5.23: the longest
    edge is first resized to `longest_edge` (up or down, capped at 4096), then cut into `tile` squares.
    """
    if not do_image_splitting:
        return 0, 0
    aspect = width / height
    if width >= height:
        width, height = longest_edge, int(longest_edge / aspect)
        height += height % 2  # the processor rounds odd sides up to even
    else:
        height, width = longest_edge, int(longest_edge * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    aspect = width / height
    if width >= height and width > IDEFICS3_MAX_IMAGE_SIZE:
        width, height = IDEFICS3_MAX_IMAGE_SIZE, int(IDEFICS3_MAX_IMAGE_SIZE / aspect)
    elif height > width and height > IDEFICS3_MAX_IMAGE_SIZE:
        height, width = IDEFICS3_MAX_IMAGE_SIZE, int(IDEFICS3_MAX_IMAGE_SIZE * aspect)
    height, width = max(height, 1), max(width, 1)
    padded_h = math.ceil(height / tile) * tile
    padded_w = math.ceil(width / tile) * tile
    if padded_h > tile or padded_w > tile:
        return math.ceil(padded_h / tile), math.ceil(padded_w / tile)
    return 0, 0


def _longest_edge(pre: Mapping[str, Any], vision: Any, key: str, default: int) -> int:
    for source in (pre.get(key), getattr(vision, key, None)):
        if isinstance(source, Mapping) and source.get("longest_edge"):
            return int(source["longest_edge"])
    return default


def _idefics3(config: Any, pre: Mapping[str, Any], image_size: ImageSize | None) -> tuple[int, int]:
    # Idefics3Processor/SmolVLMProcessor: image_seq_len tokens per tile plus one global view.
    vision = config.vision_config
    # SmolVLM's config.json repeats the processor sizes in vision_config; the processor's files win.
    longest_edge = _longest_edge(pre, vision, "size", IDEFICS3_LONGEST_EDGE)
    tile = _longest_edge(pre, vision, "max_image_size", IDEFICS3_TILE)
    splitting = bool(pre.get("do_image_splitting", True))
    per_tile = pre.get("image_seq_len") or int(
        (vision.image_size // vision.patch_size) ** 2 / config.scale_factor**2
    )
    # The largest picture tiles like a square with the longest allowed edge.
    side = min(longest_edge, IDEFICS3_MAX_IMAGE_SIZE)
    height, width = image_size if image_size is not None else (side, side)
    rows, cols = idefics3_tiles(height, width, longest_edge, tile, splitting)
    tiles = rows * cols
    return (tiles + 1) * int(per_tile), 2 * tiles + 3


COUNTERS: dict[str, Counter] = {
    "llava": _llava,
    "qwen2_vl": _qwen,
    "qwen2_5_vl": _qwen,
    "gemma3": _gemma3,
    "paligemma": _paligemma,
    "idefics3": _idefics3,
    "smolvlm": _idefics3,
}

__all__ = [
    "SHIPPED",
    "UnknownArchitectureError",
    "config_from_dict",
    "image_tokens",
    "load_architecture",
    "meta_model",
    "qwen_resize",
    "read_preprocessor",
    "shrink",
]
