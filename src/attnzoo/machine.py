"""How busy the CPU is, and what a command does about it.

On a machine that other work shares, two OpenMP threads collapse when one core is taken (each waits for the
other at every parallel region), and a throughput measured then says more about the neighbours than about the
model. So the commands that compute for long (compare, train, eval, bench) take as many torch threads as there
are free cores, read from the load average, and a measurement keeps the load average it was taken under: one
taken while more work was runnable than there are cores is marked unreliable.

And what the CPU computes natively: bf16 autocast on a CPU without native bf16 is emulated, and many times slower
than float32, so a run that asks for it there is warned (:func:`emulated_bf16`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

THREADS_VARIABLE = "OMP_NUM_THREADS"

CPUINFO = Path("/proc/cpuinfo")
# The flags (Linux's names) of the CPUs that compute bf16 natively: AVX512-BF16 and AMX on x86, the BF16 extension
# on Arm. AVX-512 alone is not one of them.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
# What emulation costs, as measured (issue 52): fwd + bwd + AdamW, dim 256, 4 layers, 8 heads, 1 thread.
EMULATED_BF16_SLOWDOWN = "13.2x slower than float32 at T=256 on a 2-core AMD EPYC with AVX2"


@dataclass(frozen=True)
class CpuLoad:
    cores: int
    load_average: float  # the 1-minute load average: processes running or waiting for a core

    @classmethod
    def now(cls) -> CpuLoad:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
        return cls(os.cpu_count() or 1, load)

    @property
    def free_cores(self) -> int:
        """Cores the load leaves idle: a core counts as taken once the load average says a whole one is busy (a
        load of 0.7 on 2 cores is usually the fading average of a job that just ended, and halving the threads
        for it doubles a run); all of them where the load cannot be read."""
        if math.isnan(self.load_average):
            return self.cores
        return max(0, min(self.cores, self.cores - math.floor(self.load_average)))


def is_busy(load_average: float | None, cores: int) -> bool:
    """Whether a measurement taken under ``load_average`` shared the CPU: more work runnable than cores."""
    return load_average is not None and not math.isnan(load_average) and load_average > cores


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    reason: str | None  # one line for the terminal where the load made the choice, else None


def choose_threads(load: CpuLoad, requested: str | None = None) -> ThreadChoice:
    """The torch threads to compute with: ``requested`` (``OMP_NUM_THREADS``) when set, else one per free core
    and at least one."""
    if requested:
        if not (requested.isdigit() and int(requested) >= 1):
            raise ValueError(f"{THREADS_VARIABLE}={requested!r} is invalid: must be an integer >= 1")
        return ThreadChoice(int(requested), None)
    threads = max(1, load.free_cores)
    if threads == load.cores:
        return ThreadChoice(threads, None)
    return ThreadChoice(
        threads,
        f"busy machine: {load.cores} cores, load average {load.load_average:.2f}: computing with {threads} torch "
        f"thread(s), not {load.cores} (set {THREADS_VARIABLE} to choose)",
    )


def cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags as Linux lists them (``/proc/cpuinfo``'s "flags" on x86, "Features" on Arm), those
    of its first processor; None where they cannot be read (another OS)."""
    try:
        text = CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return None


def native_bf16() -> bool | None:
    """Whether the CPU computes bf16 natively (:data:`NATIVE_BF16_FLAGS`); None where its flags cannot be read."""
    flags = cpu_flags()
    return None if flags is None else bool(flags & NATIVE_BF16_FLAGS)


def emulated_bf16(device_type: str) -> str | None:
    """The warning for bf16 autocast on ``device_type`` where the CPU emulates bf16; None on another device, on a
    CPU with native bf16, or where that cannot be told."""
    if device_type != "cpu" or native_bf16() is not False:
        return None
    return (
        f"bfloat16 on this CPU is emulated: it has no native bf16 (no AVX512-BF16 or AMX), and a bf16-autocast "
        f"training step measured {EMULATED_BF16_SLOWDOWN} (issue 52); --dtype float32, or auto, computes in float32 "
        "here"
    )


def bf16_support() -> str:
    """What ``attnzoo info`` says of the CPU's bf16."""
    flags = cpu_flags()
    if flags is None:
        return "unknown (the CPU's flags cannot be read here)"
    native = sorted(flags & NATIVE_BF16_FLAGS)
    if native:
        return f"native ({', '.join(native)}): bfloat16 autocast computes in it"
    return (
        f"none (no AVX512-BF16 or AMX): bfloat16 is emulated, a training step measured {EMULATED_BF16_SLOWDOWN}; "
        "'auto' computes in float32 here"
    )
