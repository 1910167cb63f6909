"""A busy machine: the thread count comes from the free cores, and a measurement taken under contention is marked.
The load is injected, never read from this machine: the tests assert nothing about time."""

import math

import pytest

from attnzoo.machine import CpuLoad, choose_threads, is_busy


@pytest.mark.parametrize(
    ("cores", "load", "threads"),
    [(2, 0.2, 2), (2, 0.71, 2), (2, 1.1, 1), (2, 4.5, 1), (8, 2.4, 6), (8, 0.0, 8), (2, math.nan, 2)],
)
def test_one_thread_per_free_core_and_at_least_one(cores, load, threads):
    assert choose_threads(CpuLoad(cores, load)).threads == threads


def test_a_busy_machine_is_said_in_one_line_naming_the_load_and_the_override():
    """Two OpenMP threads collapse when the other core is busy: the issue's compare ran 43 min for 1 min 41 s."""
    choice = choose_threads(CpuLoad(2, 4.52))
    assert choice.reason == (
        "busy machine: 2 cores, load average 4.52: computing with 1 torch thread(s), not 2 (set OMP_NUM_THREADS "
        "to choose)"
    )
    assert choose_threads(CpuLoad(2, 0.3)).reason is None  # nothing to say on a quiet machine


def test_omp_num_threads_wins_over_the_load_and_is_checked():
    assert choose_threads(CpuLoad(2, 5.0), "2") == choose_threads(CpuLoad(2, 0.0), "2")
    assert choose_threads(CpuLoad(2, 5.0), "2").threads == 2
    with pytest.raises(ValueError, match=r"OMP_NUM_THREADS='two' is invalid: must be an integer >= 1"):
        choose_threads(CpuLoad(2, 0.0), "two")


@pytest.mark.parametrize(("load", "busy"), [(1.9, False), (2.0, False), (2.01, True), (None, False), (math.nan, False)])
def test_a_measurement_is_busy_when_more_work_was_runnable_than_cores(load, busy):
    assert is_busy(load, cores=2) is busy


@pytest.mark.parametrize(("load", "threads", "said"), [(4.5, 1, True), (0.1, 2, False)])
def test_train_computes_with_the_free_cores_and_says_so(tmp_path, monkeypatch, capsys, load, threads, said):
    import json

    import torch
    from training_helpers import TINY_FLAGS, write_text_corpus

    from attnzoo import machine
    from attnzoo.cli import main

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(machine.CpuLoad, "now", classmethod(lambda cls: cls(2, load)))
    previous = torch.get_num_threads()
    text = write_text_corpus(tmp_path / "text.txt")
    try:
        assert main(["train", "--data", str(text), "--out", str(tmp_path / "run"), *TINY_FLAGS, "--steps", "1"]) == 0
    finally:
        torch.set_num_threads(previous)
    assert json.loads((tmp_path / "run" / "run.json").read_text())["torch_threads"] == threads
    assert (
        "busy machine: 2 cores, load average 4.50: computing with 1 torch thread(s)" in capsys.readouterr().err
    ) == said


def _bench_result(case, tokens_per_s, load):
    from attnzoo.bench import BenchResult

    return BenchResult(case, "train", 256, 4, tokens_per_s, tokens_per_s * 0.9, tokens_per_s * 1.1, 100.0,
                       {"load_average": load})  # fmt: skip


def test_attnzoo_bench_marks_a_ratio_measured_on_a_busy_machine(monkeypatch):
    """ALiBi '6.07× faster than MHA' at load 4-6 was printed as a result."""
    from attnzoo import bench

    monkeypatch.setattr(bench.os, "cpu_count", lambda: 2)
    quiet = bench.ratio_table([_bench_result("mha", 100.0, 0.8), _bench_result("alibi", 120.0, 1.2)], "mha")
    busy = bench.ratio_table([_bench_result("mha", 100.0, 0.8), _bench_result("alibi", 607.0, 5.3)], "mha")
    (quiet_row,), (busy_row,) = (table.rows[1:] for table in (quiet, busy))
    assert quiet_row[6] == "1.20×" and quiet_row[-1] == "1.20"
    assert busy_row[6] == "6.07× unreliable: busy machine" and busy_row[-1] == "5.30"
    # The baseline's own load counts too: a ratio is as reliable as the worse of its two measurements.
    flipped = bench.ratio_table([_bench_result("mha", 100.0, 5.3), _bench_result("alibi", 120.0, 0.8)], "mha")
    assert flipped.rows[1][6] == "1.20× unreliable: busy machine"


def test_the_compare_report_keeps_each_measurements_load_and_marks_busy_ratios():
    from attnzoo.results.comparison import BenchMeasurement, BenchRecord, BenchTiming

    def measured(variant, rate, load):
        return BenchMeasurement(variant, "train", 64, 16, BenchTiming(rate, rate * 0.9, rate * 1.1, 10.0, load, 2))

    record = BenchRecord({}, "a machine", [measured("mha+rope", 100.0, 1.0), measured("mha+alibi", 607.0, 5.3),
                                           measured("diff+rope", 80.0, 1.5)])  # fmt: skip
    busy = {r.measurement.variant: r.busy for r in record.ratios("mha+rope")}
    assert busy == {"mha+rope": False, "mha+alibi": True, "diff+rope": False}
    old = BenchTiming(100.0, 90.0, 110.0, 10.0)  # a record written before the load was kept
    assert not old.busy


def test_attnzoo_bench_measures_the_cases_in_interleaved_rounds_and_keeps_each_rounds_load(tmp_path, monkeypatch):
    """Back to back, a load that came mid-sweep fell on whichever cases ran then."""
    from attnzoo import bench

    measured, loads = [], iter([0.5, 0.6, 5.1, 0.7])  # the third measurement shares the CPU

    def fake_measure(case, *, repeats, threads, device):
        measured.append((case.label, repeats))
        result = _bench_result(case.label, 100.0, next(loads))
        return bench.BenchResult(case.label, case.mode, case.seq_len, case.batch_size, 100.0, 100.0, 100.0, 1.0,
                                 {**result.extra, "rates": [100.0] * repeats})  # fmt: skip

    monkeypatch.setattr(bench, "measure", fake_measure)
    monkeypatch.setattr(bench.os, "cpu_count", lambda: 2)
    sweep = bench.BenchSweep(variants=("mha+rope", "diff+rope"), seq_lens=(16,), modes=("train",), repeats=3,
                             rounds=2, dim=32, n_layers=1, n_heads=2, threads=1, device="cpu")  # fmt: skip
    results = bench.run_bench(sweep, tmp_path, progress=False)
    assert measured == [("mha+rope", 2), ("diff+rope", 2), ("mha+rope", 2), ("diff+rope", 2)]  # round by round
    assert [r.extra["round_load_averages"] for r in results] == [[0.5, 5.1], [0.6, 0.7]]
    assert "| diff+rope | train | 16 | 256 | 100 | 100–100 | 1.00× unreliable: busy machine |" in (
        (tmp_path / "bench.md").read_text()
    )


# ---------------------------------------------------------------------------------------------------------------
# bf16 on a CPU without it (issue 52): simulated by the flags the CPU lists, never read from this machine

AVX2_EPYC = frozenset({"fpu", "sse4_2", "avx", "avx2", "fma"})  # the AMD EPYC of issue 52
SAPPHIRE_RAPIDS = AVX2_EPYC | {"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
SKYLAKE = AVX2_EPYC | {"avx512f", "avx512bw"}  # AVX-512 alone is no bf16


@pytest.mark.parametrize(
    ("cpuinfo", "native"),
    [
        ("processor\t: 0\nflags\t\t: fpu avx avx2 fma\n", False),
        ("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512bw\n", False),
        ("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n", True),
        ("processor\t: 0\nflags\t\t: fpu avx2 amx_bf16 amx_tile\n", True),
        ("processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n", True),  # Arm's BF16 extension
        ("processor\t: 0\nFeatures\t: fp asimd\n", False),
        ("processor\t: 0\n", None),  # no flags listed: unknown, not "none"
    ],
)
def test_native_bf16_is_read_off_the_cpus_flags(tmp_path, monkeypatch, cpuinfo, native):
    from attnzoo import machine

    (tmp_path / "cpuinfo").write_text(cpuinfo)
    monkeypatch.setattr(machine, "CPUINFO", tmp_path / "cpuinfo")
    assert machine.native_bf16() is native
    monkeypatch.setattr(machine, "CPUINFO", tmp_path / "nowhere")  # not Linux
    assert machine.native_bf16() is None


@pytest.mark.parametrize(
    ("flags", "dtype", "trained", "warned"),
    [
        (AVX2_EPYC, "bfloat16", "bfloat16", True),
        (SKYLAKE, "bfloat16", "bfloat16", True),
        (SAPPHIRE_RAPIDS, "bfloat16", "bfloat16", False),
        (AVX2_EPYC, "auto", "float32", False),
        (AVX2_EPYC, "float32", "float32", False),
    ],
    ids=["avx2-bf16", "avx512-without-bf16", "amx-bf16", "avx2-auto", "avx2-fp32"],
)
def test_bf16_on_a_cpu_without_it_is_warned_once_with_the_measured_slowdown(
    tmp_path, monkeypatch, capsys, flags, dtype, trained, warned
):
    """A bf16-autocast step ran 13.2x slower than fp32 on an AVX2 EPYC, silently; "auto" stays fp32 on a CPU."""
    import json

    from training_helpers import TINY_FLAGS, write_text_corpus

    from attnzoo import machine
    from attnzoo.cli import main

    monkeypatch.setattr(machine, "cpu_flags", lambda: flags)
    text = write_text_corpus(tmp_path / "text.txt")
    flags_ = ["--steps", "2", "--eval-interval", "1", "--dtype", dtype]
    assert main(["train", "--data", str(text), "--out", str(tmp_path / "run"), *TINY_FLAGS, *flags_]) == 0
    assert json.loads((tmp_path / "run" / "run.json").read_text())["dtype"] == trained
    said = [line for line in capsys.readouterr().err.splitlines() if "no native bf16" in line]
    if warned:
        (line,) = said  # once, not per step or evaluation
        assert "13.2x slower than float32" in line and "AVX512-BF16 or AMX" in line and "--dtype float32" in line
    else:
        assert said == []


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (AVX2_EPYC, "\nCPU\n  bf16: none (no AVX512-BF16 or AMX): bfloat16 is emulated"),
        (SAPPHIRE_RAPIDS, "\nCPU\n  bf16: native (amx_bf16, avx512_bf16)"),
        (None, "\nCPU\n  bf16: unknown (the CPU's flags cannot be read here)"),
    ],
)
def test_info_says_whether_the_cpu_has_native_bf16(monkeypatch, capsys, flags, said):
    from attnzoo import machine
    from attnzoo.cli import main

    monkeypatch.setattr(machine, "cpu_flags", lambda: flags)
    assert main(["info", "--dim", "32", "--n-layers", "1", "--n-heads", "2"]) == 0
    assert said in capsys.readouterr().out


def test_eval_and_bench_in_bf16_on_a_cpu_without_it_say_so_once(tmp_path, monkeypatch, capsys):
    from training_helpers import TINY_FLAGS, write_text_corpus

    from attnzoo import machine
    from attnzoo.cli import main

    text = write_text_corpus(tmp_path / "text.txt")
    assert main(["train", "--data", str(text), "--out", str(tmp_path / "run"), *TINY_FLAGS, "--steps", "1"]) == 0
    monkeypatch.setattr(machine, "cpu_flags", lambda: AVX2_EPYC)
    capsys.readouterr()
    evaluate = ["eval", str(tmp_path / "run"), "--device", "cpu", "--dtype", "bfloat16", "--max-windows", "2"]
    assert main([*evaluate, "--no-progress"]) == 0
    bench = ["bench", "--variants", "mha+rope", "--seq-lens", "8", "--modes", "train", "--repeats", "1"]
    bench += ["--rounds", "1", "--dim", "32", "--n-layers", "1", "--n-heads", "2", "--dtype", "bfloat16"]
    assert main([*bench, "--device", "cpu", "--out", str(tmp_path / "bench"), "--no-progress"]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "no native bf16" in line]
    assert len(said) == 2 and all("13.2x slower than float32" in line for line in said)
