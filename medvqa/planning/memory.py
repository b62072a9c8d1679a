"""Bytes per GPU and per host for a configured run, and what to change when it cannot fit.

`Setup` holds what the memory depends on (parameter counts from the meta-device model, the
trainer's sharding, batch and sequence sizes, the measured layer activations); `estimate` turns
it into a `Plan`. The terms, per GPU, for a step of training:

- weights: frozen parameters in the model's dtype, trained ones in float32 (`apply_method`),
  and one byte per frozen decoder weight while the fit runs them in FP8 (`model.fp8`);
  under DeepSpeed every parameter in the model's dtype (it casts the module);
- gradients: float32 per trained parameter (DDP adds its float32 bucket copies); ZeRO-2 keeps
  1/N of them plus its reduce buckets;
- optimizer: AdamW's two moments in float32 (ZeRO-2: 1/N of them and of its fp32 master copy;
  offloaded to the host with `offload_optimizer`);
- activations: micro-batch x tokens x (layers x measured bytes per token per layer) plus the
  per-forward part (autocast's weight copies), or for a checkpointed layer its input hidden
  state, plus one layer recomputed at a time (checkpointing every n-th layer: the others keep
  everything); and the loss: float32 logits over the whole vocabulary at
  the positions that predict a label (`training.module.causal_lm_loss`: the union over the
  micro-batch of each row's answer positions), with their gradient;
- a fixed reserve for the CUDA context, cuBLAS and NCCL workspaces and allocator slack.

Generation needs the weights, the KV cache of `eval_batch` sequences and one layer's prefill.
With shared image prefixes (`model.share_image_prefix`) it runs each image's prefix (at worst one
image per row) and then the rows' suffixes against the repeated cache: the larger of the two.
The host holds each rank's copy of the model as loaded (every rank loads it on the CPU before its
first Trainer moves it to the GPU) plus a process's libraries.
The reserve and per-process figures are estimates; every other term is counted.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from medvqa.models.spec import ModelSchema, decode_cache_length
from medvqa.planning.activations import LayerActivations

GIB = 2**30
# What torch reports for an 80 GB H100/A100 (torch.cuda.get_device_properties().total_memory);
# the capacity task=plan assumes on a machine without a GPU.
DEFAULT_GPU_GIB = 79.2
# CUDA context, cuBLAS/cuDNN and NCCL workspaces, allocator slack (estimate).
CUDA_RESERVE_GIB = 2.5
# A rank's own host memory beside the model: Python, torch, CUDA libraries (estimate).
HOST_PROCESS_GIB = 3.0
# Text tokens per sample the plan assumes beside the image tokens: a question, the prompt's
# wrapping and the answer (SLAKE with the SURE prompt: ~35; longer for MCQ options).
TEXT_TOKENS = 64
# Lightning's DeepSpeedStrategy defaults (elements): gradients are reduced through two buckets
# of this size (overlap_comm), parameters all-gathered through one.
ZERO_REDUCE_BUCKET = 200_000_000
ZERO_ALLGATHER_BUCKET = 200_000_000
# A change the plan suggests must leave this share of the GPU unused: the estimate's reserve
# and per-process terms are not measured, and the allocator fragments.
SUGGESTED_SHARE = 0.9
# `data.eval_batch_size=auto`: the largest of these whose generation fits (the plan ran), else
# `AUTO_EVAL_BATCH` (no plan: the CPU, task=eval, check_memory=false).
EVAL_BATCHES = (256, 192, 128, 96, 64)
AUTO_EVAL_BATCH = 64
# Labelled (answer) tokens per sample the plan assumes: the loss projects onto the vocabulary the
# union over a micro-batch of the rows' answer positions (SLAKE's answers: ~5 tokens).
LABELLED_TOKENS = 16
# Bytes per element of transformers' causal-LM loss per vocabulary entry and token at its peak:
# bf16 logits (kept in the output), their float32 upcast, log-softmax's saved float32 output and
# the float32 gradient coming back (ForCausalLMLoss: logits.float(), cross_entropy).
LOSS_BYTES_PER_LOGIT = 2 + 4 + 4 + 4


@dataclass(frozen=True)
class Setup:
    """What the memory of one run depends on (one GPU's view)."""

    model: str
    params: int  # every parameter of the model
    trainable: int  # those the method trains
    dtype_bytes: int  # the model's dtype (bf16: 2)
    trainable_bytes: int  # the trained parameters' dtype (4; DeepSpeed: the model's)
    layers: int  # decoder layers of the language model
    hidden: int
    vocab: int
    kv_width: int  # key/value heads x head dim
    intermediate: int  # the MLP's width
    # One decoder layer with the run's method and dtypes. The ZeRO-2 changes `fixes` suggests
    # reuse it (measured with fp32 trainables, it keeps autocast's bf16 weight copies that
    # ZeRO-2's bf16 module does not make: under checkpointing, one layer's more).
    layer: LayerActivations
    image_tokens: int
    text_tokens: int
    micro_batch: int  # per GPU and forward (data.batch_size)
    accumulate: int
    eval_batch: int
    max_new_tokens: int
    checkpoint_every: int  # 0: no gradient checkpointing; n: every n-th decoder layer (1: all)
    strategy: str  # "single", "ddp" or "zero2"
    devices: int  # per node
    nodes: int = 1
    offload_optimizer: bool = False
    gpu_gib: float = DEFAULT_GPU_GIB
    # Parameters copied while generating: the adapted layers' base weights, merged into copies
    # (`model.merge_adapters`; on an H100 LLaVA-Med's LoRA generation peaked 12.4 GiB higher)
    merged: int = 0
    # Generation runs each image's prompt prefix once (`medvqa.generation.prefix`).
    shared_prefix: bool = False
    decode: str = ModelSchema.decode  # the engine sizes the cache (`decode_cache_length`)
    # Frozen weights copied to FP8 for the fit (`model.fp8`): one byte each while it trains.
    fp8_params: int = 0

    @property
    def checkpointing(self) -> bool:
        return self.checkpoint_every > 0

    @property
    def checkpointed_layers(self) -> int:
        """Layers that keep only their input (transformers checkpoints layer i if i % n == 0)."""
        return math.ceil(self.layers / self.checkpoint_every) if self.checkpointing else 0

    @property
    def world_size(self) -> int:
        return self.devices * self.nodes

    @property
    def tokens(self) -> int:
        """Tokens of one sample (the plan's worst case: the largest image the processor makes)."""
        return self.image_tokens + self.text_tokens

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.accumulate * self.world_size


@dataclass(frozen=True)
class Plan:
    """Bytes per GPU (training and generation) and per host, for one `Setup`."""

    setup: Setup
    weights: float
    gradients: float
    optimizer: float
    activations: float
    loss: float
    reserve: float
    generation: float
    host_per_rank: float

    @property
    def training(self) -> float:
        return (
            self.weights + self.gradients + self.optimizer + self.activations + self.loss
        ) + self.reserve

    @property
    def peak(self) -> float:
        return max(self.training, self.generation)

    @property
    def host_per_node(self) -> float:
        return self.host_per_rank * self.setup.devices

    @property
    def fits(self) -> bool:
        return self.peak <= self.setup.gpu_gib * GIB


def estimate(s: Setup) -> Plan:
    """The memory of `s`, term by term (see the module docstring)."""
    frozen = s.params - s.trainable
    sharded = s.strategy == "zero2"
    if sharded:  # DeepSpeed casts the module; fp32 master, moments and gradients partitioned
        weights = s.params * s.dtype_bytes
        gradients = s.trainable * 4 / s.world_size + (
            2 * min(ZERO_REDUCE_BUCKET, s.trainable) * 4
            + min(ZERO_ALLGATHER_BUCKET, s.trainable) * s.dtype_bytes
        )
        optimizer = 0.0 if s.offload_optimizer else s.trainable * (4 + 8) / s.world_size
    else:
        weights = frozen * s.dtype_bytes + s.trainable * s.trainable_bytes + s.fp8_params
        buckets = s.trainable * 4 if s.strategy == "ddp" and s.world_size > 1 else 0
        gradients = s.trainable * 4 + buckets
        optimizer = s.trainable * 8.0
    tokens = s.micro_batch * s.tokens
    layer = s.layer
    full_layer = layer.per_token * tokens + layer.per_forward
    kept = s.checkpointed_layers
    activations = (s.layers - kept) * full_layer + kept * layer.hidden_bytes * tokens
    if kept:
        activations += full_layer  # the layer being recomputed
    positions = s.micro_batch * min(s.tokens, s.micro_batch * LABELLED_TOKENS)
    loss = positions * (s.vocab * LOSS_BYTES_PER_LOGIT + s.hidden * 8)
    reserve = CUDA_RESERVE_GIB * GIB
    generation = _generation(s) + reserve
    host = s.params * s.dtype_bytes + s.trainable * max(0, s.trainable_bytes - s.dtype_bytes)
    # Lightning's DeepSpeed teardown moves this rank's share of AdamW's moments to the CPU after
    # the fit (its fp32 master copy stays where it is); the other strategies keep the model and
    # the optimizer's state on the GPU (`training.strategies.KeepOnDevice`).
    host += s.trainable * 8 / s.world_size if sharded else 0.0
    host += HOST_PROCESS_GIB * GIB
    return Plan(s, weights, gradients, optimizer, activations, loss, reserve, generation, host)


def _generation(s: Setup) -> float:
    """Weights (and the merged copies of the adapted ones), the KV cache of an eval batch and
    one layer's prefill (bf16 activations). With shared prefixes, the larger of: the prefixes
    (the image tokens) of every image of a batch, at worst one per row, with their prefill; and
    the rows' whole cache, one layer of the prefixes' cache being repeated (the rest is freed
    layer by layer) and the suffixes' (the text tokens) prefill."""
    frozen = s.params - s.trainable
    weights = (frozen + s.merged) * s.dtype_bytes + s.trainable * s.trainable_bytes
    length = decode_cache_length(s.decode, s.tokens, s.max_new_tokens)

    def kv_cache(tokens: int, layers: int = s.layers) -> float:
        return s.eval_batch * tokens * layers * 2 * s.kv_width * s.dtype_bytes

    def prefill(tokens: int) -> float:  # one layer's attention and MLP tensors in flight
        return s.eval_batch * tokens * (4 * s.hidden + 3 * s.intermediate) * s.dtype_bytes

    if not s.shared_prefix:
        return weights + kv_cache(length) + prefill(s.tokens)
    prefixes = kv_cache(s.image_tokens) + prefill(s.image_tokens)
    rows = kv_cache(length) + kv_cache(s.image_tokens, 1) + prefill(s.text_tokens)
    return weights + max(prefixes, rows)


@dataclass(frozen=True)
class Fix:
    """A change of settings that makes the run fit, with the overrides that make it."""

    what: str
    overrides: tuple[str, ...]
    plan: Plan


def fixes(s: Setup, max_devices: int = 8, max_nodes: int = 4) -> list[Fix]:
    """Ways to make `s` fit with `SUGGESTED_SHARE` of the GPU, cheapest first: checkpointing; a
    smaller micro-batch with more accumulation (the same global batch); and where neither does
    on these GPUs, ZeRO-2 on enough GPUs (the same global batch), else with the optimizer state
    on the host."""
    found: list[Fix] = []
    limit = SUGGESTED_SHARE * s.gpu_gib * GIB
    evaluation: list[str] = []  # a smaller eval batch where generation does not fit
    if estimate(s).generation > limit:
        batch = s.eval_batch
        while batch > 1 and estimate(dataclasses.replace(s, eval_batch=batch)).generation > limit:
            batch //= 2
        s = dataclasses.replace(s, eval_batch=batch)
        evaluation = [f"data.eval_batch_size={batch}"]

    def consider(what: str, overrides: list[str], setup: Setup) -> bool:
        plan = estimate(dataclasses.replace(setup, eval_batch=s.eval_batch))
        if comfortable(plan):
            label = [f"eval batch {s.eval_batch}"] if evaluation else []
            found.append(
                Fix(", ".join([*label, what] if what else label), (*evaluation, *overrides), plan)
            )
        return comfortable(plan)

    if evaluation and consider("", [], s):
        return found

    ckpt = dataclasses.replace(s, checkpoint_every=1)
    ckpt_override = [] if s.checkpoint_every == 1 else ["model.gradient_checkpointing=true"]
    if s.checkpoint_every != 1:
        consider("gradient checkpointing", ckpt_override, ckpt)
    for base, extra in ((s, []), (ckpt, ckpt_override)):
        for micro in _smaller(base.micro_batch):
            accumulate = base.accumulate * base.micro_batch // micro
            smaller = dataclasses.replace(base, micro_batch=micro, accumulate=accumulate)
            overrides = [
                *extra,
                f"data.batch_size={micro}",
                f"trainer.accumulate_grad_batches={accumulate}",
            ]
            if consider(
                f"micro-batch {micro} x {accumulate} accumulation steps", overrides, smaller
            ):
                break
        if found:
            return found
    fewest = None  # ZeRO-2 on enough GPUs; with the optimizer state on the host if fewer do
    for offload in (False, True):
        sharded = _zero2(ckpt, max_devices, max_nodes, offload)
        if sharded is None or (fewest is not None and sharded[0].world_size >= fewest):
            continue
        setup, overrides = sharded
        fewest = setup.world_size
        what = "ZeRO-2 on {} GPU{}{}".format(
            setup.world_size,
            "s" if setup.world_size > 1 else "",
            ", optimizer state on the host" if offload else "",
        )
        consider(what, [*ckpt_override, *overrides], setup)
    return found


# What `model.gradient_checkpointing=auto` tries, least recompute first: off, every 4th, every
# 2nd, every layer (benchmarks/gpu.py: LLaVA-Med LoRA at batch 16 on an H100 trains 10.7
# samples/s checkpointing every layer, 12.7 every 2nd).
AUTO_CHECKPOINTING = (0, 4, 2, 1)
# The time model `auto` ranks layouts by (an estimate): time per sample proportional to
# (1 + MICRO_BATCH_COST / micro-batch) x (1 + RECOMPUTE_COST x the share of layers checkpointed).
# Fitted to the H100 rows of LLaVA-Med LoRA (eager) in benchmarks/results/gpu-h100-2026-11-26.jsonl:
# no checkpointing 8 x 2 14.5 and 4 x 4 12.7 samples/s give the first; every layer 10.7 and every
# 2nd 12.7 at 16 x 1 the second. It predicts every 2nd at 8 x 2 within 5 % (11.8 for 11.3), and
# ranks Qwen2.5-VL's three setups as measured.
MICRO_BATCH_COST = 1.31
RECOMPUTE_COST = 0.46


def checkpointing_label(every: int) -> str:
    return {0: "off", 1: "on"}.get(every, f"every {every} layers")


def step_time(s: Setup) -> float:
    """Time per sample of `s` relative to an unbounded micro-batch without checkpointing
    (the time model above: an estimate, used to rank layouts, never as a measurement)."""
    share = s.checkpointed_layers / s.layers if s.layers else 0.0
    return (1 + MICRO_BATCH_COST / s.micro_batch) * (1 + RECOMPUTE_COST * share)


def layouts(s: Setup) -> list[Setup]:
    """Every split of `s`'s per-GPU step batch (micro-batch x accumulation unchanged) with every
    checkpointing `auto` tries: the same optimisation (one token mean per step), other memory
    and speed."""
    per_gpu = s.micro_batch * s.accumulate
    micro = [m for m in range(per_gpu, 0, -1) if per_gpu % m == 0]
    return [
        dataclasses.replace(s, micro_batch=m, accumulate=per_gpu // m, checkpoint_every=every)
        for m in micro
        for every in AUTO_CHECKPOINTING
    ]


def fastest_layout(s: Setup) -> Setup:
    """`model.gradient_checkpointing=auto`: the layout (`layouts`) the time model ranks
    fastest among those that fit with `SUGGESTED_SHARE` of the GPU; ties go to the larger
    micro-batch. Where none fits, `s` checkpointing every layer (the plan then refuses it, with
    the fixes)."""
    fitting = [c for c in layouts(s) if comfortable(estimate(c))]
    if not fitting:
        return dataclasses.replace(s, checkpoint_every=1)
    return min(fitting, key=speed_order)


def merge_if_fits(s: Setup, mergeable: int) -> Setup:
    """`model.merge_adapters=auto`: generate with the adapters folded into copies of their
    base weights (`mergeable` parameters) where generation with the copies leaves
    `SUGGESTED_SHARE` of the GPU free; else `s` unmerged."""
    merged = dataclasses.replace(s, merged=mergeable)
    limit = SUGGESTED_SHARE * s.gpu_gib * GIB
    return merged if mergeable and estimate(merged).generation <= limit else s


def batch_if_fits(s: Setup) -> Setup:
    """`data.eval_batch_size=auto`: the largest of `EVAL_BATCHES` whose generation (with the
    merge decided) leaves `SUGGESTED_SHARE` of the GPU free; else `s` (at `AUTO_EVAL_BATCH`,
    which `fixes` shrinks where even that does not fit)."""
    limit = SUGGESTED_SHARE * s.gpu_gib * GIB
    for batch in EVAL_BATCHES:
        candidate = dataclasses.replace(s, eval_batch=batch)
        if estimate(candidate).generation <= limit:
            return candidate
    return s


def speed_order(s: Setup) -> tuple[float, int]:
    """Sort key of layouts, fastest first by the time model; ties to the larger micro-batch."""
    return round(step_time(s), 9), -s.micro_batch


def comfortable(plan: Plan) -> bool:
    """Whether `plan` leaves `SUGGESTED_SHARE` of the GPU free (what `auto` and the fixes need)."""
    return plan.peak <= SUGGESTED_SHARE * plan.setup.gpu_gib * GIB


def _smaller(micro: int) -> list[int]:
    """Micro-batches below `micro` that divide it, largest first."""
    return [m for m in range(micro - 1, 0, -1) if micro % m == 0]


def _zero2(
    s: Setup, max_devices: int, max_nodes: int, offload: bool
) -> tuple[Setup, list[str]] | None:
    """The fewest GPUs (at least as many as `s` has) on which ZeRO-2 fits `s`, keeping its
    global batch."""
    for nodes in range(1, max_nodes + 1):
        for devices in (d for d in (1, 2, 4, 8) if d <= max_devices):
            if nodes > 1 and devices != max_devices:
                continue  # more than one node: whole nodes
            world = devices * nodes
            if world < s.world_size or s.global_batch % world:
                continue
            per_gpu = s.global_batch // world
            micro = math.gcd(per_gpu, s.micro_batch)
            setup = dataclasses.replace(
                s,
                strategy="zero2",
                devices=devices,
                nodes=nodes,
                micro_batch=micro,
                accumulate=per_gpu // micro,
                trainable_bytes=s.dtype_bytes,
                offload_optimizer=offload,
            )
            if comfortable(estimate(setup)):
                overrides = [
                    "trainer=deepspeed_zero2",
                    f"trainer.devices={devices}",
                    *([f"trainer.num_nodes={nodes}"] if nodes > 1 else []),
                    f"data.batch_size={micro}",
                    f"trainer.accumulate_grad_batches={per_gpu // micro}",
                    *(["++trainer.strategy.offload_optimizer=true"] if offload else []),
                ]
                return setup, overrides
    return None


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def describe(plan: Plan) -> dict[str, Any]:
    """The plan as flat numbers (GiB, counts) for results.json and the loggers."""
    s = plan.setup
    return {
        "params": float(s.params),
        "trainable": float(s.trainable),
        "tokens_per_sample": float(s.tokens),
        "gpu_gib": s.gpu_gib,
        "weights_gib": plan.weights / GIB,
        "gradients_gib": plan.gradients / GIB,
        "optimizer_gib": plan.optimizer / GIB,
        "activations_gib": plan.activations / GIB,
        "loss_gib": plan.loss / GIB,
        "reserve_gib": plan.reserve / GIB,
        "train_gib": plan.training / GIB,
        "generation_gib": plan.generation / GIB,
        "host_per_node_gib": plan.host_per_node / GIB,
        "fits": float(plan.fits),
        "micro_batch": float(s.micro_batch),
        "accumulate": float(s.accumulate),
        "checkpoint_every": float(s.checkpoint_every),
        "merged_adapters": float(s.merged > 0),
    }


def headline(plan: Plan) -> str:
    """One line: what the run needs per GPU against what the GPU has."""
    s = plan.setup
    where = f"{s.world_size} GPU{'s' if s.world_size > 1 else ''} ({s.strategy})"
    terms = ", ".join(
        f"{name} {value / GIB:.1f}"
        for name, value in (
            ("weights", plan.weights),
            ("gradients", plan.gradients),
            ("optimizer", plan.optimizer),
            ("activations", plan.activations),
            ("loss", plan.loss),
            ("reserve", plan.reserve),
        )
    )
    return (
        f"model={s.model} on {where}: training needs {gib(plan.training)} per GPU ({terms} GiB), "
        f"generation {gib(plan.generation)}; the GPU has {s.gpu_gib:.1f} GiB"
    )


def refusal(plan: Plan, found: list[Fix]) -> str:
    """Why the run cannot fit, and each change that makes it fit (overrides to add)."""
    lines = [f"{headline(plan)}: it does not fit."]
    if found:
        lines.append("It fits with (add to the command):")
        lines += [
            f"  - {fix.what}: {gib(fix.plan.peak)} per GPU: {' '.join(fix.overrides)}"
            for fix in found
        ]
    else:
        lines.append(
            "No change tried fits (checkpointing, smaller micro-batches, ZeRO-2 on up to 4 nodes "
            "of 8 GPUs, optimizer offload): a smaller model or GPUs with more memory."
        )
    return "\n".join(lines)
