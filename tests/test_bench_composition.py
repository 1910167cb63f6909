"""benchmarks/bench_composition.py refuses bad sizes by name, before it measures (its timings are not tested)."""

import subprocess
import sys

import pytest
from benchmark_scripts import BENCHMARKS


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--heads", "8", "0"], "--heads 8 0 is invalid: must be >= 1"),
        (["--seq-len", "1"], "--seq-len 1 is invalid: must be >= 2"),
        (["--repeats", "0"], "--repeats 0 is invalid: must be >= 1"),
    ],
)
def test_bad_sizes_are_refused(args, message, tmp_path):
    run = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_composition.py"), *args, "--out", str(tmp_path / "x.md")],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and message in run.stderr
    assert not (tmp_path / "x.md").exists()
