"""What hardware a trainer needs: fail at once, with the fix in the message, when it is absent."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from medvqa.cluster import GPU_ACCELERATORS

# The Lightning precision that autocasts to each half dtype (`model.dtype` names): half-precision
# frozen weights and fp32 trainables mix only inside autocast (medvqa.models.adapters.apply_method
# makes trainables fp32).
MIXED_PRECISION = {"bfloat16": "bf16-mixed", "float16": "16-mixed"}


log = logging.getLogger(__name__)

# PyTorch reads it when its CUDA caching allocator starts (the first allocation).
ALLOC_CONF_ENV = "PYTORCH_CUDA_ALLOC_CONF"


def _whole(low: int, high: int | None = None) -> Callable[[str], bool]:
    """A whole number in [low, high]."""
    return lambda v: v.isdigit() and int(v) >= low and (high is None or int(v) <= high)


def _fraction(low_open: bool) -> Callable[[str], bool]:
    """A number in (0, 1) (`low_open`) or [0, 1]."""

    def ok(v: str) -> bool:
        try:
            x = float(v)
        except ValueError:
            return False
        return (0 < x < 1) if low_open else (0 <= x <= 1)

    return ok


def _power_of_two(v: str) -> bool:
    return v.isdigit() and int(v) > 0 and int(v) & (int(v) - 1) == 0


def _roundup_divisions(v: str) -> bool:
    """A power of 2, or `[<size MB, a power of 2, or >>:<divisions, 0 or a power of 2>, ...]`."""
    if not (v.startswith("[") and v.endswith("]")):
        return _power_of_two(v)
    pairs = [p.partition(":") for p in v[1:-1].split(",")]
    return bool(pairs) and all(
        colon and (size == ">" or _power_of_two(size)) and (n == "0" or _power_of_two(n))
        for size, colon, n in pairs
    )


def _true_false(v: str) -> bool:
    return v in ("True", "False")  # PyTorch's tokenizer takes these two spellings only


# PYTORCH_CUDA_ALLOC_CONF's options as PyTorch's CUDA caching allocator parses them (torch 2.13:
# c10/core/AllocatorConfig.cpp and c10/cuda/CUDAAllocatorConfig.cpp), option -> (accepted?, what
# it takes). PyTorch refuses another option or value only at the first CUDA allocation, after the
# data and the model have loaded; `cuda_allocator_problem` refuses them when a run starts.
CUDA_ALLOC_OPTIONS: dict[str, tuple[Callable[[str], bool], str]] = {
    "backend": (lambda v: v in ("native", "cudaMallocAsync"), "native or cudaMallocAsync"),
    "expandable_segments": (_true_false, "True or False"),
    "max_split_size_mb": (_whole(20), "a whole number of MB >= 20"),
    "max_non_split_rounding_mb": (_whole(20), "a whole number of MB >= 20"),
    "large_segment_size_mb": (_whole(11), "a whole number of MB > 10"),
    "garbage_collection_threshold": (_fraction(low_open=True), "a fraction in (0, 1)"),
    "roundup_power2_divisions": (
        _roundup_divisions,
        "a power of 2, or per size [<MB>:<divisions>,...,>:<divisions>] with powers of 2",
    ),
    "release_lock_on_cudamalloc": (_true_false, "True or False"),
    "pinned_use_cuda_host_register": (_true_false, "True or False"),
    "pinned_num_register_threads": (
        lambda v: _power_of_two(v) and int(v) <= 128,
        "a power of 2 <= 128",
    ),
    "pinned_use_background_threads": (_true_false, "True or False"),
    "pinned_reserve_segment_size_mb": (_whole(1), "a whole number of MB >= 1"),
    "pinned_max_round_threshold_mb": (_whole(0), "a whole number of MB"),
    "pinned_max_cached_size_mb": (_whole(0), "a whole number of MB"),
    "graph_capture_record_stream_reuse": (_true_false, "True or False"),
    "per_process_memory_fraction": (_fraction(low_open=False), "a fraction in [0, 1]"),
}


def _options(setting: str) -> list[str]:
    """`key:value` items of a setting, split at the commas outside `[...]`; spaces dropped, as
    PyTorch's tokenizer drops them."""
    items, depth, current = [], 0, ""
    for ch in setting.replace(" ", ""):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += ch
    return [*items, current]


def cuda_allocator_problem(setting: str | None) -> str | None:
    """What PyTorch's CUDA caching allocator would refuse in `cuda_allocator` (None: nothing;
    null and "" leave PyTorch's default), said when a run starts rather than at its first CUDA
    allocation after loading. Checked whether or not an exported variable overrides it."""
    if not setting:
        return None
    fix = "e.g. cuda_allocator=expandable_segments:True, or null for PyTorch's default"
    for item in _options(str(setting)):
        key, colon, value = item.partition(":")
        if key not in CUDA_ALLOC_OPTIONS or not colon:
            return (
                f"{item!r} is not a <option>:<value> of PyTorch's CUDA caching allocator, whose "
                f"options are {', '.join(CUDA_ALLOC_OPTIONS)} (comma-separated; {fix})"
            )
        ok, takes = CUDA_ALLOC_OPTIONS[key]
        if not ok(value):
            return f"{key}:{value}: {key} takes {takes} ({fix})"
    return None


def configure_cuda_allocator(setting: str | None, environ: Any = os.environ) -> None:
    """Apply `cuda_allocator` (e.g. "expandable_segments:True") before anything allocates on a
    GPU, for this process and the ranks it starts (they inherit the environment). A value the
    user exported wins; null leaves PyTorch's default. Why a default at all: on an H200 the
    study's 7B LoRA fit reserved 120.2 GiB for 103.2 allocated with PyTorch's default segments,
    104.0 with expandable ones, at the same speed
    (docs/gpus.md#a-whole-job-on-one-gpu-make-gpu-check)."""
    if not setting:
        return
    current = environ.get(ALLOC_CONF_ENV)
    if current is None:
        environ[ALLOC_CONF_ENV] = str(setting)
    elif current != str(setting):
        log.info(
            "%s=%s from the environment (cuda_allocator=%s not applied)",
            ALLOC_CONF_ENV,
            current,
            setting,
        )


INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
COMPILE_CACHE = "inductor"  # under paths.cache_dir
_SET_HERE: set[str] = set()  # the values configure_compile_cache set in this process


def configure_compile_cache(cache_dir: str | Path, environ: Any = os.environ) -> Path:
    """torch.compile's caches (inductor's FX graphs, AOT autograd graphs, Triton kernels) under
    `paths.cache_dir/inductor`, for this process and the ranks it starts: the jobs of a sweep
    share `paths.cache_dir`, so every job after the first compiles its layers and its decode
    from the cache (torch's default, a per-user folder under /tmp, is neither shared between
    nodes nor kept). A directory the user exported wins; torch's own default, which torch sets
    in the environment when it is imported (`import lightning` does), is not an export. Returns
    the directory in use."""
    current = environ.get(INDUCTOR_CACHE_ENV)
    if current and current not in _SET_HERE and current != _torch_default_cache():
        return Path(current)  # exported by the user
    path = Path(cache_dir).expanduser() / COMPILE_CACHE
    environ[INDUCTOR_CACHE_ENV] = str(path)
    _SET_HERE.add(str(path))  # a later job in this process (a local multirun) sets its own
    return path


def _torch_default_cache() -> str:
    """The folder torch's inductor uses (and writes into the environment) when none is set."""
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # a torch without it: its long-standing default
        import getpass
        import tempfile

        return os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")
    return os.path.abspath(default_cache_dir())


class HardwareError(RuntimeError):
    """The chosen trainer cannot run on this machine."""


def _strategy_name(strategy: Any) -> str:
    """A strategy's name from the config: a registry string ("deepspeed_stage_2"), an object
    spec's `_target_` (lightning.pytorch.strategies.DeepSpeedStrategy) or an instance's class."""
    if isinstance(strategy, str):
        return strategy
    if isinstance(strategy, Mapping):
        return str(strategy.get("_target_", strategy))
    return type(strategy).__qualname__


def check_trainer(trainer_cfg: Any, cuda_available: bool | None = None) -> None:
    """DeepSpeed and `accelerator: gpu` need CUDA; say so before any data or model is loaded."""
    if cuda_available is None:
        import torch  # only when checking: the module is imported by config-only tools too

        cuda_available = torch.cuda.is_available()
    from medvqa.training.spec import TrainerSchema
    from medvqa.training.strategies import needs_cuda  # imports lightning: only when checking

    # A partial trainer config (tests, scripts) means the schema's values: declared there once.
    strategy_cfg = trainer_cfg.get("strategy", TrainerSchema.strategy)
    strategy = _strategy_name(strategy_cfg)
    accelerator = str(trainer_cfg.get("accelerator", TrainerSchema.accelerator))
    if needs_cuda(strategy_cfg) and not cuda_available:
        raise HardwareError(
            f"trainer strategy {strategy!r} (DeepSpeed ZeRO) needs CUDA GPUs, and "
            "torch.cuda.is_available() is False here. Use trainer=cpu on this machine, or run "
            "on a GPU node with the gpu extra installed (pip install -e '.[gpu]')."
        )
    if accelerator in GPU_ACCELERATORS and not cuda_available:
        raise HardwareError(
            f"trainer accelerator {accelerator!r} needs a CUDA GPU, and none is visible "
            "(torch.cuda.is_available() is False). Use trainer=cpu."
        )


def check_precision(trainer_cfg: Any, model_cfg: Any) -> None:
    """A bf16/fp16 base must be fitted with a mixed trainer precision; say so before loading.

    With "32-true" the fp32 trainables meet half-precision activations without autocast and a
    matmul fails (the fp32 projector on bf16 image features); with "bf16-true"/"16-true"
    Lightning casts the trainables back to half and AdamW's updates round away.
    """
    from medvqa.models.loading import model_option, torch_dtype
    from medvqa.training.spec import TrainerSchema

    dtype = str(torch_dtype(model_cfg)).removeprefix("torch.")
    precision = str(trainer_cfg.get("precision", TrainerSchema.precision))
    if dtype in MIXED_PRECISION and precision not in MIXED_PRECISION.values():
        raise HardwareError(
            f"model.dtype={model_option(model_cfg, 'dtype')} (half precision) cannot be fitted "
            f"with trainer.precision={precision!r}: the trainable parameters are float32 and "
            f"need autocast. Set trainer.precision={MIXED_PRECISION[dtype]} (trainer=gpu and "
            "trainer=deepspeed_zero2 do), or load the model in float32 with model.dtype=float32."
        )
