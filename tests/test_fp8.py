"""model.fp8: the frozen weights' GEMMs in FP8 during a fit, checked on the CPU (torch's
`_scaled_mm` runs there too, slowly): the numbers close to bf16's, gradients reaching the input
and the adapters and never the frozen weight, nothing changed outside the fit, the option
resolved (auto off where nothing was measured, true refused without an FP8 GPU) and the plan's
memory counting the copy. Its speed and its numerics on a real fit are GPU work
(benchmarks/gpu.py's fp8 setups; docs/gpus.md)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from medvqa.errors import ConfigError
from medvqa.models import fp8
from medvqa.planning import rates
from medvqa.planning.memory import estimate
from medvqa.planning.setup import uses_fp8


def _block(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    block = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 32, bias=False))
    return block.requires_grad_(False)


def test_fp8_matmuls_are_close_to_the_weights_own_and_give_the_input_its_gradient() -> None:
    """e4m3 keeps 3 mantissa bits: ~3 % relative error per GEMM with row-wise scales; the
    gradient flows to the input (a LoRA's or a prompt's), never to the frozen weight."""
    block = _block()
    x = torch.randn(4, 10, 64, requires_grad=True)
    reference = block(x)
    (gx_ref,) = torch.autograd.grad(reference.square().sum(), x)
    with fp8.fp8_frozen_weights(block) as converted:
        assert converted == 2
        assert all(type(m) is fp8.Fp8FrozenLinear for m in block if isinstance(m, nn.Linear))
        y = block(x)
        (gx,) = torch.autograd.grad(y.square().sum(), x)
    relative = (y - reference).norm() / reference.norm()
    assert 1e-4 < relative < 0.06, relative  # FP8 ran (not exact), and stayed close
    assert (gx - gx_ref).norm() / gx_ref.norm() < 0.1
    assert all(p.grad is None for p in block.parameters())
    # back to plain Linears, the same state-dict keys, no FP8 copy left behind
    assert all(type(m) is nn.Linear for m in block if isinstance(m, nn.Linear))
    assert "_fp8" not in vars(block[0]) and list(block.state_dict()) == [
        "0.weight", "0.bias", "2.weight"]  # fmt: skip
    assert torch.equal(block(x), reference)


def test_only_training_uses_fp8_and_eval_frees_the_copy() -> None:
    """Validation and generation (eval mode, no grad) run the weights as they are, bit for bit;
    the copy is dropped in eval and made again when training resumes."""
    block = _block()
    x = torch.randn(3, 64)
    with fp8.fp8_frozen_weights(block):
        layer = block[0]
        assert layer._fp8 is not None
        with torch.no_grad():
            assert torch.equal(block(x), torch.nn.functional.gelu(layer(x)) @ block[2].weight.T)
        block.eval()
        assert layer._fp8 is None
        assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
        block.train()
        assert layer._fp8 is not None and layer._fp8[0].dtype == torch.float8_e4m3fn


def test_trained_and_misaligned_layers_are_left_alone() -> None:
    """A weight that trains (full fine-tuning, a projector) keeps its bf16 GEMM; `_scaled_mm`
    needs dimensions in multiples of 16 on CUDA."""
    trained = nn.Linear(64, 64)
    odd = nn.Linear(64, 33).requires_grad_(False)
    frozen = nn.Linear(32, 48).requires_grad_(False)
    model = nn.ModuleList([trained, odd, frozen])
    assert fp8.frozen_linears(model) == [frozen]
    assert fp8.fp8_params(model) == 32 * 48


def test_a_lora_layer_trains_its_adapter_through_an_fp8_base() -> None:
    """peft keeps the base as `base_layer`, a plain frozen Linear: it runs in FP8; the LoRA
    matrices get their gradients, the base weight does not change."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 16))
    lora = get_peft_model(model, LoraConfig(r=4, target_modules=["0"], lora_dropout=0.0))
    base = lora.base_model.model[0].base_layer
    before = base.weight.clone()
    optimizer = torch.optim.SGD([p for p in lora.parameters() if p.requires_grad], lr=0.1)
    with fp8.fp8_frozen_weights(lora) as converted:
        assert type(base) is fp8.Fp8FrozenLinear and converted == 2  # and the frozen head
        for _ in range(3):
            loss = lora(torch.randn(8, 64)).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    b = lora.base_model.model[0].lora_B["default"].weight
    assert b.abs().sum() > 0  # the adapter trained (B starts at zero)
    assert torch.equal(base.weight, before) and base.weight.grad is None


def _model_cfg(value: object) -> object:
    return OmegaConf.create({"fp8": value})


def test_auto_is_off_where_no_row_measured_it_faster_and_true_is_refused_without_fp8(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert uses_fp8(_model_cfg(False), "gpu") is False
    with caplog.at_level("INFO"):
        assert uses_fp8(_model_cfg("auto"), "cpu") is False
    assert "model.fp8=auto: off (trainer.accelerator=cpu)" in caplog.text
    with pytest.raises(ConfigError, match=r"model\.fp8=true: trainer\.accelerator=cpu"):
        uses_fp8(_model_cfg(True), "cpu")
    # a GPU without FP8 tensor cores: true refused, naming it; a plan made elsewhere counts it
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(ConfigError, match=r"A100-SXM4-80GB \(compute capability 8.0\) has no FP8"):
        uses_fp8(_model_cfg(True), "gpu")
    assert uses_fp8(_model_cfg(True), "gpu", planning=True) is True
    # an H100: true on; auto only once a shipped row measured FP8 faster there
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert uses_fp8(_model_cfg(True), "gpu") is True
    assert uses_fp8(_model_cfg("auto"), "gpu") is False
    (plain,) = [r for r in rates.rows(rates.TrainRow) if r.kernels == "compiled" and
                r.preset == "llava_med"]  # fmt: skip
    faster = dataclasses.replace(plain, fp8=True, samples_per_s=plain.samples_per_s * 1.3)
    shipped = rates.shipped()
    monkeypatch.setattr(rates, "shipped", lambda: (*shipped, faster))
    assert uses_fp8(_model_cfg("auto"), "gpu") is True
    slower = dataclasses.replace(faster, samples_per_s=plain.samples_per_s * 0.9)
    monkeypatch.setattr(rates, "shipped", lambda: (*shipped, slower))
    assert uses_fp8(_model_cfg("auto"), "gpu") is False


def test_the_plan_counts_a_byte_per_copied_weight() -> None:
    from tests.test_plan_cost import setup

    plain = setup()
    with_fp8 = dataclasses.replace(plain, fp8_params=6_000_000_000)
    assert estimate(with_fp8).weights - estimate(plain).weights == 6_000_000_000
    assert estimate(with_fp8).generation == estimate(plain).generation  # dropped before answers


def test_model_fp8_true_on_a_cpu_trainer_is_refused_at_start() -> None:
    from medvqa.config import check_config
    from tests.conftest import compose

    with pytest.raises(ConfigError, match=r"model\.fp8=true with trainer\.accelerator=cpu"):
        check_config(compose(["trainer=cpu", "model.fp8=true"]))
    with pytest.raises(ConfigError, match=r"model\.fp8=1: use auto"):
        check_config(compose(["model.fp8=1"]))
