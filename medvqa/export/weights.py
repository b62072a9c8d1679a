"""A run's trained weights in the formats other tools load: a peft adapter folder, or a whole
transformers checkpoint with the method folded in.

Both start from the model `task=eval` evaluates: the base loaded as the run loaded it, the run's
method applied, its `trainable.safetensors` loaded (`load_trained`). From there everything is
peft's and transformers' own code (`get_peft_model`, `set_peft_model_state_dict`,
`merge_and_unload`, `save_pretrained`), so what they write is what they read back:

- **adapter folder** (`write_adapter`): the method's adapter (`adapter_config.json`,
  `adapter_model.safetensors`), with the parts the method trains as full weights (the
  projector) as peft's `modules_to_save` and the base's id or path as
  `base_model_name_or_path`. Prompt tuning's virtual tokens are real added tokens whose
  embedding rows train (peft's trainable tokens); peft has no trainable-tokens adapter that
  carries `modules_to_save`, so they are written as LoRA's `trainable_token_indices` beside a
  rank-1 LoRA layer whose B is zero (`PLACEHOLDER_RANK`: it adds exactly nothing) on one
  language-model Linear: the one adapter type that holds both. The tokenizer with those tokens,
  the chat template and the generation config (the virtual tokens suppressed, the protocol's
  answer length) go beside it;
- **merged checkpoint** (`write_merged`): `merge_and_unload` of the adapter (trained token rows
  written into the embedding), cast to the dtype the base was loaded in, with its config,
  processor, chat template and generation config: `AutoModelForImageTextToText.from_pretrained`
  loads it without medvqa. Full fine-tuning can only be exported so.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from medvqa.models.adapters import apply_method, trained_roles
from medvqa.models.loading import load_vlm, roles, torch_dtype
from medvqa.models.prompting import VIRTUAL_TOKEN
from medvqa.models.saving import load_trainable

log = logging.getLogger(__name__)

# The rank of the zero LoRA layer a prompt-tuning adapter carries so that peft's LoRA config can
# hold its trainable tokens and modules_to_save (module doc).
PLACEHOLDER_RANK = 1


class ExportError(ValueError):
    """A run whose weights cannot be written in the asked format; the message says why and
    what can be exported instead."""


def load_trained(
    model_cfg: Any, peft_cfg: Any, trained_dir: Path, images: bool
) -> tuple[torch.nn.Module, Any]:
    """(model, processor) as `task=eval` evaluates the weights in `trained_dir`: the base as the
    run loaded it, the method applied (`images`: trained with images, which decides whether
    the image-only roles trained), the saved trainable parameters loaded. In eval mode."""
    model, processor = load_vlm(model_cfg)
    model = apply_method(model, peft_cfg, roles(model_cfg), processor, images=images)
    load_trainable(model, trained_dir, peft_cfg.name)
    return model.eval(), processor


def has_adapter(model: torch.nn.Module) -> bool:
    """Whether the method wrapped the model with a peft adapter (not full fine-tuning)."""
    return hasattr(model, "peft_config")


def saved_modules(model_cfg: Any, peft_cfg: Any, images: bool) -> list[str]:
    """The module names the method trains as full weights (`peft.train_modules`), as peft's
    `modules_to_save` (matched by name ending); one inside another is saved with it."""
    parts = roles(model_cfg)
    names = [parts[r] for r in trained_roles(peft_cfg, images)]
    return [n for n in names if not any(n.startswith(f"{o}.") for o in names if o != n)]


def _virtual_ids(processor: Any) -> list[int]:
    """The ids of prompt tuning's virtual tokens in the processor's tokenizer, in order."""
    tok = processor.tokenizer
    names = []
    i = 0
    while VIRTUAL_TOKEN.format(i) in tok.get_added_vocab():
        names.append(VIRTUAL_TOKEN.format(i))
        i += 1
    return list(tok.convert_tokens_to_ids(names))


def _module_name(model: torch.nn.Module, module: torch.nn.Module) -> str:
    return next(name for name, m in model.named_modules() if m is module)


def _placeholder_target(model: torch.nn.Module, language: str) -> str:
    """The first Linear of the language model, by its full name: the zero LoRA layer's home."""
    for name, module in model.named_modules():
        if f"{language}." in f"{name}." and isinstance(module, torch.nn.Linear):
            return name
    raise ExportError(f"no Linear layer in the language model ({language!r}) to hold the adapter")


def _token_config(
    base: torch.nn.Module, config: Any, token_ids: Sequence[int], language: str
) -> Any:
    """The LoRA config that carries trainable tokens (module doc): the embedding's rows, and the
    output layer's where it is not tied to the embedding (its rows of the virtual tokens are
    the base's own copies, `add_virtual_tokens`, which a plain resize would not reproduce)."""
    from peft import LoraConfig

    rows = {_module_name(base, base.get_input_embeddings()): list(token_ids)}
    output = base.get_output_embeddings()
    if output is not None and output.weight is not base.get_input_embeddings().weight:
        rows[_module_name(base, output)] = list(token_ids)
    return LoraConfig(
        r=PLACEHOLDER_RANK,
        lora_alpha=PLACEHOLDER_RANK,
        lora_dropout=0.0,
        target_modules=[_placeholder_target(base, language)],
        trainable_token_indices=rows,
        modules_to_save=config.modules_to_save,
        base_model_name_or_path=config.base_model_name_or_path,
        revision=config.revision,
    )


def adapter_model(
    model: torch.nn.Module,
    processor: Any,
    model_cfg: Any,
    peft_cfg: Any,
    images: bool,
    base: str,
    revision: str | None = None,
) -> torch.nn.Module:
    """The trained model (`load_trained`) as the peft model its adapter folder holds: the same
    adapter weights, the full-weight parts as `modules_to_save`, the base's `base` id or path.
    Built from the model in place (it is consumed)."""
    from peft import get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
    from peft.utils import PeftType

    if not has_adapter(model):
        raise ExportError(
            f"method {peft_cfg.name!r} trains the weights themselves, not an adapter: export "
            "it as a whole checkpoint (--merged, task.merged=true)"
        )
    config = copy.deepcopy(model.peft_config["default"])
    config.modules_to_save = saved_modules(model_cfg, peft_cfg, images) or None
    config.base_model_name_or_path, config.revision = base, revision
    config.inference_mode = True
    if config.peft_type == PeftType.TRAINABLE_TOKENS:
        # The trained rows written into the embedding; the new adapter starts from them.
        plain = model.merge_and_unload()
        config = _token_config(plain, config, _virtual_ids(processor), roles(model_cfg)["language"])
        exported = get_peft_model(plain, config)
        return exported.eval()
    state = get_peft_model_state_dict(model, save_embedding_layers=False)
    exported = get_peft_model(model.unload(), config)  # the full-weight parts wrapped as trained
    # The wrapped parts as they were copied (trained), the adapter's layers as they trained.
    set_peft_model_state_dict(exported, get_peft_model_state_dict(exported) | state)
    loaded = get_peft_model_state_dict(exported, save_embedding_layers=False)
    differ = [k for k, v in state.items() if k not in loaded or not torch.equal(loaded[k], v)]
    if differ:
        raise ExportError(f"peft did not take the trained adapter weights {differ[:5]}")
    return exported.eval()


def merged_model(model: torch.nn.Module, model_cfg: Any) -> torch.nn.Module:
    """The trained model (`load_trained`) with its adapter folded in (`merge_and_unload`), in
    the dtype the base was loaded in (the trained parts are float32 beside a half base)."""
    if has_adapter(model):
        model = model.merge_and_unload()
    return model.to(torch_dtype(model_cfg)).eval()


def write_adapter(exported: torch.nn.Module, processor: Any, out: Path) -> None:
    """The adapter folder: peft's files, the processor (tokenizer, chat template), the
    generation config."""
    exported.save_pretrained(out, save_embedding_layers=False)
    _save_processor(processor, out)
    exported.get_base_model().generation_config.save_pretrained(out)


def write_merged(merged: torch.nn.Module, processor: Any, out: Path) -> None:
    """The whole checkpoint: weights, config and generation config, processor."""
    merged.save_pretrained(out)
    _save_processor(processor, out)


def _save_processor(processor: Any, out: Path) -> None:
    """`save_pretrained`, naming transformers' own processor class where medvqa registered an
    image-only subclass (`medvqa.models.processors`): a name only medvqa resolves would make the
    folder unloadable without it."""
    processor.save_pretrained(out)
    public = next(c for c in type(processor).__mro__ if c.__module__.startswith("transformers."))
    if public is type(processor):
        return
    for path in sorted(Path(out).glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and data.get("processor_class") == type(processor).__name__:
            data["processor_class"] = public.__name__
            path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def set_generation(model: torch.nn.Module, settings: Mapping[str, Any]) -> None:
    """Greedy decoding with the run's answer length, where it was recorded: `generate` then
    answers as the run's generation did, without being told."""
    config = model.generation_config
    config.do_sample = False
    if settings.get("max_new_tokens") is not None:
        config.max_new_tokens = int(settings["max_new_tokens"])


__all__ = [
    "ExportError",
    "adapter_model",
    "has_adapter",
    "load_trained",
    "merged_model",
    "saved_modules",
    "set_generation",
    "write_adapter",
    "write_merged",
]
