"""``benchmarks/dcmha_triton_sm90.py``: the DCMHA kernels compiled for an H100 or an A100 here, with no GPU, and what
ptxas allocated to them."""

import json
import os
import subprocess
import sys

import pytest
from benchmark_scripts import BENCHMARKS, load_benchmark

pytest.importorskip("triton")

pytestmark = pytest.mark.triton

sm90 = load_benchmark("dcmha_triton_sm90")


@pytest.mark.parametrize("kernel", ["forward", "backward_query", "backward_key"])
def test_each_kernel_argument_gets_the_type_its_launch_passes(kernel):
    """Tensors (the arguments before the strides) are pointers, bf16 for q, k, v and their gradients and fp32 for
    the weights and statistics; sizes such as H, T and G are i32 although upper-case; constants are constexpr."""
    spec = sm90.kernel_spec(sm90.SHAPES["gpu-lm"])
    constants, _ = sm90.candidates(kernel, spec, 64, configs="untuned")[0]
    function = sm90.jit.KERNELS_BY_NAME[kernel]
    types = sm90.signature(function, constants)
    assert list(types) == function.arg_names
    assert types["Q"] == types["K"] == types["V"] == "*bf16" and types["WQ"] == "*fp32"
    assert types["H"] == types["T"] == types["G"] == types["stride_qb"] == "i32" and types["scale"] == "fp32"
    assert {name for name, kind in types.items() if kind == "constexpr"} == set(constants)


def test_the_configs_compiled_are_the_autotuners():
    """At 16 heads per group and rank 2 the tuner times 16-wide tiles only (32 are pruned): the forward every warp
    count, stage and heads a program of its set, the backward kernels theirs (one stage, whole rows a step clamped to
    head_dim 64), each config at the register cap its launch sets; the untuned config is among them."""
    spec = sm90.kernel_spec(sm90.SHAPES["185m"])
    forward = sm90.candidates("forward", spec, 64)
    key = sm90.candidates("backward_key", spec, 64)
    tuning = sm90.tuning
    assert {c["BT"] for c, _ in forward + key} == {16} and {o["num_stages"] for _, o in key} == {1}
    assert len(forward) == sum(tile == 16 for tile, *_ in tuning.FORWARD_TUNING)
    assert {o["num_warps"] for _, o in forward} == {warps for _, warps, *_ in tuning.FORWARD_TUNING}
    assert {c["MC"] for c, _ in forward} == set(tuning.HEADS_PER_PROGRAM)
    assert sorted((c["MC"], c["DF"]) for c, _ in key) == [(1, 16), (1, 64), (4, 16)]
    assert all(o["maxnreg"] == tuning.register_cap(o["num_warps"]) for _, o in forward + key)
    for kernel in ("forward", "backward_key"):
        assert sm90.candidates(kernel, spec, 64, configs="untuned")[0] in sm90.candidates(kernel, spec, 64)


def test_the_untuned_kernels_compile_for_sm90_and_ptxas_figures_come_back(tmp_path):
    """The three kernels at gpu-lm's shape, compiled for sm_80 by Triton without a GPU (in a process where the
    interpreter is off, which the tests' conftest turns on): a row per kernel with ptxas' registers (the script checks
    them against the cubin's), spills, shared memory, tensor-core instructions (every kernel multiplies with tl.dot) and
    the roofline figures. (The committed dumps are sm_90a's and sm_80's: tests/test_dcmha_triton_dumps.py.)"""
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    out = tmp_path / "sm90.md"
    command = [sys.executable, str(BENCHMARKS / "dcmha_triton_sm90.py"), "--configs", "untuned", "--shapes", "gpu-lm",
               "--arch", "sm_80", "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    cfg = sm90.SHAPES["gpu-lm"]
    assert [r["kernel"] for r in rows] == ["forward", "backward_query", "backward_key"]
    for row in rows:
        assert (row["M"], row["R"], row["D"]) == (cfg.n_heads, cfg.attention_opts.rank, cfg.head_dim)
        assert 0 < row["registers"] <= 255 and row["spill_store_bytes"] >= 0 and row["stack_bytes"] >= 0
        assert row["shared_bytes"] > 0 and row["hmma"] + row["hgmma"] > 0 and row["layout_conversions"] > 0
        assert row["arch"] == "sm_80" and row["tile_mflop"] >= row["flash_mflop"] > 0 and row["tile_kib"] > 0
    summary, every = out.read_text().split("Every config:")
    assert "| gpu-lm | forward | 1 |" in summary and "| gpu-lm | forward | 6 | 2 | 64 |" in every


def test_it_refuses_interpreted_kernels(tmp_path):
    env = os.environ | {"TRITON_INTERPRET": "1"}
    command = [sys.executable, str(BENCHMARKS / "dcmha_triton_sm90.py"), "--arch", "sm_90a", "--out",
               str(tmp_path / "x.md")]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "TRITON_INTERPRET=1" in done.stderr and not (tmp_path / "x.md").exists()


def test_an_out_that_is_a_directory_is_refused_before_anything_compiles(tmp_path, monkeypatch, capsys):
    """It ended in IsADirectoryError after every config had compiled."""

    def no_work(*args, **kwargs):
        raise AssertionError("compiled before --out was checked")

    monkeypatch.setattr(sm90, "measure", no_work)
    with pytest.raises(SystemExit) as stop:
        sm90.main(["--shapes", "gpu-lm", "--out", str(tmp_path)])
    assert stop.value.code == 2
    assert f"--out={tmp_path} is invalid: it is a directory; name the .md file to write" in capsys.readouterr().err
