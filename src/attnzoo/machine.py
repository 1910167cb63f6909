"""How busy the CPU is, and what a command does about it.

On a machine that other work shares, two OpenMP threads collapse when one core is taken (each waits for the
other at every parallel region), and a throughput measured then says more about the neighbours than about the
model. So the commands that compute for long (compare, train, eval, bench) take as many torch threads as there
are free cores, read from the load average, and a measurement keeps the load average it was taken under: one
taken while more work was runnable than there are cores is marked unreliable.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

THREADS_VARIABLE = "OMP_NUM_THREADS"


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
