"""Fine-tuning and generation speed of the real architectures on one GPU (a benchmark, not a test).

Each model preset (`conf/model/<name>.yaml`; LLaVA-Med v1.5 7B and Qwen2.5-VL-7B by default) is
built from its shipped architecture config (`medvqa/models/architectures/`) with random bf16
weights directly on the GPU: no hub, no download, the real shapes and kernels. The method is
applied as a run applies it (`apply_method`), and the project's own training module, collate
function and Lightning trainer (`trainer=gpu`) fit it on synthetic batches shaped like the data:
SLAKE (a 512 px image: LLaVA's 336 px crop, Qwen's 324 tokens; the SURE prompt's ~35 text
tokens; answers of 2-6 tokens) and, for Qwen,
MIMIC (a 2.5k x 3k radiograph under the preset's pixel cap). Per method and setup it prints:

- train samples/s and tokens/s (steady state: warm-up steps excluded, CUDA-synchronised, no
  Trainer set-up or teardown in the timed window);
- model-FLOPs MFU: per sample 2N.T forward + 2N.T activation gradients for the frozen language
  model, 6N.T for its trained weights, the frozen vision tower's forward, the projector, and
  attention (causal), over the GPU's dense bf16 peak (`medvqa.models.flops`, the count a run's own
  `perf/fit/mfu` uses); hardware-FLOPs utilisation
  adds what the setup recomputes (checkpointing) or computes for nothing (logits at every
  position);
- peak GPU memory; generation rows/s (batch 64, 16 new tokens, greedy, as `GenerationModule`):
  every image asked once, unmerged and merged; and with shared image prefixes (the default,
  `model.share_image_prefix`) at SLAKE's 11 questions per image and at one;
- the activation bytes one decoder layer keeps per token, measured on the GPU by the code
  `task=plan` measures them with on the CPU (`medvqa.planning.activations.measure_layer`).

    python benchmarks/gpu.py                                   # LLaVA-Med and Qwen2.5-VL-7B
    python benchmarks/gpu.py --models llava_med --methods lora --setups before ckpt/2-16 none-8
    python benchmarks/gpu.py --setups none-4-compile --warmup 10   # compiled rows: warm up longer
    python benchmarks/gpu.py --cpu                             # a shrunk shape on the CPU

`--models` takes the presets whose `pretrained` has an architecture to build (a local checkpoint
or a shipped config; not a `builder` preset such as tiny), or `preset@checkpoint`; another is
refused before any work, naming them.

`--cpu` shrinks the architecture (2 layers, narrow) and runs the same code on the CPU: it checks
the script (tests/test_training_speed.py), its figures mean nothing. `--out FILE` appends one JSON
line per row as it is measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import logging
import math
import sys
import time
from collections.abc import Iterator, Mapping
from functools import cache, partial
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from lightning.fabric.utilities.apply_func import move_data_to_device
from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table
from torch.utils.data import DataLoader, Dataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import medvqa.config  # noqa: E402,F401  (registers the schemas)
from medvqa.generation.decode import Decoder  # noqa: E402
from medvqa.generation.logprobs import ChosenLogProbs  # noqa: E402
from medvqa.generation.prefix import IMAGE_KEY, collate_generation  # noqa: E402
from medvqa.generation.settings import GenerationSettings  # noqa: E402
from medvqa.models.adapters import (  # noqa: E402
    apply_method,
    build_adapter_config,
    compiled_decoder_layers,
    decoder_layers,
    enable_gradient_checkpointing,
    merged_adapters,
)
from medvqa.models.architectures import (  # noqa: E402
    UnknownArchitectureError,
    image_tokens,
    load_architecture,
    shrink,
)
from medvqa.models.families.qwen import qwen_resize  # noqa: E402
from medvqa.models.flops import (  # noqa: E402
    add_batch,
    attention_shape,
    matmul_params,
    model_flops,
    new_sums,
    peak_bandwidth,
    peak_flops,
    recompute_flops,
)
from medvqa.models.fp8 import fp8_frozen_weights  # noqa: E402
from medvqa.models.loading import apply_liger_kernels, roles  # noqa: E402
from medvqa.models.prompting import IGNORE_INDEX  # noqa: E402
from medvqa.models.spec import decode_cache_length  # noqa: E402
from medvqa.planning.activations import measure_layer  # noqa: E402
from medvqa.provenance import git_state, gpus, versions  # noqa: E402
from medvqa.training.datamodule import collate  # noqa: E402
from medvqa.training.module import VQAModule  # noqa: E402
from medvqa.training.strategies import ResidentSingleDevice  # noqa: E402

log = logging.getLogger("benchmarks.gpu")

METHODS = ("lora", "ia3")  # prompt tuning needs the checkpoint's tokenizer (virtual tokens)
SAMPLES_PER_STEP = 16
QWEN_7B = "qwen2_5_vl@Qwen/Qwen2.5-VL-7B-Instruct"  # the preset is the 3B checkpoint  # data.batch_size: every setup trains 16 samples per optimiser step


@dataclasses.dataclass(frozen=True)
class Setup:
    """How one row trains: the knobs the waste items of the GPU path are about."""

    checkpoint_every: int  # 0: no gradient checkpointing; n: every n-th decoder layer
    micro_batch: int  # samples per forward; accumulation makes up SAMPLES_PER_STEP
    label_logits_only: bool = True  # False: float32 logits at every position (transformers)
    check_finite_every: int = 32  # 1: a host sync every step
    compile_layers: bool = False  # torch.compile of each decoder layer
    lora_dropout: float | None = None  # None: the method's (SURE: 0.05); 0.0 is a method change
    fp8: bool = False  # the frozen decoder weights' GEMMs in FP8 (model.fp8, medvqa.models.fp8)


SETUPS: dict[str, Setup] = {
    # The preset as it was: full checkpointing at batch 16, logits everywhere, a sync per step.
    "before": Setup(1, 16, label_logits_only=False, check_finite_every=1),
    "ckpt-16": Setup(1, 16),
    "ckpt/2-16": Setup(2, 16),
    "ckpt/2-8": Setup(2, 8),
    "none-8": Setup(0, 8),
    "none-4": Setup(0, 4),
    "ckpt/2-8-compile": Setup(2, 8, compile_layers=True),
    "none-4-compile": Setup(0, 4, compile_layers=True),
    "none-8-compile": Setup(0, 8, compile_layers=True),
    "none-8-fp8": Setup(0, 8, fp8=True),
    "none-8-compile-fp8": Setup(0, 8, compile_layers=True, fp8=True),
    "ckpt/2-8-dropout0": Setup(2, 8, lora_dropout=0.0),
    "none-8-dropout0": Setup(0, 8, lora_dropout=0.0),
}
# Least memory first: a row that runs out of memory comes last.
DEFAULT_SETUPS = ("before", "ckpt-16", "ckpt/2-16", "ckpt/2-8", "none-4", "none-8")


# --- FLOPs -----------------------------------------------------------------------------------


# --- synthetic batches -----------------------------------------------------------------------


class SyntheticVQA(Dataset):
    """Samples shaped as the processor of `config`'s family makes them (what `encode` returns):
    a prompt with one image's placeholder tokens and ~35 text tokens, an answer of 2-6 tokens
    (labelled, with the end-of-turn token), the image tensors. Token ids are random (the weights
    are too); lengths vary per sample as real questions do. `per_image` consecutive samples ask
    about one image (the same pixels and prompt up to the end of the image; SLAKE: 11)."""

    def __init__(
        self,
        config: Any,
        preprocessor: Mapping[str, Any],
        n: int,
        image_size: tuple[int, int],
        with_answer: bool,
        seed: int = 0,
        per_image: int = 1,
    ) -> None:
        self.config, self.pre, self.n = config, preprocessor, n
        self.image_size, self.with_answer, self.seed = image_size, with_answer, seed
        self.per_image = per_image
        self.family = config.model_type
        if self.family not in ("llava", "qwen2_vl", "qwen2_5_vl"):
            raise ValueError(f"no synthetic sample shape for model_type {self.family!r}")
        self.vocab = int(config.get_text_config(decoder=True).vocab_size)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(self.seed * 100_003 + i)
        # The image and the prompt before it: one draw per image.
        gi = torch.Generator().manual_seed(self.seed * 100_003 + 50_000 + i // self.per_image)
        head = torch.randint(10, min(self.vocab, 30_000), (5,), generator=gi)
        # The SURE prompt around a SLAKE question: 8-16 question tokens, options on every
        # other sample (closed questions), the turn markers; 2-6 answer tokens + end of turn.
        question = int(torch.randint(8, 17, (), generator=g))
        options = 8 if i % 2 else 0
        answer = int(torch.randint(2, 7, (), generator=g)) + 1 if self.with_answer else 0
        text = torch.randint(10, min(self.vocab, 30_000), (40 + question + options,), generator=g)
        if self.family == "llava":
            n_image = image_tokens(self.config, self.pre)
            image = torch.full((n_image,), int(self.config.image_token_index))
            tail = text[5 : 5 + 1 + question + options + 4]
            ids = [head, image, tail]
            side = int(self.config.vision_config.image_size)
            extra = {"pixel_values": torch.rand(1, 3, side, side, generator=gi)}
        else:
            patch, merge, _, resize = qwen_resize(self.config, self.pre)
            h, w = resize(*self.image_size)
            grid = torch.tensor([[1, h // patch, w // patch]])
            n_patches = int(grid.prod())
            n_image = n_patches // merge**2
            image = torch.full((n_image,), int(self.config.image_token_id))
            start = torch.tensor([int(self.config.vision_start_token_id)])
            end = torch.tensor([int(self.config.vision_end_token_id)])
            tail = text[5 : 5 + 1 + question + options + 4]
            ids = [head, start, image, end, tail]
            depth = 3 * self.config.vision_config.temporal_patch_size * patch**2
            extra = {
                "pixel_values": torch.rand(n_patches, depth, generator=gi),
                "image_grid_thw": grid,
            }
        prompt = torch.cat(ids)
        answer_ids = torch.randint(10, min(self.vocab, 30_000), (answer,), generator=g)
        input_ids = torch.cat([prompt, answer_ids])
        out: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
        }
        if self.with_answer:
            out["labels"] = torch.cat([torch.full_like(prompt, IGNORE_INDEX), answer_ids])
        out.update(extra)
        out["record_ids"] = f"s{i}"
        if not self.with_answer:  # what generation groups shared prefixes by
            out[IMAGE_KEY] = f"image{i // self.per_image}"
        return out


def loader(
    data: SyntheticVQA,
    batch: int,
    cuda: bool,
    padding_side: str,
    image_token: int | None = None,
    share: bool = False,
) -> DataLoader:
    """The job's loader settings: the project's collate (for generation, `image_token` given:
    generation's, with shared image prefixes if `share`), two workers, pinned memory."""
    collate_fn = partial(collate, pad_token_id=0, padding_side=padding_side)
    if image_token is not None:
        collate_fn = partial(
            collate_generation,
            pad_token_id=0,
            padding_side=padding_side,
            image_token=image_token,
            meta_key="record_ids",
            share=share,
        )
    return DataLoader(
        data,
        batch_size=batch,
        collate_fn=collate_fn,
        num_workers=2,
        pin_memory=cuda,
        persistent_workers=True,
    )


# --- the model ---------------------------------------------------------------------------------


def build_model(cfg: Any, device: torch.device, small: bool) -> tuple[Any, Any, Any]:
    """(model with random weights on `device`, its config, image-token preprocessor fields)."""
    from transformers import AutoModelForImageTextToText

    config, pre = load_architecture(cfg.model.pretrained)
    pre = {**pre, **dict(cfg.model.get("processor_kwargs") or {})}
    if small:
        config = shrink(config)
    dtype = getattr(torch, str(cfg.model.dtype))
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForImageTextToText.from_config(
            config, dtype=dtype, attn_implementation=str(cfg.model.attn_implementation)
        )
    return model, config, pre


def set_lora_dropout(model: torch.nn.Module, p: float) -> int:
    """Replace LoRA's dropout modules (peft uses Identity for 0); returns how many changed."""
    changed = 0
    for module in model.modules():
        drops = getattr(module, "lora_dropout", None)
        if isinstance(drops, torch.nn.ModuleDict):
            for key in list(drops):
                drops[key] = torch.nn.Identity() if p == 0 else torch.nn.Dropout(p)
                changed += 1
    return changed


# --- measuring -------------------------------------------------------------------------------


class Meter(L.Callback):
    """Steady-state clock: starts after `warmup` batches (synchronised), stops at the end of
    training before the Trainer tears down; sums tokens and squared lengths of timed batches."""

    def __init__(self, warmup: int, cuda: bool) -> None:
        self.warmup, self.cuda = warmup, cuda
        self.batches = 0
        self.start = self.stop = 0.0
        self.sums = new_sums()
        self.patch_size = 0  # the vision tower's (LLaVA's patches per image)
        self.peak = float("nan")

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def on_train_batch_start(self, trainer: L.Trainer, module: Any, batch: Any, i: int) -> None:
        if self.batches == self.warmup:
            self._sync()
            self.start = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, module: Any, out: Any, batch: Any, i: int):
        if self.batches >= self.warmup:
            add_batch(self.sums, batch, self.patch_size)
        self.batches += 1

    def on_train_end(self, trainer: L.Trainer, module: Any) -> None:
        self._sync()
        self.stop = time.perf_counter()
        if self.cuda:
            self.peak = torch.cuda.max_memory_allocated() / 2**30

    @property
    def seconds(self) -> float:
        return self.stop - self.start


def train_row(
    model: torch.nn.Module,
    cfg: Any,
    config: Any,
    pre: Mapping[str, Any],
    setup: Setup,
    args: argparse.Namespace,
    image_size: tuple[int, int],
) -> dict[str, Any]:
    """Fit `model` (adapted already) for warm-up + timed steps under `setup`; the figures."""
    cuda = not args.cpu
    device = next(model.parameters()).device
    if setup.checkpoint_every:
        enable_gradient_checkpointing(model, every_n_layers=setup.checkpoint_every)
    else:  # transformers renamed it (medvqa.models.adapters.enable_gradient_checkpointing)
        disable = getattr(model, "activation_checkpointing_disable", None)
        (disable or model.gradient_checkpointing_disable)()
    dropout_changed = 0
    if setup.lora_dropout is not None:
        dropout_changed = set_lora_dropout(model, setup.lora_dropout)
    micro = min(setup.micro_batch, args.micro_batch_cap or setup.micro_batch)
    accumulate = max(1, SAMPLES_PER_STEP // micro) if not args.cpu else 1
    steps = args.steps
    n = (args.warmup + steps) * accumulate * micro
    data = SyntheticVQA(config, pre, n, image_size, with_answer=True)
    meter = Meter(warmup=args.warmup * accumulate, cuda=cuda)
    meter.patch_size = int(config.vision_config.patch_size)
    module = VQAModule.for_method(model, cfg.peft, roles(cfg.model)["projector"])
    module.label_logits_only = setup.label_logits_only
    module.check_finite_every = setup.check_finite_every
    trainer = instantiate(
        cfg.trainer,
        devices=1,
        strategy=ResidentSingleDevice.on(device) if cuda else "auto",
        max_steps=args.warmup + steps,
        max_epochs=None,
        accumulate_grad_batches=accumulate,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[meter],
    )
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    try:
        with (
            fp8_frozen_weights(model, setup.fp8, roots=list(decoder_layers(model))),
            compiled_decoder_layers(model, setup.compile_layers),
        ):
            trainer.fit(module, train_dataloaders=loader(data, micro, cuda, "right"))
    finally:
        if setup.lora_dropout is not None and dropout_changed:
            set_lora_dropout(model, float(cfg.peft.adapter.lora_dropout))
    p = matmul_params(model, roles(cfg.model))
    shape = attention_shape(config)
    s = meter.sums
    flops = model_flops(
        p, shape, s["tokens"], s["tokens_sq"], s["labelled"],
        s["patches"], s["patches_sq"], s["projected"],
    )  # fmt: skip
    beyond = 0.0 if setup.label_logits_only else s["positions"] - s["labelled"]
    hw = flops + recompute_flops(
        p, shape, setup.checkpoint_every, s["tokens"], s["tokens_sq"], beyond
    )
    seconds = meter.seconds
    return {
        "samples_s": s["samples"] / seconds,
        "tokens_s": s["tokens"] / seconds,
        "tflop_sample": flops / max(s["samples"], 1) / 1e12,
        "model_flops_s": flops / seconds,
        "hw_flops_s": hw / seconds,
        "peak_gib": meter.peak,
        "micro_batch": micro,
        "accumulate": accumulate,
        "timed_samples": int(s["samples"]),
        "tokens_per_sample": s["tokens"] / max(s["samples"], 1),
    }


@dataclasses.dataclass(frozen=True)
class GenCase:
    """One generation row: how the job would decode (`GenerationSettings`) and the data shape."""

    merge: bool = False
    per_image: int = 1  # questions per image (SLAKE: 11)
    share: bool = True  # model.share_image_prefix
    decode: str = "static"  # model.decode
    new_tokens: int | None = None  # None: --new-tokens


GEN_CASES: dict[str, GenCase] = {
    # Before the static decode: the growing cache, unmerged, shared prefixes (the old default).
    "gen-dynamic-11q": GenCase(per_image=11, decode="dynamic"),
    "gen-dynamic-1q": GenCase(decode="dynamic"),
    "gen-dynamic-merged-1q": GenCase(merge=True, decode="dynamic"),
    "gen-unshared-1q": GenCase(share=False, decode="dynamic"),
    # The static decode (compiled on CUDA: model.compile_decode=auto).
    "gen-static-11q": GenCase(per_image=11),
    "gen-static-merged-11q": GenCase(merge=True, per_image=11),
    "gen-static-1q": GenCase(),
    "gen-static-merged-1q": GenCase(merge=True),
    "gen-static-merged-11q-100tok": GenCase(merge=True, per_image=11, new_tokens=100),  # MIMIC
    "gen-static-merged-11q-6tok": GenCase(merge=True, per_image=11, new_tokens=6),  # SLAKE's own
}


def generation_row(
    model: torch.nn.Module,
    config: Any,
    pre: Mapping[str, Any],
    args: argparse.Namespace,
    image_size: tuple[int, int],
    case: GenCase,
) -> dict[str, float]:
    """Greedy generation of `--gen-batch` left-padded prompts through the job's decoder
    (`medvqa.generation.decode.Decoder` with `case`'s settings and its log-probability recorder),
    under bf16 autocast as the predict Trainer runs it; one warm-up batch (compilation), then
    `--gen-batches` timed. Random weights rarely end a row early (one end token in the
    vocabulary), so every batch decodes its new tokens. The decode step is timed apart (a batch
    of the same rows with one new token, subtracted) and set against its floor: the language
    model's weights and the static cache read once per step at the GPU's bandwidth."""
    cuda = not args.cpu
    device = next(model.parameters()).device
    model.eval()
    new_tokens = case.new_tokens or args.new_tokens
    rows = args.gen_batch * (2 + args.gen_batches)
    data = SyntheticVQA(config, pre, rows, image_size, False, seed=1, per_image=case.per_image)
    token = config.image_token_index if config.model_type == "llava" else config.image_token_id
    batches = iter(loader(data, args.gen_batch, cuda, "left", int(token), case.share))
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda)

    def decoder(tokens: int) -> Decoder:
        settings = GenerationSettings(
            args.gen_batch, tokens, case.share, None, case.merge, case.decode
        )
        return Decoder(settings, pad_token_id=0)

    full, one = decoder(new_tokens), decoder(1)
    prompt = 0

    def run(batch: dict[str, Any], decode: Decoder) -> None:
        nonlocal prompt
        batch.pop("record_ids")
        inputs = move_data_to_device(batch, device)
        prompt = max(prompt, int(inputs["input_ids"].shape[1]))
        decode(model, inputs, ChosenLogProbs())

    def timed(decode: Decoder, batch_list: list[dict[str, Any]]) -> float:
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for b in batch_list:
            run(dict(b), decode)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    with torch.inference_mode(), autocast, merged_adapters(model, case.merge):
        warm = next(batches)
        run(dict(warm), full)
        run(dict(warm), one)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        measured = [next(batches) for _ in range(args.gen_batches)]
        seconds = timed(full, measured)
        prefill = timed(one, measured)
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
    step = (seconds - prefill) / args.gen_batches / max(new_tokens - 1, 1)
    model.train()
    return {
        "gen_rows_s": args.gen_batch * args.gen_batches / seconds,
        "gen_peak_gib": peak,
        "gen_new_tokens": new_tokens,
        "gen_step_ms": step * 1e3,
        "gen_floor_ms": decode_floor(model, config, args, prompt + new_tokens) * 1e3,
    }


def decode_floor(model: torch.nn.Module, config: Any, args: argparse.Namespace, tokens: int):
    """Seconds a decode step takes at least: the language model's weights (the vision tower
    does not run) and a static cache of `tokens` positions per row read once at the GPU's
    bandwidth (NaN where it is unknown: the CPU, an unlisted GPU)."""
    bandwidth = None if args.cpu else peak_bandwidth(torch.cuda.get_device_name())
    if bandwidth is None:
        return float("nan")
    text = config.get_text_config(decoder=True)
    weights = sum(
        p.numel() * p.element_size()
        for n, p in model.named_parameters()
        if "vision" not in n and "visual" not in n
    )
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    length = decode_cache_length("static", tokens, 0)
    cache = 2 * text.num_hidden_layers * heads * head_dim * length * args.gen_batch * 2  # bf16
    return (weights + cache) / bandwidth


def liger_check(
    model: torch.nn.Module, config: Any, pre: Mapping[str, Any], device: torch.device
) -> dict[str, Any]:
    """Apply Liger's kernels as `model.liger_kernels` does, checking on one batch (no dropout,
    bf16 autocast) that the loss is the eager model's to bf16 tolerance: the rows that follow
    run with Liger, and say so."""
    data = SyntheticVQA(config, pre, 4, (512, 512), with_answer=True)
    batch = collate([data[i] for i in range(len(data))], pad_token_id=0, padding_side="right")
    batch.pop("record_ids", None)
    inputs = {k: v.to(device) for k, v in batch.items() if isinstance(v, torch.Tensor)}

    def loss() -> float:
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
            return float(model(**inputs).loss)

    model.eval()
    before = loss()
    apply_liger_kernels(model)
    after = loss()
    model.train()
    return {"liger": True, "liger_loss_eager": before, "liger_loss": after}


def layer_activations(config: Any, cfg: Any, device: torch.device) -> float:
    """KiB per token one decoder layer keeps under this method, measured on `device` with the
    adapter `task=plan` measures it with (plain module names: the layer is the language model's)."""
    adapter = build_adapter_config(cfg.peft.adapter, None, roles(cfg.model))
    train_weights = "language" in list(cfg.peft.train_modules)
    measured = measure_layer(config, adapter, train_weights=train_weights, device=device)
    return measured.per_token / 1024


def _has_architecture(pretrained: str) -> bool:
    """Whether `build_model` can build `pretrained`: a local checkpoint or a shipped config."""
    try:
        load_architecture(pretrained)
    except UnknownArchitectureError:
        return False
    return True


@cache
def buildable_presets() -> dict[str, str]:
    """The model presets (conf/model/) this script builds, preset -> checkpoint: those whose
    `pretrained` has an architecture `load_architecture` reads. A preset without one (tiny,
    smollm2_llava: made by a `builder`) has no architecture to draw random weights for."""
    presets = {}
    for path in sorted((ROOT / "conf" / "model").glob("*.yaml")):
        pretrained = OmegaConf.load(path).get("pretrained")
        if isinstance(pretrained, str) and _has_architecture(pretrained):
            presets[path.stem] = pretrained
    return presets


def model_arg(value: str) -> str:
    """A `--models` entry, checked before any work: a preset this script builds, or
    `preset@checkpoint` (another checkpoint of one, with an architecture to build)."""
    preset, at, pretrained = value.partition("@")
    presets = buildable_presets()
    if preset not in presets:
        why = f"the preset {preset!r} " + (
            "names no checkpoint architecture (model.pretrained) to build with random weights"
            if (ROOT / "conf" / "model" / f"{preset}.yaml").is_file()
            else "is not in conf/model/"
        )
    elif at and not _has_architecture(pretrained):
        why = f"{pretrained!r} is neither a local checkpoint nor a shipped architecture"
    else:
        return value
    raise argparse.ArgumentTypeError(
        f"{value}: {why}. The presets it builds: {', '.join(presets)} (or <preset>@<checkpoint> "
        "for another checkpoint of one, e.g. " + QWEN_7B + ")"
    )


def compose_cfg(model: str, method: str, cpu: bool, overrides: list[str]) -> Any:
    """The run's config; `model` is a preset, or `preset@hub_id` for another checkpoint of it."""
    trainer = "cpu" if cpu else "gpu"
    extra = ["model.dtype=float32"] if cpu else []
    model, _, pretrained = model.partition("@")
    if pretrained:
        extra.append(f"model.pretrained={pretrained}")
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(
            "config",
            overrides=[
                f"model={model}",
                f"trainer={trainer}",
                f"peft={method}",
                *extra,
                *overrides,
            ],
        )


def rows_for(model_name: str, args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """Every (method, setup) row of one model, then its generation row per method."""
    device = torch.device("cpu" if args.cpu else "cuda")
    for method in args.methods:
        cfg = compose_cfg(model_name, method, args.cpu, args.overrides)
        model, config, pre = build_model(cfg, device, small=args.cpu)
        liger: dict[str, Any] = {}
        if args.liger:
            liger = liger_check(model, config, pre, device)
        model = apply_method(model, cfg.peft, roles(cfg.model))
        cases = [("slake", (512, 512))]
        if config.model_type.startswith("qwen") and args.mimic:
            cases.append(("mimic", (2544, 3056)))
        try:
            kib = layer_activations(config, cfg, device)
        except Exception as err:  # a figure beside the table: it must not stop the rows
            log.warning("layer activations of %s: %r", model_name, err)
            kib = float("nan")
        for data_name, size in cases:
            base = {"model": model_name, "method": method, "data": data_name, **liger}
            base["adapter_r"] = (cfg.peft.get("adapter") or {}).get("r")  # the rank it trained
            for name in args.setups:
                setup = SETUPS[name]
                if setup.lora_dropout is not None and method != "lora":
                    continue
                row = {**base, "setup": name, "setup_fields": dataclasses.asdict(setup)}
                try:
                    row.update(train_row(model, cfg, config, pre, setup, args, size))
                except torch.OutOfMemoryError:
                    row["error"] = "out of memory"
                except Exception as err:  # one failing row must not hide the others
                    row["error"] = repr(err)[:300]
                row["layer_kib_token"] = kib
                yield row
                if not args.cpu:
                    gc.collect()  # an out-of-memory row's trainer and optimizer state
                    torch.cuda.empty_cache()
            for name in args.gen_cases if args.gen_batches else ():
                case = dataclasses.asdict(GEN_CASES[name])  # docs/measurements.md reads it
                gen = {**base, "setup": name, "gen_batch": args.gen_batch, "gen_case": case}
                try:
                    gen.update(generation_row(model, config, pre, args, size, GEN_CASES[name]))
                except torch.OutOfMemoryError:
                    gen["error"] = "out of memory"
                except Exception as err:  # one failing row must not hide the others
                    gen["error"] = repr(err)[:300]
                yield gen
        del model
        if not args.cpu:
            torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", type=model_arg, default=["llava_med", QWEN_7B])
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--setups", nargs="+", default=list(DEFAULT_SETUPS), choices=SETUPS)
    parser.add_argument("--steps", type=int, default=8, help="timed optimiser steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed optimiser steps first")
    parser.add_argument("--micro-batch-cap", type=int, default=None)
    parser.add_argument("--gen-batch", type=int, default=64)
    parser.add_argument("--gen-batches", type=int, default=2, help="timed; 0: no generation rows")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--gen-cases", nargs="+", default=list(GEN_CASES), choices=GEN_CASES)
    parser.add_argument("--no-mimic", dest="mimic", action="store_false")
    parser.add_argument("--peak-tflops", type=float, default=None, help="GPU peak bf16 TFLOP/s")
    parser.add_argument("--out", type=Path, default=None, help="append a JSON line per row")
    parser.add_argument("--cpu", action="store_true", help="a shrunk shape on the CPU")
    parser.add_argument(
        "--liger", action="store_true", help="Liger's kernels (model.liger_kernels)"
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. peft.adapter.r=8")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    console = Console(width=200)
    if args.cpu:
        gpu, peak = "cpu (shrunk shapes: a script check, no figures)", None
        args.micro_batch_cap = args.micro_batch_cap or 2
        args.gen_batch, args.gen_batches, args.new_tokens = 2, 1, 2
    elif not torch.cuda.is_available():
        console.print("benchmarks/gpu.py needs CUDA; --cpu checks the script on this machine.")
        sys.exit(2)
    else:
        gpu = torch.cuda.get_device_name()
        peak = peak_flops(gpu, args.peak_tflops)
    table = Table(title=f"medvqa on {gpu}; torch {torch.__version__}")
    columns = ("model", "method", "data", "setup", "µbatch×acc", "samples/s", "tokens/s",
               "TFLOP/sample", "MFU", "HFU", "peak GiB", "gen rows/s", "step ms (floor)",
               "KiB/token/layer")  # fmt: skip
    for col in columns:
        table.add_column(col)
    rows: list[dict[str, Any]] = []
    made_with = {
        "date": datetime.date.today().isoformat(),
        "git": git_state(),
        "versions": versions(),
        "gpus": gpus(),  # name, NVIDIA driver, memory (nvidia-smi)
        "argv": list(argv or sys.argv[1:]),
    }
    for model_name in args.models:
        for row in rows_for(model_name, args):
            row["gpu"] = gpu
            row.update(made_with)  # every row says what it ran: commit, libraries, arguments
            if peak and "model_flops_s" in row:
                row["mfu"] = row["model_flops_s"] / peak
                row["hfu"] = row["hw_flops_s"] / peak
            rows.append(row)
            if args.out is not None:
                with args.out.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
            console.print(_line(row))
            table.add_row(*_cells(row))
    console.print(table)
    return rows


def _fmt(value: Any, spec: str) -> str:
    return (
        "—"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else format(value, spec)
    )


def _cells(r: Mapping[str, Any]) -> list[str]:
    shape = f"{r['micro_batch']}×{r['accumulate']}" if "micro_batch" in r else ""
    setup = r["setup"] + ("+liger" if r.get("liger") else "")
    if "error" in r:
        return [r["model"], r["method"], r["data"], setup, shape, r["error"][:40],
                *[""] * 8]  # fmt: skip
    return [r["model"], r["method"], r["data"], setup, shape,
            _fmt(r.get("samples_s"), ".2f"), _fmt(r.get("tokens_s"), ".0f"),
            _fmt(r.get("tflop_sample"), ".2f"), _fmt(r.get("mfu"), ".1%"), _fmt(r.get("hfu"), ".1%"),
            _fmt(r.get("peak_gib", r.get("gen_peak_gib")), ".1f"), _fmt(r.get("gen_rows_s"), ".1f"),
            _step(r), _fmt(r.get("layer_kib_token"), ".0f")]  # fmt: skip


def _step(r: Mapping[str, Any]) -> str:
    if "gen_step_ms" not in r:
        return ""
    return f"{_fmt(r['gen_step_ms'], '.1f')} ({_fmt(r.get('gen_floor_ms'), '.1f')})"


def _line(r: Mapping[str, Any]) -> str:
    keys = ("samples_s", "mfu", "hfu", "peak_gib", "gen_rows_s", "gen_step_ms", "gen_floor_ms",
            "liger_loss_eager", "liger_loss", "error")  # fmt: skip
    setup = r["setup"] + ("+liger" if r.get("liger") else "")
    return f"{r['model']}/{r['method']}/{r['data']}/{setup}: " + ", ".join(
        f"{k}={r[k]:.3g}" if isinstance(r[k], float) else f"{k}={r[k]}" for k in keys if k in r
    )


if __name__ == "__main__":
    main()
