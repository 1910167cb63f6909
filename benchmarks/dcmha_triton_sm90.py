"""What the DCMHA Triton kernels use on an H100 or an A100, read from the compiler on any machine: no GPU needed.

Triton compiles for a target it is not running on. This script compiles each of the three kernels for sm_90a (H100,
H200) and sm_80 (A100) at the model shapes the lease script times, in every configuration the autotuner tries there
(``tuning.TUNING`` after ``prune_tiles``), and records what ptxas allocated per thread: registers, spilled
bytes and stack; the shared memory; and the tensor-core instructions in the SASS (HMMA is ``mma.sync``, the
Ampere-style path; HGMMA is Hopper's ``wgmma``). These are the compiler's figures, not a profile: a kernel whose
working set spills waits on local memory, which bounds it, but nothing here is timed.

Beside each config, a roofline estimate of what it costs per (query tile × key tile) of one head group, summed over
the programs that share the tile, against flash attention's kernel of the same role at the same shape: tensor-core
FLOPs (every program recomputes the whole group's scores; see ``tile_cost``) and the bytes of q, k, v and dO it reads.

    python benchmarks/dcmha_triton_sm90.py [--arch sm_90a sm_80] [--shapes gpu-lm 185m]
        [--out benchmarks/results/dcmha-triton-{arch}.md] [--configs tuned | untuned] [--no-cap]

``--out`` names the .md file (its .json beside it), ``{arch}`` standing for sm90 or sm80. ``--no-cap`` leaves ptxas
to choose the registers (the evidence for ``register_cap``). Spills compare per program (a thread's bytes ×
threads): more warps spill less a thread, not necessarily less in all. Needs Triton (the ``triton`` or ``dev``
extra), whose wheel carries ptxas and cuobjdump.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import gpu_speed

from attnzoo import ModelConfig
from attnzoo.attention.kernels.dcmha_triton import jit, op, tuning
from attnzoo.cli.command import path_argument
from attnzoo.io import atomic_write_text
from attnzoo.tables import Table
from attnzoo.variants import Variant, matched_configs

REPO = Path(__file__).resolve().parents[1]
ARCHES = {"sm_90a": 90, "sm_80": 80}  # --arch: the compute capability Triton compiles for
# DCMHA as the lease script (benchmarks/gpu_speed.py) trains it, matched to MHA at the gpu-lm size (6 heads) and at
# the 185M size (16 heads, as its layer bench).
SHAPES: dict[str, ModelConfig] = {
    name: matched_configs([Variant("dcmha", "rope")], size)["dcmha+rope"]
    for name, size in (("gpu-lm", gpu_speed.GPU_SIZES.lm), ("185m", gpu_speed.GPU_SIZES.large))
}
TRAINING_TENSORS = {"Q", "K", "V", "DO", "OUT", "DQ"}  # bf16 as training runs; the rest (weights, statistics) fp32
PTXAS_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
PTXAS_REGISTERS = re.compile(r"Used (\d+) registers")


@dataclass(frozen=True)
class Resources:
    arch: str
    shape: str
    kernel: str
    M: int
    R: int
    D: int
    BT: int
    BS: int
    MC: int  # heads whose output one program accumulates
    DF: int  # features of q·kᵀ and dO·vᵀ a step
    num_warps: int
    num_stages: int
    register_cap: int  # per thread, the .maxnreg the launch passes (tuning.register_cap); 0: none
    registers: int  # per thread, used
    spill_store_bytes: int  # per thread
    stack_bytes: int  # per thread: spills and local arrays, in local memory
    shared_bytes: int
    layout_conversions: int  # ttg.convert_layout operations in the TTGIR
    hmma: int  # tensor-core instructions in the SASS: mma.sync (HMMA) and wgmma (HGMMA)
    hgmma: int
    tile_mflop: float  # tensor-core work per (query tile × key tile) of a group, all programs (tile_cost)
    flash_mflop: float
    tile_kib: float  # q, k, v, dO read per (query tile × key tile) of a group, all programs
    flash_kib: float

    @property
    def clean(self) -> bool:
        """Nothing spilled, and the matmuls on tensor cores."""
        return self.spill_store_bytes == 0 and self.hmma + self.hgmma > 0

    @property
    def program_spill_kib(self) -> float:
        """Spill stores of the whole program: a thread's times its threads, what compares configs of other warps."""
        return self.spill_store_bytes * 32 * self.num_warps / 1024


def tile_cost(kernel: str, constants: dict[str, Any]) -> tuple[float, float, float, float]:
    """(MFLOP, flash attention's MFLOP, KiB, flash attention's KiB) per (query tile × key tile) of one group, summed
    over the MP/MC programs that each recompute the group's scores; bf16 operands. A unit is one head's BT×BS×D
    matmul, and reads two heads' tiles of q, k, v or dO (an output's matmul one).

    The forward's programs each form every head's q·kᵀ (twice with post-composition: statistics, then
    probabilities), then the own MC heads' P'·v. The backward kernels go over the group's heads a chunk at a time in
    stages (jit._chunk_tile), recomputing each head's q·kᵀ per stage: the pre-mixes (q·kᵀ), the post-mixes (q·kᵀ and
    dO·vᵀ), the pre-mixes of dZ (both again), then the own heads (both, and dS·k, or dSᵀ·q and P'ᵀ·dO); the dq kernel
    with post-composition finds D first (pre-mixes, post-mixes, and both once more). Flash attention per head:
    forward q·kᵀ, P·v reading k, v; its dq kernel q·kᵀ, dO·vᵀ, dS·k reading k, v; its dk/dv kernel q·kᵀ, dO·vᵀ,
    Pᵀ·dO, dSᵀ·q reading q, dO."""
    heads, own, group = constants["MP"], constants["MC"], constants["M"]
    pre, post = int(constants.get("PRE", True)), int(constants["POST"])
    programs = heads // own
    outputs = {"forward": 1, "backward_query": 1, "backward_key": 2}[kernel]
    if kernel == "forward":
        scores = (1 + post) * heads
    else:
        stages = pre + 2 * post + 2 * pre  # q·kᵀ and dO·vᵀ per head in each stage over the group
        delta = post * (pre + 2 * post + 2) if kernel == "backward_query" else 0
        scores = (stages + delta) * heads + 2 * own
    units, rows = scores + outputs * own, 2 * scores + outputs * own
    flash_units, flash_rows = {"forward": (2, 2), "backward_query": (3, 2), "backward_key": (4, 2)}[kernel]
    unit_flop = 2 * constants["BT"] * constants["BS"] * constants["D"]
    row_bytes = 2 * constants["BT"] * constants["D"]  # BT = BS: one head's tile of q, k, v or dO
    return (programs * units * unit_flop / 1e6, flash_units * group * unit_flop / 1e6,
            programs * rows * row_bytes / 1024, flash_rows * group * row_bytes / 1024)  # fmt: skip


def kernel_spec(cfg: ModelConfig) -> op.KernelSpec:
    """The spec ``dcmha_attention`` builds for a layer of this config (global window)."""
    opts = cfg.attention_opts
    return op.KernelSpec(
        num_groups=opts.num_groups,
        heads_per_group=cfg.n_heads // opts.num_groups,
        rank=opts.rank,
        pre=opts.pre_compose,
        post=opts.post_compose,
        key_wise=not opts.query_wise,
        window=None,
        scale=cfg.head_dim**-0.5,
    )


def signature(function: Any, constants: dict[str, Any]) -> dict[str, str]:
    """Triton's type of each argument: bf16 or fp32 pointers (every kernel takes its tensors first, then strides),
    i32 sizes and strides, the fp32 scale."""
    tensors = function.arg_names[: function.arg_names.index("stride_qb")]
    types = {}
    for name in function.arg_names:
        if name in constants:
            types[name] = "constexpr"
        elif name == "scale":
            types[name] = "fp32"
        elif name in tensors:
            types[name] = "*bf16" if name in TRAINING_TENSORS else "*fp32"
        else:
            types[name] = "i32"
    return types


CONFIG_SETS = {"tuned": "every config the autotuner times", "untuned": "the config each kernel runs untuned"}


def candidates(
    kernel: str, spec: op.KernelSpec, head_dim: int, configs: str = "tuned"
) -> list[tuple[dict[str, Any], dict[str, int]]]:
    """(constants, compile options) of each config in the set (:data:`CONFIG_SETS`) for this kernel and spec, as the
    kernel's launch passes them (``tuning.untuned_launch`` for the untuned one)."""
    constants, untuned = tuning.untuned_launch(kernel, spec, head_dim)
    constants |= {"PREC": "tf32", "WIDEN": False}
    if configs == "untuned":
        return [(constants, untuned)]
    kept = tuning.prune_tiles(tuning.tuning_configs(kernel), {}, **constants)
    return [
        (constants | c.kwargs, {"num_warps": c.num_warps, "num_stages": c.num_stages, "maxnreg": c.maxnreg})
        for c in kept
    ]


def cuobjdump() -> str:
    return str(Path(op.triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")


@functools.cache
def ptxas(capability: int = 90) -> tuple[str, str]:
    """(path, release) of the ptxas Triton builds cubins of this compute capability with. Triton's accessor has
    changed shape across releases (3.9: get_ptxas(arch) returning a tool with .path; some earlier: get_ptxas() or a
    (path, version) pair)."""
    from triton.backends.nvidia import compiler

    try:
        found = compiler.get_ptxas(capability)
    except TypeError:
        found = compiler.get_ptxas()
    path = found.path if hasattr(found, "path") else found[0]
    version = subprocess.run([path, "--version"], capture_output=True, text=True, check=True).stdout
    release = re.search(r"release ([\d.]+)", version)
    return path, release[1] if release else "?"


def ptxas_report(ptx: str, arch: str = "sm_90a") -> tuple[int, int, int]:
    """(registers, spill store bytes, stack bytes) of ptxas -v on the PTX, with the options Triton's own cubin gets
    (Triton 3.9 adds --regAllocOptLevel=2 for ptxas 13; the caller checks the registers against the cubin's)."""
    path, release = ptxas(ARCHES[arch])
    workaround = ["--regAllocOptLevel=2"] if int(release.split(".")[0]) >= 13 else []
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "kernel.ptx"
        source.write_text(ptx)
        command = [path, "-lineinfo", "-v", *workaround, f"--gpu-name={arch}", str(source), "-o",
                   str(source.with_suffix(".o"))]  # fmt: skip
        log = subprocess.run(command, capture_output=True, text=True, check=True).stderr
    stack = PTXAS_STACK.search(log)
    registers = PTXAS_REGISTERS.search(log)
    if stack is None or registers is None:
        raise RuntimeError(f"ptxas -v printed no register or stack line:\n{log}")
    return int(registers[1]), int(stack[2]), int(stack[1])


def sass_figures(cubin: bytes) -> tuple[int, int, int]:
    """(registers, HMMA, HGMMA) of the cubin Triton built, from cuobjdump: its register count, and the tensor-core
    instructions in its SASS."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.cubin"
        path.write_bytes(cubin)
        usage = subprocess.run([cuobjdump(), "-res-usage", str(path)], capture_output=True, text=True, check=True)
        sass = subprocess.run([cuobjdump(), "-sass", str(path)], capture_output=True, text=True, check=True)
    registers = re.search(r"REG:(\d+)", usage.stdout)
    if registers is None:
        raise RuntimeError(f"cuobjdump -res-usage named no register count:\n{usage.stdout}")
    return int(registers[1]), len(re.findall(r"\bHMMA\b", sass.stdout)), len(re.findall(r"\bHGMMA\b", sass.stdout))


def compile_for(arch: str, kernel: str, constants: dict[str, Any], options: dict[str, int]) -> Any:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    function = jit.KERNELS_BY_NAME[kernel]
    source = ASTSource(fn=function, signature=signature(function, constants), constexprs=constants)
    return op.triton.compile(source, target=GPUTarget("cuda", ARCHES[arch], 32), options=options)


def measure(
    shape: str, cfg: ModelConfig, configs: str = "tuned", capped: bool = True, arch: str = "sm_90a"
) -> list[Resources]:
    """Each kernel compiled for the arch in each config of the set at this shape; ``capped`` False leaves ptxas to
    choose its registers, as launches did before ``register_cap``."""
    spec = kernel_spec(cfg)
    rows = []
    for kernel in jit.KERNELS_BY_NAME:
        for constants, options in candidates(kernel, spec, cfg.head_dim, configs):
            options = options if capped else options | {"maxnreg": None}
            compiled = compile_for(arch, kernel, constants, options)
            registers, spills, stack = ptxas_report(compiled.asm["ptx"], arch)
            built_registers, hmma, hgmma = sass_figures(compiled.asm["cubin"])
            if built_registers != registers:  # the spill figures would describe another allocation than Triton's
                raise RuntimeError(f"ptxas -v gave {registers} registers, Triton's cubin has {built_registers}")
            mflop, flash_mflop, kib, flash_kib = tile_cost(kernel, constants)
            row = Resources(
                arch=arch,
                shape=shape,
                kernel=kernel,
                **{name: constants[name] for name in ("M", "R", "D", "BT", "BS", "MC", "DF")},
                num_warps=options["num_warps"],
                num_stages=options["num_stages"],
                register_cap=options["maxnreg"] or 0,
                registers=registers,
                spill_store_bytes=spills,
                stack_bytes=stack,
                shared_bytes=compiled.metadata.shared,
                layout_conversions=compiled.asm["ttgir"].count("ttg.convert_layout"),
                hmma=hmma,
                hgmma=hgmma,
                tile_mflop=mflop,
                flash_mflop=flash_mflop,
                tile_kib=kib,
                flash_kib=flash_kib,
            )
            print(" ".join(table([row]).to_markdown().splitlines()[-1].split()), flush=True)
            rows.append(row)
    return rows


def config_name(r: Resources) -> str:
    stages = f"{r.num_stages} stage{'s' if r.num_stages > 1 else ''}"
    heads = f"{r.MC} head{'s' if r.MC > 1 else ''} a program"
    return f"BT = BS = {r.BT}, {heads}, {r.DF} features a step, {r.num_warps} warps, {stages}"


def table(rows: list[Resources]) -> Table:
    header = ["shape", "kernel", "M", "R", "D", "BT = BS", "heads a program", "features a step", "warps", "stages",
              "registers (cap)",
              "spill stores (B/thread)", "spill stores (KiB/program)", "stack (B/thread)", "shared KiB",
              "layout conversions", "HMMA", "HGMMA", "MFLOP/tile (× flash)", "KiB read/tile (× flash)"]  # fmt: skip
    body = [
        [
            r.shape,
            r.kernel,
            str(r.M),
            str(r.R),
            str(r.D),
            str(r.BT),
            str(r.MC),
            str(r.DF),
            str(r.num_warps),
            str(r.num_stages),
            f"{r.registers} ({r.register_cap or 'none'})",
            f"{r.spill_store_bytes:,}",
            f"{r.program_spill_kib:,.0f}",
            f"{r.stack_bytes:,}",
            f"{r.shared_bytes / 1024:.1f}",
            str(r.layout_conversions),
            str(r.hmma),
            str(r.hgmma),
            f"{r.tile_mflop:.1f} ({r.tile_mflop / r.flash_mflop:.1f}×)",
            f"{r.tile_kib:.0f} ({r.tile_kib / r.flash_kib:.1f}×)",
        ]
        for r in rows
    ]
    return Table(header, body)


def summary(rows: list[Resources]) -> Table:
    """Per shape and kernel, over its configs: how many are clean (no spill, tensor cores) and the cheapest of them by
    the roofline (tensor-core FLOPs, then bytes), else the least spilled; shared memory and layout conversions'
    ranges."""
    groups: dict[tuple[str, str], list[Resources]] = {}
    for row in rows:
        groups.setdefault((row.shape, row.kernel), []).append(row)
    header = ["shape", "kernel", "configs", "clean (0 spills, tensor cores)", "cheapest clean, else least spilled",
              "its spills (KiB/program)", "its MFLOP/tile (× flash)", "its KiB read/tile (× flash)", "shared KiB",
              "layout conversions"]  # fmt: skip
    body = []
    for (shape, kernel), group in groups.items():
        clean = [r for r in group if r.clean]
        best = (
            min(clean, key=lambda r: (r.tile_mflop, r.tile_kib))
            if clean
            else min(group, key=lambda r: r.program_spill_kib)
        )
        shared = sorted({r.shared_bytes / 1024 for r in group})
        conversions = sorted({r.layout_conversions for r in group})
        body.append(
            [
                shape,
                kernel,
                str(len(group)),
                str(len(clean)),
                config_name(best),
                f"{best.program_spill_kib:,.0f}",
                f"{best.tile_mflop:.1f} ({best.tile_mflop / best.flash_mflop:.1f}×)",
                f"{best.tile_kib:.0f} ({best.tile_kib / best.flash_kib:.1f}×)",
                f"{shared[0]:.0f}–{shared[-1]:.0f}",
                f"{conversions[0]}–{conversions[-1]}",
            ]
        )
    return Table(header, body)


def commit() -> str:
    """The commit the dump was made at, marked when the kernels or this script differ from it."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True, cwd=REPO).stdout.strip()

    kernels = Path(jit.__file__).parent.relative_to(REPO / "src").as_posix()
    changed = git("status", "--porcelain", "--", f"src/{kernels}", f"benchmarks/{Path(__file__).name}")
    return git("rev-parse", "--short", "HEAD") + (" with uncommitted changes to the kernels" if changed else "")


def toolchain(arch: str) -> str:
    return f"triton {op.triton.__version__}, ptxas {ptxas(ARCHES[arch])[1]} ({arch})"


GPUS = {"sm_90a": "an H100", "sm_80": "an A100"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", nargs="+", choices=list(ARCHES), default=list(ARCHES))
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES))
    parser.add_argument("--configs", choices=sorted(CONFIG_SETS), default="tuned", help="which configs to compile")
    parser.add_argument("--no-cap", action="store_true", help="leave ptxas to choose the registers (no .maxnreg)")
    parser.add_argument("--out", type=path_argument, default=Path("benchmarks/results/dcmha-triton-{arch}.md"))
    args = parser.parse_args(argv)
    if args.out.is_dir():
        parser.error(
            f"--out={args.out} is invalid: it is a directory; name the .md file to write (its .json beside it)"
        )
    if len(args.arch) > 1 and "{arch}" not in str(args.out):
        parser.error(f"--out={args.out} is invalid: with {len(args.arch)} archs it must contain {{arch}}")
    problem = gpu_speed.directory_problem(args.out.parent)
    if problem is not None:
        parser.error(f"--out={args.out} is invalid: its folder {args.out.parent}: {problem}")
    if op.triton is None:
        print('dcmha_triton_sm90: needs Triton: pip install -e ".[triton]" in the clone', file=sys.stderr)
        return 2
    if jit.INTERPRETED:
        print("dcmha_triton_sm90: TRITON_INTERPRET=1 makes the kernels interpreted, which nothing compiles; unset it",
              file=sys.stderr)  # fmt: skip
        return 2
    made_at = commit()
    for arch in args.arch:
        rows = [
            row for shape in args.shapes for row in measure(shape, SHAPES[shape], args.configs, not args.no_cap, arch)
        ]
        configs = CONFIG_SETS[args.configs] + (", ptxas choosing the registers (no cap)" if args.no_cap else "")
        header = (
            f"Compiled for {GPUS[arch]} without one, at commit {made_at}: {toolchain(arch)}. DCMHA's defaults (rank 2, "
            f"one group, pre- and post-composition, key-wise), global window, bf16 q/k/v; {configs}. Per thread: "
            f"registers used (and the cap the launch sets), spill stores and stack (local memory); per program: shared "
            f"memory; layout conversions in the TTGIR; HMMA/HGMMA: tensor-core instructions in the SASS (mma.sync / "
            f"wgmma). Per (query tile × key tile) of a head group, all its programs: tensor-core MFLOP and KiB of q, "
            f"k, v, dO read, against flash attention's kernel of the same role at the same shape (`tile_cost`)."
        )
        markdown = f"{header}\n\n{summary(rows).to_markdown()}\n\nEvery config:\n\n{table(rows).to_markdown()}\n"
        out = Path(str(args.out).replace("{arch}", arch.removesuffix("a").replace("_", "")))
        atomic_write_text(out, markdown)
        payload = {"commit": made_at, "toolchain": toolchain(arch), "rows": [asdict(r) for r in rows]}
        atomic_write_text(out.with_suffix(".json"), json.dumps(payload, indent=2))
        print(f"\n{markdown}\nwrote {out} and {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
