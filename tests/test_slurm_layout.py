"""A SLURM job's layout: nodes, tasks, memory and per-rank logs follow the trainer, and the ranks
of 2 nodes x 2 tasks come out as Lightning and medvqa expect (only global rank 0 writes).

The job is never started here: each simulated task is a fresh Python process with the
environment srun gives it, composing the real config and building its Trainer without fitting.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import ROOT, compose

SWEEP = ["hydra/launcher=slurm", "hydra.sweep.dir=/tmp/sweep"]
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")


def _launcher(overrides: list[str]) -> dict:
    """The sbatch options Hydra's submitit launcher gets, from the composed config."""
    from hydra.core.plugins import Plugins

    cfg = compose([*SWEEP, *overrides])
    return Plugins.instance()._instantiate(cfg.hydra.launcher).params


@pytest.mark.parametrize(
    ("overrides", "nodes", "tasks", "gpus", "mem_gb"),
    [
        ([], 1, 1, None, 36 + 16),  # trainer=cpu
        (["trainer=gpu"], 1, 1, 1, 36 + 16),
        (["trainer=gpu", "trainer.devices=4"], 1, 4, 4, 4 * 36 + 16),
        (["trainer=gpu", "trainer.devices=4", "trainer.num_nodes=2"], 2, 4, 4, 4 * 36 + 16),
        (["trainer=deepspeed_zero2", "trainer.devices=8", "trainer.num_nodes=3"], 3, 8, 8, 304),
    ],
)
def test_nodes_tasks_and_memory_follow_the_trainer(
    overrides: list[str], nodes: int, tasks: int, gpus: int | None, mem_gb: int
) -> None:
    params = _launcher(overrides)
    assert (params["nodes"], params["tasks_per_node"], params["gpus_per_node"]) == (
        nodes,
        tasks,
        gpus,
    )
    assert params["mem_gb"] == mem_gb


def test_memory_follows_hand_set_tasks_and_can_be_set_outright() -> None:
    assert _launcher(["trainer=gpu", "hydra.launcher.tasks_per_node=2"])["mem_gb"] == 2 * 36 + 16
    assert (
        _launcher(["trainer=gpu", "trainer.devices=4", "hydra.launcher.mem_gb=500"])["mem_gb"]
        == 500
    )


@pytest.mark.heavy
def test_num_nodes_is_a_trainer_setting_not_a_folder_name() -> None:
    cfg = compose(["trainer=gpu", "trainer.num_nodes=2"])
    assert cfg.trainer.num_nodes == 2 and compose([]).trainer.num_nodes == 1
    excluded = cfg.hydra.job.config.override_dirname.exclude_keys
    assert "trainer.num_nodes" in excluded  # the same setting on 1 or 2 nodes: one folder


def test_slurm_mem_gb_refuses_what_cannot_size_a_node() -> None:
    from medvqa.cluster import slurm_mem_gb

    assert slurm_mem_gb(2, 36, 16) == 88
    with pytest.raises(ValueError, match=r"hydra\.launcher\.mem_gb=N"):
        slurm_mem_gb(0, 36, 16)


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({}, "run.log"),
        ({"SLURM_PROCID": "0"}, "run.log"),
        ({"SLURM_PROCID": "3"}, "run_rank3.log"),
        ({"RANK": "2", "SLURM_PROCID": "0"}, "run_rank2.log"),  # Lightning's order: RANK first
    ],
)
def test_each_rank_names_its_own_log(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], name: str
) -> None:
    from medvqa.cluster import rank_log_name

    for key in RANK_VARIABLES:
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert rank_log_name() == name
    handler = compose([]).hydra.job_logging.handlers.file
    assert OmegaConf.to_container(handler)["filename"].endswith("/${rank_log:}")


@pytest.mark.slow
def test_a_slurm_task_logs_to_its_own_file(tmp_path: Path, cache_dir: Path) -> None:
    """Task 1 of a job runs the whole job in the same run directory (and writes no record):
    its log is run_rank1.log, and rank 0's run.log is left to rank 0."""
    clean = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "run.py"),
            "task=splits",
            "logger=csv",
            "dataset.n_cases=60",
            f"hydra.run.dir={tmp_path}",
        ],
        cwd=ROOT,
        env={**clean, "MEDVQA_CACHE": str(cache_dir), "SLURM_PROCID": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "global rank 1: running the task" in (tmp_path / "run_rank1.log").read_text()
    assert not (tmp_path / "run.log").exists()
    assert not (tmp_path / "results.json").exists()  # rank 0 records


# One SLURM task of `srun` on 2 nodes x 2 tasks per node: what it reads, what it reports.
TASK = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from hydra.utils import instantiate
from medvqa import distributed
from medvqa.cluster import rank_log_name
from tests.conftest import compose

before = distributed.global_rank()  # known before any Trainer: the task's file log needs it
cfg = compose(["trainer.devices=2", "trainer.num_nodes=2", "trainer.strategy=ddp"])
trainer = instantiate(cfg.trainer, logger=False, enable_checkpointing=False)
# What Lightning checks when the fit starts: the trainer's devices and nodes are srun's.
trainer.strategy.cluster_environment.validate_settings(trainer.num_devices, trainer.num_nodes)
print(json.dumps({
    "before": before,
    "global_rank": trainer.global_rank,
    "local_rank": trainer.local_rank,
    "node_rank": trainer.node_rank,
    "world_size": trainer.world_size,
    "environment": type(trainer.strategy.cluster_environment).__name__,
    "medvqa_rank": distributed.global_rank(),
    "writes": distributed.is_global_zero(),
    "log": rank_log_name(),
}))
"""


def _task(procid: int) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES and "SLURM" not in k}
    env.update(
        {
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NAME": "medvqa",
            "SLURM_NNODES": "2",
            "SLURM_JOB_NODELIST": "gpu[07-08]",
            "SLURM_NODELIST": "gpu[07-08]",
            "SLURM_NTASKS": "4",
            "SLURM_NTASKS_PER_NODE": "2",
            "SLURM_TASKS_PER_NODE": "2(x2)",
            "SLURM_PROCID": str(procid),
            "SLURM_LOCALID": str(procid % 2),
            "SLURM_NODEID": str(procid // 2),
        }
    )
    return subprocess.Popen(
        [sys.executable, "-c", TASK, str(ROOT)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_two_nodes_of_two_tasks_are_four_ranks_and_rank_zero_writes() -> None:
    tasks = []
    for proc in [
        _task(procid) for procid in range(4)
    ]:  # the four tasks at once, as srun starts them
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        tasks.append(json.loads(out.strip().splitlines()[-1]))
    for procid, task in enumerate(tasks):
        assert task["environment"] == "SLURMEnvironment"
        assert task["world_size"] == 4
        assert (task["global_rank"], task["local_rank"], task["node_rank"]) == (
            procid,
            procid % 2,
            procid // 2,
        )
        assert task["before"] == task["medvqa_rank"] == procid
        assert task["log"] == ("run.log" if procid == 0 else f"run_rank{procid}.log")
    # Only global rank 0 writes; node 1's local rank 0 (global 2) does not.
    assert [t["writes"] for t in tasks] == [True, False, False, False]
