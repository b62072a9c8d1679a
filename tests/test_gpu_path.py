"""The GPU path's defects, shown on CPU: DeepSpeed generation (the test-only ZeRO-2 strategy runs
Lightning's DeepSpeed code on CPU), several ranks (two gloo processes stand in for two GPUs),
several jobs of one sweep in one process."""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from medvqa.generation import predict as generation
from medvqa.generation.files import read_predictions
from medvqa.generation.predict import generate_predictions
from medvqa.models.loading import load_vlm
from medvqa.models.prompting import encode
from medvqa.record import read_record
from medvqa.training.strategies import (
    DeepSpeedStrategy,
    ResidentDDP,
    ResidentSingleDevice,
    is_deepspeed,
    prediction_strategy,
    resident,
)
from tests.conftest import SMALL, compose, run_main
from tests.generating import settings

pytest.importorskip("deepspeed", reason="deepspeed is in the dev extra")

SMOKE = ["debug=smoke", "logger=csv"]
# conf/trainer/deepspeed_zero2.yaml's strategy, on CPU (tests/zero2_cpu.py).
CPU_ZERO2 = "{_target_: tests.zero2_cpu.CPUZero2Strategy, exclude_frozen_parameters: true}"
ZERO2_TRAINER = [f"trainer.strategy={CPU_ZERO2}", "trainer.precision=bf16-mixed"]


def test_deepspeed_is_recognised_in_every_form() -> None:
    assert is_deepspeed("deepspeed_stage_2") and is_deepspeed("deepspeed_stage_2_offload")
    assert is_deepspeed({"_target_": "medvqa.training.strategies.DeepSpeedStrategy"})
    assert is_deepspeed({"_target_": "tests.zero2_cpu.CPUZero2Strategy"})  # a subclass
    assert is_deepspeed({"_target_": "lightning.pytorch.strategies.DeepSpeedStrategy"})
    assert not is_deepspeed("ddp") and not is_deepspeed("auto")
    assert not is_deepspeed({"_target_": "lightning.pytorch.strategies.DDPStrategy"})
    # Generation under DeepSpeed: DDP, or one device; both keep the model on its device.
    for devices, nodes in ((-1, 1), (4, 1), (1, 2)):
        ddp = prediction_strategy("deepspeed_stage_2", devices=devices, num_nodes=nodes)
        assert isinstance(ddp, ResidentDDP)
    single = prediction_strategy("deepspeed_stage_2", devices=1, accelerator="gpu")
    assert isinstance(single, ResidentSingleDevice) and single.root_device.type == "cuda"
    assert (
        prediction_strategy("ddp_find_unused_parameters_true") == "ddp_find_unused_parameters_true"
    )


def test_a_jobs_trainers_keep_the_model_on_its_devices() -> None:
    """ "auto" and "ddp" become their resident twins (the model stays on the device between the
    job's Trainers); the GPU index of a one-device trainer is kept; anything else is left."""
    assert isinstance(resident("auto", "gpu", 2), ResidentDDP)
    assert isinstance(resident("ddp", "cpu", 1), ResidentDDP)
    assert isinstance(resident("auto", "cpu", 1, num_nodes=2), ResidentDDP)
    assert resident("auto", "gpu", [3]).root_device == torch.device("cuda", 3)
    assert resident("auto", "cuda", "1,").root_device == torch.device("cuda", 1)
    assert resident("auto", "gpu", 1).root_device == torch.device("cuda", 0)
    assert resident("auto", "cpu", 1).root_device == torch.device("cpu")
    assert resident("auto", "gpu", -1) == "auto"  # how many: known only where it runs
    assert resident("auto", "auto", 1) == "auto"  # which device: Lightning's choice
    assert resident("fsdp", "gpu", 2) == "fsdp"
    spec = {"_target_": "medvqa.training.strategies.DeepSpeedStrategy"}
    assert resident(spec, "gpu", 4) is spec


def test_the_shipped_deepspeed_trainer_reduces_and_accumulates_gradients_in_fp32() -> None:
    cfg = compose(["trainer=deepspeed_zero2"])
    strategy = OmegaConf.to_container(cfg.trainer.strategy)
    assert is_deepspeed(strategy)
    built = DeepSpeedStrategy(
        **{k: v for k, v in strategy.items() if k != "_target_"}  # type: ignore[union-attr]
    )
    assert built.config["communication_data_type"] == "fp32"
    assert built.config["data_types"]["grad_accum_dtype"] == "fp32"
    assert built.config["zero_optimization"]["stage"] == 2
    with pytest.raises(ValueError, match="communication_data_type"):
        DeepSpeedStrategy(stage=2, communication_data_type="float32")


def test_generation_under_a_deepspeed_trainer_runs_twice_outside_deepspeed(
    tiny_model_dir: Path, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lightning's DeepSpeed inference set-up wipes every module hook, transformers' once-only
    output-capturing hooks too: the LLaVA vision tower then returns no hidden states and the
    second generation raised IndexError (modeling_llava.py). Generation now runs under DDP."""
    from hydra.utils import instantiate

    source = instantiate(compose(SMALL, cache_dir).dataset)
    frame = source.table().head(6)
    model, processor = load_vlm(
        OmegaConf.create({"name": "tiny", "pretrained": str(tiny_model_dir), "dtype": "float32"})
    )
    trainer_cfg = OmegaConf.create(
        {
            "_target_": "lightning.Trainer",
            "accelerator": "cpu",
            "devices": 1,
            "strategy": OmegaConf.create(CPU_ZERO2),
            "precision": "bf16-mixed",
            "enable_progress_bar": False,
        }
    )
    strategies = []
    original = generation.GenerationModule.predict_step

    def spy(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        strategies.append(type(self.trainer.strategy).__name__)
        return original(self, batch, batch_idx)

    monkeypatch.setattr(generation.GenerationModule, "predict_step", spy)
    answers = [
        generate_predictions(
            model,
            processor,
            frame,
            source,
            tmp_path / "p.jsonl",
            split,
            settings(model, processor, batch_size=4, max_new_tokens=3),
            trainer_cfg=trainer_cfg,
        )
        for split in ("test_iid", "test_ood")
    ]
    assert [len(a) for a in answers] == [6, 6]  # type: ignore[arg-type]
    assert strategies and not any("DeepSpeed" in s or "Zero2" in s for s in strategies), strategies


@pytest.mark.slow
def test_a_deepspeed_job_trains_then_generates_every_split(cache_dir: Path, tmp_path: Path) -> None:
    """The whole job under (CPU) ZeRO-2: zero-shot answers for both test splits, the fit, the
    tuned answers for both splits. It crashed in the zero-shot answers of the second split."""
    proc = run_main([*SMOKE, *ZERO2_TRAINER], tmp_path, cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = read_record(tmp_path / "results.json")
    assert record["status"] == "finished"
    metrics = record["metrics"]
    for prefix in ("", "zero_shot/"):
        assert metrics[f"{prefix}test_iid/n"] == 12 and metrics[f"{prefix}test_ood/n"] == 12
    assert metrics["train/global_step"] == 3


TWO_RANKS = ["trainer.devices=2", "trainer.strategy=ddp"]


@pytest.mark.slow
def test_a_nan_on_one_rank_stops_every_rank_and_the_run_is_diverged(
    cache_dir: Path, tmp_path: Path
) -> None:
    """Rank 1 alone sees a NaN loss at step 1. It used to stop alone and leave rank 0 in the
    gradient all-reduce (gloo: an error at once, recorded `failed`; NCCL: a 30-minute hang)."""
    poison = "{_target_: tests.rank_faults.NaNImagesOnRank, rank: 1, step: 1}"
    proc = run_main([*SMOKE, *TWO_RANKS, f"+callbacks.nan_on_rank={poison}"], tmp_path, cache_dir)
    assert proc.returncode == 4, proc.stderr[-3000:]  # diverged's exit code
    record = read_record(tmp_path / "results.json")
    assert record["status"] == "diverged", record.get("error")
    assert record["diverged_step"] == 1
    assert "NaN/inf at optimiser step 1" in (tmp_path / "run_rank1.log").read_text()


@pytest.mark.slow
def test_generation_with_fewer_rows_than_ranks(cache_dir: Path, tmp_path: Path) -> None:
    """One row per split on two ranks: rank 1 gets none (as a resumed split with one row left
    does). Lightning refused its empty loader and rank 0 waited at the merge."""
    one_row = ["peft=none", "data.limit.test_iid=1", "data.limit.test_ood=1"]
    proc = run_main([*SMOKE, *TWO_RANKS, *one_row], tmp_path, cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = read_record(tmp_path / "results.json")
    assert record["status"] == "finished"
    preds = read_predictions(tmp_path / "predictions.jsonl")
    assert sorted(preds["split"]) == ["test_iid", "test_ood"]
    assert not list(tmp_path.glob("*.rank*"))


@pytest.mark.slow
def test_a_no_image_run_on_two_ranks_in_bf16_and_its_weights_evaluated_as_documented(
    cache_dir: Path, tmp_path: Path
) -> None:
    """`baseline=no_image` trained the projector it never uses: DDP refused the first step on
    two ranks. Its weights are then evaluated with the documented command, which names neither
    the precision nor the image mode: both come from the run (a bf16 model without autocast was
    refused; the trained parts depend on the image mode)."""
    bf16 = ["model.dtype=bfloat16", "trainer.precision=bf16-mixed"]
    run = tmp_path / "run"
    proc = run_main([*SMOKE, *TWO_RANKS, "baseline=no_image", *bf16], run, cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trained = read_record(run / "results.json")
    assert trained["status"] == "finished", trained.get("error")
    from safetensors.torch import load_file

    saved = load_file(str(run / "trained" / "trainable.safetensors"))
    assert saved and not any("multi_modal_projector" in name for name in saved)

    again = tmp_path / "eval"
    proc = run_main([*SMOKE, "task=eval", f"eval.from_run={run}"], again, cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = read_record(again / "results.json")
    assert record["status"] == "finished"
    assert record["config"]["trainer"]["precision"] == "bf16-mixed"
    assert record["config"]["data"]["train_image"] == "none"


@pytest.mark.heavy
def test_a_toy_model_on_real_data_is_refused_unless_allowed() -> None:
    """The README's study recipe selected no model: 105 jobs of the 0.5M-parameter tiny LLaVA
    on SLAKE, OVQA and MIMIC would have looked like normal rows."""
    from medvqa.tasks.train_eval import check_model_for_data

    with pytest.raises(ValueError, match="allow_toy_model=true"):
        check_model_for_data(compose(["+experiment=slake_modality"]))
    with pytest.raises(ValueError, match="toy model"):
        check_model_for_data(compose(["+experiment=ovqa_body_part", "model=smollm2_llava"]))
    check_model_for_data(compose(["+experiment=slake_modality", "allow_toy_model=true"]))
    check_model_for_data(compose(["+experiment=slake_modality", "debug=smoke"]))
    check_model_for_data(compose(["+experiment=slake_modality", "model=llava_med"]))
    check_model_for_data(compose([]))  # the synthetic demo


def test_the_shared_answers_key_holds_what_changes_the_answers(tiny_model_dir: Path) -> None:
    """The untuned base's answers are shared by the jobs of a sweep through this key: it held
    the precision but not the device type, the batches (ranks, eval batch: left padding flips
    bf16 near ties), the attention kernel, the image processor's size cap or TF32."""
    import copy

    import pandas as pd
    import torch

    from medvqa.data import records as R
    from medvqa.generation.predict import prediction_key

    model, processor = load_vlm(
        OmegaConf.create({"name": "tiny", "pretrained": str(tiny_model_dir), "dtype": "float32"})
    )
    frames = {"test_iid": pd.DataFrame({R.ID: ["a"], R.QUESTION: ["q"]})}
    trainer = OmegaConf.create(
        {"accelerator": "gpu", "devices": 1, "precision": "bf16-mixed", "strategy": "auto"}
    )

    def key(trainer_cfg=trainer, proc=processor, batch_size=64, **options):  # type: ignore[no-untyped-def]
        chosen = settings(model, proc, batch_size=batch_size, **options)
        return prediction_key("w", model, proc, frames, chosen, trainer_cfg=trainer_cfg)

    base = key()
    deepspeed = OmegaConf.merge(
        trainer, {"strategy": {"_target_": "tests.zero2_cpu.CPUZero2Strategy"}}
    )
    assert key(deepspeed) == base  # generation runs under DDP for both
    changed = [
        key(OmegaConf.merge(trainer, {"accelerator": "cpu"})),
        key(OmegaConf.merge(trainer, {"devices": 4})),
        key(OmegaConf.merge(trainer, {"precision": "32-true"})),
        key(batch_size=32),
        key(max_new_tokens=8),
        key(decode="dynamic"),
        key(compile=True),
    ]
    capped = copy.deepcopy(processor)
    capped.image_processor.size = {"height": 16, "width": 16}
    changed.append(key(proc=capped))
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        changed.append(key())
    finally:
        torch.set_float32_matmul_precision(previous)
    model.config._attn_implementation = "eager"
    try:
        changed.append(key())
    finally:
        model.config._attn_implementation = "sdpa"
    assert base not in changed and len(set(changed)) == len(changed)


@pytest.mark.parametrize("name", ["qwen2_vl", "qwen2_5_vl"])
def test_the_qwen_presets_cap_an_image_at_512_tokens(
    name: str, cache_dir: Path, tmp_path: Path
) -> None:
    """The checkpoints' processors allow 12.8 MP: a 2.5k x 3k radiograph became ~9.9k tokens.
    The preset's cap (`model.processor_kwargs`) reaches the loaded processor even though the
    real checkpoints' preprocessor_config.json carries its own min/max_pixels, which at loading
    override a `size` given as an argument."""
    import json
    import shutil

    from PIL import Image

    from medvqa.models.loading import resolve_pretrained
    from tests.test_families import model_cfg

    twin = Path(resolve_pretrained(model_cfg(name, cache_dir)))
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(twin, checkpoint)
    saved = checkpoint / "processor_config.json"  # transformers 5 nests the image processor
    fields = json.loads(saved.read_text())
    # as Qwen/Qwen2-VL-7B-Instruct's preprocessor_config.json says
    fields["image_processor"].update(min_pixels=3136, max_pixels=12845056)
    saved.write_text(json.dumps(fields))

    cfg = compose([f"model={name}", f"model.pretrained={checkpoint}", "model.dtype=float32"])
    _, processor = load_vlm(cfg.model)
    cap = 512 * 28 * 28
    assert processor.image_processor.size["longest_edge"] == cap
    grid = processor.image_processor(images=[Image.new("RGB", (2500, 3000))])["image_grid_thw"]
    patch = processor.image_processor.patch_size
    assert int(grid.prod()) * patch**2 <= cap  # pixels kept: at most the cap
    # ... and is not handed back at every call through the tokenizer's init kwargs (a
    # FutureWarning: call-time min/max_pixels go in transformers 5.23), nor saved with it.
    assert not {"min_pixels", "max_pixels"} & set(processor.tokenizer.init_kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        encode(processor, "Which organ?", Image.new("RGB", (300, 200)))


@pytest.mark.slow
@pytest.mark.heavy
def test_a_fit_that_cannot_fit_the_gpus_is_refused_before_anything_loads(tmp_path: Path) -> None:
    """train_eval's pre-flight on CUDA (it cannot reach it here: no CUDA): full fine-tuning of
    LLaVA-Med on one 80 GB GPU is refused with the fixes; LoRA with the preset passes."""
    from medvqa.planning.setup import PlanError
    from medvqa.tasks.plan import check_fits

    cache = [f"paths.cache_dir={tmp_path}"]
    with pytest.raises(PlanError, match="trainer=deepspeed_zero2"):
        check_fits(compose(["model=llava_med", "peft=full", "trainer=gpu", *cache]))
    every, estimates = check_fits(compose(["model=llava_med", "peft=lora", "trainer=gpu", *cache]))
    assert every is not None and estimates["plan/fits"] == 1.0
    # recorded beside the run's measured peaks (perf/fit/peak_reserved_gib)
    assert estimates["plan/train_gib"] > estimates["plan/weights_gib"] > 0
    unknown = ["model=llava_med", "model.pretrained=nobody/unknown-vlm", "trainer=gpu", *cache]
    assert check_fits(compose(unknown)) == (None, {})  # no architecture offline: a warning
    # the GPU time task=plan estimates for the job, recorded beside what it will measure
    slake = ["+experiment=slake_modality", "model=llava_med", "peft=lora", "trainer=gpu", *cache]
    _, estimates = check_fits(compose(slake))
    assert estimates["plan/wall_hours"] > 0 and estimates["plan/gpu_hours"] == pytest.approx(
        estimates["plan/train_gpu_hours"]
        + estimates["plan/val_gpu_hours"]
        + estimates["plan/generate_gpu_hours"]
        + estimates["plan/overhead_gpu_hours"]  # loading, compiling, checkpoints
    )


def test_the_fit_trains_with_the_layout_the_plan_chose(
    tiny_model_dir: Path, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On CUDA `auto` hands the fit the plan's layout (train_eval._fit's `planned`): a step of
    4 rows (data.batch_size=4) planned as 2 x 2 runs micro-batches of 2, two per step, and
    checkpoints what the plan says; a fixed gradient_checkpointing keeps data.batch_size."""
    from hydra.utils import instantiate

    from medvqa.models.adapters import apply_method
    from medvqa.models.loading import roles
    from medvqa.models.prompting import PLAIN
    from medvqa.tasks import train_eval
    from medvqa.training.module import VQAModule

    seen: list[tuple[int, int]] = []
    real_step = VQAModule.training_step

    def spy(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        seen.append((int(batch["input_ids"].shape[0]), int(self.trainer.accumulate_grad_batches)))
        return real_step(self, batch, batch_idx)

    monkeypatch.setattr(VQAModule, "training_step", spy)
    for setting, expected in (("auto", (2, 2)), ("false", (4, 1))):
        cfg = compose(
            [
                *SMALL,
                "debug=smoke",
                "data.batch_size=4",
                "trainer.max_steps=2",
                "callbacks=none",
                f"model.gradient_checkpointing={setting}",
            ],
            cache_dir,
        )
        spec = OmegaConf.create({"name": "tiny", "pretrained": str(tiny_model_dir)})
        model, processor = load_vlm(spec)
        model = apply_method(model, cfg.peft, roles(cfg.model))
        source = instantiate(cfg.dataset)
        table = source.table()
        frames = {"train": table.head(16), "val": table.head(4)}
        planned = SimpleNamespace(micro_batch=2, accumulate=2, checkpoint_every=0)  # a layout
        seen.clear()
        steps = train_eval._fit(
            cfg, model, roles(cfg.model), processor, frames, source, PLAIN, tmp_path / setting,
            [], [], planned,
        )  # fmt: skip
        assert steps == 2
        assert set(seen) == {expected} and len(seen) == 2 * expected[1], seen
