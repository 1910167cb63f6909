"""Which kernel a mechanism runs first on CUDA, as the lease script (``benchmarks/gpu_speed.py``) timed it.

For DCMHA and Diff more than one kernel computes a CUDA training step, and only a GPU can say which is fastest:
DCMHA's Triton kernel or its chunked PyTorch path (eager, or compiled with the model), Diff's two SDPA calls or its
one-call layouts ``diff-halves`` and ``diff-stacked``. The lease times each of them at the gpu-lm size, eager and
compiled, and ``benchmarks/gpu_speed.py --write-routes`` turns its ``summary.json`` into ``cuda_routes.json`` beside
this module by :func:`decide_route`, one rule for every mechanism and mode. The dispatcher reads that file
(:func:`cuda_routes`) and tries the routed kernel first on CUDA, for fresh sequences (the calls the lease timed) in
the mode it was measured in; every other call, and every call where the file is absent or a mode undecided, runs the
mechanism's own order (``Attention.kernels``), today's default.

ALiBi has no entry: on CUDA its one kernel is SDPA with its bias (``alibi-flash`` is the CPU's), so the lease has
nothing to time against it. A new CUDA kernel joins a mechanism's :data:`CANDIDATES` and the lease's cases.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROUTES_FILE = Path(__file__).with_name("cuda_routes.json")
MODES = ("eager", "compiled")
# How much shorter a training step must be for a less simple kernel to be routed first: 5% of the faster step.
MARGIN = 0.05
RULE = (
    "per mechanism and mode, once every candidate was timed at the gpu-lm size: the fastest candidate, unless a "
    f"simpler one's training step is within {MARGIN:.0%} of its step, then the simplest such; else undecided"
)


@dataclass(frozen=True)
class Candidates:
    """The kernels a lease times for a mechanism's CUDA training step, the simplest first, and the one its own
    order (``Attention.kernels``) runs there, which stays first where nothing is decided."""

    kernels: tuple[str, ...]
    default: str


CANDIDATES = {
    "dcmha": Candidates(("chunked", "dcmha-triton"), default="dcmha-triton"),
    "diff": Candidates(("sdpa", "diff-halves", "diff-stacked"), default="sdpa"),
}


def decide_route(mechanism: str, speeds: Mapping[str, float]) -> str | None:
    """The kernel to run first for ``mechanism`` in one mode, from ``speeds`` (each candidate's training speed,
    tokens per second or any multiple of it), by :data:`RULE`; None where a candidate was not timed."""
    candidates = CANDIDATES[mechanism].kernels
    if any(speeds.get(kernel) is None for kernel in candidates):
        return None
    fastest = max(candidates, key=lambda kernel: speeds[kernel])
    # A step's time is 1 / speed: within the margin of the fastest step means speed ≥ fastest's / (1 + MARGIN).
    return next(kernel for kernel in candidates if speeds[kernel] * (1 + MARGIN) >= speeds[fastest])


def load_routes(path: Path) -> dict[tuple[str, str], str]:
    """{(mechanism, mode): kernel} for every decided route of a routes file; {} where the file is absent."""
    if not path.is_file():
        return {}
    routes: dict[tuple[str, str], str] = {}
    for mechanism, by_mode in json.loads(path.read_text())["routes"].items():
        for mode, kernel in by_mode.items():
            if kernel is None:
                continue
            allowed = CANDIDATES[mechanism].kernels if mechanism in CANDIDATES else ()
            if mode not in MODES or kernel not in allowed:
                raise ValueError(
                    f"{path}: route {mechanism}/{mode}={kernel!r} is invalid: the modes are {', '.join(MODES)} and "
                    f"the kernels {', '.join(allowed) or 'none (no candidates for ' + mechanism + ')'}"
                )
            routes[mechanism, mode] = kernel
    return routes


@cache
def cuda_routes() -> dict[tuple[str, str], str]:
    """The committed routes (:data:`ROUTES_FILE`), read once."""
    return load_routes(ROUTES_FILE)
