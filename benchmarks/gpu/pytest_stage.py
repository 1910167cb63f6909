"""The tests' stage, last with the budget left: ``pytest -m "cuda or triton"`` as the GPU kit runs it."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from gpu import kit
from gpu.plan import CUT_OFF, ERROR, MEASURED, SKIPPED, Settings

TESTS_GROUP = 5  # pytest -m "cuda or triton": not a case, run after every case with the budget they left
REPOSITORY = Path(__file__).resolve().parents[2]  # where the tests' paths start
MIN_TESTS_S = 30.0  # less left than this, and the tests are not started


def run_tests(out: Path, settings: Settings, seconds: float) -> dict[str, Any]:
    """``pytest -m "cuda or triton"`` in a subprocess, stopped after ``seconds``: its counts and failed tests, from the
    junit file it writes beside the report."""
    if seconds < MIN_TESTS_S:
        return {
            "status": SKIPPED,
            "reason": f"{max(seconds, 0):.0f} s of the budget were left, under {MIN_TESTS_S:.0f}",
        }
    junit = (out / "tests-junit.xml").resolve()
    command = kit.gpu_tests_command(settings.test_args, junit)
    start = time.perf_counter()
    try:
        completed = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired:
        return {"status": CUT_OFF, "reason": f"still running when the budget's {seconds:.0f} s left to it ran out"}
    record: dict[str, Any] = {"command": " ".join(command[1:]), "wall_s": time.perf_counter() - start}
    if completed.returncode not in kit.PYTEST_FINISHED or not junit.is_file():
        tail = (completed.stdout + completed.stderr)[-2000:]
        return {"status": ERROR, "reason": f"pytest exited {completed.returncode}", "output_tail": tail, **record}
    return {"status": MEASURED, "reason": "", **kit.junit_counts(junit), **record}


def tests_line(tests: dict[str, Any] | None) -> str:
    if tests is None:
        return "not asked for (--groups without 5)"
    if tests["status"] != MEASURED:
        return f"{tests['status']}: {tests['reason']}"
    return f"{tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} skipped"
