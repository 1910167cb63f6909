"""benchmarks/gpu_speed.py, issue 36's lease script: its CPU dry run records every planned case, and its budget skips
what would overrun (its timings are not tested)."""

import json
import time

import pytest
from benchmark_scripts import load_benchmark

load_benchmark("gpu_speed")  # puts benchmarks/ on sys.path, as running the script does
from gpu import measure, pytest_stage  # noqa: E402
from gpu import speed as gpu_speed  # noqa: E402

PEAK_TFLOPS = 0.05  # a stated peak, so that the dry run computes MFU as a GPU run does


@pytest.mark.slow
def test_the_dry_run_records_every_planned_case_measured_or_skipped_with_a_reason(tmp_path):
    assert gpu_speed.main(["--dry-run", "--out", str(tmp_path), "--peak-tflops", str(PEAK_TFLOPS)]) == 0
    text = (tmp_path / "gpu-speed.md").read_text()
    payload = json.loads((tmp_path / "gpu-speed.json").read_text())
    planned = [case.name for case in gpu_speed.plan_cases(gpu_speed.DRY_RUN_SIZES)]
    assert [case["name"] for case in payload["cases"]] == planned
    assert len(planned) == 34 and payload["meta"]["finished"]
    cases = {case["name"]: case for case in payload["cases"]}
    for name, case in cases.items():
        assert f"| {name} |" in text, name
        if "dcmha-triton" in name:  # the kernel runs on CUDA only: skipped with its own reason, never run eagerly
            assert case["status"] == "skipped" and "runs on CUDA" in case["reason"], case
        else:
            assert case["status"] == "measured", case
    for case in cases.values():
        if case["kind"] == "train" and case["status"] == "measured":
            assert case["tokens_per_s"] > 0 and case["flops_per_token"] > 0
            assert case["mfu"] == pytest.approx(case["flops_per_token"] * case["tokens_per_s"] / (PEAK_TFLOPS * 1e12))
            assert (case["compile_s"] is not None) == (case["mode"] == "compiled")
        if case["kind"] == "decode":
            assert [row["path"] for row in case["rows"]] == ["eager", "compiled"]
    assert cases["gpu-lm dcmha[chunked] eager"]["kernels"] == ["chunked", "chunked"]
    for layout in ("diff-halves", "diff-stacked"):  # Diff's one-call layouts run where they are named
        assert cases[f"gpu-lm diff[{layout}] compiled"]["kernels"] == [layout, layout]
    # The DCMHA layer against flash attention: every path but the Triton kernel's, whose resources are then absent.
    layers = [case for case in payload["cases"] if case["kind"] == "layer"]
    assert [case["name"] for case in layers if case["status"] == "measured"] == [
        "layer mha-flash eager",
        "layer dcmha-pytorch eager",
        "layer mha-flash compiled",
        "layer dcmha-pytorch compiled",
    ]
    assert "not recorded: the kernel's layer case did not run" in text
    assert payload["summary"]["train_speed_vs_mha"]["gpu-lm"]["compiled"]["mha"] == 1.0
    # summary.json: issue 36's figures, each the best measured row of its kind, with the row it came from.
    headline = json.loads((tmp_path / "summary.json").read_text())
    assert (headline["device"], headline["commit"]) == (payload["meta"]["device"], payload["meta"]["commit"])
    speed = payload["summary"]["train_speed_vs_mha"]["gpu-lm"]
    dcmha = max((by[label], f"gpu-lm {label} {mode}") for mode, by in speed.items() for label in by if "dcmha" in label)
    assert headline["dcmha_vs_mha_train_bf16"] == dcmha[0] and headline["sources"][
        "dcmha_vs_mha_train_bf16"
    ].startswith(dcmha[1])
    assert headline["diff_vs_mha_train_bf16"] == max(
        value for by in speed.values() for label, value in by.items() if label.startswith("diff")
    )
    flash_ms = cases["layer mha-flash eager"]["ms_per_step"]
    layer_ratios = [
        flash_ms / case["ms_per_step"] for case in layers if "dcmha" in case["name"] and "ms_per_step" in case
    ]
    assert headline["dcmha_layer_vs_flash_T2048"] == pytest.approx(max(layer_ratios))
    anchor = [case["mfu"] for case in payload["cases"] if case["name"].startswith("nanogpt-124m")]
    large = [case["mfu"] for case in payload["cases"] if case["name"].startswith("185m mha ")]
    assert headline["mha_mfu_nanogpt_124m"] == max(anchor) and headline["mha_mfu_185m"] == max(large)
    # At 185M, DCMHA's chunked path compiled against MHA compiled (its kernel's eager row is skipped on the CPU).
    large_speed = payload["summary"]["train_speed_vs_mha"]["185m"]
    assert headline["dcmha_vs_mha_train_bf16_185m"] == large_speed["compiled"]["dcmha[chunked]"]
    decode = next(row for row in cases["decode mha batch 1"]["rows"] if row["path"] == "compiled")
    assert headline["decode_mha_b1_tok_s_compiled"] == decode["tokens_per_s"] > 0
    assert "| mha | 1.00× | 1.00× |" in text  # the glance table: MHA against itself in both modes
    # The tests ran last, narrowed to a few quick Triton tests on the CPU, and their counts reached both reports.
    tests = payload["meta"]["tests"]
    assert tests["status"] == "measured" and tests["passed"] > 0 and tests["failed"] == 0, tests
    assert headline["tests"] == f"{tests['passed']} passed, 0 failed, {tests['skipped']} skipped"
    assert f'`pytest -m "cuda or triton"`: {headline["tests"]}' in text


def case_named(name):
    return next(case for case in gpu_speed.plan_cases(gpu_speed.DRY_RUN_SIZES) if case.name == name)


def test_a_case_is_skipped_before_it_starts_only_when_a_finished_case_of_its_kind_took_longer_than_is_left():
    mha, diff = case_named("gpu-lm mha compiled"), case_named("gpu-lm diff compiled")
    eager = case_named("gpu-lm mha eager")
    done = [(mha, {"wall_s": 50.0}), (eager, {"wall_s": 500.0})]
    assert "gpu-lm mha compiled took 50 s" in gpu_speed.skip_before_start(diff, 40.0, done)
    assert gpu_speed.skip_before_start(diff, 60.0, done) is None
    assert gpu_speed.skip_before_start(case_named("gpu-lm diff eager"), 60.0, done) is not None
    assert gpu_speed.skip_before_start(case_named("decode mha batch 1"), 60.0, done) is None  # nothing like it ran
    assert gpu_speed.skip_before_start(diff, 0.0, []) == "the budget was spent before it"


def test_a_training_case_that_cannot_fit_one_timed_round_is_skipped_after_its_first_steps():
    record = measure.run_training(case_named("gpu-lm mha eager"), gpu_speed.DRY_RUN_SETTINGS, time.perf_counter())
    assert record["status"] == "skipped" and record["reason"].startswith("would overrun the budget")
    assert record["first_step_s"] > 0 and "tokens_per_s" not in record


def test_the_peak_is_the_devices_dense_bf16_rate_or_none():
    assert gpu_speed.device_peak("NVIDIA H100 80GB HBM3", None)[0] == 989.5
    assert gpu_speed.device_peak("NVIDIA H100 PCIe", None)[0] == 756.5
    assert gpu_speed.device_peak("NVIDIA H200", None)[0] == 989.5
    assert gpu_speed.device_peak("NVIDIA A100-SXM4-80GB", None)[0] is None
    assert gpu_speed.device_peak("NVIDIA A100-SXM4-80GB", 312.0) == (312.0, "given by --peak-tflops")


def test_a_case_still_running_past_its_budget_and_the_grace_is_stopped():
    worker = gpu_speed.Worker(gpu_speed.DRY_RUN_SETTINGS)
    try:
        assert worker.run(case_named("decode dcmha batch 16"), 0.5 - gpu_speed.GRACE_S) is None
        assert not worker.process.is_alive()
    finally:
        worker.stop()


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="2" tests="7">
<testcase classname="tests.test_a" name="test_ok"/>
<testcase classname="tests.test_a" name="test_bad"><failure message="assert 1 == 2"/></testcase>
<testcase classname="tests.test_b" name="test_broken[cuda]"><error message="fixture"/></testcase>
<testcase classname="tests.test_b" name="test_skip"><skipped message="needs a CUDA device"/></testcase>
</testsuite></testsuites>
"""


def test_the_tests_counts_come_from_pytests_junit_file_with_every_failed_test_named(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    assert pytest_stage.kit.junit_counts(junit) == {
        "passed": 3,
        "failed": 2,
        "skipped": 2,
        "failed_tests": ["tests.test_a::test_bad", "tests.test_b::test_broken[cuda]"],
    }


def test_the_tests_are_skipped_with_too_little_budget_and_stopped_when_it_runs_out(tmp_path, monkeypatch):
    settings = gpu_speed.DRY_RUN_SETTINGS
    skipped = gpu_speed.run_tests(tmp_path, settings, pytest_stage.MIN_TESTS_S - 1)
    assert skipped["status"] == "skipped" and "under 30" in skipped["reason"]
    monkeypatch.setattr(pytest_stage, "MIN_TESTS_S", 0.0)
    stopped = gpu_speed.run_tests(tmp_path, settings, 0.01)  # no interpreter starts in 10 ms
    assert stopped["status"] == "cut off" and "ran out" in stopped["reason"]


def test_the_kernels_tuning_and_resources_are_logged_and_rendered(monkeypatch):
    """Triton calls the listener after each tuning; the log keeps the kernel, the shape, the choice and each config's
    median time (do_bench's first quantile), and the report prints it under each compiled variant's registers, spills
    and shared memory (bench_dcmha_triton, which both benchmarks use)."""
    triton = pytest.importorskip("triton")
    bench = measure.bench_dcmha_triton
    monkeypatch.setattr(bench, "TUNING_LOG", [])
    fast = triton.Config({"BT": 32, "BS": 32}, num_warps=4, num_stages=1)
    slow = triton.Config({"BT": 16, "BS": 16}, num_warps=8, num_stages=3)

    def _forward_kernel():
        pass

    bench.record_tuning(
        fn=_forward_kernel,
        key=(2048, 16, "torch.bfloat16"),
        best_config=fast,
        configs_timings={fast: [1.5, 1.4, 1.6], slow: [2.5, 2.4, 2.6]},
        duration=3.0,
        cache_hit=False,
    )
    (row,) = bench.TUNING_LOG
    assert row["kernel"] == "forward_kernel" and row["key"] == ["2048", "16", "torch.bfloat16"]
    assert row["chosen"] == str(fast) and row["timed_ms"] == {str(fast): 1.5, str(slow): 2.5}
    variant = {"kernel": "forward_kernel", "M": 16, "R": 2, "D": 64, "BT": 32, "BS": 32, "num_warps": 4,
               "num_stages": 1, "registers": 255, "spills": 1024, "shared_bytes": 49152}  # fmt: skip
    text = "\n".join(bench.kernel_report_lines({"triton_kernels": [variant], "triton_tuning": bench.TUNING_LOG}))
    assert "| forward_kernel | 16 | 2 | 64 | 32 | 32 | 4 | 1 | 255 | 1024 | 48.0 |" in text
    assert (
        f"- autotuned forward_kernel at (2048, 16, torch.bfloat16): {fast}; timed (ms): {fast} 1.5, {slow} 2.5" in text
    )
    unread = bench.kernel_report_lines(
        {"triton_kernels_error": "AttributeError: x", "triton_tuning": [], "untunable": ["backward_key"]}
    )
    assert "not read: AttributeError: x" in unread
    assert "- tuning failed, so these ran untuned: backward_key (the warning names why)" in unread


def refused(monkeypatch, capsys, *flags: str) -> str:
    """The one line ``main`` exits with: before any case runs or any report is written."""

    def no_work(*args, **kwargs):
        raise AssertionError("a report was written before the flags were checked")

    monkeypatch.setattr(gpu_speed, "write_report", no_work)
    with pytest.raises(SystemExit) as stop:
        gpu_speed.main(["--dry-run", *flags])
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
    return line


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--budget-s", "nan"], "--budget-s=nan is invalid: must be a finite number of seconds > 0"),
        (["--budget-s", "inf"], "--budget-s=inf is invalid: must be a finite number of seconds > 0"),
        (["--peak-tflops", "nan"], "--peak-tflops=nan is invalid: must be a finite number > 0"),
        (["--peak-tflops", "0"], "--peak-tflops=0.0 is invalid: must be a finite number > 0"),
        (["--out", ""], "argument --out: the path is empty"),
        (
            ["--out", "/proc/attnzoo-report"],
            "--out=/proc/attnzoo-report is invalid: cannot write there (No such file or directory)",
        ),
    ],
)
def test_a_bad_flag_is_one_line_before_any_work(monkeypatch, capsys, flags, said):
    """NaN and inf budgets failed every case after two minutes without naming the flag; NaN peaks were accepted;
    --out '' wrote into the current directory and /proc ended in a traceback."""
    assert said in refused(monkeypatch, capsys, *flags)


def test_an_out_that_is_a_file_is_refused_and_left_alone(tmp_path, monkeypatch, capsys):
    """It ended in FileExistsError after the run had started."""
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    line = refused(monkeypatch, capsys, "--out", str(notes))
    assert f"--out={notes} is invalid: it is a file, not a directory" in line
    assert notes.read_text() == "mine\n"
