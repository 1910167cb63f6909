"""benchmarks/bench_mechanisms.py renders a saved sweep without measuring (its timings are not tested)."""

import dataclasses
import json
import subprocess
import sys

import pytest
from benchmark_scripts import BENCHMARKS

from attnzoo.bench import BenchResult

SCRIPT = BENCHMARKS / "bench_mechanisms.py"


def test_render_rewrites_the_markdown_from_the_json(tmp_path):
    results = [
        BenchResult("mha", "train+adamw", 256, 16, 4000.0, 3900.0, 4100.0, 600.0),
        BenchResult("dcmha", "train+adamw", 256, 16, 1000.0, 990.0, 1010.0, 1200.0),
    ]
    section = {
        "threads": 2,
        "header": "### 2 thread(s)",
        "results": [dataclasses.asdict(r) for r in results],
        "failed": ["- dcmha train+adamw T=8192: died"],
    }
    (tmp_path / "sweep.json").write_text(json.dumps([section]), encoding="utf-8")
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--render", "--out", str(tmp_path / "sweep.md")], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    markdown = (tmp_path / "sweep.md").read_text(encoding="utf-8")
    assert markdown.startswith("### 2 thread(s)\n\n| speed / memory vs mha | train+adamw T=256 |")
    assert "| dcmha | 0.25× / 2.00× |" in markdown  # the ratios at a glance
    assert "| dcmha | train+adamw | 256 | 16 | 1,000 | 990–1,010 | 0.25× |" in markdown  # every row
    assert markdown.endswith("Not measured:\n- dcmha train+adamw T=8192: died\n")


def test_render_without_a_sweep_is_refused(tmp_path):
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--render", "--out", str(tmp_path / "none.md")], capture_output=True, text=True
    )
    assert run.returncode == 2
    assert "none.json, which does not exist: run the sweep first" in run.stderr


@pytest.mark.parametrize("flag", ["--rounds", "--repeats"])
def test_counts_below_one_are_refused(flag, tmp_path):
    run = subprocess.run(
        [sys.executable, str(SCRIPT), flag, "0", "--out", str(tmp_path / "x.md")], capture_output=True, text=True
    )
    assert run.returncode == 2 and f"{flag} 0 is invalid: must be >= 1" in run.stderr
