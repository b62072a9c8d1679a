"""The GPU path's speed fixes, shown on the CPU (benchmarks/gpu.py measures them on a GPU).

- the loss from logits at the labelled positions only equals transformers' loss and gradients;
- training builds no KV cache;
- fused AdamW clips under bf16 (Lightning refused it: every GPU fit stopped at its first step);
- the finiteness check reads the device every N steps and still names the first bad step;
- the single-device strategy leaves the model on its device after a Trainer;
- the benchmark's FLOP count matches the hand computation for LLaVA-Med's real shapes, and the
  benchmark script runs end to end on a shrunk shape.
"""

from __future__ import annotations

import functools
import math
import sys
from pathlib import Path

import lightning as L
import pytest
import torch

from medvqa.models.adapters import apply_method
from medvqa.models.loading import load_vlm, roles
from medvqa.training import module as training_module
from medvqa.training.datamodule import META_KEY, VQADataset, make_loader
from medvqa.training.module import Diverged, VQAModule, causal_lm_loss
from medvqa.training.strategies import ResidentSingleDevice
from tests.conftest import ROOT, compose
from tests.test_families import model_cfg


def _quiet_trainer(**kwargs) -> L.Trainer:
    options = {
        "accelerator": "cpu",
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    return L.Trainer(**{**options, **kwargs})


@pytest.fixture(scope="module")
def source(cache_dir: Path):
    from medvqa.data.sources.synthetic import SyntheticVQA

    return SyntheticVQA(cache_dir, n_cases=6, image_size=32, questions_per_image=2)


def _batch(processor, source, rows: int = 4) -> dict:
    dataset = VQADataset(source.table().head(rows), source, processor, with_answer=True)
    loader = make_loader(dataset, rows, shuffle=False, padding_side="right")
    batch = next(iter(loader))
    batch.pop(META_KEY)
    return batch


@pytest.mark.heavy
@pytest.mark.parametrize("name", ["llava_med", "qwen2_vl", "medgemma", "smolvlm", "paligemma"])
def test_label_position_loss_equals_the_full_loss_and_its_gradients(
    name: str, cache_dir: Path, source
) -> None:
    cfg = compose(["peft=lora"], cache_dir)
    spec = model_cfg(name, cache_dir)
    model, processor = load_vlm(spec)
    model = apply_method(model, cfg.peft, roles(spec), processor)
    model.train()
    batch = _batch(processor, source)
    # Labels sit at different positions per row (answers and questions differ in length).
    assert len({int((row != -100).nonzero()[0]) for row in batch["labels"]}) > 1

    def loss_and_grads(full: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        torch.manual_seed(0)  # the same dropout masks for both
        loss = model(**batch).loss if full else causal_lm_loss(model, dict(batch))
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
        return loss.detach(), grads

    full, full_grads = loss_and_grads(True)
    mine, my_grads = loss_and_grads(False)
    assert torch.isfinite(full)
    torch.testing.assert_close(mine, full, rtol=1e-5, atol=1e-6)
    for a, b in zip(my_grads, full_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_label_position_loss_projects_only_labelled_positions(cache_dir: Path, source) -> None:
    spec = model_cfg("llava_med", cache_dir)
    model, processor = load_vlm(spec)
    batch = _batch(processor, source)
    seen: dict[str, object] = {}
    head = model.get_output_embeddings()

    def record(module: torch.nn.Module, args: object, out: torch.Tensor) -> None:
        seen["shape"] = out.shape

    handle = head.register_forward_hook(record)
    original = model.forward

    @functools.wraps(original)  # the same signature: logits_to_keep is seen
    def spy(*args, **kwargs):
        seen["use_cache"] = kwargs.get("use_cache")
        return original(*args, **kwargs)

    model.forward = spy
    try:
        causal_lm_loss(model, dict(batch))
    finally:
        handle.remove()
        del model.forward
    labelled = int((batch["labels"][:, 1:] != -100).any(dim=0).sum())
    assert seen["shape"][1] == labelled < batch["input_ids"].shape[1] // 2
    assert seen["use_cache"] is False  # no KV cache while training


def test_a_batch_without_labels_gets_the_models_own_loss() -> None:
    class Plain(torch.nn.Module):
        def forward(self, input_ids, use_cache=None):
            return type("Out", (), {"loss": input_ids.float().sum()})()

    assert float(causal_lm_loss(Plain(), {"input_ids": torch.ones(2, 3)})) == 6.0


class _Quadratic(torch.nn.Module):
    """A model whose loss needs clipping: large inputs, a loss of their square."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, input_ids: torch.Tensor, **_: object) -> object:
        return type("Out", (), {"loss": (self.lin(input_ids.float()) ** 2).mean()})()


def _fit_quadratic(clip: float | None, fused: bool, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(training_module, "FUSED_DEVICES", ("cuda", "cpu") if fused else ("cuda",))
    torch.manual_seed(0)
    model = _Quadratic()
    rows = [{"input_ids": torch.randn(4) * 10} for _ in range(8)]
    trainer = _quiet_trainer(precision="bf16-mixed", max_steps=3, gradient_clip_val=clip)
    trainer.fit(
        VQAModule(model, lr=0.1, projector_lr=None),
        torch.utils.data.DataLoader(rows, batch_size=2),
    )
    assert bool(trainer.optimizers[0].defaults.get("fused")) is fused
    return model.lin.weight.detach().clone()


def test_fused_adamw_clips_gradients_under_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning's AMP plugin raised for any clipping with a fused optimizer; torch has a fused
    AdamW on the CPU too, so the GPU path's optimizer runs here."""
    fused = _fit_quadratic(0.01, True, monkeypatch)
    foreach = _fit_quadratic(0.01, False, monkeypatch)
    unclipped = _fit_quadratic(None, True, monkeypatch)
    torch.testing.assert_close(fused, foreach)  # clipped as Lightning clips
    assert not torch.allclose(fused, unclipped)


class _NaNAt(torch.nn.Module):
    """Finite losses until optimiser step `step`, NaN from then on."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))
        self.step, self.calls = step, 0

    def forward(self, **_: object) -> object:
        bad = self.calls >= self.step
        self.calls += 1
        return type("Out", (), {"loss": self.w * (float("nan") if bad else 1.0)})()


def test_a_non_finite_loss_is_found_at_the_next_check_with_its_own_step() -> None:
    loader = torch.utils.data.DataLoader([{"input_ids": torch.ones(3)}] * 40, batch_size=1)
    module = VQAModule(_NaNAt(5), projector_lr=None, check_finite_every=8)
    trainer = _quiet_trainer(max_steps=40)
    with pytest.raises(Diverged) as err:
        trainer.fit(module, train_dataloaders=loader)
    assert err.value.step == 5 and math.isnan(err.value.loss)
    assert trainer.global_step == 7  # stopped at the check after batch 8, not at the end


def test_the_last_step_is_checked_whatever_the_interval() -> None:
    loader = torch.utils.data.DataLoader([{"input_ids": torch.ones(3)}] * 40, batch_size=1)
    module = VQAModule(_NaNAt(2), projector_lr=None, check_finite_every=1000)
    with pytest.raises(Diverged) as err:
        _quiet_trainer(max_steps=3).fit(module, train_dataloaders=loader)
    assert err.value.step == 2


def test_the_single_device_strategy_keeps_the_model_where_it_is() -> None:
    """Lightning's teardown calls `.cpu()` on the module (15 GB over the bus per Trainer for a
    7B model); the resident strategy does not. On the CPU a spy stands in for the move."""
    moved: list[str] = []

    class Spy(VQAModule):
        def cpu(self):  # type: ignore[override]
            moved.append("cpu")
            return super().cpu()

    loader = torch.utils.data.DataLoader([{"input_ids": torch.ones(3)}] * 2, batch_size=1)
    for strategy, expected in (("auto", ["cpu"]), (ResidentSingleDevice.on("cpu"), [])):
        moved.clear()
        _quiet_trainer(max_steps=1, strategy=strategy).fit(
            Spy(_NaNAt(10**6), projector_lr=None), train_dataloaders=loader
        )
        assert moved == expected


def _bench(script: str = "gpu"):
    """A benchmark script (benchmarks/<script>.py) as a module."""
    import importlib.util

    path = ROOT / "benchmarks" / f"{script}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{script}", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look their module up there
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.heavy
def test_model_flops_of_llava_med_lora_by_hand(cache_dir: Path) -> None:
    """LLaVA-Med v1.5 (Mistral-7B + CLIP-L/336) with the shipped LoRA, built on the meta device:
    the FLOPs per SLAKE-shaped sample (medvqa.models.flops: the benchmark's count and a run's)
    equal the formula written out by hand."""
    from medvqa.models import flops as bench
    from medvqa.models.architectures import load_architecture, meta_model

    cfg = compose(["model=llava_med", "peft=lora"], cache_dir)
    config, _ = load_architecture(cfg.model.pretrained)
    model = apply_method(meta_model(config), cfg.peft, roles(cfg.model))
    p = bench.matmul_params(model, roles(cfg.model))
    # Mistral-7B: 32 layers of q,o 4096x4096, k,v 1024x4096, gate,up,down 4096x14336.
    layer = 2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 4096 * 14336
    assert p.language_frozen == 32 * layer
    # LoRA r=16 on the seven projections: A is 16 x in, B is out x 16.
    lora = 16 * (2 * (4096 + 4096) + 2 * (4096 + 1024) + 2 * (4096 + 14336) + (14336 + 4096))
    assert p.language_trained == 32 * lora
    assert p.lm_head == 32064 * 4096
    assert p.projector_trained == 1024 * 4096 + 4096 * 4096  # two Linear layers, trained
    # CLIP-L/14-336: 24 layers of 4 x 1024^2 + 2 x 1024 x 4096, and the 14x14 patch conv.
    assert p.vision == 24 * (4 * 1024**2 + 2 * 1024 * 4096) + 1024 * 3 * 14 * 14
    tokens, labelled, patches = 610, 5, 577
    flops = bench.model_flops(
        p, bench.attention_shape(config), tokens, tokens**2, labelled, patches, patches**2, 576
    )
    by_hand = (
        4 * p.language_frozen * tokens  # forward + input gradient of the frozen weights
        + 6 * p.language_trained * tokens  # LoRA: forward, input and weight gradients
        + 4 * p.lm_head * labelled
        + 2 * p.vision * patches  # frozen tower, nothing trains before it
        + 6 * p.projector_trained * 576
        + 6 * 32 * 4096 * tokens**2  # causal attention, forward + backward
        + 4 * 24 * 1024 * patches**2
    )
    assert flops == by_hand
    assert 17.5e12 < flops < 18.5e12  # ~18 TFLOP per sample, as the issue estimated


def test_a_batch_is_counted_on_the_host_as_the_flops_need_it() -> None:
    """The counts a run sums per training batch (VQAModule.on_before_batch_transfer, before
    the batch goes to the GPU): samples, tokens and squared lengths from the attention mask,
    labelled positions, and LLaVA's patches per image from the pixels (+ the class token)."""
    from medvqa.models.flops import add_batch, new_sums

    batch = {
        "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]),
        "labels": torch.tensor([[-100, -100, 5, -100], [-100, -100, 6, 7]]),
        "pixel_values": torch.zeros(2, 3, 28, 28),
    }
    sums = new_sums()
    add_batch(sums, batch, patch_size=14)
    assert sums == {
        "samples": 2, "tokens": 7, "tokens_sq": 9 + 16, "labelled": 3, "positions": 8,
        "patches": 2 * 5, "patches_sq": 2 * 25, "projected": 2 * 4,
    }  # fmt: skip


@pytest.mark.slow  # every generation case too: ~40 s (make test-slow)
def test_the_gpu_benchmark_runs_on_a_shrunk_shape(tmp_path: Path) -> None:
    bench = _bench()
    out = tmp_path / "rows.jsonl"
    rows = bench.main(
        ["--cpu", "--models", "llava_med", "--methods", "lora", "--setups", "before", "none-4",
         "none-8-fp8", "--steps", "1", "--warmup", "1", "--out", str(out)]
    )  # fmt: skip
    assert [r["setup"] for r in rows] == ["before", "none-4", "none-8-fp8", *bench.GEN_CASES]
    assert all("error" not in r for r in rows), rows
    # what task=plan's rates need of a row: its date, commit and LoRA rank (medvqa.planning.rates)
    assert rows[0]["adapter_r"] == 16 and rows[0]["date"] and "commit" in rows[0]["git"]
    assert rows[2]["setup_fields"]["fp8"] is True
    for row in rows[:3]:
        assert row["samples_s"] > 0 and row["timed_samples"] == 2
        assert row["tflop_sample"] > 0 and 500 < row["tokens_per_sample"] < 700
        assert row["hw_flops_s"] >= row["model_flops_s"]
    assert rows[0]["hw_flops_s"] > rows[0]["model_flops_s"]  # recompute and full logits
    assert all(r["gen_rows_s"] > 0 and r["gen_step_ms"] == r["gen_step_ms"] for r in rows[3:])
    assert len(out.read_text().splitlines()) == 3 + len(bench.GEN_CASES)
    assert all(r["versions"]["torch"] and "git" in r and r["argv"][0] == "--cpu" for r in rows)


@pytest.mark.parametrize(
    ("models", "why"),
    [
        (["tiny"], "'tiny' names no checkpoint architecture"),  # a builder preset
        (["llava_med", "smollm2_llava"], "'smollm2_llava' names no checkpoint architecture"),
        (["no_such_preset"], "is not in conf/model/"),
        (["llava_med@nobody/unshipped-7b"], "neither a local checkpoint nor a shipped"),
    ],
)
def test_the_gpu_benchmark_refuses_a_model_it_cannot_build_before_any_work(
    models: list[str], why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--models tiny` (no checkpoint) ended in load_architecture(None)'s TypeError, after any
    models listed before it had run; argument parsing refuses it, naming the presets it can build
    (those of conf/model/ with a checkpoint architecture)."""
    bench = _bench()
    with pytest.raises(SystemExit) as done:
        bench.main(["--cpu", "--models", *models])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert why in err, err
    presets = err.split("The presets it builds: ")[1]
    assert "llava_med" in presets and "qwen2_5_vl" in presets and "tiny" not in presets


def test_loader_workers_change_neither_the_trained_weights_nor_the_answers(
    tiny_model_dir: Path, cache_dir: Path, tmp_path: Path
) -> None:
    """`data.num_workers` is how to run, not what is computed (GPU runs now default to
    several): the same weights and the same answers with loader processes or without."""
    from hydra.utils import instantiate

    from medvqa.data.shifts import Shift, make_splits
    from medvqa.generation.predict import generate_predictions
    from medvqa.training.datamodule import VQADataModule
    from tests.generating import settings
    from tests.test_numerics import _lora

    outcomes = []
    for workers in (0, 2):
        L.seed_everything(0)  # the adapters' initial values
        cfg, model, processor = _lora(tiny_model_dir, cache_dir)
        source = instantiate(cfg.dataset)
        splits = make_splits(source.table(), Shift.from_config(dict(cfg.shift)), seed=0)
        data = VQADataModule(
            splits.frames, source, processor, batch_size=4, num_workers=workers, seed=5
        )
        _quiet_trainer(max_steps=3, limit_val_batches=0).fit(
            VQAModule.for_method(model, cfg.peft, roles(cfg.model)["projector"]), datamodule=data
        )
        weights = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        answers = generate_predictions(
            model, processor, splits["test_iid"].head(6), source,
            tmp_path / f"p{workers}.jsonl", "test_iid", settings(model, processor, batch_size=3),
            num_workers=workers,
        )  # fmt: skip
        outcomes.append((weights, answers["prediction"].tolist()))
    (w0, a0), (w2, a2) = outcomes
    assert w0.keys() == w2.keys() and all(torch.equal(w0[k], w2[k]) for k in w0)
    assert a0 == a2


def test_auto_workers_follow_the_cores_a_gpu_rank_has(monkeypatch: pytest.MonkeyPatch) -> None:
    from medvqa.training import datamodule

    def trainer(devices: int, device: torch.device) -> object:
        strategy = type("S", (), {"root_device": device})()
        return type("T", (), {"strategy": strategy, "num_devices": devices})()

    monkeypatch.setattr(datamodule.os, "cpu_count", lambda: 64)
    monkeypatch.setattr(
        datamodule.os, "sched_getaffinity", lambda pid: set(range(64)), raising=False
    )
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    gpu = torch.device("cuda", 0)
    assert datamodule.auto_workers(trainer(1, gpu)) == 8  # capped
    assert datamodule.auto_workers(trainer(16, gpu)) == 3  # 64 cores shared by 16 ranks
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "4")
    assert datamodule.auto_workers(trainer(1, gpu)) == 3
    monkeypatch.setattr(datamodule.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert datamodule.auto_workers(trainer(1, gpu)) == 0  # one core: the rank's own
    cpu = _quiet_trainer(max_steps=1)
    assert datamodule.auto_workers(cpu) == 0 and datamodule.auto_workers(None) == 0
    options = datamodule.loader_options(trainer(1, gpu), None)
    assert options == {"num_workers": 0, "pin_memory": True}
    assert datamodule.loader_options(cpu, 3) == {"num_workers": 3, "pin_memory": False}


def test_a_training_example_renders_its_prompt_twice_not_three_times(
    cache_dir: Path, source
) -> None:
    """The generation prompt once, the prompt with its answer once (it rendered the prompt a
    second time to find where the answer starts)."""
    from medvqa.models.prompting import encode

    _, processor = load_vlm(model_cfg("llava_med", cache_dir))
    calls: list[bool] = []
    render = processor.apply_chat_template

    def counting(*args, **kwargs):
        calls.append(bool(kwargs.get("add_generation_prompt")))
        return render(*args, **kwargs)

    processor.apply_chat_template = counting
    row = source.table().iloc[0]
    features = encode(processor, row["question"], source.load_image(row["image"], row["id"]), "yes")
    assert calls == [True, False]
    assert (features["labels"] != -100).sum() > 0


@pytest.mark.slow
def test_compiled_decoder_layers_train_the_same_weights_and_are_eager_after(
    tiny_model_dir: Path, cache_dir: Path
) -> None:
    """`model.compile_layers=true`: the fit runs compiled layers (the same numbers to float
    tolerance, without dropout: compiled dropout draws its masks from another generator) and
    generation afterwards runs them eager again."""
    from medvqa.models.adapters import compiled_decoder_layers, decoder_layers
    from tests.test_numerics import _loader, _lora

    trained = []
    for compiled in (False, True):
        L.seed_everything(0)
        cfg, model, processor = _lora(tiny_model_dir, cache_dir, "peft.adapter.lora_dropout=0.0")
        layers = decoder_layers(model)
        with compiled_decoder_layers(model, compiled):
            assert all((layer._compiled_call_impl is not None) == compiled for layer in layers)
            _quiet_trainer(max_steps=2).fit(
                VQAModule.for_method(model, cfg.peft, roles(cfg.model)["projector"]),
                train_dataloaders=_loader(cfg, processor),
            )
        assert all(layer._compiled_call_impl is None for layer in layers)
        trained.append({n: p.detach() for n, p in model.named_parameters() if p.requires_grad})
    eager, compiled_weights = trained
    for name, value in eager.items():
        torch.testing.assert_close(compiled_weights[name], value, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("value", "accelerator", "liger", "expected"),
    [
        ("auto", "gpu", False, True),
        ("auto", "cuda", False, True),
        ("auto", "cpu", False, False),
        ("auto", "gpu", True, False),  # torch.compile cannot trace Liger's kernels
        (True, "cpu", False, True),
        (False, "gpu", False, False),
    ],
)
def test_compile_layers_auto_compiles_on_cuda_gpus_without_liger(
    value: object, accelerator: str, liger: bool, expected: bool, cache_dir: Path
) -> None:
    from medvqa.models.adapters import compiles_layers

    cfg = compose(
        [f"model.compile_layers={str(value).lower()}", f"model.liger_kernels={str(liger).lower()}"],
        cache_dir,
    )
    assert cfg.model.compile_layers == value or value == "auto"
    assert compiles_layers(cfg.model, accelerator) is expected


@pytest.mark.heavy
def test_compile_layers_is_auto_by_default_and_a_bad_value_is_refused(cache_dir: Path) -> None:
    from medvqa.config import ConfigError, check_config

    assert compose([], cache_dir).model.compile_layers == "auto"
    check_config(compose(["model.liger_kernels=true"], cache_dir))  # auto: no conflict
    with pytest.raises(ConfigError, match=r"model\.compile_layers=fast: use auto"):
        check_config(compose(["model.compile_layers=fast"], cache_dir))


@pytest.mark.slow
def test_a_layer_that_does_not_compile_runs_eager_under_auto_and_stops_a_forced_fit(
    tiny_model_dir: Path, cache_dir: Path
) -> None:
    """`compile_layers: auto` falls back to eager (torch's warning) where the compiler fails;
    `true` stops: a user who forced it wants to know."""
    from medvqa.models.adapters import compiled_decoder_layers, decoder_layers
    from tests.test_numerics import _lora

    def broken(graph: torch.fx.GraphModule, inputs: list) -> object:
        raise RuntimeError("this compiler cannot compile anything")

    torch._dynamo.reset()
    model = _lora(tiny_model_dir, cache_dir)[1]
    layer = decoder_layers(model)[0]
    hidden = torch.randn(1, 5, model.config.get_text_config().hidden_size)
    positions = torch.arange(5)[None]
    rotary_emb = next(m for n, m in model.named_modules() if n.endswith("rotary_emb"))
    rotary = rotary_emb(hidden, positions)
    with torch.no_grad():
        eager = layer(hidden, position_embeddings=rotary)
        with compiled_decoder_layers(model, True, fallback=True, backend=broken):
            fallen_back = layer(hidden, position_embeddings=rotary)
        torch._dynamo.reset()
        with (
            pytest.raises(Exception, match="cannot compile anything"),
            compiled_decoder_layers(model, True, fallback=False, backend=broken),
        ):
            layer(hidden, position_embeddings=rotary)
    torch.testing.assert_close(fallen_back, eager)
    torch._dynamo.reset()


def test_every_split_is_generated_with_one_prediction_trainer(
    tiny_model_dir: Path, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One Trainer for a job's generation (before: one per split, each moving the model)."""
    from hydra.utils import instantiate

    from medvqa.generation import predict as generation
    from tests.generating import settings
    from tests.test_numerics import _spec

    made: list[L.Trainer] = []
    original = generation.prediction_trainer

    def counting(trainer_cfg=None):
        made.append(original(trainer_cfg))
        return made[-1]

    monkeypatch.setattr(generation, "prediction_trainer", counting)
    cfg = compose(["dataset.n_cases=60"], cache_dir)
    source = instantiate(cfg.dataset)
    model, processor = load_vlm(_spec(tiny_model_dir))
    table = source.table()
    frames = {"test_iid": table.head(3), "test_ood": table.tail(3)}
    out = generation.generate_passes(
        model,
        processor,
        source,
        [generation.PassFiles(frames, tmp_path / "p.jsonl")],
        settings(model, processor, batch_size=3, max_new_tokens=2),
    )
    assert out is not None and [len(out[0][s]) for s in frames] == [3, 3]
    assert len(made) == 1


@pytest.mark.slow
def test_the_loader_benchmark_runs_the_training_loaders_path() -> None:
    bench = _bench("loader")
    rates = bench.main(["--images", str(2 * bench.BATCH), "--workers", "0", "1"])
    assert set(rates) == set(bench.SHAPES)
    assert all(len(r) == 2 and min(r) > 0 for r in rates.values())


def test_label_positions_are_found_before_the_batch_goes_to_the_device(
    tiny_model_dir: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`nonzero` on a GPU tensor waits for the GPU (a host sync every step): the positions are
    taken from the host's labels in `on_before_batch_transfer` and the loss receives them."""
    from tests.test_numerics import _loader, _lora

    seen: list[tuple[str, bool]] = []
    real_positions, real_loss = training_module.label_positions, training_module.causal_lm_loss

    def positions(labels):
        seen.append(("positions", labels.device.type == "cpu"))
        return real_positions(labels)

    def loss(model, inputs, positions=None, normalizer=None):
        seen.append(("loss", positions is not None and "label_positions" not in inputs))
        return real_loss(model, inputs, positions, normalizer)

    monkeypatch.setattr(training_module, "label_positions", positions)
    monkeypatch.setattr(training_module, "causal_lm_loss", loss)
    cfg, model, processor = _lora(tiny_model_dir, cache_dir)
    _quiet_trainer(max_steps=2).fit(
        VQAModule.for_method(model, cfg.peft, roles(cfg.model)["projector"]),
        train_dataloaders=_loader(cfg, processor),
    )
    assert seen == [("positions", True), ("loss", True)] * 2


def _randomise_adapters(model: torch.nn.Module) -> None:
    """LoRA's B starts at zero (a merge would add nothing): give every adapter weight a value."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name or "ia3_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05 + (1.0 if "ia3_" in name else 0))


@pytest.mark.parametrize("method", ["lora", "ia3"])
def test_merged_adapters_compute_the_same_and_give_the_weights_back_bit_for_bit(
    tiny_model_dir: Path, cache_dir: Path, source, method: str
) -> None:
    """`model.merge_adapters`: generation runs on base weights with the adapters folded in (a
    copy), then the very tensors the model trained are back, unmerged and still trainable."""
    from medvqa.models.adapters import mergeable_layers, merged_adapters
    from tests.test_numerics import _spec

    cfg = compose([f"peft={method}"], cache_dir)
    model, processor = load_vlm(_spec(tiny_model_dir))
    model = apply_method(model, cfg.peft, roles(cfg.model), processor)
    _randomise_adapters(model)
    model.eval()
    layers = mergeable_layers(model)
    assert layers
    before = {id(p): (p.data_ptr(), p.detach().clone()) for p in model.parameters()}
    batch = _batch(processor, source)
    with torch.no_grad():
        unmerged = model(**batch).logits
        with merged_adapters(model) as n:
            assert n == len(layers) and all(layer.merged for layer in layers)
            for layer in layers:  # the adapters are in (copies of) the weights, not beside them
                weight = layer.get_base_layer().weight
                assert not torch.equal(weight, before[id(weight)][1])
            merged = model(**batch).logits
    torch.testing.assert_close(merged, unmerged, rtol=1e-4, atol=1e-4)
    assert not any(layer.merged for layer in mergeable_layers(model))
    for p in model.parameters():
        storage, copy = before[id(p)]
        assert p.data_ptr() == storage and torch.equal(p, copy)  # the very tensor, unchanged
    model.train()
    loss = model(**_batch(processor, source), use_cache=False).loss
    loss.backward()  # the adapters train again
    assert all(p.grad is not None for n, p in model.named_parameters() if p.requires_grad)


def test_merged_generation_gives_the_unmerged_answers_keyed_apart(
    tiny_model_dir: Path, cache_dir: Path, source, tmp_path: Path
) -> None:
    """The same answers (float32) through the prediction loop, the weights unchanged after it;
    bf16 answers may differ by rounding, so a merged run's answers are keyed apart, unless the
    model has no adapter to merge (the zero-shot base's shared answers)."""
    from medvqa.generation.predict import generate_predictions, prediction_key
    from tests.generating import settings
    from tests.test_numerics import _lora, _spec

    _, model, processor = _lora(tiny_model_dir, cache_dir)
    _randomise_adapters(model)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    frame = source.table().head(6)
    answers = [
        generate_predictions(
            model, processor, frame, source, tmp_path / f"p{merge}.jsonl", "test_iid",
            settings(model, processor, batch_size=3, max_new_tokens=4, merge_adapters=merge),
        )["prediction"].tolist()
        for merge in (False, True)
    ]  # fmt: skip
    assert answers[0] == answers[1]
    assert all(torch.equal(p, weights[n]) for n, p in model.named_parameters())
    frames = {"test_iid": frame}
    keys = [
        prediction_key("w", model, processor, frames, settings(model, processor, merge_adapters=m))
        for m in (False, True)
    ]
    assert keys[0] != keys[1]
    base, base_processor = load_vlm(_spec(tiny_model_dir))
    assert (
        len(
            {
                prediction_key(
                    "w",
                    base,
                    base_processor,
                    frames,
                    settings(base, base_processor, merge_adapters=m),
                )
                for m in (False, True)
            }
        )
        == 1
    )


def test_liger_kernels_are_refused_without_a_gpu_or_the_package_and_with_compiled_layers(
    tiny_model_dir: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`model.liger_kernels`: Triton kernels, CUDA only; the one call transformers' Trainer
    makes (`_apply_liger_kernel_to_instance`), without Liger's fused cross-entropy (the loss
    is medvqa's own); torch.compile cannot trace them, so the pair is refused up front."""
    import types

    from medvqa.config import ConfigError, check_config
    from medvqa.models import loading
    from tests.test_numerics import _spec

    spec = _spec(tiny_model_dir, liger_kernels=True)
    with pytest.raises(RuntimeError, match="CUDA GPUs; this machine has none"):
        load_vlm(spec)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "liger_kernel", None)
    with pytest.raises(ImportError, match="pip install liger-kernel"):
        load_vlm(spec)
    calls = []
    fake = types.ModuleType("liger_kernel.transformers")
    fake._apply_liger_kernel_to_instance = lambda model, **kw: calls.append((model, kw))
    monkeypatch.setitem(sys.modules, "liger_kernel", types.ModuleType("liger_kernel"))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", fake)
    model, _ = load_vlm(spec)
    assert calls == [(model, {"cross_entropy": False, "fused_linear_cross_entropy": False})]
    assert loading.apply_liger_kernels  # the one place the call is made
    cfg = compose(["model.liger_kernels=true", "model.compile_layers=true"], cache_dir)
    with pytest.raises(ConfigError, match=r"liger_kernels=true with model\.compile_layers=true"):
        check_config(cfg)


def test_generation_records_each_answers_log_probabilities_as_a_forward_pass_gives_them(
    tiny_model_dir: Path, source
) -> None:
    """The calibration inputs: mean and minimum log-probability of the generated tokens up to
    and including the end token, and their sum at other temperatures, equal to a
    teacher-forced forward pass over prompt + answer."""
    from medvqa.generation.logprobs import end_token_ids
    from medvqa.generation.predict import GenerationModule
    from tests.generating import settings
    from tests.test_numerics import _spec

    model, processor = load_vlm(_spec(tiny_model_dir))
    model.eval()
    module = GenerationModule(
        model, processor.tokenizer, settings(model, processor, batch_size=1, max_new_tokens=6)
    )
    dataset = VQADataset(source.table().head(3), source, processor, with_answer=False)
    ends = end_token_ids(model, processor.tokenizer)
    for batch in make_loader(dataset, 1, shuffle=False, padding_side="left"):
        prompt = {k: v for k, v in batch.items() if k != META_KEY}
        batch[META_KEY] = [(0, rid) for rid in batch[META_KEY]]  # (target, id), as generation's
        with torch.no_grad():
            ((meta, text, mean, low, count, by_temperature),) = module.predict_step(dict(batch), 0)
            out = model.generate(**prompt, max_new_tokens=6, do_sample=False)
            new = out[0, prompt["input_ids"].shape[1] :].tolist()
            stop = next((i for i, t in enumerate(new) if t in ends), len(new) - 1)
            answer = new[: stop + 1]
            full = torch.cat([prompt["input_ids"], torch.tensor([answer])], dim=1)
            logits = model(
                input_ids=full,
                attention_mask=torch.ones_like(full),
                pixel_values=prompt["pixel_values"],
            ).logits[0, prompt["input_ids"].shape[1] - 1 : -1]
        chosen = torch.log_softmax(logits.float(), -1)[torch.arange(len(answer)), answer]
        assert count == len(answer) and meta == batch[META_KEY][0]
        assert text == processor.tokenizer.decode(answer, skip_special_tokens=True).strip()
        assert mean == pytest.approx(chosen.mean().item(), abs=1e-4)
        assert low == pytest.approx(chosen.min().item(), abs=1e-4)
        for t in (0.5, 1.0, 2.0):  # the logits divided by a temperature: the same tokens
            at_t = torch.log_softmax(logits.float() / t, -1)[torch.arange(len(answer)), answer]
            assert by_temperature[str(t)] == pytest.approx(at_t.sum().item(), abs=1e-4)
