"""A run folder is data everywhere: one reader (`medvqa.untrusted`) for every command.

One real run of the tiny model (under umask 000: nothing it makes may be group- or
world-writable) gives a real `results.json`, `splits.json` and `trained/trainable.json`. At
every key path of each, a `_target_` node, an interpolation and `trust_remote_code: true` are
planted and the reader is asked directly (fast); the reading commands (task=eval's adoption,
resuming, medvqa-report with its paired differences, medvqa-select) then run on a sample of the
planted records, in-process. Nothing runs: the planted class's module would write a file when
imported, the planted resolver when resolved.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
import shutil
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf, open_dict

from medvqa.data.shifts import SPLITS_FILE
from medvqa.models.saving import META_FILE, TRAINED_DIR, read_manifest
from medvqa.record import RESULTS_FILE, RunRecord, read_record
from medvqa.tasks.from_run import RunFolderError, _read_splits, adopt_run
from medvqa.untrusted import CLASS_KEY, REMOTE_CODE_KEY, TARGET_KEY, UntrustedDataError
from tests.conftest import ROOT, compose, run_main

CANARY_MODULE = "medvqa_canary_module"
CANARY_TARGET = f"{CANARY_MODULE}.Canary"
INTERPOLATION = "${medvqa_canary:}"
# Where the commands are run on a planted record: the two ways in the issue showed (the
# report's bootstrap, the processor's kwargs), each adopted group, a metric family, a plain
# value, the record's own keys.
SAMPLE = (
    "config.evaluation.bootstrap",
    "config.model.processor_kwargs",
    "config.model.builder",
    "config.peft.adapter",
    "config.metric.traditional",
    "config.dataset",
    "config.trainer",
    "config.seed",
    "config.evaluation.primary_closed",
)
OUTSIDE_CONFIG = ("provenance.metrics.traditional", "choices", "metrics")


@pytest.fixture(scope="module")
def real_run(
    tmp_path_factory: pytest.TempPathFactory, cache_dir: Path, tiny_model_dir: Path
) -> Path:
    """A finished ia3 run on the tiny model, made under umask 000 with a cache of its own (the
    session's tiny model copied in: built once per session)."""
    root = tmp_path_factory.mktemp("record_reader")
    shutil.copytree(tiny_model_dir, root / "cache" / "models" / tiny_model_dir.name)
    before = os.umask(0)  # the run inherits it
    try:
        proc = run_main(["debug=smoke", "logger=csv", "peft=ia3"], root / "run", root / "cache")
    finally:
        os.umask(before)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


@pytest.fixture
def canary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A module that writes a file when imported, and a resolver that writes it when resolved."""
    marker = tmp_path / "ran"
    (tmp_path / f"{CANARY_MODULE}.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).touch()\nclass Canary:\n"
        f"    def __init__(self, *a, **k):\n        pathlib.Path({str(marker)!r}).touch()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    OmegaConf.register_new_resolver("medvqa_canary", lambda: marker.touch() or "x", replace=True)
    yield marker
    OmegaConf.clear_resolver("medvqa_canary")
    assert not marker.exists(), "planted code ran"
    assert CANARY_MODULE not in sys.modules


# -- planting ------------------------------------------------------------------------------------


def key_paths(node: Any, path: tuple = ()) -> Iterator[tuple]:
    """Every key path of a JSON value (its nodes and leaves)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield (*path, key)
            yield from key_paths(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield (*path, i)
            yield from key_paths(value, (*path, i))


def dotted(path: tuple) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def get(node: Any, path: tuple) -> Any:
    for part in path:
        node = node[part]
    return node


def plant(data: Any, path: tuple, kind: str, victim: Path) -> Any:
    """`data` with a `_target_` node, an interpolation or trust_remote_code at `path` (the last
    inside the node there, or beside the leaf)."""
    out = copy.deepcopy(data)
    if kind == "remote":
        node = get(out, path)
        (node if isinstance(node, dict) else get(out, path[:-1]))[REMOTE_CODE_KEY] = True
        return out
    value = (
        {TARGET_KEY: CANARY_TARGET, "_args_": [str(victim)], "path": str(victim)}
        if kind == "target"
        else INTERPOLATION
    )
    if not path:
        return value
    get(out, path[:-1])[path[-1]] = value
    return out


def sample_paths(data: dict, keep: int = 12) -> list[tuple]:
    """Every key path, but at most `keep` of each run of sibling leaves alike (the hundreds of
    `metrics` keys are one kind of path)."""
    out, seen = [], {}
    for path in key_paths(data):
        parent = path[:-1]
        if not isinstance(get(data, path), dict | list):
            seen[parent] = seen.get(parent, 0) + 1
            if seen[parent] > keep:
                continue
        out.append(path)
    return out


def has_key(node: Any, key: str) -> bool:
    if isinstance(node, dict):
        return key in node or any(has_key(v, key) for v in node.values())
    if isinstance(node, list):
        return any(has_key(v, key) for v in node)
    return False


def _write(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data))
    return path


# -- the reader at every path --------------------------------------------------------------------


@pytest.mark.slow
def test_a_umask_000_run_makes_nothing_group_or_world_writable(real_run: Path) -> None:
    loose = [
        f"{p} {stat.filemode(p.lstat().st_mode)}"
        for p in [real_run / "run", real_run / "cache", *real_run.rglob("*")]
        if not p.is_symlink() and p.lstat().st_mode & 0o022
    ]
    assert not loose, loose


def test_every_path_of_a_record_is_read_as_plain_values(
    real_run: Path, tmp_path: Path, canary: Path
) -> None:
    record = json.loads((real_run / "run" / RESULTS_FILE).read_text())
    victim = tmp_path / "victim"
    path = tmp_path / RESULTS_FILE
    paths = sample_paths(record)
    assert len(paths) > 300 and ("config", "model", "processor_kwargs") in paths
    for at in paths:
        where = dotted(at)
        if at[-1] == REMOTE_CODE_KEY:  # taken out whatever it holds, and named
            for kind in ("target", "interpolation"):
                remote: list[str] = []
                read = read_record(_write(path, plant(record, at, kind, victim)), remote)
                assert not has_key(read, REMOTE_CODE_KEY) and remote[0].startswith(f"{where}=")
            continue
        planted = plant(record, at, "target", victim)
        if at[0] == "config" and at[-1] == TARGET_KEY:  # a class name that is not one
            with pytest.raises(UntrustedDataError, match=re.escape(f"{where}=")):
                read_record(_write(path, planted))
        elif at[0] == "config":  # a class by name only: no `_target_` survives
            read = read_record(_write(path, planted))
            assert not has_key(read, TARGET_KEY), where
            assert get(read, at)[CLASS_KEY] == CANARY_TARGET, where
        else:
            with pytest.raises(UntrustedDataError, match=re.escape(f"{where}._target_=")):
                read_record(_write(path, planted))
        with pytest.raises(UntrustedDataError, match="an interpolation") as err:
            read_record(_write(path, plant(record, at, "interpolation", victim)))
        assert f"{where}={INTERPOLATION!r}" in str(err.value)
        if isinstance(get(record, at), dict):
            remote = []
            read = read_record(_write(path, plant(record, at, "remote", victim)), remote)
            assert not has_key(read, REMOTE_CODE_KEY) and remote == [
                f"{where}.{REMOTE_CODE_KEY}=True"
            ], where
    assert not victim.exists()


def test_every_path_of_splits_and_manifest_is_read_as_plain_values(
    real_run: Path, tmp_path: Path, canary: Path
) -> None:
    """splits.json and the weights' manifest: medvqa writes no class there, so a `_target_`
    is refused as an interpolation is, by key; trust_remote_code is taken out."""
    run = tmp_path / "run"
    shutil.copytree(real_run / "run", run)
    victim = tmp_path / "victim"
    for name, read in (
        (SPLITS_FILE, lambda: _read_splits(run)),
        (f"{TRAINED_DIR}/{META_FILE}", lambda: read_manifest(run / TRAINED_DIR)),
    ):
        data = json.loads((real_run / "run" / name).read_text())
        paths = sample_paths(data)
        assert paths, name
        for at in paths:
            for kind, said in (("target", "._target_="), ("interpolation", "an interpolation")):
                _write(run / name, plant(data, at, kind, victim))
                with pytest.raises(UntrustedDataError) as err:
                    read()
                assert dotted(at) in str(err.value) and said in str(err.value), (name, at)
            if isinstance(get(data, at), dict):
                _write(run / name, plant(data, at, "remote", victim))
                assert not has_key(read(), REMOTE_CODE_KEY)
        _write(run / name, data)
    assert not victim.exists()


# -- the reading commands on planted records -----------------------------------------------------


def _planted_run(real_run: Path, tmp_path: Path, name: str, kind: str, where: tuple) -> Path:
    """A copy of the real run whose record has `kind` planted at each of `where`."""
    run = tmp_path / name
    shutil.copytree(real_run / "run", run)
    record = json.loads((run / RESULTS_FILE).read_text())
    for dotted_path in where:
        record = plant(record, tuple(dotted_path.split(".")), kind, tmp_path / "victim")
    _write(run / RESULTS_FILE, record)
    return run


def _eval_cfg(run: Path, cache: Path, *overrides: str) -> Any:
    cfg = compose(["debug=smoke", "logger=csv", "task=eval", f"eval.from_run={run}", *overrides],
                  cache)  # fmt: skip
    with open_dict(cfg):
        del cfg["hydra"]
        cfg.paths.root_dir = str(ROOT)
        cfg.paths.output_dir = str(run.parent / "eval")
    return cfg


def _report(runs: Path, out: Path, caplog: pytest.LogCaptureFixture) -> tuple[int, str]:
    from medvqa.cli.report import main

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        status = main([str(runs), "--out", str(out)])
    return status, caplog.text


@pytest.mark.parametrize("kind", ["target", "interpolation", "remote"])
def test_the_reading_commands_run_nothing_a_record_plants(
    real_run: Path,
    tmp_path: Path,
    canary: Path,
    kind: str,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture,
) -> None:
    from medvqa.cli.select import main as select_main

    run = _planted_run(real_run, tmp_path, "run", kind, SAMPLE)
    choices = json.loads((real_run / "run" / RESULTS_FILE).read_text())["choices"]
    cfg = _eval_cfg(run, real_run / "cache")
    # task=eval: refused by name (a class where the installed option builds another, an
    # interpolation, remote code the command line did not turn on), or adopted without it
    try:
        adopted, _ = adopt_run(cfg, dict(choices), [], dict(choices))
    except (UntrustedDataError, RunFolderError) as err:
        said = {"target": "model.builder._target_", "interpolation": "an interpolation",
                "remote": "trust_remote_code"}[kind]  # fmt: skip
        assert said in str(err), err
    else:
        pytest.fail(f"task=eval adopted a record with {kind} planted: {adopted.model}")
    # resuming: the planted record is not this job's finished one, and nothing of it runs
    assert RunRecord(run, OmegaConf.create(cfg)).finished_before() is None
    # medvqa-report, its paired differences and judge comparisons: read, or listed unreadable
    status, logged = _report(run.parent, tmp_path / "report", caplog)
    assert status == 0 and "Traceback" not in logged + capsys.readouterr().err
    issues = (tmp_path / "report" / "issues.csv").read_text()
    if kind == "interpolation":
        assert "an interpolation" in issues and "config.evaluation.bootstrap" in issues
    # medvqa-select: a refusal (these runs scored no validation split), never a traceback
    assert select_main([str(run.parent), "--out", str(tmp_path / "select")]) == 2
    assert "Traceback" not in caplog.text + capsys.readouterr().err


def test_a_class_outside_the_config_is_refused_by_every_reader(
    real_run: Path, tmp_path: Path, canary: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = _planted_run(real_run, tmp_path, "run", "target", OUTSIDE_CONFIG)
    status, _ = _report(run.parent, tmp_path / "report", caplog)
    issues = (tmp_path / "report" / "issues.csv").read_text()
    assert status == 0 and "provenance.metrics.traditional._target_" in issues
    cfg = _eval_cfg(run, real_run / "cache")
    with pytest.raises(UntrustedDataError, match=r"choices\._target_="):
        adopt_run(cfg, {}, [], {})


def test_the_reports_paired_bootstrap_builds_nothing_a_record_names(
    real_run: Path, tmp_path: Path, canary: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's attack: no recorded per-sample columns, a family that takes a bootstrap,
    and a `_target_` under `evaluation.bootstrap`. The families are the registry's, built with
    plain values: the paired difference is computed and the planted class never imported."""
    for method, label in (("ia3", "(IA)³"), ("lora", "LoRA")):
        run = tmp_path / "runs" / method
        shutil.copytree(real_run / "run", run)
        record = json.loads((run / RESULTS_FILE).read_text())
        record["choices"]["peft"] = method
        record["config"]["peft"].update(name=method, label=label)
        record["provenance"]["metrics"] = {"traditional": {}}  # no ci_columns
        record["config"]["metric"]["closed_set"] = {  # a family that takes the bootstrap
            TARGET_KEY: "medvqa.scoring.metrics.closed_set.ClosedSetMetric",
            "tasks": ["q6"],
            "primary": ["q6"],
        }
        record["config"]["evaluation"]["bootstrap"] = {
            TARGET_KEY: CANARY_TARGET, "samples": 50, "seed": 1, "level": 0.9,
        }  # fmt: skip
        _write(run / RESULTS_FILE, record)
    status, logged = _report(tmp_path / "runs", tmp_path / "report", caplog)
    assert status == 0, logged
    paired = (tmp_path / "report" / "paired_differences.csv").read_text()
    assert "method − method" in paired, paired


def test_a_processors_remote_code_never_runs_from_processor_kwargs(
    tmp_path: Path, canary: Path
) -> None:
    """The issue's other way in: a checkpoint folder whose processor is a module in the folder,
    and `trust_remote_code` in `model.processor_kwargs`. The processor is loaded with
    `model.trust_remote_code` (off) alone, so transformers refuses to run the folder's code;
    `processor_kwargs` may not carry it at all."""
    from medvqa.errors import ConfigError
    from medvqa.models.loading import processor_kwargs
    from medvqa.models.rehearsal import own_processor

    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "X"}))
    auto_map = {"auto_map": {"AutoProcessor": f"{CANARY_MODULE}.Canary"}}
    for name in ("processor_config.json", "preprocessor_config.json", "config.json"):
        (folder / name).write_text(json.dumps(auto_map))
    shutil.copy(canary.parent / f"{CANARY_MODULE}.py", folder / f"{CANARY_MODULE}.py")
    with pytest.raises(Exception, match="trust_remote_code"):
        own_processor(str(folder), {REMOTE_CODE_KEY: True})
    with pytest.raises(ConfigError, match=r"model\.trust_remote_code alone"):
        processor_kwargs({"processor_kwargs": {REMOTE_CODE_KEY: True}})


def test_a_records_text_never_becomes_yaml_that_medvqa_select_writes() -> None:
    """A failed run's error (from its record) is quoted in the selected file's header: a line
    break there would start a YAML key that a study composes (a `_target_` to build)."""
    import yaml

    from medvqa.analysis.select import Candidate, Run, Selection

    error = f"boom\nmodel:\n  builder:\n    {TARGET_KEY}: {CANARY_TARGET}\u2028x: 1"
    good = Candidate({"peft.lr": 0.1}, [Run("a", 0, "finished", None, 0.5, 0.5)])
    bad = Candidate({"peft.lr": 0.2}, [Run("b", 0, "failed", error, float("nan"), float("nan"))])
    selection = Selection("synthetic", "lora", ("val/a", "val/b"), "test", [good, bad], [error])
    assert yaml.safe_load(selection.yaml([f"dir\n{TARGET_KEY}: x"])) == {"peft": {"lr": 0.1}}
