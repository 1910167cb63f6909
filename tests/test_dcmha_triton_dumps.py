"""The committed compiler dumps of DCMHA's Triton kernels (``benchmarks/results/dcmha-triton-sm90.json`` and
``-sm80.json``, written by ``benchmarks/dcmha_triton_sm90.py``): at each lease shape, each kernel must have a config the
autotuner times that spills nothing and multiplies on tensor cores, compiled for an H100 (sm_90a) and an A100 (sm_80).
The dumps must also be of the configs the autotuner times today, so that a change of the tuning makes them stale here.
"""

import json
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark

pytest.importorskip("triton")

pytestmark = pytest.mark.triton

sm90 = load_benchmark("dcmha_triton_sm90")
RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
ARCHES = {"sm_90a": "sm90", "sm_80": "sm80"}  # the arch and its dump's file name
CASES = [(arch, shape, kernel) for arch in ARCHES for shape in sm90.SHAPES for kernel in sm90.jit.KERNELS_BY_NAME]


def dump(arch: str) -> dict:
    return json.loads((RESULTS / f"dcmha-triton-{ARCHES[arch]}.json").read_text())


def rows_of(arch: str, shape: str, kernel: str) -> list[dict]:
    return [r for r in dump(arch)["rows"] if (r["arch"], r["shape"], r["kernel"]) == (arch, shape, kernel)]


@pytest.mark.parametrize(("arch", "shape", "kernel"), CASES)
def test_each_kernel_at_each_lease_shape_has_a_clean_config(arch, shape, kernel):
    rows = rows_of(arch, shape, kernel)
    assert rows, f"the {arch} dump has no {kernel} row at {shape}"
    clean = [r for r in rows if r["spill_store_bytes"] == 0 and r["hmma"] + r["hgmma"] > 0]
    least = min(rows, key=lambda r: r["spill_store_bytes"] * r["num_warps"])
    assert clean, f"no config spills nothing on tensor cores; least spilled: {least}"


@pytest.mark.parametrize(("arch", "shape", "kernel"), CASES)
def test_the_dumps_are_of_the_configs_the_autotuner_times_now(arch, shape, kernel):
    """Each dump names the commit it was made at, and compiles exactly the tuner's configs at each shape."""
    assert dump(arch)["commit"] and "with uncommitted changes" not in dump(arch)["commit"]
    spec = sm90.kernel_spec(sm90.SHAPES[shape])
    tuned = sorted(
        (c["BT"], c["MC"], c["DF"], o["num_warps"], o["num_stages"], o["maxnreg"])
        for c, o in sm90.candidates(kernel, spec, sm90.SHAPES[shape].head_dim)
    )
    dumped = sorted(
        (r["BT"], r["MC"], r["DF"], r["num_warps"], r["num_stages"], r["register_cap"])
        for r in rows_of(arch, shape, kernel)
    )
    assert dumped == tuned


def test_the_roofline_of_one_program_a_group_without_post_composition_is_flash_attentions():
    """``tile_cost``'s bookkeeping: a group in one program without post-composition forms q·kᵀ and P·v once per head,
    as flash attention's forward does, and reads what it reads, plus each head's q (read again per key tile here);
    a head a program multiplies the q·kᵀ by the heads."""
    constants = {"M": 8, "MP": 8, "MC": 8, "POST": False, "BT": 16, "BS": 16, "D": 64}
    mflop, flash_mflop, kib, flash_kib = sm90.tile_cost("forward", constants)
    assert mflop == flash_mflop and kib == 1.5 * flash_kib
    one_head, *_ = sm90.tile_cost("forward", constants | {"MC": 1})
    assert one_head == 8 * 8 * 2 * 16 * 16 * 64 / 1e6 + 8 * 2 * 16 * 16 * 64 / 1e6


def test_the_roofline_of_the_backward_without_composition_is_flash_attentions():
    """Without either composition the backward kernels have no stage over the group: a program of the whole group
    forms q·kᵀ and dO·vᵀ once per head and its outputs' matmuls, flash attention's three (dq) and four (dk, dv); with
    both compositions each stage over the group adds two units a head (the pre-mixes one), and the dq kernel's pass
    for D five more."""
    constants = {"M": 8, "MP": 8, "MC": 8, "PRE": False, "POST": False, "BT": 16, "BS": 16, "D": 64}
    for kernel in ("backward_query", "backward_key"):
        mflop, flash_mflop, _, _ = sm90.tile_cost(kernel, constants)
        assert mflop == flash_mflop, kernel
    unit = 2 * 16 * 16 * 64 / 1e6
    composed = constants | {"PRE": True, "POST": True, "MC": 1}
    assert sm90.tile_cost("backward_key", composed)[0] == 8 * (5 * 8 + 4) * unit
    assert sm90.tile_cost("backward_query", composed)[0] == 8 * (10 * 8 + 3) * unit
