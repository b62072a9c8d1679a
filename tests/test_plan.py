"""task=plan: the memory a run needs per GPU, from the real architectures on the meta device.

The hand computations below count LLaVA-Med v1.5 (CLIP ViT-L/14-336 + Mistral-7B) from its
published shapes, and the activations autograd keeps in one decoder layer from the tensors each
operation saves (listed where they are summed); the plan measures the same layer on the CPU.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from medvqa.planning.memory import (
    CUDA_RESERVE_GIB,
    GIB,
    LABELLED_TOKENS,
    LOSS_BYTES_PER_LOGIT,
    TEXT_TOKENS,
    ZERO_ALLGATHER_BUCKET,
    ZERO_REDUCE_BUCKET,
    estimate,
    fixes,
)
from medvqa.planning.setup import build_setup
from medvqa.record import read_record
from tests.conftest import compose, diagonal, run_main

# LLaVA-Med v1.5 (transformers' LLaVA layout): Mistral-7B text model, CLIP ViT-L/14 at 336 px.
H, KV, MLP, HEADS, HEAD_DIM, LAYERS, VOCAB = 4096, 1024, 14336, 32, 128, 32, 32064
ALL_PARAMS = 7_566_743_552  # the original release's safetensors total + 64 added vocab rows
CLIP_PARAMS = (
    3 * 14 * 14 * 1024 + 1024 + 577 * 1024  # patch conv, class embedding, positions
    + 2 * 1024 + 2 * 1024  # pre and post layer norms
    + 24 * (4 * (1024 * 1024 + 1024) + (1024 * 4096 + 4096) + (4096 * 1024 + 1024) + 4 * 1024)
)  # fmt: skip
PROJECTOR = (1024 * 4096 + 4096) + (4096 * 4096 + 4096)
R = 16  # LoRA rank of conf/peft/lora.yaml, on q, k, v, o, gate, up and down
LORA_IN_OUT = (H + H) + (H + KV) + (H + KV) + (H + H) + 3 * (H + MLP)
LORA = LAYERS * R * LORA_IN_OUT
IMAGE_TOKENS = (336 // 14) ** 2  # 576: CLIP's patches, the class token dropped
TOKENS = IMAGE_TOKENS + TEXT_TOKENS


def lora_layer_bytes_per_token(r: int = R) -> int:
    """Bytes autograd keeps per token in one Mistral layer with LoRA (dropout > 0), trainables
    in fp32 under bf16 autocast, frozen base: the base linears keep nothing (frozen weights)."""
    norm = 4 * H + 4  # RMSNorm: its input upcast to fp32, and rsqrt
    adapted = 4 * 1 + 2 * 1 + 0  # per input feature: dropout's fp32 output and its bf16 copy
    q_k_v = 3 * (adapted * H + 2 * r)  # + the bf16 output of lora_A (r features)
    attention = 2 * H + 2 * KV + 2 * KV + 2 * H + 4 * HEADS  # q, k, v, output, logsumexp
    rope = 2 * 2 * HEAD_DIM  # cos and sin
    o = adapted * H + 2 * r
    gate_up = 2 * (adapted * H + 2 * r) + 2 * 2 * MLP  # + their outputs (for silu(gate) * up)
    silu = 2 * MLP
    down = adapted * MLP + 2 * r
    return norm + q_k_v + attention + rope + o + norm + gate_up + silu + down


def full_layer_bytes_per_token() -> int:
    """The same for full fine-tuning (every weight trained, no adapter)."""
    norm = 4 * H + 4 + 2 * H  # + its bf16 output (the norm weight is trained)
    inputs = 3 * 2 * H + 2 * H + 2 * 2 * H + 2 * MLP  # bf16 inputs of q, k, v, o, gate, up, down
    attention = 2 * H + 2 * KV + 2 * KV + 2 * H + 4 * HEADS + 2 * 2 * HEAD_DIM
    mlp = 2 * 2 * MLP + 2 * MLP  # gate and up outputs, silu output
    return 2 * norm + inputs + attention + mlp


@pytest.fixture(scope="module")
def plan_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("plans")


def _plan(overrides: list[str], cache: Path, **options: object):  # type: ignore[no-untyped-def]
    cfg = compose(["model=llava_med", *overrides, f"paths.cache_dir={cache}"])
    return estimate(build_setup(cfg, **options))  # type: ignore[arg-type]


def test_the_architecture_is_counted_by_hand() -> None:
    assert CLIP_PARAMS == 303_507_456
    assert LORA + PROJECTOR == 62_922_752


@pytest.mark.heavy
def test_lora_on_one_gpu_equals_a_hand_computation(plan_cache: Path) -> None:
    """Checkpointing every layer, batch 16, one 80 GB GPU."""
    plan = _plan(
        ["peft=lora", "trainer=gpu", "model.gradient_checkpointing=true"], plan_cache, gpu_gib=79.2
    )
    s = plan.setup
    assert (s.params, s.trainable) == (ALL_PARAMS + LORA, LORA + PROJECTOR)
    assert (s.image_tokens, s.tokens, s.micro_batch, s.checkpointing) == (576, TOKENS, 16, True)
    trainable = LORA + PROJECTOR
    tokens = 16 * TOKENS
    per_forward = 2 * R * LORA_IN_OUT  # autocast's bf16 copies of one layer's LoRA weights
    by_hand = {
        "weights": ALL_PARAMS * 2 - PROJECTOR * 2 + trainable * 4,
        "gradients": trainable * 4,
        "optimizer": trainable * 8,
        # checkpointing: each layer's bf16 input, and one layer recomputed at a time
        "activations": LAYERS * 2 * H * tokens
        + lora_layer_bytes_per_token() * tokens
        + per_forward,
        # logits at the answer positions only: 16 rows x (their union: at most 16 x 16)
        "loss": 16 * min(TOKENS, 16 * LABELLED_TOKENS) * (VOCAB * LOSS_BYTES_PER_LOGIT + 8 * H),
    }
    for term, expected in by_hand.items():
        assert getattr(plan, term) == pytest.approx(expected, rel=0.10), term
    total = sum(by_hand.values()) + CUDA_RESERVE_GIB * GIB
    assert plan.training == pytest.approx(total, rel=0.10)
    assert plan.fits and plan.training < 40 * GIB
    # the measured layer is the hand count (the LoRA layer's saved tensors, exactly)
    assert s.layer.per_token == pytest.approx(lora_layer_bytes_per_token(), rel=0.01)


@pytest.mark.heavy
def test_auto_checkpointing_is_the_least_that_fits_and_is_counted_by_hand(
    plan_cache: Path,
) -> None:
    """`model.gradient_checkpointing=auto` (the presets): the layout of the step's 16 rows
    (micro-batch x accumulation, checkpointing off, every 4th, 2nd or every layer) the time
    model ranks fastest among those that fit; a layer not checkpointed keeps all its
    activations."""
    chosen = {
        gib: (lambda s: (s.micro_batch, s.accumulate, s.checkpoint_every))(
            _plan(["peft=lora", "trainer=gpu"], plan_cache, gpu_gib=gib).setup
        )
        for gib in (40.0, 79.2, 141.0, 400.0)
    }
    # The layer measured on the CPU (365 KiB/token; 251 on an H100, where a GPU machine measures
    # it): on 80 GB 8 x 2 checkpointing every 4th layer, on an H200's 141 GB 8 x 2 without.
    assert chosen == {
        40.0: (16, 1, 1),
        79.2: (8, 2, 4),
        141.0: (8, 2, 0),
        400.0: (16, 1, 0),
    }, chosen
    plan = _plan(["peft=lora", "trainer=gpu", "model.gradient_checkpointing=4"], plan_cache)
    s = plan.setup
    assert (s.checkpoint_every, s.checkpointed_layers) == (4, LAYERS // 4)
    tokens = 16 * TOKENS
    full_layer = lora_layer_bytes_per_token() * tokens + 2 * R * LORA_IN_OUT
    by_hand = (LAYERS - 8) * full_layer + 8 * 2 * H * tokens + full_layer
    assert plan.activations == pytest.approx(by_hand, rel=0.10)


@pytest.mark.heavy
def test_lora_without_checkpointing_at_batch_16_is_refused_with_the_fixes(plan_cache: Path) -> None:
    """The shipped defaults before the presets: ~92 GiB of activations was the audit's CPU
    estimate for a layer whose input needs no grad; every layer's but the first does."""
    plan = _plan(["peft=lora", "trainer=gpu", "model.gradient_checkpointing=false"], plan_cache)
    assert not plan.fits
    layers = LAYERS * (lora_layer_bytes_per_token() * 16 * TOKENS + 2 * R * LORA_IN_OUT)
    assert plan.activations == pytest.approx(layers, rel=0.10) and plan.activations > 100 * GIB
    found = {fix.what: fix for fix in fixes(plan.setup)}
    assert "model.gradient_checkpointing=true" in found["gradient checkpointing"].overrides
    micro = next(f for w, f in found.items() if w.startswith("micro-batch"))
    assert micro.plan.setup.global_batch == 16 and micro.plan.fits


@pytest.mark.slow
@pytest.mark.heavy
def test_full_fine_tuning_on_one_gpu_is_refused_and_zero2_on_four_fits(plan_cache: Path) -> None:
    plan = _plan(["peft=full", "trainer=gpu"], plan_cache)
    trainable = ALL_PARAMS - CLIP_PARAMS  # language model, lm_head and projector
    assert plan.setup.trainable == trainable
    # fp32 weights, gradients and AdamW moments: 16 bytes per trained parameter
    states = CLIP_PARAMS * 2 + trainable * (4 + 4 + 8)
    assert plan.weights + plan.gradients + plan.optimizer == pytest.approx(states, rel=0.01)
    assert not plan.fits and states > 100 * GIB
    gpus, offload = fixes(plan.setup)  # more GPUs; or fewer, with the optimizer on the host
    assert "trainer=deepspeed_zero2" in gpus.overrides and gpus.plan.setup.world_size >= 4
    assert "++trainer.strategy.offload_optimizer=true" in offload.overrides
    assert offload.plan.setup.world_size < gpus.plan.setup.world_size
    for fix in (gpus, offload):
        assert fix.plan.setup.global_batch == 16  # the same batch per optimiser step
        assert fix.plan.peak <= 0.9 * fix.plan.setup.gpu_gib * GIB

    every_layer = "model.gradient_checkpointing=true"  # auto would pick a layout; by hand: this one
    sharded = _plan(
        ["peft=full", "trainer=deepspeed_zero2", "trainer.devices=4", every_layer], plan_cache
    )
    s = sharded.setup
    assert (s.strategy, s.world_size, s.trainable_bytes) == ("zero2", 4, 2)
    tokens = 16 * TOKENS
    by_hand = {
        "weights": ALL_PARAMS * 2,  # DeepSpeed casts the module to bf16
        "gradients": trainable * 4 / 4 + 2 * ZERO_REDUCE_BUCKET * 4 + ZERO_ALLGATHER_BUCKET * 2,
        "optimizer": trainable * (4 + 8) / 4,  # fp32 master + moments, a quarter each
        "activations": LAYERS * 2 * H * tokens + full_layer_bytes_per_token() * tokens,
    }
    for term, expected in by_hand.items():
        assert getattr(sharded, term) == pytest.approx(expected, rel=0.10), term
    assert sharded.fits


@pytest.mark.parametrize(
    ("model", "peft"),
    diagonal(
        ["llava_med", "llava", "qwen2_vl", "qwen2_5_vl", "medgemma", "paligemma", "smolvlm"],
        ["lora", "ia3", "prompt_tuning"],
    ),
)
@pytest.mark.heavy
def test_every_preset_fits_one_80gb_gpu_at_the_study_batch(
    model: str, peft: str, plan_cache: Path
) -> None:
    cfg = compose(
        [f"model={model}", f"peft={peft}", "trainer=gpu", "study=sure_vqa", f"paths.cache_dir={plan_cache}"]
    )  # fmt: skip
    plan = estimate(build_setup(cfg, gpu_gib=79.2))
    assert plan.setup.micro_batch * plan.setup.accumulate == 32  # auto may split the step
    assert plan.fits, plan.peak / GIB


@pytest.mark.slow
def test_task_plan_prints_a_fitting_plan_and_refuses_full_fine_tuning(
    cache_dir: Path, tmp_path: Path
) -> None:
    lora = ["task=plan", "model=llava_med", "peft=lora", "logger=csv"]
    fits = run_main(lora, tmp_path / "lora", cache_dir, small=[])
    assert fits.returncode == 0, fits.stderr[-3000:]
    record = read_record(tmp_path / "lora" / "results.json")
    assert record["status"] == "finished" and record["metrics"]["plan/fits"] == 1.0
    assert record["metrics"]["plan/trainable"] == LORA + PROJECTOR
    assert "training" in fits.stdout and "fits" in fits.stdout
    # the default trainer is the CPU's: compile_layers=auto leaves the layers eager there
    assert record["metrics"]["plan/compiled_layers"] == 0.0
    assert "decoder layers in the fit: eager (model.compile_layers=auto" in fits.stdout

    full = ["task=plan", "model=llava_med", "peft=full", "trainer=gpu", "logger=csv"]
    refused = run_main(full, tmp_path / "full", cache_dir, small=[])
    assert refused.returncode != 0
    assert "does not fit" in refused.stderr and "trainer=deepspeed_zero2" in refused.stderr
    assert "decoder layers in the fit: compiled" in refused.stdout  # auto, on a CUDA trainer
    record = read_record(tmp_path / "full" / "results.json")
    assert record["status"] == "failed" and "trainer.devices=" in record["error"]


@pytest.mark.parametrize(
    ("sweep", "peft", "devices"),
    [
        ("sure_study", "lora", 1),
        ("sure_study", "ia3", 1),
        ("sure_study", "prompt_tuning", 1),
        ("sure_study_full", "full", 4),
    ],
)
@pytest.mark.heavy
def test_every_job_of_the_sure_study_fits_its_gpus(
    sweep: str, peft: str, devices: int, plan_cache: Path
) -> None:
    """With the chosen settings of the largest ones (LoRA r128 on SLAKE, prompt tuning's 50
    tokens): the sweeps' own trainer (trainer=gpu on one GPU; ZeRO-2 on four for full)."""
    extra = ["trainer=gpu"] if sweep == "sure_study" else []
    cfg = compose(
        [f"sweep={sweep}", "+experiment=slake_modality", f"peft={peft}", *extra, f"paths.cache_dir={plan_cache}"]
    )  # fmt: skip
    plan = estimate(build_setup(cfg, gpu_gib=79.2))
    assert plan.setup.world_size == devices and plan.setup.global_batch == 32
    assert plan.peak <= 0.9 * 79.2 * GIB, plan.peak / GIB


@pytest.mark.heavy
def test_merged_generation_plans_the_copies_of_the_adapted_weights(plan_cache: Path) -> None:
    """`model.merge_adapters` folds LoRA into copies of the base weights of every adapted
    projection while generating: the plan's generation peak holds them once more, in bf16
    (measured on an H100: LLaVA-Med's merged generation peaked 12.4 GiB above the unmerged)."""
    base = _plan(
        ["peft=lora", "trainer=gpu", "model.merge_adapters=false"], plan_cache, gpu_gib=79.2
    )
    merged = _plan(
        ["peft=lora", "trainer=gpu", "model.merge_adapters=true"], plan_cache, gpu_gib=79.2
    )
    # q, k, v, o, gate, up, down of each of the language model's layers
    projections = LAYERS * (2 * H * H + 2 * H * KV + 3 * H * MLP)
    assert merged.setup.merged == projections
    assert merged.generation - base.generation == projections * 2
    assert merged.training == base.training
    full = _plan(["peft=full", "model.merge_adapters=true"], plan_cache, gpu_gib=400.0)
    assert full.setup.merged == 0  # nothing to merge


@pytest.mark.heavy
def test_auto_merges_for_generation_where_the_copies_fit_a_gpu(plan_cache: Path) -> None:
    """`model.merge_adapters=auto` (the default): merged where generation with the copies leaves
    a tenth of the GPU free (LLaVA-Med LoRA: 38.4 GiB of an H100's 79.2), unmerged where it
    would not (a 40 GiB GPU, on which unmerged generation's 25.4 fits) and on the CPU; the run
    follows the plan (`merges_adapters`), and merges without one only when told to."""
    from medvqa.planning.setup import merges_adapters

    merged = _plan(["peft=lora", "trainer=gpu", "model.merge_adapters=true"], plan_cache)
    auto = _plan(["peft=lora", "trainer=gpu"], plan_cache, gpu_gib=79.2)
    assert auto.setup.merged == merged.setup.merged > 0
    assert auto.generation == merged.generation
    small = _plan(["peft=lora", "trainer=gpu"], plan_cache, gpu_gib=40.0)
    assert small.setup.merged == 0 and small.generation < 0.9 * 40 * GIB < merged.generation
    assert _plan(["peft=lora", "trainer=cpu"], plan_cache, gpu_gib=79.2).setup.merged == 0
    cfg = compose(["model=llava_med", "peft=lora"])
    assert merges_adapters(cfg.model, auto.setup) and not merges_adapters(cfg.model, small.setup)
    assert not merges_adapters(cfg.model, None)  # no plan ran: task=eval, check_memory=false
    cfg.model.merge_adapters = True
    assert merges_adapters(cfg.model, None) and merges_adapters(cfg.model, small.setup)
    cfg.model.merge_adapters = False
    assert not merges_adapters(cfg.model, auto.setup)


@pytest.mark.heavy
def test_auto_picks_the_measured_fastest_layout_with_the_h100_layer(plan_cache: Path) -> None:
    """With the layer an H100 measured (251 KiB per token, LLaVA-Med LoRA) the plan picks, for
    the step of 16 the benchmark timed, 8 x 2 without checkpointing: the fastest eager row
    measured (14.5 samples/s; 16 x 1 every 2nd layer 12.7, 4 x 4 off 12.7, every layer 10.7).
    The study's 32 per step becomes 8 x 4 without checkpointing."""
    from medvqa.planning.memory import fastest_layout, step_time

    base = _plan(["peft=lora", "trainer=gpu", "model.gradient_checkpointing=true"], plan_cache)
    h100 = dataclasses.replace(base.setup.layer, per_token=251 * 1024)
    s = dataclasses.replace(base.setup, layer=h100, gpu_gib=79.2)
    picked = fastest_layout(s)
    assert (picked.micro_batch, picked.accumulate, picked.checkpoint_every) == (8, 2, 0)
    study = fastest_layout(dataclasses.replace(s, micro_batch=32))
    assert (study.micro_batch, study.accumulate, study.checkpoint_every) == (8, 4, 0)
    # the time model against the H100 rows (samples/s), up to one constant
    rows = {(16, 1): 10.7, (16, 2): 12.7, (8, 0): 14.5, (4, 0): 12.7}
    at = {
        k: step_time(dataclasses.replace(s, micro_batch=k[0], checkpoint_every=k[1])) for k in rows
    }
    constant = rows[(8, 0)] * at[(8, 0)]
    for key, measured in rows.items():
        assert constant / at[key] == pytest.approx(measured, rel=0.05), key


@pytest.mark.slow
@pytest.mark.heavy
def test_auto_refuses_as_before_where_no_layout_fits(plan_cache: Path) -> None:
    """Full fine-tuning of LLaVA-Med on one 80 GB GPU: no split of the step fits, so the plan
    keeps the configured micro-batch with every layer checkpointed, and refuses it."""
    plan = _plan(["peft=full", "trainer=gpu"], plan_cache, gpu_gib=79.2)
    assert (plan.setup.micro_batch, plan.setup.checkpoint_every) == (16, 1) and not plan.fits


@pytest.mark.heavy
def test_generation_with_shared_image_prefixes_equals_a_hand_computation(plan_cache: Path) -> None:
    """Shared image prefixes (the default): the larger of every image's prefix (one image per
    row at worst) with its prefill, and the rows' repeated cache plus one layer of the prefixes'
    cache with the suffixes' prefill; never more than every prompt in full."""
    batch = "data.eval_batch_size=64"
    shared = _plan(["peft=lora", "trainer=gpu", batch], plan_cache, gpu_gib=79.2)
    full = _plan(
        ["peft=lora", "trainer=gpu", "model.share_image_prefix=false", batch],
        plan_cache,
        gpu_gib=79.2,
    )
    s = shared.setup
    assert s.shared_prefix and not full.setup.shared_prefix
    per_token_kv = LAYERS * 2 * KV * 2  # bytes per token: K and V of every layer in bf16
    length = -(-(TOKENS + s.max_new_tokens) // 64) * 64  # the static cache: a multiple of 64

    def prefill(tokens: int) -> int:
        return s.eval_batch * tokens * (4 * H + 3 * MLP) * 2

    unshared = s.eval_batch * length * per_token_kv + prefill(TOKENS)
    weights = full.generation - unshared
    prefixes = s.eval_batch * IMAGE_TOKENS * per_token_kv + prefill(IMAGE_TOKENS)
    rows = s.eval_batch * (length * per_token_kv + IMAGE_TOKENS * 2 * KV * 2) + prefill(TEXT_TOKENS)
    assert shared.generation == pytest.approx(weights + max(prefixes, rows))
    assert shared.generation < full.generation
    cfg = compose(["model=paligemma", "peft=lora", "trainer=gpu", f"paths.cache_dir={plan_cache}"])
    assert not build_setup(cfg, gpu_gib=79.2).shared_prefix  # its image attends to the question


@pytest.mark.heavy
def test_the_eval_batch_is_the_largest_that_fits_under_auto(plan_cache: Path) -> None:
    """`data.eval_batch_size=auto` (the default): the largest of `EVAL_BATCHES` whose generation
    leaves a tenth of the GPU free, after the merge is decided; 64 where it is set, or where no
    plan ran (`eval_batch_size`); a smaller GPU, a smaller batch."""
    from medvqa.planning.memory import EVAL_BATCHES, SUGGESTED_SHARE, estimate
    from medvqa.planning.setup import eval_batch_size

    big = _plan(["peft=lora", "trainer=gpu"], plan_cache, gpu_gib=79.2)
    small = _plan(["peft=lora", "trainer=gpu"], plan_cache, gpu_gib=40.0)
    for plan in (big, small):
        s = plan.setup
        assert s.eval_batch in EVAL_BATCHES and plan.generation <= SUGGESTED_SHARE * s.gpu_gib * GIB
        larger = [b for b in EVAL_BATCHES if b > s.eval_batch]
        assert all(
            estimate(dataclasses.replace(s, eval_batch=b)).generation
            > SUGGESTED_SHARE * s.gpu_gib * GIB
            for b in larger
        )
    assert big.setup.eval_batch > small.setup.eval_batch
    assert big.setup.eval_batch > 64 and big.setup.merged > 0  # merged, and still a larger batch
    fixed = _plan(["peft=lora", "trainer=gpu", "data.eval_batch_size=64"], plan_cache, gpu_gib=79.2)
    assert fixed.setup.eval_batch == 64
    cfg = compose(["peft=lora", f"paths.cache_dir={plan_cache}"])
    assert eval_batch_size(cfg.data, None) == 64  # no plan: the CPU, task=eval
    assert eval_batch_size(cfg.data, big.setup) == big.setup.eval_batch
    assert build_setup(cfg, gpu_gib=79.2).eval_batch == 64  # a CPU trainer: not raised


@pytest.mark.heavy
def test_a_generation_that_does_not_fit_is_told_a_smaller_eval_batch(plan_cache: Path) -> None:
    from medvqa.planning.memory import fixes

    plan = _plan(
        ["peft=lora", "trainer=gpu", "data.eval_batch_size=4096"], plan_cache, gpu_gib=79.2
    )
    assert plan.generation > plan.training and not plan.fits
    first = fixes(plan.setup)[0]
    batch = int(first.overrides[0].split("=")[1])
    assert first.overrides[0].startswith("data.eval_batch_size=") and batch < 4096
    assert first.what == f"eval batch {batch}" and first.plan.fits
