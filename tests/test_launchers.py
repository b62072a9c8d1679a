"""Launchers: every `hydra/launcher` option composes, the SLURM one carries the knobs a cluster
user edits, and the local one runs a real multirun. The SLURM launcher against a real cluster is
`make test-slurm` (launch/test_slurm.sh), not part of this fast suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import CONF, ROOT, compose

LAUNCHERS = sorted(p.stem for p in (CONF / "hydra" / "launcher").glob("*.yaml"))
# What a cluster user has to be able to set in conf/hydra/launcher/slurm.yaml.
SLURM_KNOBS = (
    "partition",
    "nodes",
    "tasks_per_node",
    "gpus_per_node",
    "cpus_per_task",
    "mem_gb",
    "timeout_min",
    "array_parallelism",
    "max_num_timeout",
    "signal_delay_s",
    "setup",
)


def test_both_launchers_are_there() -> None:
    assert {"local", "slurm"} <= set(LAUNCHERS)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_launcher_composes_and_resolves(launcher: str) -> None:
    cfg = compose([f"hydra/launcher={launcher}", "hydra.sweep.dir=/tmp/sweep"])
    node = cfg.hydra.launcher
    OmegaConf.to_container(node, resolve=True)  # no dangling interpolation
    assert node._target_.startswith(("hydra_plugins.", "hydra._internal.")), node._target_


def test_slurm_launcher_has_the_cluster_knobs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEDVQA_SLURM_PARTITION", raising=False)
    cfg = compose(["hydra/launcher=slurm", "hydra.sweep.dir=/tmp/sweep"])
    node = cfg.hydra.launcher
    assert node._target_.endswith("SlurmLauncher")
    missing = [k for k in SLURM_KNOBS if k not in node]
    assert not missing, f"conf/hydra/launcher/slurm.yaml lacks {missing}"
    assert node.partition is None  # the cluster's default partition
    # A requeued job must be allowed to come back, with a checkpoint to resume from.
    assert node.max_num_timeout >= 1
    assert 0 < node.signal_delay_s < node.timeout_min * 60
    # The sbatch logs and pickled jobs sit in the sweep they belong to.
    assert node.submitit_folder.startswith("/tmp/sweep/")


def test_slurm_partition_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEDVQA_SLURM_PARTITION", "gpu-long")
    cfg = compose(["hydra/launcher=slurm", "hydra.sweep.dir=/tmp/sweep"])
    assert cfg.hydra.launcher.partition == "gpu-long"


def test_slurm_knobs_can_be_overridden_per_sweep() -> None:
    cfg = compose(
        [
            "hydra/launcher=slurm",
            "hydra.sweep.dir=/tmp/sweep",
            "hydra.launcher.partition=a100",
            "hydra.launcher.gpus_per_node=4",
            "hydra.launcher.timeout_min=30",
            "hydra.launcher.setup=[module load cuda]",
        ]
    )
    node = cfg.hydra.launcher
    assert (node.partition, node.gpus_per_node, node.timeout_min) == ("a100", 4, 30)
    assert list(node.setup) == ["module load cuda"]


@pytest.mark.slow
def test_local_launcher_runs_a_two_job_multirun(tmp_path: Path) -> None:
    """task=splits loads no model: a real multirun through `hydra/launcher=local` in seconds."""
    env = {**os.environ, "MEDVQA_CACHE": str(tmp_path / "cache"), "WANDB_MODE": "offline"}
    cmd = [
        sys.executable,
        str(ROOT / "run.py"),
        "-m",
        "hydra/launcher=local",
        "task=splits",
        "logger=csv",
        "dataset.n_cases=60",
        "seed=0,1",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(p.read_text()) for p in (tmp_path / "sweep").rglob("results.json")]
    assert sorted(r["seed"] for r in records) == [0, 1]
    assert {r["status"] for r in records} == {"finished"}, [r.get("error") for r in records]
    assert all(r["choices"]["task"] == "splits" for r in records)


@pytest.mark.parametrize(
    ("overrides", "gpus", "tasks"),
    [
        ([], None, 1),  # trainer=cpu: no GPU asked for
        (["trainer=gpu"], 1, 1),
        (["trainer=gpu", "trainer.devices=4"], 4, 4),
        (["trainer=deepspeed_zero2", "trainer.devices=2"], 2, 2),
        (["trainer=gpu", "trainer.devices=[0,1,2]"], 3, 3),
        (["trainer=cpu", "trainer.devices=2"], None, 2),
    ],
)
def test_slurm_job_size_follows_trainer_devices(
    overrides: list[str], gpus: int | None, tasks: int
) -> None:
    """One override sizes a job: Lightning wants one SLURM task per device. Checked on the
    launcher object itself, which Hydra builds from this config in the sweep process."""
    from hydra.core.plugins import Plugins

    cfg = compose(["hydra/launcher=slurm", "hydra.sweep.dir=/tmp/sweep", *overrides])
    launcher = Plugins.instance()._instantiate(cfg.hydra.launcher)
    assert (launcher.params["gpus_per_node"], launcher.params["tasks_per_node"]) == (gpus, tasks)


def test_slurm_refuses_all_visible_devices() -> None:
    """trainer=deepspeed_zero2's devices=-1 means "what the job sees", which SLURM must be told."""
    from omegaconf.errors import InterpolationResolutionError

    cfg = compose(["hydra/launcher=slurm", "hydra.sweep.dir=/tmp/sweep", "trainer=deepspeed_zero2"])
    with pytest.raises(InterpolationResolutionError, match=r"trainer\.devices=N"):
        OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    # The same trainer on the local launcher keeps -1: every GPU of the workstation.
    assert compose(["trainer=deepspeed_zero2"]).trainer.devices == -1


@pytest.mark.parametrize(("devices", "tasks"), [(3, 3), ("3", 3), ("0,1", 2), ([0, 1], 2)])
def test_slurm_tasks_reads_lightning_device_forms(devices: object, tasks: int) -> None:
    from medvqa.cluster import slurm_tasks

    assert slurm_tasks(devices) == tasks


@pytest.mark.parametrize("devices", [-1, "-1", "auto", 0, True, []])
def test_slurm_tasks_refuses_what_cannot_size_a_job(devices: object) -> None:
    from medvqa.cluster import slurm_tasks

    with pytest.raises(ValueError, match=r"trainer\.devices=N"):
        slurm_tasks(devices)
