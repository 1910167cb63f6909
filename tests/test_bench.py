import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from attnzoo import ModelConfig, Transformer, bench
from attnzoo.bench import (
    BenchCase,
    BenchResult,
    BenchSweep,
    measure,
    pool_rounds,
    ratio_matrix,
    ratio_table,
    sdpa_kernels,
)
from attnzoo.cli import main
from attnzoo.model import cache_bytes


def test_measure_runs_each_mode_in_a_fresh_process_and_tables_ratios():
    cfg = ModelConfig(vocab_size=32, dim=32, n_layers=1, n_heads=2, max_seq_len=32)
    results = [
        measure(BenchCase("base", cfg, batch_size=2, seq_len=16, mode="train"), repeats=2),
        measure(BenchCase("other", cfg, batch_size=2, seq_len=16, mode="train"), repeats=2),
        measure(BenchCase("base", cfg, batch_size=1, seq_len=8, mode="decode", decode_tokens=4), repeats=2),
        measure(BenchCase("base", cfg, 1, 8, mode="decode-nocache", decode_tokens=4), repeats=2),
    ]
    for r in results:
        assert r.tokens_per_s_min <= r.tokens_per_s <= r.tokens_per_s_max and r.tokens_per_s > 0
        assert len(r.extra["rates"]) == 2 and min(r.extra["rates"]) == r.tokens_per_s_min  # each repeat's rate
        assert r.peak_mem_mb >= 0
    assert results[0].extra["params"] == results[1].extra["params"]
    # Decode with a cache reports the bytes its buffers hold: the formula at T + decoded tokens positions.
    assert results[2].extra["cache_bytes"] == sum(cache_bytes(cfg, 1, 8 + 4, torch.float32))
    assert "cache_bytes" not in results[0].extra and "cache_bytes" not in results[3].extra
    table = ratio_table(results, baseline="base").to_markdown().splitlines()
    assert len(table) == 2 + 4
    assert "| base | train | 16 | 2 |" in table[2] and "| 1.00× |" in table[2]
    assert "| base | decode | 8 | 1 |" in table[4] and "| 1.00× |" in table[4]
    assert f"| {results[2].extra['cache_bytes'] / 2**20:,.2f} |" in table[4] and "| – |" in table[2]
    assert "| base | decode-nocache | 8 | 1 |" in table[5]


def test_bad_case_is_refused():
    cfg = ModelConfig(vocab_size=32, dim=32, n_layers=1, n_heads=2)
    with pytest.raises(ValueError, match="mode='backward'"):
        BenchCase("x", cfg, 1, 8, mode="backward")
    with pytest.raises(ValueError, match="dtype='float16'"):
        BenchCase("x", cfg, 1, 8, dtype="float16")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"variants": ()}, r"variants=\(\) is invalid"),
        ({"variants": ("mha+nope",)}, "nope"),
        ({"seq_lens": (256, 0)}, r"seq_lens=\[256, 0\] is invalid: each must be an integer >= 1"),
        ({"modes": ("train", "backward")}, r"modes=\['train', 'backward'\] is invalid: choose among"),
        ({"dtype": "float16"}, "dtype='float16' is invalid"),
        ({"repeats": 0}, "repeats=0 is invalid: must be an integer >= 1"),
        ({"tokens_per_step": 1.5}, "tokens_per_step=1.5 is invalid"),
        ({"n_heads": 3}, "n_heads=3 is invalid"),
    ],
)
def test_a_bad_sweep_is_refused_before_anything_is_measured(changes, message):
    with pytest.raises(ValueError, match=message):
        BenchSweep(**changes)


def test_bench_command_gives_one_clear_line_for_a_bad_flag(tmp_path, capsys):
    assert main(["bench", "--seq-lens", "0", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err == "attnzoo bench: error: seq_lens=[0] is invalid: each must be an integer >= 1\n"
    assert not any(tmp_path.iterdir())


def test_sdpa_kernel_is_read_from_the_profiler():
    idx = torch.randint(0, 32, (1, 16))
    kernels = {}
    for backend in ("sdpa", "eager"):
        model = Transformer(ModelConfig(vocab_size=32, dim=32, n_layers=1, n_heads=2, attn_backend=backend)).eval()
        kernels[backend] = sdpa_kernels(model, idx)
    assert kernels["sdpa"] == ["flash (CPU)"]
    assert kernels["eager"] == []


@pytest.mark.slow
def test_bench_command_writes_markdown_and_json(tmp_path, monkeypatch):
    # Measured in this process: the test above measures in fresh processes, which here cost 8 torch imports.
    monkeypatch.setattr(bench, "measure", lambda case, *, threads, **kwargs: bench.measure_here(case, **kwargs))
    argv = "--variants mha+rope diff+rope --seq-lens 16 --modes train decode --repeats 1 --dim 32 --n-layers 1"
    argv += " --n-heads 4 --decode-tokens 2 --threads 1"
    assert main(["bench", *argv.split(), "--out", str(tmp_path)]) == 0
    payload = json.loads((tmp_path / "bench.json").read_text())
    assert payload["baseline"] == "mha+rope"
    assert [(r["case"], r["mode"]) for r in payload["results"]] == [
        ("mha+rope", "train"),
        ("diff+rope", "train"),
        ("mha+rope", "decode"),
        ("diff+rope", "decode"),
    ]
    markdown = (tmp_path / "bench.md").read_text()
    assert "speed vs mha+rope (>1 faster)" in markdown and "| diff+rope | train | 16 |" in markdown


def _die_before_reporting(*args):
    os._exit(3)


def test_a_child_that_dies_is_an_error_not_a_hang(monkeypatch):
    import attnzoo.bench as bench

    monkeypatch.setattr(bench, "_child", _die_before_reporting)
    cfg = ModelConfig(vocab_size=32, dim=32, n_layers=1, n_heads=2)
    with pytest.raises(RuntimeError, match="died with exit code 3"):
        measure(BenchCase("x", cfg, 1, 8), repeats=1)


def test_peak_memory_is_the_childs_own_even_under_a_large_parent():
    # A spawned child inherits its parent's resident high-water mark; measured naively, a large parent
    # hides the child's peak (it read 0 MB). The activations of this step need tens of MB.
    ballast = torch.ones(300 * 2**20 // 4)
    ballast += 1
    cfg = ModelConfig(vocab_size=256, dim=128, n_layers=2, n_heads=4, max_seq_len=512)
    result = measure(BenchCase("mha", cfg, 4, 512, "train"), repeats=1)
    assert 10 < result.peak_mem_mb < 300
    del ballast


# A case that never ends, measured until a Ctrl-C; SIGINT raises KeyboardInterrupt even where it was ignored.
MEASURE_UNTIL_CTRL_C = """
import signal
signal.signal(signal.SIGINT, signal.default_int_handler)
from attnzoo import ModelConfig
from attnzoo.bench import BenchCase, measure
case = BenchCase("x", ModelConfig(vocab_size=32, dim=32, n_layers=1, n_heads=2, max_seq_len=32), 2, 16)
try:
    measure(case, repeats=10**9)
except KeyboardInterrupt:
    print("stopped")
"""


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the process ended while we looked
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the case's process through /proc")
def test_ctrl_c_while_a_case_runs_ends_it_without_a_traceback_from_its_process():
    """A Ctrl-C reaches every process of the terminal's group: the case's own printed a multiprocessing traceback."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-c", MEASURE_UNTIL_CTRL_C],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its own process group, as a terminal gives a command
    )
    deadline = time.monotonic() + 120
    while not _children(process.pid) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # into the case's start-up (importing torch) or its measuring: both printed the traceback
    os.killpg(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert out == "stopped\n" and "Traceback" not in err and "KeyboardInterrupt" not in err, err


def _result(case: str, mode: str, seq_len: int, tokens_per_s: float, peak_mem_mb: float) -> BenchResult:
    return BenchResult(case, mode, seq_len, 1, tokens_per_s, tokens_per_s, tokens_per_s, peak_mem_mb)


def test_ratio_matrix_has_one_row_per_case_and_one_column_per_mode_and_length():
    results = [
        _result("base", "train", 256, 1000.0, 100.0),
        _result("fast", "train", 256, 1500.0, 300.0),
        _result("base", "train", 1024, 400.0, 200.0),
        _result("fast", "decode", 1024, 50.0, 10.0),  # no baseline at decode: not a ratio
        _result("base", "decode", 1024, 100.0, 0.0),  # a baseline with no measured rise: no memory ratio
    ]
    table = ratio_matrix(results, baseline="base")
    assert table.header == ["speed / memory vs base", "train T=256", "train T=1024", "decode T=1024"]
    assert table.rows == [
        ["base", "1.00× / 1.00×", "1.00× / 1.00×", "1.00× / –"],
        ["fast", "1.50× / 3.00×", "–", "0.50× / –"],
    ]


def test_pool_rounds_pools_every_rounds_repeats():
    rounds = [
        dataclasses.replace(_result("a", "train", 256, 0.0, 100.0), extra={"rates": [10.0, 30.0], "load_average": 0.5}),
        dataclasses.replace(_result("a", "train", 256, 0.0, 120.0), extra={"rates": [20.0], "load_average": 1.5}),
    ]
    pooled = pool_rounds(rounds)
    assert (pooled.tokens_per_s, pooled.tokens_per_s_min, pooled.tokens_per_s_max) == (20.0, 10.0, 30.0)
    assert pooled.peak_mem_mb == 120.0
    assert pooled.extra["rates"] == [10.0, 30.0, 20.0] and pooled.extra["round_load_averages"] == [0.5, 1.5]
    with pytest.raises(ValueError, match="rounds of one case"):
        pool_rounds([rounds[0], _result("b", "train", 256, 1.0, 1.0)])
