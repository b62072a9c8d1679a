"""The model spec (`conf/model/*.yaml`): what a VLM is and where its parts live. It sits with
the models, which read its defaults (`medvqa.models.loading.model_option`); `medvqa.config`
registers it as the model group's schema."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING


@dataclass
class ModuleRoles:
    """Where the parts of a VLM live, as module-name fragments (they differ per family)."""

    vision: str = "vision_tower"
    projector: str = "multi_modal_projector"
    language: str = "language_model"
    lm_head: str = "lm_head"


@dataclass
class ServedSchema:
    """A model behind an OpenAI-compatible chat-completions endpoint (`model=served`: vLLM,
    SGLang, TGI, a hosted API), asked the protocol's questions and never loaded or trained here
    (`medvqa.generation.served`; docs/export.md#evaluating-a-served-model)."""

    # Both required; unset, the run is refused when it starts (medvqa.config.check_config).
    base_url: str | None = None  # e.g. http://localhost:8000/v1
    model: str | None = None  # the name the server serves it under
    # The *name* of the environment variable holding the key (never the key); null: none sent
    # (a placeholder), as for the judge (medvqa.judge.keys).
    api_key_env: str | None = None
    timeout: float = 120.0  # seconds per request
    retries: int = 4  # more tries after a timeout, a dropped connection, HTTP 429/5xx, garbage
    backoff: float = 2.0  # seconds before the first retry, doubled at each
    concurrency: int = 8  # requests in flight at once
    seed: int | None = 0  # sent where the server takes one (greedy anyway: temperature 0)
    logprobs: bool = True  # ask for the answer tokens' log-probabilities (calibration)
    # Each answer stored under (endpoint, model, messages, settings) as it arrives: a killed run
    # asks only what it lacks, a re-run nothing. null: asked afresh every time.
    cache_dir: str | None = None


@dataclass
class ModelSchema:
    """A VLM: a local directory or hub id, or an offline `builder` that makes one."""

    name: str = MISSING
    pretrained: str | None = None
    builder: Any = None
    modules: ModuleRoles = dataclasses.field(default_factory=ModuleRoles)
    dtype: str = "float32"
    trust_remote_code: bool = False
    max_new_tokens: int = 16
    # Passed to from_pretrained: "sdpa" (PyTorch's fused attention, CPU and GPU),
    # "flash_attention_2" (needs the flash-attn package and a CUDA GPU) or "eager".
    attn_implementation: str = "sdpa"
    # Recompute activations in the backward pass: far less activation memory for a 7B model,
    # for about one extra forward pass per step. true (every decoder layer), false, n (every
    # n-th layer: the others keep their activations), or auto (on a GPU, the least the memory
    # plan finds to fit, off / every 4th / 2nd / every layer; elsewhere every layer).
    gradient_checkpointing: Any = False
    # torch.compile the language model's decoder layers for the fit (not for generation): fused
    # elementwise kernels (norms, activations, the adapters' casts); the first steps compile.
    # Compiled dropout draws its masks from another generator: reproducible, but other numbers
    # than an eager run's. auto: on CUDA GPUs without Liger, falling back to eager (with
    # torch's warning) where a layer does not compile; eager elsewhere. true: compiled, and a
    # layer that does not compile stops the run.
    compile_layers: Any = "auto"
    # FP8 (e4m3, row-wise scales) for the GEMMs of the decoder layers' frozen Linears in the
    # fit, forward and input gradient (medvqa.models.fp8): the adapters and everything trained
    # stay in bf16, and answers never use it. Needs a CUDA GPU of compute capability 8.9+ (H100,
    # L40S). auto: on only where a shipped measured row found it faster on this GPU
    # (medvqa.planning.rates; none yet), else off with a log line; true: on, refused on a GPU
    # without FP8 and with trainer.accelerator=cpu; false: off.
    fp8: Any = "auto"
    # Fold LoRA/(IA)³ into (copies of) the base weights while generating: decoding a 7B model
    # with unmerged adapters is bound by their extra kernel launches. Costs the adapted
    # weights' bytes once more while generating; answers can differ from unmerged ones by bf16
    # rounding (W + BA rounded once), so they are keyed apart. Training is unaffected. auto:
    # where the memory plan ran before a fit on CUDA GPUs and the copies fit beside generation
    # (on an H100, LLaVA-Med LoRA: 37.5 against 29.7 rows/s in a whole job, +12.4 GiB); true:
    # always; false: never (nor with auto where no plan ran: task=eval, check_memory=false, CPU).
    merge_adapters: Any = "auto"
    # Generation runs the prompt prefix an image's questions share (the template up to the end
    # of the image) once per batch, then each question's suffix from its cache: rows are
    # batched by image (SLAKE asks ~11 questions per image). Same answers in float32; in bf16 a
    # near tie can flip (other kernel shapes), so they are keyed apart. Families whose image
    # depends on the question (PaliGemma, a prefix-LM) generate unshared. false: every prompt in full.
    share_image_prefix: bool = True
    # How a batch decodes (medvqa.generation.decode): static (keys and values allocated once for
    # prompt + new tokens, written in place; what CUDA compiles) or dynamic (transformers'
    # growing cache, the engine before static caches). Same answers in float32; in bf16 the
    # kernels differ, so they are keyed apart.
    decode: str = "static"
    # Compile the static decode's model call (transformers' `reduce-overhead`: a CUDA graph per
    # batch shape). auto: on CUDA GPUs, falling back to eager with a log line where the model
    # does not compile; eager elsewhere. true: on any device, and a failure stops the run.
    compile_decode: Any = "auto"
    # Liger's fused Triton kernels (RMSNorm, SwiGLU, RoPE) in the language model, through
    # `liger_kernel.transformers._apply_liger_kernel_to_instance` as transformers' Trainer
    # applies them (pip install liger-kernel; CUDA GPUs only). The loss stays medvqa's own
    # (labelled positions only), not Liger's fused cross-entropy.
    liger_kernels: bool = False
    # A rehearsal (docs/gpus.md#rehearsals-modelrandom_weights): the checkpoint's architecture
    # (its local config.json, else the shipped one) with seeded random weights built on the
    # device, and its own processor files where the directory has them, else a stand-in of the
    # family's processor and special tokens. true: full size; shrunk: two narrow layers per
    # tower (as benchmarks/gpu.py --cpu), for a CPU. Records and reports mark such a run as a
    # rehearsal: its scores mean nothing.
    random_weights: Any = False
    # A named chat template (medvqa.models.prompting.chat_template: llava_med, or a family's
    # own such as paligemma) replacing the processor's, for checkpoints saved without the one
    # the model was trained with.
    chat_template: str | None = None
    # Keyword arguments for AutoProcessor.from_pretrained, e.g. Qwen's image size cap
    # `{min_pixels: 3136, max_pixels: 401408}`; part of what answers are keyed by (through the
    # loaded image processor's settings), and what task=plan counts image tokens with.
    processor_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    # A model behind an endpoint (conf/model/served.yaml): its answers come from the server,
    # and nothing above applies to it; null for a model loaded here.
    served: ServedSchema | None = None


# `model.decode` (medvqa.generation.decode): a KV cache allocated once per batch, or grown a
# step at a time.
DECODE_ENGINES = ("static", "dynamic")
# A static cache's length is a multiple of this: batches of nearby lengths share one compiled graph.
CACHE_BUCKET = 64


def decode_cache_length(engine: str, prompt_tokens: int, new_tokens: int) -> int:
    """The KV cache positions a batch's rows hold at the end of decoding: prompt and answer,
    rounded up to `CACHE_BUCKET` for the static engine (what the memory plan counts)."""
    need = prompt_tokens + new_tokens
    return -(-need // CACHE_BUCKET) * CACHE_BUCKET if engine == "static" else need


# model.random_weights=shrunk: two narrow layers per tower (medvqa.models.architectures.shrink).
SHRUNK = "shrunk"


def random_weights_kind(value: Any) -> str | None:
    """A `model.random_weights` value as None (the checkpoint's weights), "full" or "shrunk":
    the one reading of it, for loading, planning, records and reports."""
    if value is None or value is False:
        return None
    if value is True:
        return "full"
    if value == SHRUNK:
        return SHRUNK
    raise ValueError(
        f"model.random_weights={value!r}: use false (the checkpoint's weights), true (its "
        f"architecture with random weights, a rehearsal) or {SHRUNK} (the same, two narrow "
        "layers per tower, for a CPU)."
    )
