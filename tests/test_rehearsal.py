"""Rehearsals (`model.random_weights`): a preset's real architecture with seeded random weights
runs the whole job offline, and every output says it is a rehearsal.

The shipped architectures are built shrunk (two narrow layers per tower, as
`benchmarks/gpu.py --cpu`); their processors must turn an image into as many tokens as the
memory plan counts for the real checkpoint, or a rehearsal would plan and run another shape.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

from medvqa.analysis.aggregate import collect
from medvqa.analysis.report import build_report
from medvqa.models.architectures import SHIPPED, image_tokens, load_architecture
from medvqa.models.loading import architecture, load_vlm
from medvqa.models.saving import weights_fingerprint
from medvqa.record import REHEARSAL_NOTE
from tests.conftest import compose, run_main, sampled
from tests.test_report import headline, write_record

# One checkpoint per family (the others share its classes).
ONE_PER_FAMILY = [
    "chaoyinshe/llava-med-v1.5-mistral-7b-hf",
    "Qwen/Qwen2-VL-2B-Instruct",
    "Qwen/Qwen2.5-VL-3B-Instruct",
    "HuggingFaceTB/SmolVLM-256M-Instruct",
    "google/medgemma-4b-it",
    "google/paligemma-3b-mix-224",
]


def spec(pretrained: str, random_weights: object = "shrunk", **extra: object):
    return OmegaConf.create(
        {
            "name": "rehearsal",
            "pretrained": pretrained,
            "random_weights": random_weights,
            "dtype": "float32",
            **extra,
        }
    )


def image_token_count(model: torch.nn.Module, input_ids: torch.Tensor) -> int:
    config = model.config
    placeholder = getattr(config, "image_token_id", None)
    if placeholder is None:
        placeholder = config.image_token_index
    return int((input_ids == placeholder).sum())


@pytest.mark.parametrize("hub_id", sampled(ONE_PER_FAMILY, keep=2))
@pytest.mark.heavy
def test_a_shrunk_rehearsal_runs_the_architecture_with_the_planned_image_tokens(
    hub_id: str,
) -> None:
    assert hub_id in SHIPPED
    cfg = spec(hub_id)
    torch.manual_seed(123)
    expected_draw = torch.rand(3)
    torch.manual_seed(123)
    model, processor = load_vlm(cfg)
    assert torch.equal(torch.rand(3), expected_draw)  # the run's own random stream untouched
    real, _ = load_architecture(hub_id)
    assert type(model.config) is type(real)
    assert model.config.get_text_config(decoder=True).num_hidden_layers == 2
    assert model.config.get_text_config(decoder=True).vocab_size == (
        real.get_text_config(decoder=True).vocab_size
    )
    config, preprocessor = architecture(cfg)
    picture = Image.new("RGB", (96, 64), (120, 30, 200))
    messages = [
        {
            "role": "user",
            "content": [{"type": "image"}, {"type": "text", "text": "is there a lesion?"}],
        }
    ]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    batch = processor(text=[text], images=[picture], return_tensors="pt")
    assert image_token_count(model, batch["input_ids"]) == image_tokens(
        config, preprocessor, (64, 96)
    )
    with torch.no_grad():
        logits = model(**batch).logits
    assert torch.isfinite(logits).all()
    out = model.generate(**batch, max_new_tokens=2, do_sample=False)
    assert out.shape[1] == batch["input_ids"].shape[1] + 2


def test_the_weights_are_the_same_in_every_rehearsal_and_not_a_checkpoints() -> None:
    first, _ = load_vlm(spec("llava-hf/llava-1.5-7b-hf"))
    second, _ = load_vlm(spec("llava-hf/llava-1.5-7b-hf"))
    assert weights_fingerprint(first) == weights_fingerprint(second)
    assert first.config._name_or_path == "random weights: llava-hf/llava-1.5-7b-hf"


def test_a_local_checkpoint_keeps_its_own_processor_and_config(tmp_path: Path) -> None:
    from medvqa.zoo.families import TinyFamilyBuilder

    directory = TinyFamilyBuilder("qwen2_vl", tmp_path, seed=7).build()  # not our seed
    real, real_processor = load_vlm(spec(str(directory), random_weights=False))
    model, processor = load_vlm(spec(str(directory), random_weights=True))
    assert processor.tokenizer.get_vocab() == real_processor.tokenizer.get_vocab()
    assert model.config.image_token_id == real.config.image_token_id
    assert model.config.get_text_config().hidden_size == real.config.get_text_config().hidden_size
    assert weights_fingerprint(model) != weights_fingerprint(real)


@pytest.mark.parametrize("value", ["yes", 2, "small"])
def test_an_unknown_random_weights_value_is_refused_with_the_choices(value: object) -> None:
    with pytest.raises(ValueError, match=r"random_weights=.*use false .* true .* shrunk"):
        load_vlm(spec("llava-hf/llava-1.5-7b-hf", random_weights=value))


def test_an_unshipped_hub_id_without_a_local_copy_names_the_fix() -> None:
    with pytest.raises(KeyError, match=r"point model\.pretrained at a local copy"):
        load_vlm(spec("someone/unknown-vlm", random_weights=True))


@pytest.mark.heavy
def test_the_plan_counts_the_shrunk_architecture(cache_dir: Path) -> None:
    from medvqa.planning.setup import build_setup

    overrides = ["model=llava_med", "trainer=cpu", "peft=lora"]
    full = build_setup(compose([*overrides, "model.random_weights=true"], cache_dir), 80.0)
    small = build_setup(compose([*overrides, "model.random_weights=shrunk"], cache_dir), 80.0)
    assert full.params > 7e9
    assert small.params < 0.05e9
    assert small.layers == 2
    assert small.image_tokens == full.image_tokens == 576


@pytest.mark.parametrize(
    ("preset", "random_weights", "extra"),
    [
        ("llava_med", "shrunk", []),
        pytest.param("qwen2_5_vl", "shrunk", [], marks=pytest.mark.slow),
        # SmolVLM-256M at full size; pictures capped at one 512-px tile (no 4x4 split of a
        # 2048-px resize), which a CPU can afford
        pytest.param(
            "smolvlm",
            True,
            ["+model.processor_kwargs.size.longest_edge=512"],
            marks=pytest.mark.slow,
        ),
    ],
)
@pytest.mark.slow
def test_a_rehearsal_runs_a_whole_smoke_job_marked_as_one(
    preset: str, random_weights: object, extra: list[str], tmp_path: Path, cache_dir: Path
) -> None:
    run_dir = tmp_path / "run"
    done = run_main(
        [
            "debug=smoke",
            f"model={preset}",
            f"model.random_weights={str(random_weights).lower()}",
            *extra,
            "model.dtype=float32",
            "model.max_new_tokens=2",
            "data.limit.train=8",
            "data.limit.test_iid=4",
            "data.limit.test_ood=4",
            "trainer.max_steps=2",
            "logger=csv",
        ],
        run_dir,
        cache_dir,
        small=["dataset.n_cases=60"],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((run_dir / "results.json").read_text())
    assert record["status"] == "finished"
    assert record["rehearsal"] is True
    assert record["config"]["model"]["random_weights"] == random_weights
    assert record["provenance"]["model"]["source"].startswith("random weights: ")
    perf = record["perf"]
    for phase in ("data", "load", "fit", "generate/predictions", "score"):
        assert perf[f"perf/{phase}/seconds"] > 0, phase
    assert perf["perf/fit/samples"] == 8
    assert (run_dir / "summary.md").read_text().startswith(f"**{REHEARSAL_NOTE}**")
    assert REHEARSAL_NOTE in done.stdout


def _rehearsal(path: Path) -> None:
    record = json.loads(path.read_text())
    record["config"]["model"]["random_weights"] = True
    record["perf"] = {
        "perf/fit/seconds": 10.0,
        "perf/fit/samples_per_s": 3.2,
        "perf/generate/predictions/rows": 30.0,
        "perf/generate/predictions/seconds": 2.0,
        "perf/generate/predictions_zero_shot/rows": 30.0,
        "perf/generate/predictions_zero_shot/seconds": 4.0,
    }
    record["metrics"]["plan/wall_hours"] = 0.01  # the pre-flight's estimate: 36 s
    record["duration_s"] = 45.0
    path.write_text(json.dumps(record))


@pytest.mark.heavy
def test_the_report_never_mixes_rehearsals_with_real_runs(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    runs_dir = tmp_path / "runs"
    real = write_record(runs_dir / "real", seed=1, metrics=headline(rng))
    mock = write_record(runs_dir / "mock", seed=2, metrics=headline(rng))
    _rehearsal(mock)
    report = build_report(collect([runs_dir]), tmp_path / "out")
    assert "1 rehearsal run(s)" in report.rehearsal
    html_text = (tmp_path / "out" / "report.html").read_text()
    assert "1 rehearsal run(s)" in html_text
    # the speed table lists both jobs; the rehearsal's generation rate is rows over seconds
    perf = report.perf.set_index("seed")
    assert bool(perf.loc[2, "rehearsal"]) and not bool(perf.loc[1, "rehearsal"])
    assert perf.loc[2, "generated rows/s"] == pytest.approx(60 / 6)
    assert perf.loc[2, "samples/s"] == pytest.approx(3.2)
    # the plan's estimate of the job beside the job's time
    assert perf.loc[2, "plan job s"] == pytest.approx(36.0)
    assert perf.loc[2, "job / plan"] == pytest.approx(45.0 / 36.0)
    assert np.isnan(perf.loc[1, "job / plan"])  # no estimate recorded (a CPU job)
    assert np.isnan(perf.loc[1, "samples/s"])
    assert (tmp_path / "out" / "perf.csv").is_file()
    # the tables hold the real run's numbers only
    alone = build_report(collect([real.parent]), tmp_path / "alone")
    pd.testing.assert_frame_equal(report.long, alone.long)


@pytest.mark.heavy
def test_a_report_of_rehearsals_only_says_so(tmp_path: Path) -> None:
    mock = write_record(tmp_path / "runs", seed=2, metrics=headline(np.random.default_rng(1)))
    _rehearsal(mock)
    report = build_report(collect([tmp_path / "runs"]), tmp_path / "out")
    assert report.rehearsal.startswith(REHEARSAL_NOTE)
    assert not report.long.empty
    assert REHEARSAL_NOTE in (tmp_path / "out" / "report.html").read_text()
