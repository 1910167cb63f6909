"""How the fused DCMHA kernel's Triton programs (``jit.py``) are tiled and launched: the autotuner's candidates and
key, the register cap per thread, and :func:`launch`, which tunes on a GPU and falls back to the untuned tiles."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from attnzoo.attention.kernels.dcmha_triton import jit
from attnzoo.attention.kernels.dcmha_triton.jit import triton

if TYPE_CHECKING:
    from attnzoo.attention.kernels.dcmha_triton.op import KernelSpec

FEATURES_PER_STEP = 16  # DF: q·kᵀ and dO·vᵀ a step of this many features (tl.dot's smallest), untuned

# How each kernel is launched: (the tile axis its grid walks, the most pipelining stages it may use; None: Triton's
# default, 3). The backward kernels walk a runtime loop over their group's head chunks inside each tile loop, which
# Triton does not pipeline; the key kernel also overflowed an H100's shared memory at 6 heads of 64 with the default
# stages, when it held every head's tiles (benchmarks/results/gpu-2026-11-25). One stage each.
KERNEL_GRID = {"forward": ("BT", None), "backward_query": ("BT", 1), "backward_key": ("BS", 1)}
# What the autotuner times on a GPU at the first call of each shape (TUNING_KEY), each config at its register cap
# (register_cap). The forward: square tiles of BT = BS queries and keys, warps, pipelining stages (1, or Triton's
# default 3) and the heads whose output one program accumulates (MC: every program recomputes the whole group's scores,
# so fewer heads a program trade that recomputation for registers), q·kᵀ 16 features a step (DF). The backward kernels
# go over the group's heads MC at a time in every stage (jit._chunk_tile), so a tile's working set is MC heads', not
# the group's: compiled for sm_90a and sm_80 at the lease shapes (benchmarks/results/dcmha-triton-sm90.md), 4 warps
# spilled in every backward config and 8 did not at one head a program, with whole rows a step (DF = D) for the dq
# kernel and 16 features for the key kernel on sm_80. KernelSpec.constants' own choice is among them, so tuning keeps
# it or finds a faster one. Tiles whose rank-R mixing products (RP·MP·BT·BS) exceed MAX_MIX_PRODUCTS are not timed:
# compiled for sm_90a and sm_80 at 6 heads a group and rank 2 (commit 5fab4c4), every 32-wide forward tile spilled
# (28 B to 2.3 KB a thread) and no 16-wide one did.
HEADS_PER_PROGRAM = (1, 4)  # at most: a group of fewer heads runs them all in one program (prune_tiles)
WHOLE_ROWS = 1024  # DF past any head_dim: prune_tiles clamps it to the padded head_dim, one step
FORWARD_TUNING = tuple(
    (tile, warps, stages, heads, FEATURES_PER_STEP)
    for tile in (16, 32)
    for warps in (4, 8)
    for stages in (1, 3)
    for heads in HEADS_PER_PROGRAM
)
BACKWARD_WARPS = 8
BACKWARD_TUNING = tuple(
    (tile, BACKWARD_WARPS, 1, heads, features)
    for tile in (16, 32)
    for heads, features in ((1, FEATURES_PER_STEP), (1, WHOLE_ROWS), (4, FEATURES_PER_STEP))
)
TUNING = {"forward": FORWARD_TUNING, "backward_query": BACKWARD_TUNING, "backward_key": BACKWARD_TUNING}
TUNING_KEY = ["T", "M", "R", "D", "PRE", "POST", "KEY_WISE", "LOCAL"]
MAX_MIX_PRODUCTS = 8192
UNTUNABLE: set[str] = set()  # the kernels whose tuning raised in this process: they run untuned (see launch)


REGISTER_FILE = 65536  # 32-bit registers per streaming multiprocessor, every CUDA GPU from Volta to Hopper


def register_cap(num_warps: int) -> int:
    """Registers a thread may use: its share of the register file when one program has an SM to itself, at most 255
    (PTX's limit). Left to choose, ptxas keeps as few as 32 a thread where a kernel's working set cannot fit anyway,
    for occupancy, and spills the rest to local memory: compiled for sm_90a, 10.9 KB a thread in the untuned forward
    kernel at 16 heads per group (benchmarks/results/dcmha-triton-sm90-uncapped.md), 2.5 KB at this cap
    (dcmha-triton-sm90.md). That occupancy is not there to buy: wherever ptxas chose 32, the program's 64-160 KiB of
    shared memory leaves room for at most three on an H100's 228 KiB. Where it chose 255 anyway, the cap changes its
    spills by -2% to +13%."""
    return min(255, REGISTER_FILE // (32 * num_warps))


def tuning_configs(kernel: str) -> list[Any]:
    return [
        triton.Config(
            {"BT": tile, "BS": tile, "MC": heads, "DF": features},
            num_warps=warps,
            num_stages=stages,
            maxnreg=register_cap(warps),
        )
        for tile, warps, stages, heads, features in TUNING[kernel]
    ]


def prune_tiles(configs: list[Any], named_args: dict[str, Any], **constants: Any) -> list[Any]:
    """The configs whose tiles' mixing products fit :data:`MAX_MIX_PRODUCTS` (the smallest tiles if none do), each
    with at most the group's (padded) heads a program and the (padded) head_dim a step, once."""
    heads = constants["MP"]
    mixes = heads * constants["RP"]
    kept = [c for c in configs if mixes * c.kwargs["BT"] * c.kwargs["BS"] <= MAX_MIX_PRODUCTS]
    smallest = min(c.kwargs["BT"] for c in configs)
    distinct = {}
    for c in kept or [c for c in configs if c.kwargs["BT"] == smallest]:
        kwargs = c.kwargs | {"MC": min(c.kwargs["MC"], heads), "DF": min(c.kwargs["DF"], constants["DP"])}
        key = (*kwargs.values(), c.num_warps, c.num_stages)
        distinct.setdefault(key, triton.Config(kwargs, num_warps=c.num_warps, num_stages=c.num_stages,
                                               maxnreg=c.maxnreg))  # fmt: skip
    return list(distinct.values())


def launch(
    kernel: str, spec: KernelSpec, head_dim: int, seq_len: int, programs: int, *args: Any, **options: Any
) -> None:
    """Runs one kernel over ``programs`` (batch × group) × tiles of the sequence: compiled on a GPU, through its
    autotuner (:data:`TUNED`), unless the spec names a block; interpreted, or with a block named, with the spec's own
    tiles (:meth:`KernelSpec.constants`) and the kernel's stage limit (:data:`KERNEL_GRID`).

    Tuning never fails a call the untuned tiles can run: the autotuner skips a candidate that runs out of registers
    or shared memory, and where tuning raises anything else (a candidate Triton cannot compile), the kernel warns
    once, names the error, and runs its untuned tiles from then on in this process (:data:`UNTUNABLE`). Every launch
    stores all of its outputs, so what a failed tuning wrote is overwritten."""
    tile = KERNEL_GRID[kernel][0]
    const, untuned = untuned_launch(kernel, spec, head_dim)
    if spec.block is None and not jit.INTERPRETED and kernel not in UNTUNABLE:
        fixed = {name: value for name, value in const.items() if name not in ("BT", "BS", "MC", "DF")}
        try:
            grid = lambda meta: (triton.cdiv(seq_len, meta[tile]), programs * meta["MP"] // meta["MC"])  # noqa: E731
            TUNED[kernel][grid](*args, **options, **fixed)
            return
        except Exception as err:
            UNTUNABLE.add(kernel)
            warnings.warn(
                f"autotuning DCMHA's {kernel} kernel failed ({type(err).__name__}: {err}); it runs its untuned "
                f"tiles (BT = BS = {const['BT']}, {untuned['num_warps']} warps) from now on in this process",
                RuntimeWarning,
                stacklevel=2,
            )
    grid = (triton.cdiv(seq_len, const[tile]), programs * const["MP"] // const["MC"])
    jit.KERNELS_BY_NAME[kernel][grid](*args, **options, **const, **untuned)


def untuned_launch(kernel: str, spec: KernelSpec, head_dim: int) -> tuple[dict[str, Any], dict[str, int]]:
    """A kernel's compile-time constants, and the launch options it runs with untuned: the spec's warps (the backward
    kernels' :data:`BACKWARD_WARPS`), the kernel's most stages (Triton's default 3 where unlimited) and the register
    cap."""
    const = spec.constants(head_dim)
    warps = const.pop("num_warps")
    if kernel != "forward":
        warps = BACKWARD_WARPS
    stages = KERNEL_GRID[kernel][1] or 3
    return const, {"num_warps": warps, "num_stages": stages, "maxnreg": register_cap(warps)}


if triton is not None:
    TUNED = {
        name: triton.autotune(
            configs=tuning_configs(name),
            key=TUNING_KEY,
            prune_configs_by={"early_config_prune": prune_tiles},
        )(function)
        for name, function in jit.KERNELS_BY_NAME.items()
    }
