"""Shared fixtures: one small cache (dataset + tiny model) per test session.

Everything a test builds is tiny: a 60-case synthetic dataset and a tiny LLaVA pre-trained for
one epoch on 30 cases. Tests that start `run.py` in a subprocess point MEDVQA_CACHE at the same
cache so the model is built once.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"

# Overrides that make the tiny model small enough for a test (any dataset).
SMALL_MODEL = [
    "model.builder.pretrain.data.n_cases=30",
    "model.builder.pretrain.epochs=1",
    "model.builder.pretrain.progress_bar=false",
]
# ... and the synthetic dataset too.
SMALL = ["dataset.n_cases=60", *SMALL_MODEL]
# Set by Lightning's launcher and process-group set-up (torch.distributed's env:// rendezvous).
DISTRIBUTED_ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK")


# `make test-fast` (`--no-models`): the tier that builds, loads or trains no model and starts
# no whole run, for use while working. A test that gets to such a step is skipped there, with
# this reason; `make test` runs it. Found where it happens, not from a list of tests.
NO_MODELS = "needs a model or a whole run: in `make test`, not the --no-models tier"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--no-models",
        action="store_true",
        help="skip each test when it would build, load or train a model or start a run.py",
    )


def _skip_model_work(*args: object, **kwargs: object) -> None:
    pytest.skip(NO_MODELS)


def pytest_configure(config: pytest.Config) -> None:
    """With --no-models: model building, loading and fitting, and starting a Python process,
    skip the test (or the fixture, of any scope) that asks, for the whole session."""
    if not config.getoption("--no-models"):
        return
    import lightning as L
    from transformers import PreTrainedModel
    from transformers.models.auto.auto_factory import _BaseAutoModelClass

    from medvqa.models.builders import gguf, smollm2_causal
    from medvqa.models.builders.cache import CachedModelBuilder
    from medvqa.zoo import smollm2

    CachedModelBuilder.build = _skip_model_work  # type: ignore[method-assign]
    # SmolLM2 from its GGUF file: the tokenizer alone takes seconds before the model loads.
    for module in (gguf, smollm2, smollm2_causal):
        module.load_smollm2 = _skip_model_work  # type: ignore[assignment]
    PreTrainedModel.from_pretrained = classmethod(_skip_model_work)  # type: ignore[assignment]
    _BaseAutoModelClass.from_pretrained = classmethod(_skip_model_work)  # type: ignore[assignment]
    L.Trainer.fit = _skip_model_work  # type: ignore[method-assign]
    subprocess.run = _skip_run(subprocess.run)  # type: ignore[assignment]
    Zygote.skip = True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With --no-models, also leave to `make test` the tests marked `heavy` and every case of a
    parametrized test but its first: the tier checks each behaviour once, in minutes; the
    other cases (each experiment with each method, each hostile target, each preset) are the
    same code on other values."""
    if not config.getoption("--no-models"):
        return
    kept, left = [], []
    seen: set[str] = set()
    for item in items:
        base = item.nodeid.split("[", 1)[0]
        if item.get_closest_marker("heavy") or (hasattr(item, "callspec") and base in seen):
            left.append(item)
        else:
            kept.append(item)
            seen.add(base)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept


def _skip_run(real: object) -> object:
    """subprocess.run, skipping the test when it starts a Python process (run.py, a console
    script, a script): those build or load models; other commands (git, make) run."""

    def run(cmd: object, *args: object, **kwargs: object) -> object:
        first = str(cmd[0] if isinstance(cmd, list | tuple) else cmd).split()[0]
        if (
            Path(first).name.startswith(("python", "medvqa-", "bash", "sh"))
            or first == sys.executable
        ):
            pytest.skip(NO_MODELS)
        return real(cmd, *args, **kwargs)  # type: ignore[operator]

    return run


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for the session's workers (pytest-xdist): each tiny model and dataset is built
    once (`medvqa.atomic.build_once` lets one worker build while the others wait), not once
    per worker."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = shared / "medvqa-cache"
    path.mkdir(parents=True, exist_ok=True)
    return path


def sampled(values: Sequence[object], keep: int = 1, *, unpack: bool = False) -> list[object]:
    """`values` for a parametrize: the first `keep` run in `make test`, the rest are marked
    slow (`make test-slow`, CI): the same code on other values, kept out of the default tier's
    time. `unpack`: each value is a tuple of several arguments."""
    return [
        pytest.param(
            *(value if unpack else (value,)),  # type: ignore[misc]
            marks=() if i < keep else (pytest.mark.slow,),
        )
        for i, value in enumerate(values)
    ]


def diagonal(rows: Sequence[object], columns: Sequence[object]) -> list[object]:
    """Every (row, column) pair for a two-argument parametrize; `make test` runs a diagonal
    (each row once, each column at least once), the other pairs are slow."""
    out = []
    for i, row in enumerate(rows):
        for j, column in enumerate(columns):
            on_diagonal = j == i % len(columns)
            marks = () if on_diagonal else (pytest.mark.slow,)
            out.append(pytest.param(row, column, marks=marks))
    return out


def compose(overrides: Sequence[str] = (), cache: Path | None = None):
    """Compose the real config (as run.py would) without running it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    import medvqa.config  # noqa: F401

    extra = [f"paths.cache_dir={cache}"] if cache is not None else []
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose("config", overrides=[*overrides, *extra], return_hydra_config=True)


def _chooses(override: str) -> bool:
    """Whether an override picks a config group's option (or sets Hydra's own config):
    compose's defaults list takes those; the rest set values."""
    key = override.lstrip("+~").split("=")[0]
    return (CONF / key.replace(".", "/")).is_dir() or key.startswith("hydra.")


@functools.lru_cache(maxsize=16)
def _composed(overrides: tuple[str, ...], cache: Path | None):
    return compose(overrides, cache)


def compose_values(values: Sequence[str], base: Sequence[str] = (), cache: Path | None = None):
    """`compose([*base, *values], cache)` in milliseconds (Hydra's compose takes about 0.2 s):
    `base` is composed once per worker and `values`, which may only set keys (no config group),
    are applied to a copy by Hydra's own step for them, the one its compose runs after the
    defaults list. For a grid of values on one config; tests/test_config_checks.py checks that
    both give the same config and the same errors."""
    import copy

    from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
    from hydra.core.override_parser.overrides_parser import OverridesParser

    chosen = [v for v in values if _chooses(v)]
    if chosen:
        raise ValueError(f"{chosen}: a config group or Hydra's; put it in base")
    parser = OverridesParser.create()
    parsed = parser.parse_overrides(list(values))
    cfg = copy.deepcopy(_composed(tuple(base), cache))
    ConfigLoaderImpl._apply_overrides_to_config(parsed, cfg)
    # What compose records of its overrides, in its order (the cache's last).
    recorded = list(cfg.hydra.overrides.task)
    cut = len(recorded) - (cache is not None)
    task = [*recorded[:cut], *values, *recorded[cut:]]
    cfg.hydra.overrides.task = task
    dirname = cfg.hydra.job.config.override_dirname
    cfg.hydra.job.override_dirname = get_overrides_dirname(
        overrides=parser.parse_overrides(task),
        kv_sep=dirname.kv_sep,
        item_sep=dirname.item_sep,
        exclude_keys=dirname.exclude_keys,
    )
    return cfg


def compose_cached(overrides: Sequence[str], cache: Path | None = None):
    """`compose(overrides, cache)` with the overrides that choose a config group (and Hydra's
    own) composed once per worker and the rest applied to a copy (compose_values). Only for
    configs no test changes: a base is not composed again after conf/ or the ConfigStore
    change."""
    groups = [o for o in overrides if _chooses(o)]
    return compose_values([o for o in overrides if o not in groups], groups, cache)


class Zygote:
    """This worker's `tests/zygote.py` process: run.py runs forked from it, without paying
    for the libraries' imports each time (about 8 s a run)."""

    process: subprocess.Popen | None = None
    skip = False  # --no-models: no run.py at all

    @classmethod
    def run(
        cls, cmd: Sequence[str], env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess:
        import json
        import tempfile

        if cls.process is None or cls.process.poll() is not None:
            base = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_ENV}
            cls.process = subprocess.Popen(
                [sys.executable, "-m", "tests.zygote"],
                cwd=ROOT,
                env=base,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert cls.process.stdout.readline().strip() == "ready"
        with tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            request = {"argv": list(cmd), "env": env, "cwd": str(ROOT), "out": str(out),
                       "err": str(err), "timeout": timeout}  # fmt: skip
            cls.process.stdin.write(json.dumps(request) + "\n")
            cls.process.stdin.flush()
            reply = json.loads(cls.process.stdout.readline())
            stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
        if reply["timed_out"]:
            raise subprocess.TimeoutExpired(list(cmd), timeout, stdout, stderr)
        return subprocess.CompletedProcess(list(cmd), reply["returncode"], stdout, stderr)


def run_main(
    args: Sequence[str],
    run_dir: Path,
    cache: Path,
    env: dict[str, str] | None = None,
    small: Sequence[str] = SMALL,
    fresh: bool = False,
) -> subprocess.CompletedProcess:
    """Run `python run.py` as a user would, in a process of its own, with a given run
    directory: forked from this worker's zygote (tests/zygote.py), or a fresh interpreter
    (`fresh`, or MEDVQA_TEST_FRESH=1) where the environment must reach the libraries' imports."""
    # A process group made in this test process (an in-process DDP/DeepSpeed test) leaves
    # MASTER_PORT & co. in os.environ; the run must pick its own.
    inherited = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_ENV}
    full_env = {
        **inherited,
        "MEDVQA_CACHE": str(cache),
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        **(env or {}),
    }
    cmd = [sys.executable, str(ROOT / "run.py"), *args, *small, f"hydra.run.dir={run_dir}"]
    if Zygote.skip:  # --no-models: a run.py builds models (as subprocess.run is told to skip)
        pytest.skip(NO_MODELS)
    if fresh or os.environ.get("MEDVQA_TEST_FRESH") == "1":
        return subprocess.run(
            cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=600
        )
    return Zygote.run(cmd, full_env, timeout=600)


@pytest.fixture(scope="session")
def tiny_model_dir(cache_dir: Path) -> Path:
    """The tiny LLaVA built (and briefly pre-trained) exactly as `model=tiny` builds it."""
    from hydra.utils import instantiate

    cfg = compose(SMALL, cache_dir)
    return Path(instantiate(cfg.model.builder).build())
