"""What a record says of the machine it ran on (medvqa.provenance)."""

from __future__ import annotations


def test_gpus_read_from_nvidia_smi(tmp_path, monkeypatch) -> None:
    """A figure measured on a GPU records its NVIDIA driver and memory; no nvidia-smi: None."""
    from medvqa.provenance import gpus

    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpus() is None
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB'\n")
    smi.chmod(0o755)
    assert gpus() == [
        {
            "name": "NVIDIA H100 80GB HBM3",
            "driver_version": "580.159.04",
            "memory.total": "81559 MiB",
        }
    ]


def test_nodes_added_later_leave_a_jobs_fingerprint_alone() -> None:
    """`passes: null` and `progress` (how to run) are not what a job computes: a job composed
    with them is the job recorded before they existed, and reuses its trained weights."""
    from omegaconf import OmegaConf

    from medvqa.record import config_fingerprint

    before = {"seed": 0, "peft": {"name": "lora", "r": 8}}
    after = {**before, "passes": None, "progress": {"when": "always", "every_s": 5.0}}
    same = config_fingerprint(OmegaConf.create(before))
    assert config_fingerprint(OmegaConf.create(after)) == same
    chosen = {**after, "passes": {"region_occlusion": True}}
    assert config_fingerprint(OmegaConf.create(chosen)) != same
