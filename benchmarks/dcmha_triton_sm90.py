"""What the DCMHA Triton kernels use on an H100, read from the compiler on any machine: no GPU needed (issue 36).

Triton compiles for a target it is not running on. This script compiles each of the three kernels for sm_90a (H100,
H200) at the model shapes the lease script times, in every configuration the autotuner tries there
(``tuning.TUNING`` after ``prune_tiles``), and records what ptxas allocated per thread: registers, spilled
bytes and stack; the shared memory; and the tensor-core instructions in the SASS (HMMA is ``mma.sync``, the
Ampere-style path; HGMMA is Hopper's ``wgmma``). These are the compiler's figures, not a profile: a kernel whose
working set spills waits on local memory, which bounds it, but nothing here is timed.

    python benchmarks/dcmha_triton_sm90.py [--shapes gpu-lm 185m] [--out benchmarks/results/dcmha-triton-sm90.md]
        [--configs tuned | untuned] [--no-cap]

``--no-cap`` leaves ptxas to choose the registers (the evidence for ``register_cap``). Spills compare per program
(a thread's bytes × threads): more warps spill less a thread, not necessarily less in all. Needs Triton (the
``triton`` or ``dev`` extra), whose wheel carries ptxas and cuobjdump.
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

ARCH = 90
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
    shape: str
    kernel: str
    M: int
    R: int
    D: int
    BT: int
    BS: int
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

    @property
    def program_spill_kib(self) -> float:
        """Spill stores of the whole program: a thread's times its threads, what compares configs of other warps."""
        return self.spill_store_bytes * 32 * self.num_warps / 1024


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
    max_stages = tuning.KERNEL_GRID[kernel][1]
    kept = tuning.prune_tiles(tuning.tuning_configs(max_stages), {}, **constants)
    return [
        (constants | c.kwargs, {"num_warps": c.num_warps, "num_stages": c.num_stages, "maxnreg": c.maxnreg})
        for c in kept
    ]


def cuobjdump() -> str:
    return str(Path(op.triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")


@functools.cache
def ptxas() -> tuple[str, str]:
    """(path, release) of the ptxas Triton builds sm_90 cubins with. Triton's accessor has changed shape across
    releases (3.9: get_ptxas(arch) returning a tool with .path; some earlier: get_ptxas() or a (path, version) pair)."""
    from triton.backends.nvidia import compiler

    try:
        found = compiler.get_ptxas(ARCH)
    except TypeError:
        found = compiler.get_ptxas()
    path = found.path if hasattr(found, "path") else found[0]
    version = subprocess.run([path, "--version"], capture_output=True, text=True, check=True).stdout
    release = re.search(r"release ([\d.]+)", version)
    return path, release[1] if release else "?"


def ptxas_report(ptx: str) -> tuple[int, int, int]:
    """(registers, spill store bytes, stack bytes) of ptxas -v on the PTX, with the options Triton's own cubin gets
    (Triton 3.9 adds --regAllocOptLevel=2 for ptxas 13; the caller checks the registers against the cubin's)."""
    path, release = ptxas()
    workaround = ["--regAllocOptLevel=2"] if int(release.split(".")[0]) >= 13 else []
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "kernel.ptx"
        source.write_text(ptx)
        command = [path, "-lineinfo", "-v", *workaround, f"--gpu-name=sm_{ARCH}a", str(source), "-o",
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


def compile_for_sm90(kernel: str, constants: dict[str, Any], options: dict[str, int]) -> Any:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    function = jit.KERNELS_BY_NAME[kernel]
    source = ASTSource(fn=function, signature=signature(function, constants), constexprs=constants)
    return op.triton.compile(source, target=GPUTarget("cuda", ARCH, 32), options=options)


def measure(shape: str, cfg: ModelConfig, configs: str = "tuned", capped: bool = True) -> list[Resources]:
    """Each kernel compiled for sm_90a in each config of the set at this shape; ``capped`` False leaves ptxas to
    choose its registers, as launches did before ``register_cap``."""
    spec = kernel_spec(cfg)
    rows = []
    for kernel in jit.KERNELS_BY_NAME:
        for constants, options in candidates(kernel, spec, cfg.head_dim, configs):
            options = options if capped else options | {"maxnreg": None}
            compiled = compile_for_sm90(kernel, constants, options)
            registers, spills, stack = ptxas_report(compiled.asm["ptx"])
            built_registers, hmma, hgmma = sass_figures(compiled.asm["cubin"])
            if built_registers != registers:  # the spill figures would describe another allocation than Triton's
                raise RuntimeError(f"ptxas -v gave {registers} registers, Triton's cubin has {built_registers}")
            row = Resources(
                shape=shape,
                kernel=kernel,
                **{name: constants[name] for name in ("M", "R", "D", "BT", "BS")},
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
            )
            print(" ".join(table([row]).to_markdown().splitlines()[-1].split()), flush=True)
            rows.append(row)
    return rows


def table(rows: list[Resources]) -> Table:
    header = ["shape", "kernel", "M", "R", "D", "BT = BS", "warps", "stages", "registers (cap)",
              "spill stores (B/thread)", "spill stores (KiB/program)", "stack (B/thread)", "shared KiB",
              "layout conversions", "HMMA", "HGMMA"]  # fmt: skip
    body = [
        [
            r.shape,
            r.kernel,
            str(r.M),
            str(r.R),
            str(r.D),
            str(r.BT),
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
        ]
        for r in rows
    ]
    return Table(header, body)


def summary(rows: list[Resources]) -> Table:
    """Per shape and kernel, over its configs: the least and most spilled, shared memory and layout conversions'
    ranges, and whether any config reached wgmma."""
    groups: dict[tuple[str, str], list[Resources]] = {}
    for row in rows:
        groups.setdefault((row.shape, row.kernel), []).append(row)
    header = ["shape", "kernel", "configs", "least spilled (KiB/program): config", "most spilled (KiB/program)",
              "shared KiB", "layout conversions", "configs with wgmma"]  # fmt: skip
    body = []
    for (shape, kernel), group in groups.items():
        least = min(group, key=lambda r: r.program_spill_kib)
        most = max(r.program_spill_kib for r in group)
        shared = sorted({r.shared_bytes / 1024 for r in group})
        conversions = sorted({r.layout_conversions for r in group})
        stages = f"{least.num_stages} stage{'s' if least.num_stages > 1 else ''}"
        config = f"BT = BS = {least.BT}, {least.num_warps} warps, {stages}"
        body.append(
            [
                shape,
                kernel,
                str(len(group)),
                f"{least.program_spill_kib:,.0f}: {config}",
                f"{most:,.0f}",
                f"{shared[0]:.0f}–{shared[-1]:.0f}",
                f"{conversions[0]}–{conversions[-1]}",
                str(sum(r.hgmma > 0 for r in group)),
            ]
        )
    return Table(header, body)


def toolchain() -> str:
    return f"triton {op.triton.__version__}, ptxas {ptxas()[1]} (sm_{ARCH}a)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES))
    parser.add_argument("--configs", choices=sorted(CONFIG_SETS), default="tuned", help="which configs to compile")
    parser.add_argument("--no-cap", action="store_true", help="leave ptxas to choose the registers (no .maxnreg)")
    parser.add_argument("--out", type=path_argument, default=Path("benchmarks/results/dcmha-triton-sm90.md"))
    args = parser.parse_args(argv)
    if args.out.is_dir():
        parser.error(
            f"--out={args.out} is invalid: it is a directory; name the .md file to write (its .json beside it)"
        )
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
    rows = [row for shape in args.shapes for row in measure(shape, SHAPES[shape], args.configs, not args.no_cap)]
    configs = CONFIG_SETS[args.configs] + (", ptxas choosing the registers (no cap)" if args.no_cap else "")
    header = (
        f"Compiled for an H100 without one: {toolchain()}. DCMHA's defaults (rank 2, one group, pre- and "
        f"post-composition, key-wise), global window, bf16 q/k/v; {configs}. Per thread: registers used (and the "
        f"cap the launch sets), spill stores and stack (local memory); per program: shared memory; layout conversions "
        f"in the TTGIR; HMMA/HGMMA: tensor-core instructions in the SASS (mma.sync / wgmma)."
    )
    markdown = f"{header}\n\n{summary(rows).to_markdown()}\n\nEvery config:\n\n{table(rows).to_markdown()}\n"
    atomic_write_text(args.out, markdown)
    payload = {"toolchain": toolchain(), "rows": [asdict(r) for r in rows]}
    atomic_write_text(args.out.with_suffix(".json"), json.dumps(payload, indent=2))
    print(f"\n{markdown}\nwrote {args.out} and {args.out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
