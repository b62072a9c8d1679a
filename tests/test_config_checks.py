"""Config values are checked when a run starts, before any data, model or record work.

A negative batch size or a breakdown by a field the dataset does not have used to fail only
after data preparation, generation and (for the breakdown) training (issue #20, defect 7).
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import pandas as pd
import pytest
from hydra.utils import instantiate

from medvqa import plugins
from medvqa.config import Config, ConfigError, check_config
from medvqa.data import records as R
from tests.conftest import CONF, compose, compose_cached, compose_values, run_main, sampled
from tests.native import fixture_writer

EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
BASELINES = sorted(p.stem for p in (CONF / "baseline").glob("*.yaml"))
SWEEPS = sorted(p.stem for p in (CONF / "sweep").glob("*.yaml"))
DATASETS = sorted(p.stem for p in (CONF / "dataset").glob("*.yaml"))
COMPOSE_CACHE = Path("/tmp/medvqa-config-checks")


def _error(overrides: list[str]) -> str:
    """The message check_config raises for the composed overrides."""
    cfg = compose_cached(overrides, COMPOSE_CACHE)
    with pytest.raises(ConfigError) as err:
        check_config(cfg)
    assert isinstance(err.value, ValueError)  # callers that catch ValueError still do
    return str(err.value)


@pytest.mark.parametrize(
    ("base", "values"),
    [
        ([], ["data.batch_size=4", "+data.limit.tain=5", "trainer.devices=[0,1]"]),
        (["+experiment=mimic_age"], ["evaluation.breakdown=[gender]", "seed=3"]),
        (["peft=ia3", "logger=csv"], []),
    ],
)
def test_values_on_a_composed_base_are_what_compose_gives(base: list, values: list) -> None:
    """The grids below apply values to a config composed once (tests/conftest.py's
    compose_values): the same config, overrides recorded, as Hydra's compose of them all."""
    from omegaconf import OmegaConf

    fast = compose_values(values, base, COMPOSE_CACHE)
    whole = compose([*base, *values], COMPOSE_CACHE)
    assert OmegaConf.to_container(fast) == OmegaConf.to_container(whole)
    assert OmegaConf.is_struct(fast) and OmegaConf.is_struct(whole)


@pytest.mark.parametrize("value", ["model.share_image_prefix=2", "+seed=4", "data.batch_sise=3"])
def test_values_on_a_composed_base_fail_as_compose_fails(value: str) -> None:
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException) as fast:
        compose_values([value], [], COMPOSE_CACHE)
    with pytest.raises(ConfigCompositionException) as whole:
        compose([value], COMPOSE_CACHE)
    assert str(fast.value) == str(whole.value)
    assert str(fast.value.__cause__) == str(whole.value.__cause__)
    with pytest.raises(ValueError, match="a config group or Hydra's"):
        compose_values(["peft=lora"])


# -- what ships passes ---------------------------------------------------------------------------


def test_the_defaults_pass() -> None:
    check_config(compose([], COMPOSE_CACHE))


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_passes(experiment: str) -> None:
    check_config(compose([f"+experiment={experiment}"], COMPOSE_CACHE))


# Baselines that set a dataset's own option, with an experiment on that dataset.
BASELINE_EXPERIMENT = {"image_only": ["+experiment=robosurg_site"]}


@pytest.mark.parametrize("baseline", BASELINES)
def test_every_baseline_passes(baseline: str) -> None:
    extra = BASELINE_EXPERIMENT.get(baseline, [])
    check_config(compose([*extra, f"baseline={baseline}", "debug=smoke"], COMPOSE_CACHE))


def _grid_points(sweep: str) -> list[list[str]]:
    """Every job of the sweep's grid as overrides (seeds aside: they change no checked key)."""
    cfg = compose([f"sweep={sweep}"], COMPOSE_CACHE)
    grid = {k: str(v).split(",") for k, v in cfg.hydra.sweeper.params.items() if k != "seed"}
    return [
        [f"sweep={sweep}", *(f"{k}={v}" for k, v in zip(grid, values, strict=True))]
        for values in itertools.product(*grid.values())
    ]


@pytest.mark.parametrize("sweep", sampled(SWEEPS, keep=3))
@pytest.mark.heavy
def test_every_sweep_job_passes(sweep: str) -> None:
    for overrides in _grid_points(sweep):
        check_config(compose(overrides, COMPOSE_CACHE))


def test_an_eval_task_is_checked_without_its_run() -> None:
    """task=eval: the checked keys are the composed ones; eval.from_run is adopt_run's to read."""
    check_config(compose(["task=eval"], COMPOSE_CACHE))
    assert "data.eval_batch_size" in _error(["task=eval", "data.eval_batch_size=0"])


@pytest.mark.parametrize(
    "overrides",
    [
        ["evaluation.breakdown=[question_type]"],
        ["evaluation.breakdown=[answer_type]"],
        ["evaluation.breakdown=[modality,question_type,answer_type]"],
        ["evaluation.breakdown=[]"],
        ["+experiment=synthetic_corruption", "evaluation.breakdown=[image_transform]"],
        ["+experiment=kvasir_transformed", "evaluation.breakdown=[complexity,question_class]"],
        ["+experiment=mimic_age", "evaluation.breakdown=[gender,ethnicity]"],
        ["+experiment=vqarad_organ", "evaluation.breakdown=[phrasing]"],
        ["shift=values", "shift.field=lesion_side", "shift.ood_values=[left]"],
        ["trainer.devices=auto"],
        ["trainer.devices=-1"],
        ["trainer.devices=[0,1]"],
        ["trainer.max_epochs=-1", "trainer.max_steps=10"],
        ["trainer.limit_val_batches=0.0"],
        ["trainer.val_check_interval=00:01:00:00"],
        ["evaluation.bootstrap.samples=0"],
        ["cuda_allocator=null"],
        ["cuda_allocator='expandable_segments:True,max_split_size_mb:128'"],
        ["cuda_allocator='backend:cudaMallocAsync'"],
        ["cuda_allocator='roundup_power2_divisions:[256:1,512:2,>:8]'"],
        ["cuda_allocator='garbage_collection_threshold:0.6,pinned_num_register_threads:8'"],
        ["model.random_weights=true"],
        ["model.random_weights=shrunk"],
        ["model.compile_layers=false", "model.merge_adapters=true"],
    ],
)
def test_valid_values_pass(overrides: list[str]) -> None:
    check_config(compose_cached(overrides, COMPOSE_CACHE))


# -- bad values fail at once, naming the key, the value and the fix ------------------------------


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("data.batch_size=-1", "data.batch_size"),
        ("data.eval_batch_size=0", "data.eval_batch_size"),
        ("data.num_workers=-2", "data.num_workers"),
        ("data.limit.train=0", "data.limit.train"),
        ("+data.limit.tain=5", "data.limit.tain"),
        ("data.eval_image=blurry", "data.eval_image"),
        ("data.extra_eval_images=[blak]", "data.extra_eval_images"),
        ("trainer.max_epochs=0", "trainer.max_epochs"),
        ("trainer.max_steps=0", "trainer.max_steps"),
        ("trainer.min_epochs=-1", "trainer.min_epochs"),
        ("trainer.accumulate_grad_batches=0", "trainer.accumulate_grad_batches"),
        ("trainer.devices=0", "trainer.devices"),
        ("trainer.devices=-2", "trainer.devices"),
        ("trainer.num_nodes=0", "trainer.num_nodes"),
        ("trainer.log_every_n_steps=0", "trainer.log_every_n_steps"),
        ("trainer.check_val_every_n_epoch=0", "trainer.check_val_every_n_epoch"),
        ("trainer.gradient_clip_val=-1.0", "trainer.gradient_clip_val"),
        ("trainer.limit_val_batches=1.5", "trainer.limit_val_batches"),
        ("trainer.val_check_interval=0", "trainer.val_check_interval"),
        ("trainer.num_sanity_val_steps=-2", "trainer.num_sanity_val_steps"),
        ("model.max_new_tokens=0", "model.max_new_tokens"),
        ("peft.lr=0", "peft.lr"),
        ("peft.warmup_ratio=1.0", "peft.warmup_ratio"),
        ("peft.adapter.r=0", "peft.adapter.r"),
        ("evaluation.bootstrap.samples=-1", "evaluation.bootstrap.samples"),
        ("evaluation.bootstrap.level=1.5", "evaluation.bootstrap.level"),
        ("judge.batch_size=0", "judge.batch_size"),
        ("judge.concurrency=0", "judge.concurrency"),
        ("judge.retries=-1", "judge.retries"),
        ("seed=-1", "seed"),
        ("cuda_allocator=garbage_value", "cuda_allocator"),
        ("cuda_allocator=expandable_segments:true", "cuda_allocator"),
        ("cuda_allocator=max_split_size_mb:8", "cuda_allocator"),
        ("cuda_allocator=pinned_num_register_threads:3", "cuda_allocator"),
        # words-or-booleans (`Any` fields) take a real bool: 1 is not true, nor 0 false
        ("model.compile_layers=1", "model.compile_layers"),
        ("model.merge_adapters=0", "model.merge_adapters"),
        ("model.compile_decode=1", "model.compile_decode"),
        ("model.decode=paged", "model.decode"),
    ],
)
def test_a_bad_value_names_its_key_and_value(override: str, key: str) -> None:
    message = _error([override])
    value = override.split("=", 1)[1]
    assert f"{key}={value}" in message, message


@pytest.mark.heavy
def test_every_problem_is_reported_at_once() -> None:
    message = _error(["data.batch_size=-1", "data.eval_batch_size=0"])
    assert "data.batch_size=-1" in message and "data.eval_batch_size=0" in message


def test_an_unknown_breakdown_field_lists_the_datasets_fields() -> None:
    message = _error(["evaluation.breakdown=[question_type,unknown_field]"])
    assert "evaluation.breakdown" in message and "'unknown_field'" in message
    assert "synthetic" in message  # the dataset it is not a field of
    assert "modality" in message and "answer_type" in message  # what it could be
    assert "evaluation.breakdown=[" in message  # the fix


def test_a_breakdown_field_of_another_dataset_is_refused() -> None:
    message = _error(["+experiment=slake_modality", "evaluation.breakdown=[complexity]"])
    assert "'complexity'" in message and "slake" in message and "content_type" in message


def test_image_transform_is_a_field_only_under_a_transform_shift() -> None:
    assert "'image_transform'" in _error(["evaluation.breakdown=[image_transform]"])


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["shift=values", "shift.field=scanner", "shift.ood_values=[B]"], "shift.field"),
        (["shift.val_group=patient"], "shift.val_group"),
        (["shift.val_stratify=[complexity]"], "shift.val_stratify"),
        (
            ["+experiment=ovqa_multimodal", "shift.any_of.1.field=organ"],
            "shift.any_of[1].field",
        ),
    ],
)
def test_an_unknown_shift_field_is_refused(overrides: list[str], key: str) -> None:
    message = _error(overrides)
    assert key in message, message
    assert "body_part" in message or "image_organ" in message  # the fields there are


def test_a_bad_shift_definition_fails_before_the_data() -> None:
    message = _error(["shift=age", "shift.ood_max=70"])  # the gap would be negative
    assert "shift" in message and "ood_max" in message


def test_an_incomplete_shift_fails_before_the_data() -> None:
    message = _error(["shift=range", "shift.field=age"])  # no thresholds
    assert "shift" in message and "iid_min" in message and "ood_max" in message
    assert "set field" in _error(["shift=values"])


def test_a_dataset_without_declared_fields_is_not_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plug-in that declares no metadata_fields: its table is the truth, found later."""
    cls = plugins.get("dataset", "synthetic")
    monkeypatch.setattr(cls, "metadata_fields", None)
    check_config(compose(["evaluation.breakdown=[scanner]"], COMPOSE_CACHE))


# -- the declared fields are the loaders' own ----------------------------------------------------


@pytest.mark.parametrize("dataset", DATASETS)
def test_declared_metadata_fields_are_the_tables_columns(dataset: str, tmp_path: Path) -> None:
    if dataset == "synthetic":
        overrides = ["dataset=synthetic", "dataset.n_cases=12"]
    else:
        writer = fixture_writer(dataset)
        assert writer is not None, dataset
        overrides = [f"dataset={dataset}", f"dataset.root={writer(tmp_path / 'data').root}"]
    source = instantiate(compose(overrides, tmp_path / "cache").dataset)
    declared = type(source).metadata_fields
    assert declared is not None, f"{type(source).__name__} declares no metadata_fields"
    assert len(set(declared)) == len(declared)
    assert sorted(R.metadata_columns(source.table())) == sorted(declared)


# -- wired in: a run and medvqa-score fail fast --------------------------------------------------


def test_the_runner_refuses_before_any_work(tmp_path: Path) -> None:
    """In process, as run.py calls it: the check comes first, so it takes no time at all."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from medvqa.runner import run

    run_dir, cache = tmp_path / "run", tmp_path / "cache"
    cfg = compose(["data.batch_size=-1", "logger=csv"], cache)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(run_dir)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    start = time.perf_counter()
    with pytest.raises(SystemExit) as refused:  # the message on stderr, no traceback: exit 2
        run(cfg)
    assert refused.value.code == 2 and isinstance(refused.value.__cause__, ConfigError)
    assert "data.batch_size=-1" in str(refused.value.__cause__)
    assert time.perf_counter() - start < 10
    assert not run_dir.exists() and not cache.exists()  # no record, no data, no model


def test_run_py_with_a_bad_batch_size_fails_before_any_work(tmp_path: Path) -> None:
    run_dir, cache = tmp_path / "run", tmp_path / "cache"
    # Without the check, this run generates the data and builds the tiny model for minutes.
    proc = run_main(["data.batch_size=-1", "logger=csv"], run_dir, cache)
    assert proc.returncode != 0
    assert "data.batch_size=-1" in proc.stderr, proc.stderr[-2000:]
    # No data generated or cached, no model built, nothing generated or scored.
    assert not cache.exists() or not any(cache.iterdir()), sorted(cache.rglob("*"))
    assert not list(run_dir.glob("predictions*")) and not (run_dir / "splits.json").exists()
    record = run_dir / "results.json"
    if record.exists():  # a record, if any, says it failed and why
        data = json.loads(record.read_text())
        assert data["status"] == "failed" and "data.batch_size" in data["error"]


def _predictions(tmp_path: Path) -> Path:
    path = tmp_path / "preds.csv"
    pd.DataFrame(
        {
            "question": ["Is it normal?", "What is enlarged?"],
            "gt": ["no", "spleen"],
            "pred": ["no", "the spleen"],
        }
    ).to_csv(path, index=False)
    return path


def test_medvqa_score_refuses_a_negative_size(tmp_path: Path) -> None:
    from medvqa.cli.score import main

    out = tmp_path / "scored"
    args = [str(_predictions(tmp_path)), "--out", str(out), "evaluation.bootstrap.samples=-1"]
    assert main(args) == 2
    assert not (out / "results.json").exists()


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["metric=[closed_set]", "metric.closed_set.labels=all"], "metric.closed_set.labels='all'"),
        (["metric=[calibration]", "metric.calibration.bins=0"], "metric.calibration.bins=0"),
        (["metric=[embedding]", "metric.embedding.batch_size=0"], "metric.embedding.batch_size=0"),
    ],
)
def test_medvqa_score_refuses_a_metric_option_out_of_range_without_a_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, overrides: list[str], named: str
) -> None:
    """A family's option checked when it is built is a ConfigError: exit status 2, the key and
    value named, no traceback, nothing written."""
    from medvqa.cli.score import main

    out = tmp_path / "scored"
    assert main([str(_predictions(tmp_path)), "--out", str(out), *overrides]) == 2
    assert named in caplog.text and "Traceback" not in caplog.text
    assert not out.exists()


@pytest.mark.heavy
def test_medvqa_score_still_skips_a_breakdown_column_the_file_lacks(tmp_path: Path) -> None:
    """The file, not a dataset, is the truth about columns there: a warning, as before."""
    from medvqa.cli.score import main

    out = tmp_path / "scored"
    args = [
        str(_predictions(tmp_path)),
        "--out",
        str(out),
        "evaluation.breakdown=[scanner]",
        "evaluation.bootstrap.samples=0",
    ]
    assert main(args) == 0
    assert json.loads((out / "results.json").read_text())["status"] == "finished"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("+task.gpu_gib=-5", "task.gpu_gib=-5: needs each GPU's memory in GiB"),
        ("+task.gpu_gib=0", "task.gpu_gib=0: needs each GPU's memory in GiB"),
        ("+task.gpu_gib=nan", "task.gpu_gib=nan: needs each GPU's memory in GiB"),
        ("+task.gpu_gib=abc", "task.gpu_gib=abc: needs each GPU's memory in GiB"),
        ("+task.text_tokens=-100", "task.text_tokens=-100: needs a whole number of text tokens"),
        ("+task.devices=0", "task.devices=0: needs a whole number of GPUs per node"),
    ],
)
def test_the_plan_options_are_checked(override: str, message: str) -> None:
    """task=plan's own options: refused naming the key, where the plan used to answer a GPU of
    -5 GiB with "a smaller model" and accept -100 text tokens."""
    assert message in _error(["task=plan", override])


def test_good_plan_options_pass() -> None:
    check_config(compose(["task=plan", "+task.gpu_gib=141", "+task.text_tokens=64"], COMPOSE_CACHE))


# -- issue #44: values refused at the first CUDA allocation, by the record writer, or read as ----
# -- booleans that are not -------------------------------------------------------------------


def test_a_cuda_allocator_pytorch_would_refuse_fails_at_once_with_the_fix() -> None:
    """`cuda_allocator=garbage_value` was applied (and recorded) as it was; PyTorch refused it
    only at the first CUDA allocation, after the data and the model had loaded."""
    message = _error(["cuda_allocator=garbage_value"])
    assert "cuda_allocator=garbage_value: 'garbage_value'" in message
    assert "expandable_segments" in message and "max_split_size_mb" in message  # the options
    assert "cuda_allocator=expandable_segments:True" in message and "null" in message  # fixes
    message = _error(["cuda_allocator='expandable_segments:True,max_split_size_mb:8'"])
    assert "max_split_size_mb:8: max_split_size_mb takes a whole number of MB >= 20" in message


@pytest.mark.parametrize("value", ["huge", "1"])
def test_a_random_weights_value_is_checked_before_any_work(value: str) -> None:
    """`model.random_weights=huge` was refused only by the record writer, so a sweep's job with
    it left no record; `medvqa.models.spec.random_weights_kind` is the one reading of it."""
    message = _error([f"model.random_weights={value}"])
    assert "model.random_weights=" in message and value in message
    assert "shrunk" in message and "false" in message  # the valid values


def test_a_refused_sweep_job_with_bad_random_weights_is_recorded_failed(tmp_path: Path) -> None:
    """The runner's refusal record (a sweep job) is written for a value the record writer itself
    cannot read as a rehearsal or not; in process, as runner.run calls it."""
    from types import SimpleNamespace

    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from medvqa.runner import _record_refusal

    cfg = compose(["model.random_weights=huge", "logger=csv"], tmp_path / "cache")
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(tmp_path / "job")
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    with pytest.raises(ConfigError) as err:
        check_config(cfg)
    hydra_cfg = SimpleNamespace(runtime=SimpleNamespace(choices={"model": "tiny"}))
    _record_refusal(cfg, tmp_path / "job", hydra_cfg, err.value)
    record = json.loads((tmp_path / "job" / "results.json").read_text())
    assert record["status"] == "failed" and record["rehearsal"] is False
    assert "model.random_weights='huge'" in record["error"]


def _bool_keys(cls: type, prefix: str = "") -> list[str]:
    """The config keys the schema dataclass `cls` (and those it nests) types `bool`."""
    import dataclasses
    import typing

    keys = []
    for name, hint in typing.get_type_hints(cls).items():
        if name.startswith("_") or name not in {f.name for f in dataclasses.fields(cls)}:
            continue
        if hint is bool or hint == bool | None:
            keys.append(f"{prefix}{name}")
        elif dataclasses.is_dataclass(hint):
            keys += _bool_keys(hint, f"{prefix}{name}.")
    return keys


BOOL_KEYS = _bool_keys(Config)


def test_the_bool_keys_are_found_in_every_schema() -> None:
    for key in ("force", "allow_toy_model", "model.share_image_prefix", "peft.fit"):
        assert key in BOOL_KEYS
    assert "trainer.enable_checkpointing" in BOOL_KEYS and "trainer.benchmark" in BOOL_KEYS


@pytest.mark.heavy
@pytest.mark.parametrize("key", BOOL_KEYS)
def test_a_bool_key_takes_true_or_false_only(key: str) -> None:
    """`model.share_image_prefix=2` composed as true: OmegaConf reads 2, "2", "yes" or "on" into
    a bool field. Each key the schemas type bool now refuses anything but true/false, naming
    the key, the value and the type it needs."""
    from hydra.errors import ConfigCompositionException

    compose_values([f"{key}=false"], cache=COMPOSE_CACHE)
    for value in ("2", "yes"):
        with pytest.raises(ConfigCompositionException) as err:
            compose_values([f"{key}={value}"], cache=COMPOSE_CACHE)
        shown = f"{err.value}\n{err.value.__cause__}"
        assert f"{key}={value}" in shown and "bool" in shown.split("type hint")[1], shown


def test_a_bool_key_written_as_a_number_in_a_yaml_file_fails_to_compose(tmp_path: Path) -> None:
    from hydra.errors import ConfigCompositionException

    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "numbers.yaml").write_text(
        "# @package _global_\nmodel:\n  share_image_prefix: 2\n"
    )
    (tmp_path / "experiment" / "words.yaml").write_text(
        "# @package _global_\ntrainer:\n  enable_checkpointing: 'on'\n"
    )
    for name, key in (("numbers", "model.share_image_prefix"), ("words", "trainer.enable_")):
        with pytest.raises(ConfigCompositionException, match=rf"(?s)type hint 'bool'.*{key}"):
            compose([f"hydra.searchpath=[file://{tmp_path}]", f"+experiment={name}"])
