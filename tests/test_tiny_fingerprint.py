"""The tiny LLaVA's pre-training fingerprint (`medvqa.zoo.tiny.PRETRAIN_FINGERPRINT`).

The tiny model is cached under a key of its parameters; code that changes what its
pre-training computes (a loss that rounds differently, another initialisation) trains other
weights under the same parameters. The fingerprint, the checksum of a short probe
pre-training, is part of the key, and this test recomputes it: such a change fails here until
the new value is recorded, which rebuilds every cached tiny model.

Why the probe runs under portable numerics (medvqa/numerics.py, as `make demo` does): the same
code trains other weights on other CPU kernels, and a few steps already show it. Measured on a
2-core AMD EPYC (AVX2), the probe's 6 steps gave another checksum with 2 threads instead of 1,
with ATEN_CPU_CAPABILITY=default instead of avx2, with MKL_CBWR=COMPATIBLE and with oneDNN off
(each alone; run to run every setting was exact), and the CPU's default kernels give another on
an AVX-512 EPYC. Portable, the probe gave the recorded checksum on both the AVX2 and the
AVX-512 EPYC (2026-11-29), run to run and with glibc's FMA variants on or off, the same at
6227bef (BUILDER_VERSION 2) as now, another with the loss before it (version 1), and another
with the step's loss normaliser one part in 4 million off (the slow test below). So the test
runs on any x86-64 CPU: one that gives another checksum shows a code path the portable
numerics miss.

The checksum also depends on torch, transformers, tokenizers and the rest of the stack, so the
test runs where those are constraints.txt's versions (make test and CI install them) and skips
elsewhere; it is recorded for x86-64 (ARM has other kernels even when portable).
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

from medvqa import numerics
from tests.conftest import CONF, DISTRIBUTED_ENV, ROOT

# The probe: conf/model/tiny.yaml's builder (sizes, seed, rate, data generator) with 8 cases
# instead of 4000 and 6 optimiser steps (the first has no rate: warm-up; the later ones carry a
# rounding change into the weights).
PROBE = {
    "pretrain": {
        "data": {"n_cases": 8},
        "batch_size": 4,
        "epochs": 1,
        "max_steps": 6,
        "progress_bar": False,
    }
}
# `make demo`'s numerics, and no GPU.
PORTABLE = {numerics.SWITCH: numerics.PORTABLE, **numerics.PORTABLE_ENV, "CUDA_VISIBLE_DEVICES": ""}
# The stack whose versions the recorded checksum belongs to (constraints.txt pins them).
STACK = ("torch", "transformers", "tokenizers", "numpy", "pillow", "lightning", "safetensors")
# Set in the probe's environment by the sensitivity test: the step's loss normaliser one part
# in 2**22 larger, a rounding-level change of the kind the fingerprint must not miss.
PERTURB_ENV = "MEDVQA_PROBE_PERTURB"


def probe_checksum(cache: Path) -> str:
    """Build the probe's tiny model into `cache` (in this process) and return its checksum."""
    from medvqa.models.builders.cache import builder_from_yaml
    from medvqa.zoo.tiny import weights_checksum

    numerics.apply()  # one thread, no oneDNN (the environment holds the rest)
    if os.environ.get(PERTURB_ENV):
        from medvqa.training.module import VQAModule

        normalizer = VQAModule._normalizer
        VQAModule._normalizer = lambda self, batch: normalizer(self, batch) * (1 + 2**-22)
    builder = builder_from_yaml(CONF / "model" / "tiny.yaml", cache, PROBE)
    return weights_checksum(builder.build(use_shipped=False))


def _skip_unless_recorded_stack() -> None:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip(f"the fingerprint is recorded for x86-64, not {platform.machine()}")
    pins = dict(
        re.findall(r"^([A-Za-z0-9_.-]+)==([^\s;]+)", (ROOT / "constraints.txt").read_text(), re.M)
    )
    pins = {k.lower(): v for k, v in pins.items()}
    for package in STACK:
        try:
            installed = version(package).split("+")[0]  # torch's "+cpu"
        except PackageNotFoundError:
            installed = None
        if installed != pins.get(package):
            pytest.skip(
                f"{package} {installed} is not constraints.txt's {pins.get(package)}: the "
                "fingerprint is recorded for the pinned stack"
            )


def _run_probe(tmp_path: Path, **extra: str) -> str:
    inherited = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_ENV}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.test_tiny_fingerprint", str(tmp_path / "cache")],
        cwd=ROOT,
        env={**inherited, **PORTABLE, **extra},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_pretraining_gives_the_recorded_fingerprint(tmp_path: Path) -> None:
    from medvqa.zoo.tiny import PRETRAIN_FINGERPRINT

    _skip_unless_recorded_stack()
    checksum = _run_probe(tmp_path)
    assert checksum == PRETRAIN_FINGERPRINT, (
        f"the pre-training's weights changed: the probe now gives {checksum}, "
        f"medvqa/zoo/tiny.py records {PRETRAIN_FINGERPRINT}. If the change is meant, bump "
        "BUILDER_VERSION (its comment says why) and record the new fingerprint: it is part "
        "of the tiny model's cache key, so every cached tiny model is rebuilt, and the README's "
        "demo table (tests/test_demo_table.py) and the shipped build (python -m "
        "medvqa.models.builders.shipped) need re-making. If only this machine differs, the "
        "portable numerics (medvqa/numerics.py) miss a CPU-specific code path."
    )


def test_the_fingerprint_is_part_of_the_cache_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A new fingerprint alone gives a new key (and thus a build), with the same parameters."""
    from hydra.utils import instantiate

    import medvqa.zoo.tiny as tiny
    from tests.conftest import compose

    cfg = compose([], tmp_path)
    before = instantiate(cfg.model.builder).key
    monkeypatch.setattr(tiny, "PRETRAIN_FINGERPRINT", "0" * 16)
    assert instantiate(cfg.model.builder).key != before


@pytest.mark.slow
def test_the_probe_sees_a_rounding_level_change(tmp_path: Path) -> None:
    """The fingerprint can fail: a loss normaliser one part in 2**22 off trains other
    weights within the probe's 6 steps (a check that could not fail would guard nothing)."""
    _skip_unless_recorded_stack()
    plain = _run_probe(tmp_path / "plain")
    assert _run_probe(tmp_path / "perturbed", **{PERTURB_ENV: "1"}) != plain


if __name__ == "__main__":
    print(probe_checksum(Path(sys.argv[1])))
