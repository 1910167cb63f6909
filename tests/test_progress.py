"""Long work shows progress: `attnzoo bench` a bar over its cases with an ETA and a line per case, `attnzoo eval`
a bar over its windows with an ETA; both on stderr, so stdout stays the result."""

import json

import pytest
from training_helpers import TINY_FLAGS, write_text_corpus

from attnzoo import bench
from attnzoo.cli import main

BENCH = ["bench", "--variants", "mha+rope", "diff+rope", "--seq-lens", "16", "32", "--modes", "train"]
BENCH += ["--dim", "32", "--n-layers", "1", "--n-heads", "4", "--repeats", "1"]


@pytest.fixture
def fake_measure(monkeypatch):
    """No timing in tests: each case 'measures' instantly."""
    measured = []

    def measure(case, **kwargs):
        measured.append(case.label)
        rates = {"rates": [900.0, 1000.0, 1100.0]}  # each repeat's rate, as a real measurement keeps them
        return bench.BenchResult(case.label, case.mode, case.seq_len, case.batch_size, 1000.0, 900.0, 1100.0, 10, rates)

    monkeypatch.setattr(bench, "measure", measure)
    return measured


def test_bench_shows_a_bar_over_its_cases_and_a_line_per_case(tmp_path, fake_measure, capsys):
    assert main([*BENCH, "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert len(fake_measure) == 8  # 4 cases in 2 interleaved rounds
    assert "bench: 100%" in err and "8/8" in err and "case" in err  # tqdm: count, rate and ETA
    assert "<" in err  # the elapsed<remaining (ETA) field
    lines = [line for line in out.splitlines() if " T=" in line]
    assert len(lines) == 8 and lines[0].startswith("round 1/2 mha+rope") and lines[4].startswith("round 2/2 mha+rope")


def test_bench_no_progress_keeps_the_lines(tmp_path, fake_measure, capsys):
    assert main([*BENCH, "--out", str(tmp_path), "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert "bench:" not in err and sum(" T=" in line for line in out.splitlines()) == 8


def test_eval_shows_a_bar_over_its_windows_on_stderr(tmp_path, capsys):
    text = write_text_corpus(tmp_path / "text.txt")
    run = tmp_path / "run"
    flags = [*TINY_FLAGS, "--steps", "3", "--eval-interval", "3", "--checkpoint-interval", "3"]
    assert main(["train", "--data", str(text), "--out", str(run), *flags]) == 0
    capsys.readouterr()
    assert main(["eval", str(run), "--json", "--max-windows", "8"]) == 0
    out, err = capsys.readouterr()
    assert "eval: 100%" in err and "8/8" in err and "window" in err
    assert json.loads(out)["tokens"] > 0  # stdout is the result alone
    assert main(["eval", str(run), "--max-windows", "8", "--no-progress"]) == 0
    assert "eval:" not in capsys.readouterr().err
