"""Apply a fine-tuning method (a `peft=` config) to a loaded VLM.

One function reads the method's data: which peft adapter (if any) and where, and which model
parts are trained as full weights. There is no per-method branch: `full` is "no adapter, train
the language model and projector", `none` is "no adapter, train nothing".
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from hydra.utils import instantiate
from peft import PeftConfig, get_peft_model

from medvqa.cluster import GPU_ACCELERATORS
from medvqa.models.prompting import VIRTUAL_TOKEN
from medvqa.models.spec import ModelSchema

log = logging.getLogger(__name__)


def build_adapter_config(
    adapter_cfg: Any, scope: str | None, roles: Mapping[str, str]
) -> PeftConfig | None:
    """Instantiate the peft config; confine `target_modules` to the model part `scope`.

    CLIP/SigLIP vision towers reuse `q_proj`/`v_proj`, so plain names would also adapt the
    vision tower; a regex over the scope's module name keeps adapters in the language model.
    """
    if adapter_cfg is None:
        return None
    config: PeftConfig = instantiate(adapter_cfg, _convert_="all")  # lists, not ListConfig
    targets = getattr(config, "target_modules", None)
    if scope is not None and targets is not None and not isinstance(targets, str):
        if scope not in roles:
            raise KeyError(
                f"peft.adapter_scope={scope!r} is not a model role; roles: {list(roles)}"
            )
        names = "|".join(re.escape(t) for t in sorted(targets))
        config.target_modules = rf".*{re.escape(roles[scope])}\.(.*\.)?({names})"
    return config


def role_parameters(
    model: torch.nn.Module, module_name: str
) -> list[tuple[str, torch.nn.Parameter]]:
    """The (name, parameter) pairs inside the module `module_name` (a role's module name).

    The one rule that maps a role to weights, used to unfreeze roles and to give the projector
    its own learning rate; it holds under peft's `base_model.model.` name prefix too. Parameters
    are found through the modules that hold them, so a weight tied to another module's (Qwen2-VL
    2B's and Gemma's lm_head share the input embeddings, and `named_parameters` lists the shared
    tensor once, under the embedding) still belongs to the role; each parameter comes once.
    """
    fragment = f"{module_name}."
    found: dict[int, tuple[str, torch.nn.Parameter]] = {}
    for name, module in model.named_modules():
        if fragment in f"{name}.":
            for pname, param in module.named_parameters(prefix=name, recurse=False):
                found.setdefault(id(param), (pname, param))
    return list(found.values())


def set_trainable(
    model: torch.nn.Module, train_modules: Sequence[str], roles: Mapping[str, str]
) -> None:
    """Unfreeze the parameters of the named model roles (e.g. projector, language)."""
    for role in train_modules:
        if role not in roles:
            raise KeyError(
                f"peft.train_modules entry {role!r} is not a model role; roles: {list(roles)}"
            )
        hits = [p for _, p in role_parameters(model, roles[role])]
        if not hits:
            raise ValueError(
                f"model role {role!r} (module name {roles[role]!r}) matches no parameter; fix "
                "model.modules for this family."
            )
        for p in hits:
            p.requires_grad_(True)


def add_virtual_tokens(model: torch.nn.Module, processor: Any, n: int, seed: int = 0) -> list[int]:
    """Add `n` virtual tokens to the tokenizer (and embedding rows to the model); return ids.

    Deterministic: the same base gets the same ids and initial rows (copies of existing token
    embeddings, as PEFT's prompt tuning initialises), so saved rows reload onto the same tokens.
    """
    tok = processor.tokenizer
    names = [VIRTUAL_TOKEN.format(i) for i in range(n)]
    tok.add_tokens(names, special_tokens=True)
    ids = tok.convert_tokens_to_ids(names)
    embeddings = model.get_input_embeddings()
    if max(ids) >= embeddings.weight.shape[0]:  # some families pad the vocabulary: no resize
        model.resize_token_embeddings(max(ids) + 1, mean_resizing=False)  # rows set below
        embeddings = model.get_input_embeddings()
    generator = torch.Generator().manual_seed(seed)
    donors = torch.randint(0, min(ids), (n,), generator=generator)
    output = model.get_output_embeddings()
    with torch.no_grad():
        embeddings.weight[ids] = embeddings.weight[donors].clone()
        if output is not None and output.weight is not embeddings.weight:  # untied lm_head
            output.weight[ids] = output.weight[donors].clone()
    generation = getattr(model, "generation_config", None)
    if generation is not None:  # prompt material, never an answer
        generation.suppress_tokens = sorted({*(generation.suppress_tokens or []), *ids})
    return list(ids)


# Model roles that only ever see images: a run trained without them (`data.train_image=none`)
# cannot train them.
IMAGE_ROLES = ("vision", "projector")


def trained_roles(peft_cfg: Any, images: bool = True) -> list[str]:
    """The roles `peft_cfg.train_modules` trains as full weights, without the image-only ones
    when the model is trained without images: they would get no gradient (DDP refuses a step
    with a trainable parameter that took no part in the loss) and be saved unchanged."""
    roles = list(peft_cfg.train_modules)
    if images:
        return roles
    kept = [r for r in roles if r not in IMAGE_ROLES]
    if kept != roles:
        log.info("trained without images: not training %s", sorted(set(roles) - set(kept)))
    return kept


def on_meta(peft_cfg: Any) -> tuple[Any, int]:
    """The method as `apply_method` applies it to a model on the meta device (the plan's counts
    and FLOPs): prompt tuning's virtual tokens become trainable rows of the embedding by index,
    which needs no tokenizer; and the number of those tokens."""
    from omegaconf import OmegaConf

    peft = OmegaConf.to_container(peft_cfg, resolve=True)
    assert isinstance(peft, dict)
    n_virtual = int(peft["virtual_tokens"])
    if n_virtual and peft.get("adapter"):
        peft["adapter"]["token_indices"] = list(range(n_virtual))
        peft["virtual_tokens"] = 0
    return OmegaConf.create(peft), n_virtual


def apply_method(
    model: torch.nn.Module,
    peft_cfg: Any,
    roles: Mapping[str, str],
    processor: Any = None,
    images: bool = True,
    trainable_dtype: torch.dtype | None = torch.float32,
) -> torch.nn.Module:
    """Freeze the base, wrap it with the method's adapter, unfreeze its full-weight parts
    (`trained_roles`: without the image-only ones when `images` is False).

    Trainable parameters end up float32 whatever the base's dtype: AdamW's steps (about `lr` in
    size) are below bf16's resolution for most weights and round away, so the base stays half
    and only the small trained part pays for fp32. Such a mixed model needs autocast to run: train
    it with a mixed trainer precision (`medvqa.training.hardware.check_precision`), and cast the
    trainables back (`cast_trainable(model, base dtype)`) before generating without autocast.
    `trainable_dtype=None` keeps them in the base's dtype: DeepSpeed casts the module to bf16
    anyway and keeps its own fp32 master copy in the optimizer, so an fp32 copy per rank would
    only cost memory (30 GB of host RAM per rank for a 7B model's full fine-tuning).

    Methods with `virtual_tokens` (prompt tuning) also add their tokens to `processor`, so
    every prompt built from it afterwards carries them.
    """
    n_virtual = int(peft_cfg.virtual_tokens)
    token_ids: list[int] = []
    if n_virtual:
        if processor is None:
            raise ValueError(f"method {peft_cfg.name!r} adds virtual tokens: pass the processor")
        token_ids = add_virtual_tokens(model, processor, n_virtual)
    model.requires_grad_(False)
    adapter = build_adapter_config(peft_cfg.adapter, peft_cfg.adapter_scope, roles)
    if adapter is not None and token_ids and hasattr(adapter, "token_indices"):
        adapter.token_indices = token_ids
    if adapter is not None:
        model = get_peft_model(model, adapter)
    set_trainable(model, trained_roles(peft_cfg, images), roles)
    upcast = 0 if trainable_dtype is None else cast_trainable(model, trainable_dtype)
    if upcast:
        log.info(
            "cast %d trainable tensors to float32 (AdamW must not update half weights)", upcast
        )
    n_train, n_all = count_parameters(model)
    log.info(
        "method %s: %d of %d parameters trainable (%.2f%%)",
        peft_cfg.name,
        n_train,
        n_all,
        100.0 * n_train / max(n_all, 1),
    )
    return model


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in model.parameters())


def cast_trainable(model: torch.nn.Module, dtype: torch.dtype) -> int:
    """Cast the trainable floating-point parameters to `dtype` in place; return how many changed.

    In place (`param.data`), so the Parameter objects that peft modules, tied weights and an
    optimizer hold stay the same objects.
    """
    changed = 0
    for param in model.parameters():
        if param.requires_grad and param.is_floating_point() and param.dtype != dtype:
            param.data = param.data.to(dtype)
            changed += 1
    return changed


AUTO = "auto"


def checkpoint_every(setting: Any) -> int | None:
    """`model.gradient_checkpointing` as the decoder layers to checkpoint: 0 (false: none), n
    (every n-th layer; true: 1, every layer), or None for "auto" (the least that fits the GPU,
    decided by the memory plan before the fit: `tasks.plan.check_fits`)."""
    if isinstance(setting, bool):
        return int(setting)
    if isinstance(setting, str) and setting.strip().lower() == AUTO:
        return None
    if isinstance(setting, int) and setting >= 0:
        return setting
    raise ValueError(
        f"model.gradient_checkpointing={setting!r}: choose true (every decoder layer), false, "
        f"a whole number n >= 1 (every n-th layer), or {AUTO} (the least that fits the GPU)"
    )


def enable_gradient_checkpointing(model: torch.nn.Module, every_n_layers: int = 1) -> None:
    """Recompute activations in the backward pass (non-reentrant `torch.utils.checkpoint`), of
    every `every_n_layers`-th decoder layer (1: all; the others keep their activations).

    Call it after `apply_method`, before fitting (prompt tuning may replace the embedding
    module). Non-reentrant checkpointing back-propagates into the adapters of a checkpointed
    layer whether or not its inputs require grad, so the hooks transformers adds to make the
    input embeddings' outputs require grad (`enable_input_require_grads`, needed only by the
    reentrant variant) are removed again: in transformers 5 they sit on every embedding of the
    model, the frozen vision tower's patch embedding too, which then saved and back-propagated
    its activations for nothing (about +1 TFLOP per CLIP-L image).
    """
    kwargs = {"use_reentrant": False}
    # transformers renamed it; gradient_checkpointing_enable is the deprecated alias.
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs=kwargs, every_n_layers=every_n_layers
        )
    elif every_n_layers == 1:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise RuntimeError(
            "checkpointing every n-th layer needs transformers' activation_checkpointing_enable "
            "(5.23 or later)"
        )
    model.disable_input_require_grads()
    log.info("gradient checkpointing on (non-reentrant, every %d layer(s))", every_n_layers)


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The language model's decoder layers (through peft's wrapper)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder().layers


def compiles_layers(model_cfg: Any, accelerator: str) -> bool:
    """Whether the fit compiles the decoder layers: `model.compile_layers`, where `auto` means
    on CUDA GPUs unless Liger's kernels are on (torch.compile cannot trace them). Measured on
    an H100: LoRA on LLaVA-Med 7B faster and in less memory compiled than eager
    (docs/measurements.md, gpu-h100-2026-11-26 training lines 22 and 31)."""
    value = model_cfg.get("compile_layers", ModelSchema.compile_layers)
    if value == "auto":
        liger = model_cfg.get("liger_kernels", ModelSchema.liger_kernels)
        return str(accelerator) in GPU_ACCELERATORS and not liger
    return bool(value)


@contextmanager
def compiled_decoder_layers(
    model: torch.nn.Module, enabled: bool = True, fallback: bool = False, backend: Any = "inductor"
) -> Iterator[None]:
    """`torch.compile` each decoder layer while the block runs (`model.compile_layers`), eager
    again after it: generation's growing KV cache would recompile them at every length.

    The layers share their code, so they share their compiled graphs (parameters are inputs);
    shapes are dynamic, as sequence lengths vary from batch to batch. The first steps compile
    (tens of seconds on a GPU). With `fallback` (`compile_layers: auto`), a layer that does not
    compile runs eager, with torch's warning, instead of stopping the fit.
    """
    if not enabled:
        yield
        return
    import torch._dynamo

    layers = decoder_layers(model)
    for layer in layers:
        layer.compile(dynamic=True, backend=backend)
    log.info(
        "torch.compile: %d decoder layers%s", len(layers), " (eager where it fails)" * fallback
    )
    try:
        with torch._dynamo.config.patch(suppress_errors=fallback):
            yield
    finally:
        for layer in layers:
            layer._compiled_call_impl = None  # where nn.Module.compile keeps the compiled call


def mergeable_layers(model: torch.nn.Module) -> list[Any]:
    """peft's adapter layers that can fold into their base weight (LoRA, (IA)³); prompt tuning
    and full fine-tuning have none."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [
        m
        for m in model.modules()
        if isinstance(m, BaseTunerLayer) and m.active_adapters and not m.merged
    ]


@contextmanager
def merged_adapters(model: torch.nn.Module, enabled: bool = True) -> Iterator[int]:
    """Fold the active adapters into copies of their base weights while the block runs
    (`model.merge_adapters`: generation), the original tensors back afterwards, bit for bit.

    Unmerged, every decode step runs each adapted Linear as three matmuls plus the adds (224
    extra modules per step in a 7B model with LoRA on every projection): decoding is bound by
    those launches, not by the GPU's arithmetic. Merged, it is the base model's cost. peft's
    own `unmerge` subtracts the delta again, which is not exact in bf16, and the weights may
    still train (a validation pass mid-fit): so the merge writes into a copy, and the copy is
    dropped. The copies cost the adapted weights' bytes once more while the block runs (13 GiB
    for LoRA on a 7B model's projections in bf16). Yields the number of layers merged.
    """
    layers = mergeable_layers(model) if enabled else []
    saved: list[tuple[Any, dict[str, torch.Tensor]]] = []
    try:
        for layer in layers:
            base = layer.get_base_layer()
            originals = {n: p.data for n, p in base.named_parameters(recurse=False)}
            for param in base.parameters(recurse=False):
                param.data = param.data.clone()
            saved.append((layer, originals))
            layer.merge()  # in place, into the copies
        if layers:
            log.info("generation: adapters merged into %d layers", len(layers))
        yield len(layers)
    finally:
        for layer, originals in saved:
            base = layer.get_base_layer()
            for name, param in base.named_parameters(recurse=False):
                param.data = originals[name]
            layer.merged_adapters.clear()
