"""The CUDA routes a lease decides: ``cuda_routes.json`` (``attnzoo.attention.kernels.routes``) from its
``summary.json``, by the rule written there (:func:`~attnzoo.attention.kernels.routes.decide_route`).

    python benchmarks/gpu_speed.py --routes-from benchmarks/results/gpu-DATE/summary.json

Each mechanism with candidates is decided per mode (eager, compiled) from its gpu-lm training rows, the speed of
each kernel's row against MHA's in the same mode (the same tokens a step, so the ratios order the steps' times):
``dcmha[chunked]`` and ``dcmha[dcmha-triton]``; ``diff`` (its own order: two SDPA calls), ``diff[diff-halves]`` and
``diff[diff-stacked]``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attnzoo.attention.kernels.routes import CANDIDATES, MODES, RULE, decide_route
from attnzoo.io import atomic_write_text

SIZE = "gpu-lm"  # the size every candidate is timed at, eager and compiled


def label_kernel(mechanism: str, label: str) -> str | None:
    """The kernel a training row of ``mechanism`` ran on CUDA: the one it names (``dcmha[chunked]``), or its own
    order's (``diff``); None for another mechanism's row."""
    if label == mechanism:
        return CANDIDATES[mechanism].default
    if label.startswith(f"{mechanism}[") and label.endswith("]"):
        return label[len(mechanism) + 1 : -1]
    return None


def routes_document(summary: dict[str, Any]) -> dict[str, Any]:
    """The routes file's content from a lease's ``summary.json``: the route of each mechanism and mode (None where
    undecided), the speeds it was decided from, the rule, and the lease's device, commit and date."""
    if summary.get("device") in (None, "CPU"):
        raise ValueError(
            f"the summary's device is {summary.get('device')!r}: a dry run's toy timings decide no CUDA route; give "
            "the summary.json of a run on a CUDA device"
        )
    by_mode = summary.get("train_speed_vs_mha", {}).get(SIZE, {})
    speeds: dict[str, dict[str, dict[str, float]]] = {}
    for mechanism in CANDIDATES:
        for mode in MODES:
            rows = by_mode.get(mode, {}).items()
            timed = {kernel: value for label, value in rows if (kernel := label_kernel(mechanism, label)) is not None}
            speeds.setdefault(mechanism, {})[mode] = timed
    return {
        "source": "benchmarks/gpu_speed.py's summary.json",
        "device": summary["device"],
        "commit": summary["commit"],
        "date": summary.get("date"),
        "dtype": summary.get("dtype"),
        "size": SIZE,
        "rule": RULE,
        "routes": {
            mechanism: {mode: decide_route(mechanism, speeds[mechanism][mode]) for mode in MODES}
            for mechanism in CANDIDATES
        },
        "train_speed_vs_mha": speeds,
    }


def write_routes(summary_path: Path, routes_path: Path) -> dict[str, Any]:
    """Write the routes ``summary_path`` decides to ``routes_path``, atomically; the document written."""
    document = routes_document(json.loads(summary_path.read_text()))
    atomic_write_text(routes_path, json.dumps(document, indent=2) + "\n")
    return document


def routes_line(document: dict[str, Any]) -> str:
    decided = [
        f"{mechanism} {mode}: {kernel or 'undecided (its order stays)'}"
        for mechanism, by_mode in document["routes"].items()
        for mode, kernel in by_mode.items()
    ]
    return "; ".join(decided)
