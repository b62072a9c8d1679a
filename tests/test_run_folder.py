"""A run folder is data from a stranger (issue #44): `task=eval` takes choices and plain values
from it, never code; checks its weights by SHA-256 before any work; and scores only rows the
weights never trained on. In-process and fast: the end-to-end wiring is tested in
tests/test_distributed.py::test_task_eval_reproduces_a_finished_run."""

from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf, open_dict

from medvqa.data import records as R
from medvqa.data.shifts import SPLITS_FILE
from medvqa.models.saving import (
    META_FILE,
    TRAINED_DIR,
    WEIGHTS_FILE,
    WeightsMismatch,
    rows_digest,
    save_trainable,
)
from medvqa.record import RESULTS_FILE, RunRecord
from medvqa.tasks.common import split_rows
from medvqa.tasks.from_run import (
    RunFolderError,
    adopt_run,
    check_trained_weights,
    check_unseen,
    installed_groups,
)
from medvqa.untrusted import UntrustedDataError, plain_values
from tests.conftest import ROOT, compose_cached, diagonal

CACHE = Path("/tmp/medvqa-run-folder")
CHOICES = {"model": "tiny", "peft": "ia3", "dataset": "synthetic", "shift": "modality",
           "debug": "smoke"}  # fmt: skip
DEFAULTS = {"model": "tiny", "peft": "lora", "dataset": "synthetic", "shift": "modality"}


def _frames(train: list[tuple[str, str]], **tests: list[tuple[str, str]]) -> dict[str, Any]:
    """Splits of (id, case) rows."""
    return {
        name: pd.DataFrame(rows, columns=[R.ID, R.CASE_ID])
        for name, rows in {"train": train, "val": [("v0", "cv")], **tests}.items()
    }


TRAINED = _frames(
    [("a", "c1"), ("b", "c1"), ("c", "c2")], test_iid=[("t1", "c3")], test_ood=[("t2", "c4")]
)


def _cfg(overrides: list[str]) -> Any:
    cfg = compose_cached(["debug=smoke", "logger=csv", *overrides], CACHE)
    with open_dict(cfg):
        del cfg["hydra"]
        cfg.paths.root_dir = str(ROOT)
        cfg.paths.output_dir = str(CACHE / "out")
    return cfg


def _run(tmp_path: Path, config: dict[str, Any] | None = None, name: str = "run") -> Path:
    """A finished ia3 run's folder as medvqa writes it: record, trained/ and splits.json."""
    run = tmp_path / name
    run.mkdir()
    torch.manual_seed(0)
    manifest = save_trainable(
        torch.nn.Linear(4, 4), run / TRAINED_DIR, "ia3", "fp", 3, rows_digest(["a", "b", "c"])
    )
    record = RunRecord(run, _cfg(["peft=ia3", "seed=3"]), choices=CHOICES)
    if config is not None:
        record.config = config
    record.provenance = {"trained": manifest}
    record.write("finished")
    report = {"dataset": "synthetic", **split_rows(TRAINED)}
    (run / SPLITS_FILE).write_text(json.dumps(report))
    return run


def _eval_cfg(run: Path, *overrides: str) -> Any:
    return _cfg(["task=eval", f"eval.from_run={run}", *overrides])


def _record(run: Path) -> dict[str, Any]:
    return json.loads((run / RESULTS_FILE).read_text())


# -- weights checked before any work ------------------------------------------------------------


@pytest.mark.heavy
def test_intact_weights_pass_and_their_checksum_is_recorded(tmp_path: Path) -> None:
    run = _run(tmp_path)
    manifest = json.loads((run / TRAINED_DIR / META_FILE).read_text())
    assert manifest["bytes"] == (run / TRAINED_DIR / WEIGHTS_FILE).stat().st_size
    assert len(manifest["sha256"]) == 64 and manifest["trained_rows"]["n"] == 3
    cfg, choices = adopt_run(_eval_cfg(run), {**DEFAULTS}, [f"eval.from_run={run}"], DEFAULTS)
    assert cfg.peft.name == "ia3" and choices["peft"] == "ia3" and cfg.seed == 3


def _flip_a_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage, said",
    [
        (_flip_a_bit, "has SHA-256"),
        (lambda p: p.write_bytes(p.read_bytes()[:-100]), "bytes, its manifest"),
    ],
    ids=["bit-flip", "truncated"],
)
@pytest.mark.heavy
def test_damaged_weights_are_refused_naming_file_expected_and_found(
    tmp_path: Path, damage: Any, said: str
) -> None:
    run = _run(tmp_path)
    weights = run / TRAINED_DIR / WEIGHTS_FILE
    damage(weights)
    expected = json.loads((run / TRAINED_DIR / META_FILE).read_text())
    with pytest.raises(WeightsMismatch) as err:
        adopt_run(_eval_cfg(run), {**DEFAULTS}, [], DEFAULTS)
    message = str(err.value)
    assert str(weights) in message and said in message
    assert expected["sha256"] in message or str(expected["bytes"]) in message


def test_another_runs_weights_of_the_same_shapes_are_refused(tmp_path: Path) -> None:
    run = _run(tmp_path)
    other = tmp_path / "other"
    torch.manual_seed(1)
    save_trainable(torch.nn.Linear(4, 4), other, "ia3", "fp", 3)
    shutil.copyfile(other / WEIGHTS_FILE, run / TRAINED_DIR / WEIGHTS_FILE)
    with pytest.raises(WeightsMismatch, match="holds other weights"):
        check_trained_weights(run, OmegaConf.create(_record(run)["config"]))


def test_weights_from_before_checksums_are_used_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = _run(tmp_path)
    meta_path = run / TRAINED_DIR / META_FILE
    meta = json.loads(meta_path.read_text())
    for key in ("bytes", "sha256"):
        meta.pop(key)
    meta_path.write_text(json.dumps(meta))
    record = _record(run)
    record["provenance"]["trained"] = meta
    (run / RESULTS_FILE).write_text(json.dumps(record))
    with caplog.at_level(logging.WARNING):
        check_trained_weights(run, OmegaConf.create(record["config"]), record["provenance"])
    assert "records no checksum" in caplog.text


# -- no code from a record ----------------------------------------------------------------------

HOSTILE = [
    "pandas.read_pickle",
    "numpy.load",
    "torch.hub.load_state_dict_from_url",
    "builtins.open",
    "shutil.rmtree",
    "pathlib.Path.write_text",
    "os.system",
    "medvqa.atomic.replace_dir",  # the project's own function: not a kind of object
    "transformers.pipeline",
    "medvqa_hostile_module.Anything",  # a module that acts when imported
]


@pytest.fixture
def hostile_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module on sys.path that touches a marker when imported."""
    marker = tmp_path / "imported"
    (tmp_path / "medvqa_hostile_module.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).touch()\nclass Anything: pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return marker


@pytest.mark.parametrize(
    ("target", "key"),
    diagonal(HOSTILE, ["model.builder", "peft.adapter", "model.builder.pretrain.data"]),
)
@pytest.mark.heavy
def test_a_hostile_target_in_a_record_runs_nothing(
    tmp_path: Path, hostile_module: Path, target: str, key: str
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("kept")
    config = _record(_run(tmp_path, name="made"))["config"]
    node = config
    for part in key.split("."):
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node.clear()
    node.update({"_target_": target, "path": str(victim), "_args_": [str(victim)]})
    run = _run(tmp_path, config)
    with pytest.raises(UntrustedDataError) as err:
        adopt_run(_eval_cfg(run), {**DEFAULTS}, [], DEFAULTS)
    message = str(err.value)
    assert f"{key}._target_={target!r}" in message and "nothing from it" in message
    assert victim.read_text() == "kept" and not hostile_module.exists()
    assert "medvqa_hostile_module" not in sys.modules


@pytest.mark.heavy
@pytest.mark.parametrize("group", ["model", "peft"])
def test_every_shipped_option_is_adopted_with_its_installed_classes(group: str) -> None:
    """What task=eval builds comes from the installed option the record names: every shipped
    model and method passes the class check against itself, and its node keeps its classes."""
    for path in sorted((ROOT / "conf" / group).glob("*.yaml")):
        config = OmegaConf.to_container(_cfg([f"{group}={path.stem}"]), resolve=True)
        record = {"choices": {group: path.stem}, "config": plain_values(config).value}
        node = installed_groups(record, str(path))[group]
        assert json.dumps(node).count('"_target_"') == json.dumps(config[group]).count(
            '"_target_"'
        ), path


@pytest.mark.heavy
@pytest.mark.parametrize("group, key", [("model", "pretrained"), ("task", "name")])
def test_an_interpolation_in_a_record_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, group: str, key: str
) -> None:
    monkeypatch.setenv("MEDVQA_TEST_SECRET", "hunter2")
    config = _record(_run(tmp_path, name="made"))["config"]
    config[group][key] = "${oc.env:MEDVQA_TEST_SECRET}"
    with pytest.raises(UntrustedDataError, match="an interpolation") as err:
        adopt_run(_eval_cfg(_run(tmp_path, config)), {**DEFAULTS}, [], DEFAULTS)
    assert f"{group}.{key}=" in str(err.value) and "hunter2" not in str(err.value)


@pytest.mark.heavy
def test_trust_remote_code_is_never_turned_on_by_a_record(tmp_path: Path) -> None:
    config = _record(_run(tmp_path, name="made"))["config"]
    config["model"]["trust_remote_code"] = True
    run = _run(tmp_path, config)
    with pytest.raises(RunFolderError, match="never turns it on"):
        adopt_run(_eval_cfg(run), {**DEFAULTS}, [], DEFAULTS)
    line = "model.trust_remote_code=true"
    cfg, _ = adopt_run(_eval_cfg(run, line), {**DEFAULTS}, [line], DEFAULTS)
    assert cfg.model.trust_remote_code is True


def test_the_report_imports_no_target_a_record_names(hostile_module: Path) -> None:
    from medvqa.analysis.rows import _option_default

    _option_default.cache_clear()
    sentinel = _option_default("medvqa_hostile_module.Anything", "test_wording")
    assert sentinel is not None and not hostile_module.exists()


# -- the model and method are the run's ---------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, composed",
    [
        (["peft=lora"], "lora"),  # the default option, named on the command line
        (["peft=prompt_tuning"], "prompt_tuning"),
        (["+experiment=x"], "prompt_tuning"),  # an experiment that picks another
    ],
)
@pytest.mark.heavy
def test_a_composed_method_that_is_not_the_runs_is_refused(
    tmp_path: Path, overrides: list[str], composed: str
) -> None:
    run = _run(tmp_path)
    cfg = _eval_cfg(run, f"peft={composed}")
    choices = {"peft": composed}
    with pytest.raises(RunFolderError) as err:
        adopt_run(cfg, {**DEFAULTS, **choices}, overrides, DEFAULTS)
    assert "the run's weights are peft 'ia3'" in str(err.value)


@pytest.mark.heavy
def test_the_runs_method_is_adopted_and_command_line_values_kept(tmp_path: Path) -> None:
    run = _run(tmp_path)
    line = "model.max_new_tokens=5"
    cfg, choices = adopt_run(
        _eval_cfg(run, line, "peft=ia3"), {**DEFAULTS}, [line, "peft=ia3"], DEFAULTS
    )
    assert cfg.peft.name == "ia3" and choices["peft"] == "ia3"
    assert cfg.model.max_new_tokens == 5  # the user's, over the run's
    assert list(cfg.eval.split_overrides) == []


@pytest.mark.heavy
def test_split_overrides_are_those_that_change_the_runs_values(tmp_path: Path) -> None:
    run = _run(tmp_path)
    lines = ["debug=smoke", "shift=body_part", "seed=4"]
    cfg, _ = adopt_run(_eval_cfg(run, "shift=body_part", "seed=4"), {**DEFAULTS, "shift":
                       "body_part", "debug": "smoke"}, lines, DEFAULTS)  # fmt: skip
    assert list(cfg.eval.split_overrides) == ["shift=body_part", "seed=4"]
    assert cfg.seed == 4  # the user's seed: its splits are checked row by row


# -- rows the weights never saw -----------------------------------------------------------------


def _check(run: Path, frames: dict[str, Any], overrides: list[str], allow: bool = False) -> Any:
    cfg = _eval_cfg(run, "seed=3")  # as adopted from the run
    with open_dict(cfg):
        cfg.eval.split_overrides = overrides
    return check_unseen(cfg, run, "synthetic", frames, ["test_iid", "test_ood"], allow, {})


def test_the_runs_own_splits_pass(tmp_path: Path) -> None:
    assert _check(_run(tmp_path), TRAINED, [])["splits"] == "the run's"


@pytest.mark.heavy
def test_other_splits_with_rows_the_weights_trained_on_are_refused(tmp_path: Path) -> None:
    run = _run(tmp_path)
    frames = _frames(
        [("c", "c2")],
        test_iid=[("t1", "c3")],
        test_ood=[("a", "c1"), ("b", "c1"), ("t5", "c1"), ("t2", "c4")],
    )
    with pytest.raises(RunFolderError) as err:
        _check(run, frames, ["shift=body_part"])
    message = str(err.value)
    assert "shift=body_part gives other splits" in message
    assert "test_ood: 2 of 4 rows trained on, 1 more of a case trained on" in message
    assert "eval.allow_seen_rows=true" in message
    found = _check(run, frames, ["shift=body_part"], allow=True)
    assert found["seen"]["test_ood"] == {"rows": 2, "case_rows": 1, "of": 4}
    assert found["allow_seen_rows"] is True


@pytest.mark.heavy
def test_a_case_the_composed_training_split_shares_by_design_is_not_counted(
    tmp_path: Path,
) -> None:
    frames = _frames([("n1", "c1")], test_iid=[("t1", "c3")], test_ood=[("t9", "c1")])
    found = _check(_run(tmp_path), frames, ["shift=question_type"])
    assert found["splits"] == "composed" and found["seen"]["test_ood"]["case_rows"] == 0


@pytest.mark.heavy
def test_other_splits_nothing_asked_for_are_refused(tmp_path: Path) -> None:
    frames = _frames([("a", "c1")], test_iid=[("t1", "c3")], test_ood=[("t7", "c7")])
    with pytest.raises(RunFolderError, match="nothing on the command line asked"):
        _check(_run(tmp_path), frames, [])


@pytest.mark.heavy
def test_another_dataset_shares_no_row_with_the_weights(tmp_path: Path) -> None:
    run = _run(tmp_path)
    cfg = _eval_cfg(run)
    with open_dict(cfg):
        cfg.eval.split_overrides = ["dataset=vqa_rad"]
    frames = _frames([("x", "y")], test_iid=[("a", "c1")], test_ood=[("b", "c1")])
    found = check_unseen(cfg, run, "vqa_rad", frames, ["test_iid", "test_ood"], False, {})
    assert found["seen"] == {}


@pytest.mark.heavy
def test_a_splits_file_that_is_not_the_weights_is_refused(tmp_path: Path) -> None:
    run = _run(tmp_path)
    report = json.loads((run / SPLITS_FILE).read_text())
    report["rows"]["train"] = ["c"]  # rows removed to hide what was trained on
    (run / SPLITS_FILE).write_text(json.dumps(report))
    with pytest.raises(RunFolderError, match="not those its weights trained on"):
        _check(run, TRAINED, ["shift=body_part"])


@pytest.mark.heavy
@pytest.mark.parametrize(
    "report", [[1, 2], {"rows": {"train": [1]}, "train_cases": []}, {"rows": {}, "train_cases": 3}]
)
def test_a_malformed_splits_file_is_refused_naming_it(tmp_path: Path, report: Any) -> None:
    run = _run(tmp_path)
    (run / SPLITS_FILE).write_text(json.dumps(report))
    with pytest.raises(RunFolderError, match=str(run / SPLITS_FILE)):
        _check(run, TRAINED, ["shift=body_part"])


@pytest.mark.heavy
def test_a_run_from_before_row_ids_is_checked_by_its_settings(tmp_path: Path) -> None:
    run = _run(tmp_path)
    (run / SPLITS_FILE).write_text(json.dumps({"dataset": "synthetic", "splits": {}}))
    assert _check(run, TRAINED, [])["splits"] == "unchecked"  # the same settings
    cfg = _eval_cfg(run, "shift=body_part")
    with open_dict(cfg):
        cfg.eval.split_overrides = ["shift=body_part"]
    args = (cfg, run, "synthetic", TRAINED, ["test_iid", "test_ood"])
    with pytest.raises(RunFolderError, match="records no row ids"):
        check_unseen(*args, False, {})
    assert check_unseen(*args, True, {})["splits"] == "unchecked"


# -- the shared answers cache -------------------------------------------------------------------


def test_a_damaged_shared_answers_file_is_generated_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from medvqa.generation.files import checksum_path, intact_shared
    from medvqa.hashing import file_hash

    shared = tmp_path / "key.jsonl"
    assert not intact_shared(shared)
    shared.write_text('{"id": "a", "prediction": "yes"}\n')
    with caplog.at_level(logging.WARNING):
        assert intact_shared(shared)  # published before checksums: used, with a warning
    assert "unchecked" in caplog.text
    checksum_path(shared).write_text(file_hash(shared) + "\n")
    assert intact_shared(shared)
    shared.write_text('{"id": "a", "prediction": "no"}\n')
    with caplog.at_level(logging.WARNING):
        assert not intact_shared(shared)
    assert "damaged or edited" in caplog.text
