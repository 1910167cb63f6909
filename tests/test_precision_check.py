"""benchmarks/precision_check.py at the micro preset: both dtypes per seed, and a summary computed from the runs."""

import json

import pytest
from benchmark_scripts import load_benchmark


def test_each_seed_trains_in_both_dtypes_and_the_summary_reads_the_runs(tmp_path, capsys):
    precision_check = load_benchmark("precision_check")
    out = tmp_path / "precision.md"
    assert precision_check.main(["--preset", "micro", "--seeds", "0", "1", "--out", str(out)]) == 0
    runs = json.loads(out.with_suffix(".json").read_text())["runs"]
    assert set(runs) == {"float32", "bfloat16"} and all(set(runs[d]) == {"0", "1"} for d in runs)
    gaps = [runs["bfloat16"][s]["final"] - runs["float32"][s]["final"] for s in ("0", "1")]
    text = out.read_text()
    assert f"per seed: {gaps[0]:+.4f}, {gaps[1]:+.4f}" in text
    assert text.count("| float32 |") == 2 and text.count("| bfloat16 |") == 2
    assert "wrote" in capsys.readouterr().out


def test_one_seed_is_refused_by_name():
    precision_check = load_benchmark("precision_check")
    with pytest.raises(SystemExit):
        precision_check.main(["--seeds", "0"])
