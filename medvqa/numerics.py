"""Portable CPU numerics: the same code trains the same bits on any x86-64 CPU with AVX2.

By default torch picks the CPU's fastest kernels: ATen's AVX2 or AVX-512 code, MKL's
per-CPU paths, oneDNN's, numpy's SIMD and glibc's FMA variants of libm, with a thread per
core. Each sums in its own order, and over a few hundred optimiser steps a last-bit difference
grows into other weights and other answers: the CPU demo printed LoRA 0.798 / 0.592 on a 2-core
Intel Xeon where a 2-core AMD EPYC printed 0.715 / 0.491. With `MEDVQA_NUMERICS=portable`
(`make demo` sets it) every one of those runs a path that does not depend on the CPU, on one
thread:

- ATen's default kernels (`ATEN_CPU_CAPABILITY=default`), MKL's conditional numerical
  reproducibility on its AVX2 branch (`MKL_CBWR=AVX2`: the same bits on every CPU that has
  AVX2, Intel or AMD, with or without AVX-512), numpy's baseline SIMD and glibc's libm without
  its FMA variants: read once when each library loads, so they are set in the environment and
  the process starts again with it (`reexec_if_requested`, before anything imports numpy or
  torch);
- one thread (a reduction splits its work by the thread count) and no oneDNN: set in the
  process (`apply`), and in every process it starts (the environment carries them).

MKL's AVX2 branch trains the tiny model 1.6 times as fast as its `COMPATIBLE` branch did
(docs/offline.md#the-same-figures-on-any-cpu). Two threads were faster still alone, but not
beside other work: OpenMP's spinning threads then ran the demo 9 times slower, and with
passive waiting two threads were no faster than one.
A CPU without AVX2 and FMA runs MKL's own choice instead and prints other figures (`apply`
warns; its record says so).

Checked: the tiny model's probe pre-training (tests/test_tiny_fingerprint.py) gives one
checksum run to run; the slow tests rebuild the shipped tiny model byte for byte and print the
README's demo table on whatever CPU runs them. It costs speed (no SIMD outside MKL, one
thread), so it is for figures that must match elsewhere, not for GPU jobs (CUDA kernels are
not affected by it).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

log = logging.getLogger(__name__)

SWITCH = "MEDVQA_NUMERICS"
PORTABLE = "portable"
NATIVE = "native"
THREADS = 1  # fixed: the figures depend on the count, not on the cores
# The CPU features MKL's AVX2 branch needs (/proc/cpuinfo's flags).
MKL_BRANCH_NEEDS = ("avx2", "fma")
# What the libraries read when they load (they never read it again).
PORTABLE_ENV = {
    "OMP_NUM_THREADS": str(THREADS),
    "MKL_NUM_THREADS": str(THREADS),
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_CBWR": "AVX2",
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
    """The settings read at run time (`THREADS` threads, no oneDNN), where the mode is portable;
    the environment's must be in place already (`reexec_if_requested`), else this refuses."""
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
    lacking_features = [f for f in MKL_BRANCH_NEEDS if f not in _cpu_flags()]
    if lacking_features and _cpu_flags():
        log.warning(
            "%s=portable: this CPU has no %s, so MKL runs its own branch instead of AVX2 and "
            "the figures differ from other CPUs' (the record says so)",
            SWITCH,
            " or ".join(lacking_features),
        )
    import torch

    torch.set_num_threads(THREADS)
    torch.backends.mkldnn.enabled = False


def _cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux's /proc/cpuinfo; empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def state() -> dict[str, Any]:
    """What a run's figures depend on, for its record: the mode, the CPU, the kernels' level,
    the threads, whether oneDNN ran and whether MKL could take its AVX2 branch."""
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
        "mkl_branch_supported": all(f in _cpu_flags() for f in MKL_BRANCH_NEEDS),
    }
