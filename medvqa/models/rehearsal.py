"""Rehearsals (`model.random_weights`): a preset's real architecture with seeded random weights.

A whole job (the plan, loading, zero-shot answers, the fit, checkpoints, generation, scoring)
then runs at the real shape on a machine without the hub: a new cluster, `make gpu-check`.
The architecture is the local checkpoint's config.json, else the shipped one
(`medvqa.models.architectures`); the processor is the checkpoint directory's own where it has
one, else a stand-in: the family's processor classes with the checkpoint's image settings and
a small byte-level tokenizer carrying the family's special tokens and chat template
(`medvqa.models.stand_in`), whose ids the config is pointed at. The scores of such a run mean
nothing: its record says `rehearsal` and medvqa-report keeps it apart from real runs.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForImageTextToText, AutoProcessor, PretrainedConfig

from medvqa.models.families.base import family_of
from medvqa.models.stand_in import build_tokenizer

log = logging.getLogger(__name__)

# Every rehearsal of an architecture starts from the same weights; the run's seed drives the
# rest. The weights are drawn in a forked generator, so the run's own random stream is the one
# a real checkpoint's run would have.
SEED = 0
# Merges the stand-in tokenizer may learn; its corpus yields a few hundred tokens. The model
# keeps the checkpoint's vocabulary (embedding rows), most of which the stand-in never uses.
STAND_IN_VOCAB = 1000
TEXT_TOKENS = ("bos_token_id", "eos_token_id", "pad_token_id")


def random_vlm(
    name: str,
    source: str,
    architecture: tuple[PretrainedConfig, dict[str, Any]],
    dtype: torch.dtype,
    attention: str,
    processor_kwargs: dict[str, Any],
    trust_remote_code: bool = False,
) -> tuple[torch.nn.Module, Any]:
    """(model with seeded random weights on this rank's device, processor) of `source`'s
    `architecture` (its config, as shrunk or not, and image-token fields;
    `medvqa.models.loading.architecture`)."""
    config, preprocessor = architecture
    processor = own_processor(source, processor_kwargs, trust_remote_code)
    if processor is None:
        processor = stand_in_processor(config, preprocessor)
        point_config_at(config, processor.tokenizer)
    device = _device()
    forked = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=forked), torch.device(device):
        torch.manual_seed(SEED)
        model = AutoModelForImageTextToText.from_config(
            config, dtype=dtype, attn_implementation=attention
        )
    tokenizer = processor.tokenizer
    for token in TEXT_TOKENS:
        setattr(model.generation_config, token, getattr(tokenizer, token))
    model.config._name_or_path = f"random weights: {source}"
    log.info(
        "REHEARSAL: %s has random weights (%.3g B parameters, %s's architecture with %d "
        "decoder layers) on %s; its scores mean nothing",
        name,
        sum(p.numel() for p in model.parameters()) / 1e9,
        source,
        config.get_text_config(decoder=True).num_hidden_layers,
        device,
    )
    return model, processor


def _device() -> torch.device:
    """This rank's GPU where there is one (the weights are drawn there: seconds for a 7B
    model, against minutes on a CPU), else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def own_processor(
    source: str, processor_kwargs: dict[str, Any], trust_remote_code: bool = False
) -> Any | None:
    """The checkpoint directory's own processor, where it has a tokenizer (else None); its
    code runs only with `model.trust_remote_code` (never from `processor_kwargs`)."""
    directory = Path(source)
    if not any((directory / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    kwargs = {k: v for k, v in processor_kwargs.items() if k != "trust_remote_code"}
    return AutoProcessor.from_pretrained(directory, trust_remote_code=trust_remote_code, **kwargs)


def stand_in_processor(config: PretrainedConfig, preprocessor: dict[str, Any]) -> Any:
    """The family's processor with the checkpoint's image settings (`preprocessor`: the
    image-token fields of its files, with model.processor_kwargs over them) and a stand-in
    tokenizer: images become as many tokens as the real processor makes of them."""
    kind = family_of(config.model_type, "model.random_weights (a stand-in processor)")
    settings = {key: value for key, value in preprocessor.items() if value is not None}
    own = kind.processor_fields
    image_processor = kind.make_image_processor(
        **{key: value for key, value in settings.items() if key not in own}
    )
    tokenizer = build_tokenizer(kind.name, STAND_IN_VOCAB)
    return kind.make_processor(
        image_processor, tokenizer, **{key: value for key, value in settings.items() if key in own}
    )


def point_config_at(config: PretrainedConfig, tokenizer: Any) -> None:
    """Make `config` name the stand-in tokenizer's ids for its special tokens (image
    placeholders, bos/eos/pad), which differ from the checkpoint tokenizer's."""
    kind = family_of(config.model_type, "model.random_weights (the stand-in's ids)")
    for attribute, token_id in kind.stand_in.config_ids(tokenizer).items():
        setattr(config, attribute, token_id)
    text = config.get_text_config(decoder=True)
    for part in {id(config): config, id(text): text}.values():
        for name in TEXT_TOKENS:
            if hasattr(part, name):
                setattr(part, name, getattr(tokenizer, name))
    if len(tokenizer) > text.vocab_size:
        raise ValueError(
            f"the stand-in tokenizer has {len(tokenizer)} tokens, more than the model's "
            f"vocabulary of {text.vocab_size}"
        )
