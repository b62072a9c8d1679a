"""Portable CPU numerics: the same code trains the same bits on any x86-64 CPU.

By default torch picks the CPU's fastest kernels: ATen's AVX2 or AVX-512 code, MKL's
per-CPU paths, oneDNN's, numpy's SIMD and glibc's FMA variants of libm, with a thread per
core. Each sums in its own order, and over a few hundred optimiser steps a last-bit difference
grows into other weights and other answers: the CPU demo printed LoRA 0.798 / 0.592 on a 2-core
Intel Xeon where a 2-core AMD EPYC printed 0.715 / 0.491. With `MEDVQA_NUMERICS=portable`
(`make demo` sets it) every one of those runs its CPU-independent path on one thread:

- ATen's default kernels (`ATEN_CPU_CAPABILITY=default`), MKL's conditional numerical
  reproducibility (`MKL_CBWR=COMPATIBLE`), numpy's baseline SIMD and glibc's libm without its
  FMA variants: read once when each library loads, so they are set in the environment and the
  process starts again with it (`reexec_if_requested`, before anything imports numpy or torch);
- one thread and no oneDNN: set in the process (`apply`), and in every process it starts
  (the environment carries them).

Checked: the tiny model's probe pre-training (tests/test_tiny_fingerprint.py) gives one
checksum on a 2-core AMD EPYC with AVX2 and on one with AVX-512, where the default kernels give
others. It costs speed (no SIMD, one thread), so it is for figures that must match elsewhere,
not for GPU jobs (CUDA kernels are not affected by it).
"""

from __future__ import annotations

import os
import sys
from typing import Any

SWITCH = "MEDVQA_NUMERICS"
PORTABLE = "portable"
NATIVE = "native"
# What the libraries read when they load (they never read it again).
PORTABLE_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_CBWR": "COMPATIBLE",
    "NPY_DISABLE_CPU_FEATURES": "X86_V3 X86_V4 AVX512_ICL AVX512_SPR AVX512F AVX512_SKX",
    "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2,-FMA,-FMA4",
}


class NumericsError(ValueError):
    """`MEDVQA_NUMERICS` holds something other than a mode, or came too late to take effect."""


def mode(environ: dict[str, str] | None = None) -> str:
    """The requested mode: `portable`, or `native` (the default: the CPU's fastest kernels)."""
    value = (os.environ if environ is None else environ).get(SWITCH, NATIVE).strip().lower()
    if value not in (PORTABLE, NATIVE):
        raise NumericsError(
            f"{SWITCH}={value!r}: use {PORTABLE} (the same figures on any x86-64 CPU) or "
            f"{NATIVE} (the CPU's fastest kernels; the default), or unset it"
        )
    return value


def missing(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The portable settings `environ` lacks (name -> the value it needs)."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in PORTABLE_ENV.items() if environ.get(k) != v}


def reexec_if_requested() -> None:
    """With `MEDVQA_NUMERICS=portable`, start this process again with the portable environment
    unless it already has it: call it first thing, before numpy or torch is imported."""
    if mode() != PORTABLE or not missing():
        return
    loaded = [name for name in ("numpy", "torch") if name in sys.modules]
    if loaded:
        raise NumericsError(
            f"{SWITCH}=portable came after {', '.join(loaded)} loaded: set it in the "
            "environment of the command (MEDVQA_NUMERICS=portable python run.py ...)"
        )
    os.execve(sys.executable, list(sys.orig_argv), {**os.environ, **PORTABLE_ENV})


def apply() -> None:
    """The settings read at run time (one thread, no oneDNN), where the mode is portable; the
    environment's must be in place already (`reexec_if_requested`), else this refuses."""
    if mode() != PORTABLE:
        return
    lacking = missing()
    if lacking:
        raise NumericsError(
            f"{SWITCH}=portable but the process started without "
            f"{', '.join(f'{k}={v}' for k, v in lacking.items())}: these are read when the "
            "libraries load, so start the command with MEDVQA_NUMERICS=portable in its "
            "environment (python run.py and medvqa-run then set the rest)"
        )
    import torch

    torch.set_num_threads(int(PORTABLE_ENV["OMP_NUM_THREADS"]))
    torch.backends.mkldnn.enabled = False


def state() -> dict[str, Any]:
    """What a run's figures depend on, for its record: the mode, the CPU, the kernels' level,
    the threads and whether oneDNN ran."""
    import platform

    import torch

    names = []
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    return {
        "mode": mode(),
        "cpu": names[0] if names else platform.processor() or platform.machine(),
        "machine": platform.machine(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "mkldnn": bool(torch.backends.mkldnn.enabled),
        "mkl_cbwr": os.environ.get("MKL_CBWR"),
    }
