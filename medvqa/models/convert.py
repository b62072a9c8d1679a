"""`medvqa-convert llava-med SRC DST`: the original LLaVA-Med release in transformers' LLaVA format.

`microsoft/llava-med-v1.5-mistral-7b` was saved by LLaVA-Med's own code (model type
`llava_mistral`): a Mistral causal LM whose state dict also holds the projector
(`model.mm_projector.{0,2}`) and, in some copies, the CLIP tower
(`model.vision_tower.vision_tower.vision_model.*`), with the vision settings as `mm_*` config keys.
transformers cannot load that, so this module rewrites it once as a
`LlavaForConditionalGeneration` directory plus a processor that preprocesses and prompts as
LLaVA-Med does (pad to square with the CLIP mean colour, its Mistral `[INST]` template). The
result loads with `model.pretrained=DST` like any hub checkpoint.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from medvqa.atomic import build_once
from medvqa.models.prompting import chat_template

log = logging.getLogger(__name__)

IMAGE_TOKEN = "<image>"
PAD_TOKEN = "<pad>"
# transformers' own LLaVA converter pads the resized vocabulary to a multiple of 64 (speed).
VOCAB_MULTIPLE = 64
DONE_FILE = "medvqa_convert.json"

# The release names its tower by hub id only; this is that checkpoint's vision config, so a
# SRC that carries the tower's weights converts without the hub. Any other tower needs a local
# copy (`--vision-tower`), whose own config is read.
CLIP_VIT_L14_336 = "openai/clip-vit-large-patch14-336"
KNOWN_TOWERS: dict[str, dict[str, Any]] = {
    CLIP_VIT_L14_336: {
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "image_size": 336,
        "patch_size": 14,
        "projection_dim": 768,
        "hidden_act": "quick_gelu",
        "layer_norm_eps": 1e-5,
    }
}

# Original key prefixes (LLaVA's LlavaMetaModel) and their homes in LlavaForConditionalGeneration.
VISION_PREFIX = "model.vision_tower.vision_tower."
PROJECTOR_PREFIX = "model.mm_projector."
PROJECTOR_LAYERS = {"0": "linear_1", "2": "linear_2"}  # nn.Sequential(Linear, GELU, Linear)
# Keys of the original config that describe LLaVA's model, not the Mistral inside it.
NOT_TEXT_KEYS = ("model_type", "architectures", "_name_or_path")
ROPE_LEGACY_KEYS = ("rope_theta", "rope_scaling")


class ConversionError(ValueError):
    """SRC is not the layout this converter reads; the message names the file or key."""


# --- reading the original layout -----------------------------------------------------------------


def read_json(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise ConversionError(f"{path} is missing: {what}")
    try:
        return json.loads(path.read_text())
    except ValueError as err:
        raise ConversionError(f"{path} is not valid JSON ({err}): {what}") from err


def weight_files(directory: Path) -> list[Path]:
    """The checkpoint's weight files: the shards an index names, else the single file(s)."""
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = directory / index_name
        if index.is_file():
            weight_map = read_json(index, "the shard index").get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise ConversionError(f"{index} has no 'weight_map': re-download the checkpoint")
            shards = [directory / name for name in sorted(set(weight_map.values()))]
            absent = [s.name for s in shards if not s.is_file()]
            if absent:
                raise ConversionError(
                    f"{index} names shards that are not in {directory}: {absent}; the download "
                    "is incomplete."
                )
            return shards
    for pattern in ("*.safetensors", "pytorch_model*.bin"):
        found = sorted(directory.glob(pattern))
        if found:
            return found
    raise ConversionError(
        f"no weights in {directory}: expected model.safetensors(.index.json) or "
        "pytorch_model(.bin.index.json) shards."
    )


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory (safetensors or pytorch .bin, sharded or not)."""
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for path in weight_files(directory):
        if path.suffix == ".safetensors":
            part = load_file(path)
        else:
            part = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        state.update(part)
    return state


def split_original(state: Mapping[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """Split LLaVA's state dict into vision tower (CLIP `vision_model.*` names), projector
    (`0.*`, `2.*`) and Mistral LM (MistralForCausalLM names: `model.*`, `lm_head.*`)."""
    parts: dict[str, dict[str, torch.Tensor]] = {"vision": {}, "projector": {}, "language": {}}
    for key, value in state.items():
        if key.endswith(".inv_freq"):  # rotary caches some LLaVA saves carry; recomputed
            continue
        if key.startswith(VISION_PREFIX):
            parts["vision"][key[len(VISION_PREFIX) :]] = value
        elif key.startswith(PROJECTOR_PREFIX):
            parts["projector"][key[len(PROJECTOR_PREFIX) :]] = value
        elif key == "model.image_newline":
            raise ConversionError(
                "the checkpoint has 'model.image_newline' (a LLaVA-NeXT any-resolution model); "
                "this converter handles LLaVA(-Med) v1.5 checkpoints only."
            )
        elif key.startswith(("model.", "lm_head.")):
            parts["language"][key] = value
        else:
            raise ConversionError(
                f"unexpected weight {key!r}: not a LLaVA key (model.vision_tower.*, "
                "model.mm_projector.*, model.* or lm_head.*)"
            )
    return parts


# --- configs -------------------------------------------------------------------------------------


def text_config(original: Mapping[str, Any]) -> Any:
    """The Mistral config inside LLaVA's: Mistral's own keys (rope_theta included), without
    LLaVA's `mm_*` and training additions."""
    from transformers import MistralConfig

    known = (set(MistralConfig().to_dict()) | set(ROPE_LEGACY_KEYS)) - set(NOT_TEXT_KEYS)
    kept = {k: v for k, v in original.items() if k in known}
    return MistralConfig.from_dict(kept)


def clip_vision_config(directory: Path) -> Any:
    """A CLIP checkpoint's vision config: a whole CLIP model's `vision_config` or a
    vision-only (`clip_vision_model`) config."""
    from transformers import CLIPVisionConfig

    raw = read_json(directory / "config.json", "the vision tower's config")
    if raw.get("model_type") == "clip":
        raw = raw.get("vision_config") or {}
    elif raw.get("model_type") != "clip_vision_model":
        raise ConversionError(
            f"{directory / 'config.json'} has model_type {raw.get('model_type')!r}; the vision "
            "tower must be a CLIP checkpoint (clip or clip_vision_model), e.g. a local copy of "
            f"{CLIP_VIT_L14_336}."
        )
    return CLIPVisionConfig.from_dict({k: v for k, v in raw.items() if k != "model_type"})


def tower_weights(directory: Path) -> dict[str, torch.Tensor]:
    """The vision weights of a CLIP checkpoint, named as in LLaVA's tower (`vision_model.*`)."""
    clip_only = ("text_model.", "visual_projection.", "text_projection.", "logit_scale")
    out = {}
    for key, value in read_weights(directory).items():
        if key.startswith(clip_only):
            continue
        out[key if key.startswith("vision_model.") else f"vision_model.{key}"] = value
    if not out:
        raise ConversionError(f"{directory} holds no CLIP vision weights (vision_model.*)")
    return out


def resolve_tower(
    original: Mapping[str, Any], vision: dict[str, torch.Tensor], tower: Path | None
) -> tuple[Any, dict[str, torch.Tensor], Path | None]:
    """(vision config, vision weights, local tower dir or None): SRC's own tower weights if it
    has them, else those of `--vision-tower` (or of `mm_vision_tower` if that is a local dir)."""
    from transformers import CLIPVisionConfig

    named = str(original.get("mm_vision_tower") or original.get("vision_tower") or "")
    if tower is None and named and Path(named).is_dir():
        tower = Path(named)
    if tower is not None:
        config = clip_vision_config(tower)
        return config, vision or tower_weights(tower), tower
    if not vision:
        raise ConversionError(
            f"SRC has no vision tower weights ({VISION_PREFIX}*) and names its tower as "
            f"{named or '(nothing)'!r}: pass --vision-tower PATH, a local copy of that CLIP "
            f"checkpoint (e.g. {CLIP_VIT_L14_336})."
        )
    if named not in KNOWN_TOWERS:
        raise ConversionError(
            f"SRC carries its vision tower's weights but names it {named!r}, whose config is "
            "unknown here: pass --vision-tower PATH, a local copy of that checkpoint."
        )
    return CLIPVisionConfig(**KNOWN_TOWERS[named]), vision, None


def check_supported(original: Mapping[str, Any], src: Path) -> None:
    """Refuse LLaVA variants LlavaForConditionalGeneration cannot express, naming the key."""
    where = src / "config.json"
    projector = original.get("mm_projector_type", "linear")
    if projector != "mlp2x_gelu":
        raise ConversionError(
            f"{where}: mm_projector_type={projector!r}; transformers' LLaVA projector is "
            "Linear-GELU-Linear (mlp2x_gelu), the one LLaVA-Med v1.5 uses."
        )
    for key, supported in (
        ("mm_vision_select_feature", ("patch", "cls_patch")),
        ("mm_patch_merge_type", ("flat",)),
        ("image_aspect_ratio", ("pad", "square", None)),
        ("mm_use_im_start_end", (False, None)),
    ):
        if original.get(key) not in supported:
            raise ConversionError(
                f"{where}: {key}={original.get(key)!r} is not supported (expected one of "
                f"{list(supported)}); this converter handles LLaVA(-Med) v1.5 checkpoints."
            )
    if "mm_vision_select_layer" not in original:
        raise ConversionError(f"{where} lacks 'mm_vision_select_layer': is SRC a LLaVA model?")


# --- tokenizer, processor, model -----------------------------------------------------------------


def build_tokenizer(src: Path) -> Any:
    """SRC's tokenizer plus the image token (and a pad token if it has none), as transformers'
    LLaVA converter adds them."""
    from transformers import AddedToken, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(src)
    except (OSError, ValueError) as err:
        raise ConversionError(
            f"cannot load the tokenizer of {src} ({err}); SRC needs the release's tokenizer "
            "files (tokenizer_config.json with tokenizer.model or tokenizer.json)."
        ) from err
    tokenizer.add_tokens(
        AddedToken(IMAGE_TOKEN, special=True, normalized=False), special_tokens=True
    )
    if tokenizer.pad_token is None:
        tokenizer.add_special_tokens({"pad_token": PAD_TOKEN})
    return tokenizer


def build_processor(
    tokenizer: Any, vision_config: Any, original: Mapping[str, Any], tower: Path | None
) -> Any:
    """LlavaProcessor: CLIP preprocessing, padded to square with the mean colour when the
    checkpoint says `image_aspect_ratio: pad`, and LLaVA-Med's chat template."""
    from transformers import LlavaImageProcessorPil, LlavaProcessor

    size = int(vision_config.image_size)
    options: dict[str, Any] = {}
    preprocessor = tower / "preprocessor_config.json" if tower is not None else None
    if preprocessor is not None and preprocessor.is_file():
        raw = read_json(preprocessor, "the vision tower's image preprocessing")
        options = {k: raw[k] for k in ("image_mean", "image_std", "resample") if k in raw}
    image_processor = LlavaImageProcessorPil(
        size={"shortest_edge": size},
        crop_size={"height": size, "width": size},
        do_pad=original.get("image_aspect_ratio") == "pad",
        **options,
    )
    strategy = "default" if original.get("mm_vision_select_feature", "patch") == "patch" else "full"
    return LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=int(vision_config.patch_size),
        vision_feature_select_strategy=strategy,
        num_additional_image_tokens=1,  # CLIP's CLS token
        image_token=IMAGE_TOKEN,
        chat_template=chat_template("llava_med"),
    )


def target_name(part: str, key: str, targets: set[str]) -> str:
    """Where an original weight lives in the installed LlavaForConditionalGeneration."""
    if part == "vision":
        rest = key.removeprefix("vision_model.")
        candidates = [f"model.vision_tower.{rest}", f"model.vision_tower.vision_model.{rest}"]
    elif part == "projector":
        layer, _, param = key.partition(".")
        if layer not in PROJECTOR_LAYERS:
            raise ConversionError(f"unexpected projector weight {PROJECTOR_PREFIX}{key!r}")
        candidates = [f"model.multi_modal_projector.{PROJECTOR_LAYERS[layer]}.{param}"]
    elif key.startswith("lm_head."):
        candidates = [key, f"language_model.{key}"]
    else:
        rest = key.removeprefix("model.")
        candidates = [f"model.language_model.{rest}", f"language_model.model.{rest}"]
    for name in candidates:
        if name in targets:
            return name
    original = {"vision": VISION_PREFIX, "projector": PROJECTOR_PREFIX}.get(part, "") + key
    raise ConversionError(
        f"weight {original!r} has no place in LlavaForConditionalGeneration (tried {candidates})"
    )


def build_model(
    original: Mapping[str, Any],
    vision_config: Any,
    parts: Mapping[str, dict[str, torch.Tensor]],
    tokenizer: Any,
    strategy: str,
    dtype: torch.dtype,
) -> torch.nn.Module:
    """LlavaForConditionalGeneration holding the original weights, vocabulary grown by the new
    tokens (their rows: the mean of the old ones, so the result is reproducible)."""
    from transformers import LlavaConfig, LlavaForConditionalGeneration

    text = text_config(original)
    language = dict(parts["language"])
    if "lm_head.weight" not in language and text.tie_word_embeddings:
        language["lm_head.weight"] = language["model.embed_tokens.weight"]
    config = LlavaConfig(
        vision_config=vision_config,
        text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        image_seq_length=(vision_config.image_size // vision_config.patch_size) ** 2,
        projector_hidden_act="gelu",
        vision_feature_layer=int(original["mm_vision_select_layer"]),
        vision_feature_select_strategy=strategy,
        multimodal_projector_bias=True,
        tie_word_embeddings=text.tie_word_embeddings,
    )
    with torch.device("meta"):
        model = LlavaForConditionalGeneration(config)
    targets = set(model.state_dict())
    state = {
        target_name(part, key, targets): value.to(dtype)
        for part in ("vision", "projector", "language")
        for key, value in parts[part].items()
    }
    missing = sorted(targets - set(state))
    tower_hint = (
        "the vision tower's weights do not fit its config (a tower other than the one "
        "mm_vision_tower names?): pass --vision-tower PATH, the CLIP checkpoint it was trained with"
    )
    if missing and all(name.startswith("model.vision_tower.") for name in missing):
        raise ConversionError(f"{tower_hint}; no weights for e.g. {missing[:3]}")
    if missing:
        raise ConversionError(
            f"SRC lacks {len(missing)} weights of the model, e.g. {missing[:5]}; the original "
            "layout has model.layers.*, model.embed_tokens, model.norm, lm_head, "
            f"{PROJECTOR_PREFIX}0/2.* and a CLIP vision tower."
        )
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as err:  # shape mismatches: config and weights disagree
        raise ConversionError(
            f"the weights do not fit the config; if the mismatch is in model.vision_tower, "
            f"{tower_hint}. {err}"
        ) from err
    model.tie_weights()
    grow_vocabulary(model, len(tokenizer))
    text_cfg = model.config.text_config
    text_cfg.pad_token_id = tokenizer.pad_token_id
    generation = model.generation_config
    generation.pad_token_id = tokenizer.pad_token_id
    generation.bos_token_id = tokenizer.bos_token_id
    generation.eos_token_id = tokenizer.eos_token_id
    return model


def grow_vocabulary(model: torch.nn.Module, n_tokens: int) -> None:
    """Resize the embeddings for the added tokens; new rows are the mean of the old rows."""
    old = model.get_input_embeddings().weight.shape[0]
    if n_tokens <= old:
        return
    model.resize_token_embeddings(n_tokens, pad_to_multiple_of=VOCAB_MULTIPLE, mean_resizing=False)
    with torch.no_grad():
        for layer in (model.get_input_embeddings(), model.get_output_embeddings()):
            weight = layer.weight
            weight[old:] = weight[:old].mean(dim=0, keepdim=True)


# --- entry points --------------------------------------------------------------------------------


def convert_llava_med(
    src: str | Path,
    dst: str | Path,
    vision_tower: str | Path | None = None,
    dtype: str | None = None,
) -> Path:
    """Write the original LLaVA(-Med) checkpoint `src` to `dst` in transformers' LLaVA format.

    `vision_tower`: a local CLIP checkpoint, needed when `src` lacks the tower's weights (the
    release names it by hub id). `dtype`: of the written weights; default the LM's own.
    """
    src, dst = Path(src), Path(dst)
    if dst.exists() and any(dst.iterdir()):
        raise ConversionError(f"{dst} already exists and is not empty: remove it or choose another")
    original = read_json(src / "config.json", "SRC must be a LLaVA(-Med) checkpoint directory")
    check_supported(original, src)
    parts = split_original(read_weights(src))
    if "model.embed_tokens.weight" not in parts["language"]:
        raise ConversionError(
            f"{src} has no 'model.embed_tokens.weight': not the original LLaVA layout (a "
            "transformers-format copy loads directly with model.pretrained)."
        )
    tower = Path(vision_tower) if vision_tower is not None else None
    vision_config, parts["vision"], tower = resolve_tower(original, parts["vision"], tower)
    weights_dtype = (
        getattr(torch, dtype) if dtype else parts["language"]["model.embed_tokens.weight"].dtype
    )
    tokenizer = build_tokenizer(src)
    processor = build_processor(tokenizer, vision_config, original, tower)
    model = build_model(
        original,
        vision_config,
        parts,
        tokenizer,
        processor.vision_feature_select_strategy,
        weights_dtype,
    )

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
        record = {
            "source": str(src.resolve()),
            "vision_tower": str(tower.resolve()) if tower is not None else "from source",
            "dtype": str(weights_dtype).removeprefix("torch."),
            "image_token_index": model.config.image_token_index,
        }
        (tmp / DONE_FILE).write_text(json.dumps(record, indent=2))

    if dst.exists():
        dst.rmdir()  # empty (checked above); build_once renames a finished copy into place
    build_once(dst, write, marker=DONE_FILE, what="converted model")
    log.info("converted %s to %s: set model.pretrained=%s", src, dst, dst)
    return dst
