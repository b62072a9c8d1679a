"""Shared image prefixes: the part of a prompt an image's questions have in common is run once.

Generating a short answer is almost all prefill, and a test set asks ~11 questions per image
(SLAKE). Every supported template puts the image before the question, so the keys and values of
the prompt up to the end of its image are the same for all questions of one image. The
generation collate (`collate_generation`) groups a batch's rows by the identity of the pixels they
are shown (`IMAGE_KEY`: the image file and its transform's draw, known from the row's metadata
before any pixel is read, `VQADataset.image_key`; no tensor is hashed) and cuts each group's
longest common token prefix, which must hold every image token; `decode.prefill_shared` runs
those prefixes once per group, gives their cache to the group's rows and lets `generate` go on
from it with the questions' suffixes.

Every token keeps its position and its attention mask: a row is [its group's prefix, right-padded
to the longest prefix][padding][its suffix], with the padding masked out, so positions counted
from the mask (and Qwen's multimodal rotary positions, computed by `generate` from the whole row)
are those of the unshared left-padded row. In float32 the answers equal the unshared path's and
their log-probabilities differ by float rounding (tests/test_shared_prefix.py); in bf16 the
kernels see other shapes, so a near tie can flip, and such answers are keyed apart
(`predict.prediction_key`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from medvqa.models.families.base import sharing_refusal
from medvqa.models.prompting import pad_batch, per_token_keys

log = logging.getLogger(__name__)

SHARED_KEY = "shared_prefix"
# Beside each generation example: the identity of the pixels it is shown (`VQADataset.image_key`).
IMAGE_KEY = "image_identity"
# Image tensors the model needs after the prefix, one row per image: Qwen-VL computes its
# multimodal rotary positions of the whole row from the image grid. Pixels are never needed again.
POSITION_INPUTS = ("image_grid_thw",)


def model_sharing_refusal(model: torch.nn.Module, processor: Any) -> str | None:
    """Why `model` with `processor` cannot share image prefixes, or None when it can
    (`sharing_refusal` with the processor's image token)."""
    return sharing_refusal(getattr(model, "config", None), image_token_id(processor))


def sliding_window(config: Any) -> int | None:
    """The language model's sliding attention window (Gemma 3: 1024 tokens), if it has one.

    A shared row puts padding between prefix and suffix where an unshared row has it in front;
    a window counts cache positions, padding included, so the two rows see the same tokens only
    while a whole row (prompt and answer) fits in the window."""
    text = config.get_text_config() if config is not None else None
    window = getattr(text, "sliding_window", None)
    layers = getattr(text, "layer_types", None)
    if not window or getattr(text, "use_sliding_window", True) is False:
        return None
    if layers is not None and "sliding_attention" not in layers:
        return None
    return int(window)


def image_token_id(processor: Any) -> int | None:
    """The token an image's features replace (the processor's `image_token_id`), or None."""
    value = getattr(processor, "image_token_id", None)
    if value is None:
        token = getattr(processor, "image_token", None)
        value = processor.tokenizer.convert_tokens_to_ids(token) if token else None
    return None if value is None else int(value)


def _common_prefix(seqs: Sequence[torch.Tensor]) -> int:
    """The length of the longest prefix all `seqs` share."""
    n = min(len(s) for s in seqs)
    same = (torch.stack([s[:n] for s in seqs]) == seqs[0][:n]).all(dim=0)
    return int(same.int().cumprod(dim=0).sum())


def share_prefixes(
    features: Sequence[dict[str, torch.Tensor]],
    images: Sequence[str],
    pad_token_id: int,
    image_token: int | None,
    max_length: int | None = None,
) -> dict[str, Any] | str:
    """The batch with shared prefixes (rows grouped by `images`, each row's pixel identity), or
    why it cannot be: an image token after the prefix, or
    rows longer than `max_length` (`sliding_window` less the new tokens). The batch holds the
    whole rows ([prefix, padding, suffix], their masks and token types; Qwen's image grids) and,
    under `SHARED_KEY`, the groups' right-padded prefixes with their image tensors (`prefix`)
    and each row's group (`rows`)."""
    token_keys = per_token_keys(features[0])
    groups: dict[str, int] = {}
    rows = [groups.setdefault(image, len(groups)) for image in images]
    members: list[list[int]] = [[] for _ in groups]
    for i, g in enumerate(rows):
        members[g].append(i)
    if len(members) == len(features):  # nothing to share: the plain batch does less work
        return "no image of the batch is asked twice"
    cuts = []
    for group in members:
        seqs = [features[i]["input_ids"] for i in group]
        # At least one token of every row is left for `generate` to run.
        cut = min(_common_prefix(seqs), min(len(s) for s in seqs) - 1)
        if image_token is not None and any((s[cut:] == image_token).any() for s in seqs):
            return "an image token comes after the prompt text its questions share"
        if cut < 1:
            return "the rows have no prompt prefix in common"
        cuts.append(cut)
    heads = [
        {k: (v[: cuts[g]] if k in token_keys else v) for k, v in features[group[0]].items()}
        for g, group in enumerate(members)
    ]
    prefix = pad_batch(heads, pad_token_id, "right")
    tails = [{k: f[k][cuts[g] :] for k in token_keys} for f, g in zip(features, rows, strict=True)]
    suffix = pad_batch(tails, pad_token_id, "left")
    index = torch.tensor(rows)
    length = prefix["input_ids"].shape[1] + suffix["input_ids"].shape[1]
    if max_length is not None and length > max_length:
        return f"shared rows of {length} tokens exceed the sliding window's {max_length}"
    batch: dict[str, Any] = {k: torch.cat([prefix[k][index], suffix[k]], 1) for k in token_keys}
    batch.update({k: prefix[k][index] for k in POSITION_INPUTS if k in prefix})
    batch[SHARED_KEY] = {"prefix": prefix, "rows": index}
    return batch


def collate_generation(
    features: list[dict[str, Any]],
    pad_token_id: int,
    padding_side: str,
    image_token: int | None,
    meta_key: str,
    share: bool = True,
    max_length: int | None = None,
) -> dict[str, Any]:
    """`datamodule.collate` for generation: with `share`, shared prefixes (`share_prefixes`)
    where the batch allows them, else the plain padded batch; the row ids beside."""
    ids = [f.pop(meta_key) for f in features]
    images = [f.pop(IMAGE_KEY) for f in features]
    batch = share_prefixes(features, images, pad_token_id, image_token, max_length) if share else ""
    if isinstance(batch, str):
        if batch:
            log.debug("batch generated unshared: %s", batch)
        batch = pad_batch(features, pad_token_id, padding_side)
    batch[meta_key] = ids
    return batch
