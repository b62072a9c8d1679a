"""Memory controls and numerics for large VLMs, checked on the tiny model (CPU, fast).

Per-group learning rates (projector vs method), fp32 trainables on a half-precision base, the
precision check, the attention kernel, gradient checkpointing and the generation length.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from omegaconf import OmegaConf

from medvqa.config import PeftSchema
from medvqa.models.adapters import apply_method, cast_trainable, enable_gradient_checkpointing
from medvqa.models.loading import load_vlm, roles
from medvqa.training.datamodule import META_KEY, VQADataset, make_loader
from medvqa.training.hardware import HardwareError, check_precision
from medvqa.training.module import VQAModule
from tests.conftest import CONF, SMALL, compose

TRAINING_METHODS = ("full", "lora", "ia3", "prompt_tuning")


def _spec(model_dir: Path, **extra: object):
    return OmegaConf.create({"name": "tiny", "pretrained": str(model_dir), **extra})


def _loader(cfg, processor, n: int = 8):
    from hydra.utils import instantiate

    source = instantiate(cfg.dataset)
    dataset = VQADataset(source.table().head(n), source, processor, with_answer=True)
    return make_loader(dataset, 4, shuffle=False, padding_side="right")


def _trainer(max_steps: int, precision: str = "32-true") -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        precision=precision,
        max_steps=max_steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def _lora(tiny_model_dir: Path, cache_dir: Path, *overrides: str, dtype: str = "float32"):
    cfg = compose([*SMALL, "peft=lora", *overrides], cache_dir)
    model, processor = load_vlm(_spec(tiny_model_dir, dtype=dtype))
    return cfg, apply_method(model, cfg.peft, roles(cfg.model), processor), processor


# --- per-group learning rates ----------------------------------------------------------------


def test_projector_trains_at_projector_lr_and_the_adapter_at_lr(
    tiny_model_dir: Path, cache_dir: Path
) -> None:
    cfg, model, processor = _lora(tiny_model_dir, cache_dir)
    projector = roles(cfg.model)["projector"]
    module = VQAModule(model, lr=1e-2, projector_lr=cfg.peft.projector_lr, projector=projector)
    trainer = _trainer(max_steps=2)
    trainer.fit(module, train_dataloaders=_loader(cfg, processor))

    groups = {g["name"]: g for g in trainer.optimizers[0].param_groups}
    assert set(groups) == {"method", "projector"}
    assert groups["method"]["initial_lr"] == 1e-2
    assert groups["projector"]["initial_lr"] == cfg.peft.projector_lr == 2e-5
    names = {id(p): n for n, p in model.named_parameters()}
    in_projector = [names[id(p)] for p in groups["projector"]["params"]]
    in_method = [names[id(p)] for p in groups["method"]["params"]]
    assert in_projector and all(projector in n for n in in_projector)
    assert in_method and all("lora_" in n for n in in_method)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert set(in_projector) | set(in_method) == trainable
    # one cosine schedule scales both groups by the same factor
    factors = [g["lr"] / g["initial_lr"] for g in groups.values()]
    assert factors[0] == pytest.approx(factors[1])


def test_empty_groups_are_omitted(tiny_model_dir: Path, cache_dir: Path) -> None:
    cfg, model, _ = _lora(tiny_model_dir, cache_dir, "peft.train_modules=[]")
    projector = roles(cfg.model)["projector"]
    groups = VQAModule(model, lr=1e-3, projector_lr=2e-5, projector=projector).param_groups()
    assert [g["name"] for g in groups] == ["method"]
    # without a projector name everything trains at `lr`, as before
    assert [g["lr"] for g in VQAModule(model, lr=1e-3, projector_lr=None).param_groups()] == [1e-3]


def test_projector_lr_without_the_projector_name_is_refused(
    tiny_model_dir: Path, cache_dir: Path
) -> None:
    _, model, _ = _lora(tiny_model_dir, cache_dir)
    with pytest.raises(ValueError, match=r"roles\(cfg.model\)\['projector'\]"):
        VQAModule(model, lr=1e-3, projector_lr=2e-5)


@pytest.mark.heavy
def test_every_training_method_trains_the_projector_at_the_papers_rate() -> None:
    """SURE-VQA's 2e-5 whatever the method's `lr` (the schema's default)."""
    for name in TRAINING_METHODS:
        raw = yaml.safe_load((CONF / "peft" / f"{name}.yaml").read_text())
        assert "projector" in raw["train_modules"], name
        peft = compose([f"peft={name}"]).peft
        assert peft.projector_lr == PeftSchema.projector_lr == 2e-5
        assert peft.lr != peft.projector_lr


# --- fp32 trainables on a half-precision base ------------------------------------------------


@pytest.mark.parametrize("method", TRAINING_METHODS)
def test_trainables_are_fp32_on_a_bf16_base(
    method: str, tiny_model_dir: Path, cache_dir: Path
) -> None:
    cfg = compose([*SMALL, f"peft={method}"], cache_dir)
    model, processor = load_vlm(_spec(tiny_model_dir, dtype="bfloat16"))
    model = apply_method(model, cfg.peft, roles(cfg.model), processor)
    trainable = {n: p.dtype for n, p in model.named_parameters() if p.requires_grad}
    frozen = {n: p.dtype for n, p in model.named_parameters() if not p.requires_grad}
    assert trainable and set(trainable.values()) == {torch.float32}
    assert frozen and set(frozen.values()) == {torch.bfloat16}


@pytest.mark.slow
def test_bf16_base_trains_under_bf16_mixed_then_generates_after_cast_back(
    tiny_model_dir: Path, cache_dir: Path
) -> None:
    """The train_eval path on a bf16 model: fit with autocast, cast back, generate without it."""
    cfg, model, processor = _lora(tiny_model_dir, cache_dir, dtype="bfloat16")
    loader = _loader(cfg, processor)
    projector = roles(cfg.model)["projector"]
    weights = [p for n, p in model.named_parameters() if projector in n]
    before = [w.detach().clone() for w in weights]
    module = VQAModule(model, lr=1e-2, projector_lr=1e-2, projector=projector)
    _trainer(max_steps=2, precision="bf16-mixed").fit(module, train_dataloaders=loader)
    assert all(w.dtype == torch.float32 for w in weights)
    assert any(not torch.equal(w, b) for w, b in zip(weights, before, strict=True))

    assert cast_trainable(model, torch.bfloat16) > 0
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    batch = {k: v for k, v in next(iter(loader)).items() if k not in (META_KEY, "labels")}
    model.eval()
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=2, do_sample=False)
    assert out.shape[1] > batch["input_ids"].shape[1]


# --- the precision check ---------------------------------------------------------------------


@pytest.mark.heavy
def test_half_precision_base_needs_a_mixed_trainer_precision() -> None:
    bf16 = compose(["model=llava_med"]).model
    assert bf16.dtype == "bfloat16"
    with pytest.raises(HardwareError, match=r"trainer\.precision=bf16-mixed") as err:
        check_precision(compose(["trainer=cpu"]).trainer, bf16)
    assert "model.dtype=bfloat16" in str(err.value) and "'32-true'" in str(err.value)
    with pytest.raises(HardwareError, match=r"trainer\.precision=16-mixed"):
        check_precision({"precision": "16-true"}, {"name": "m", "dtype": "float16"})
    for trainer in ("gpu", "deepspeed_zero2"):
        check_precision(compose([f"trainer={trainer}"]).trainer, bf16)
    check_precision(compose(["trainer=cpu"]).trainer, compose([]).model)  # float32: any


# --- attention kernel and gradient checkpointing ---------------------------------------------


def test_attn_implementation_reaches_the_model_config(tiny_model_dir: Path) -> None:
    default, _ = load_vlm(_spec(tiny_model_dir, dtype="float32"))
    assert default.config._attn_implementation == "sdpa"
    eager, _ = load_vlm(_spec(tiny_model_dir, dtype="float32", attn_implementation="eager"))
    assert eager.config._attn_implementation == "eager"
    assert eager.config.text_config._attn_implementation == "eager"
    cfg = compose(["model.attn_implementation=eager", "model.gradient_checkpointing=true"])
    assert cfg.model.attn_implementation == "eager" and cfg.model.gradient_checkpointing


def test_bad_attn_implementation_names_the_key_and_the_fix(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"model\.attn_implementation='flash'.*sdpa"):
        load_vlm(_spec(tiny_model_dir, attn_implementation="flash"))
    if importlib.util.find_spec("flash_attn") is None:
        with pytest.raises(ImportError, match=r"pip install flash-attn.*attn_implementation=sdpa"):
            load_vlm(_spec(tiny_model_dir, attn_implementation="flash_attention_2"))


@pytest.mark.slow
def test_gradient_checkpointing_gives_the_same_gradients_and_trains(
    tiny_model_dir: Path, cache_dir: Path
) -> None:
    cfg, plain, processor = _lora(tiny_model_dir, cache_dir)
    _, checkpointed, _ = _lora(tiny_model_dir, cache_dir)
    checkpointed.load_state_dict(plain.state_dict())  # the same random LoRA A
    enable_gradient_checkpointing(checkpointed)
    assert checkpointed.is_activation_checkpointing
    batch = {k: v for k, v in next(iter(_loader(cfg, processor))).items() if k != META_KEY}

    def submodule(model: torch.nn.Module, suffix: str) -> torch.nn.Module:
        return next(m for n, m in model.named_modules() if n.endswith(suffix))

    def grads(model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], int, bool]:
        """Gradients of one step, how often the first attention block started forward, and
        whether the frozen vision tower's first layer produced an output that requires grad."""
        calls, vision = [], []
        hooks = [
            submodule(model, "language_model.layers.0.self_attn").register_forward_pre_hook(
                lambda *_: calls.append(1)
            ),
            submodule(model, "vision_tower.encoder.layers.0").register_forward_hook(
                lambda _m, _i, out: vision.append(
                    (out[0] if isinstance(out, tuple) else out).requires_grad
                )
            ),
        ]
        model.train()
        torch.manual_seed(0)  # LoRA dropout: the same masks in both models
        model(**batch).loss.backward()
        for hook in hooks:
            hook.remove()
        grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
        return grads, len(calls), any(vision)

    (expected, plain_calls, _), (got, checkpointed_calls, vision_grad) = (
        grads(plain),
        grads(checkpointed),
    )
    assert (plain_calls, checkpointed_calls) == (1, 2), "checkpointing recomputes the layer"
    # The frozen tower keeps no activations and gets no backward pass.
    assert not vision_grad, "checkpointing made the frozen vision tower require grad"
    assert got.keys() == expected.keys()
    for name, grad in got.items():
        assert grad is not None, name
        torch.testing.assert_close(grad, expected[name], msg=name)

    checkpointed.zero_grad()
    lora_b = [p for n, p in checkpointed.named_parameters() if "lora_B" in n]
    module = VQAModule(checkpointed, lr=1e-2, projector_lr=None)
    _trainer(max_steps=2).fit(module, train_dataloaders=_loader(cfg, processor))
    assert any(p.abs().sum() > 0 for p in lora_b), "the adapter trained with checkpointing on"


# --- generation length -----------------------------------------------------------------------


def test_generation_length_is_the_larger_of_model_and_dataset(tmp_path: Path) -> None:
    from medvqa.data.sources.mimic_cxr_vqa import MimicCxrVqa
    from medvqa.data.sources.synthetic import SyntheticVQA
    from medvqa.generation.lengths import generation_length

    model = OmegaConf.create({"max_new_tokens": 12})
    mimic = MimicCxrVqa(root=tmp_path)
    assert generation_length(model, mimic) == 100
    assert generation_length(model, SyntheticVQA(cache_dir=tmp_path, n_cases=4)) == 12
    assert generation_length(OmegaConf.create({"max_new_tokens": 200}), mimic) == 200
