"""The fused DCMHA Triton kernel against the PyTorch DCMHA path and MHA with flash attention: forward+backward
time and peak memory of one attention layer at T = 2048 .. 16384 (issue 14, part 3). Needs a CUDA device.

    python benchmarks/bench_dcmha_triton.py [--seq-lens 2048 4096 8192 16384] [--tokens 16384]
        [--window-types G L] [--repeats 5] [--out benchmarks/results/dcmha-triton-<gpu>.md]

One layer, dim 1024, 16 heads of 64, under bf16 autocast as training runs; DCMHA with its defaults (rank 2, one
group of 16, pre- and post-composition, key-wise), global ("G") or local ("L", window 256). A step is the layer's
forward and backward, projections included (the same in all three paths); batch × T = --tokens. The paths:

* ``dcmha-triton``: the layer as it runs on CUDA, through the fused kernel (``attention/kernels/dcmha_triton/``);
* ``dcmha-pytorch``: the same layer with ``attn_backend="chunked"``, i.e. the chunked PyTorch path;
* ``mha-flash``: MHA of the same size, SDPA restricted to the flash backend (causal, no window).

Time: CUDA events around each step, median of --repeats after --warmup steps (the first compiles the kernels).
Peak memory: ``max_memory_allocated`` during one step minus what was allocated before it. A path that runs out of
memory is reported as OOM. The first row of each T also records the largest difference between the two DCMHA
paths' outputs, a sanity check (tests/test_dcmha_triton.py is the real one).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnzoo import ModelConfig
from attnzoo.attention import ATTENTION, AttentionContext
from attnzoo.attention.kernels.dcmha_triton import jit, op, tuning
from attnzoo.io import atomic_write_text
from attnzoo.positions import POSITIONS
from attnzoo.tables import Table

DIM, HEADS, WINDOW = 1024, 16, 256
PATHS = ("dcmha-triton", "dcmha-pytorch", "mha-flash")
TRITON_KERNELS = ("_forward_kernel", "_backward_query_kernel", "_backward_key_kernel")
TILE_CONSTANTS = ("M", "R", "D", "BT", "BS")
TUNING_LOG: list[dict[str, Any]] = []  # every tuning of a DCMHA kernel in this process, by record_tuning


@dataclass
class Row:
    path: str
    window_type: str
    seq_len: int
    batch: int
    ms: float | None  # median per step; None when out of memory
    ms_min: float | None
    ms_max: float | None
    peak_mb: float | None
    max_diff: float | None = None  # dcmha-triton only: largest |output − dcmha-pytorch's output|

    @property
    def tokens_per_s(self) -> float | None:
        return None if self.ms is None else self.batch * self.seq_len / (self.ms / 1e3)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 1")
    return value


def cuda_refusal() -> str | None:
    """Why this benchmark cannot run here, or None."""
    if not torch.cuda.is_available():
        return "needs a CUDA device, and none is visible"
    if op.triton is None:
        return 'needs Triton (Linux): pip install -e ".[triton]" in the clone'
    return None


def layer_config(path: str, window_type: str, seq_len: int, dim: int = DIM, heads: int = HEADS) -> ModelConfig:
    """The one-layer config of a path: DCMHA's defaults with the path's kernel, or MHA of the same size."""
    mechanism = "mha" if path == "mha-flash" else "dcmha"
    options = {"window_type": window_type, "window_size": WINDOW} if mechanism == "dcmha" else {}
    backend = {"dcmha-triton": "dcmha-triton", "dcmha-pytorch": "chunked"}.get(path, "auto")
    return ModelConfig(
        dim=dim,
        n_heads=heads,
        n_layers=1,
        max_seq_len=seq_len,
        attention=mechanism,
        attention_options=options,
        attn_backend=backend,
    )


def make_layer(cfg: ModelConfig, device: str = "cuda") -> tuple[torch.nn.Module, AttentionContext]:
    layer = ATTENTION.get(cfg.attention)(cfg, 0)
    layer.reset_mechanism_parameters()  # DCMHA's dynamic weights start at zero otherwise: no composition at all
    scheme = POSITIONS.get(cfg.position)(cfg, cfg.head_dim).to(device)
    positions = torch.arange(cfg.max_seq_len, device=device)
    ctx = AttentionContext(positions, 0, scheme, scheme.prepare(positions, cfg.max_seq_len))
    return layer.to(device).train(), ctx


def time_steps(step: Callable[[], torch.Tensor], repeats: int, warmup: int) -> tuple[list[float], float]:
    """Milliseconds of each timed step, and the peak memory (MB) one step adds to what is allocated before it."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return times, (torch.cuda.max_memory_allocated() - before) / 2**20


def run_path(
    path: str, window_type: str, seq_len: int, batch: int, repeats: int, warmup: int
) -> tuple[Row, torch.Tensor | None]:
    """One path's row, and its output (fp32) for the sanity check; the same seed gives every path the same
    parameters and input."""
    torch.cuda.empty_cache()
    torch.manual_seed(0)
    layer, ctx = make_layer(layer_config(path, window_type, seq_len))
    x = torch.randn(batch, seq_len, DIM, device="cuda", requires_grad=True)
    grad = torch.randn(batch, seq_len, DIM, device="cuda")

    def step() -> torch.Tensor:
        x.grad = None
        layer.zero_grad(set_to_none=True)
        flash_only = sdpa_kernel([SDPBackend.FLASH_ATTENTION]) if path == "mha-flash" else contextlib.nullcontext()
        with flash_only, torch.autocast("cuda", dtype=torch.bfloat16):
            out = layer(x, ctx)
        out.backward(grad.to(out.dtype))
        return out

    try:
        times, peak = time_steps(step, repeats, warmup)
        out = step().detach().float()
        row = Row(path, window_type, seq_len, batch, statistics.median(times), min(times), max(times), peak)
    except torch.cuda.OutOfMemoryError:
        out = None
        row = Row(path, window_type, seq_len, batch, None, None, None, None)
    return row, out


def record_tuning(*, fn: Any, key: tuple, best_config: Any, configs_timings: dict | None, duration: float | None,
                  cache_hit: bool) -> None:  # fmt: skip
    """Triton's autotuning listener: which config each kernel chose at each shape, and the median milliseconds it
    timed for every config it tried."""
    timings = configs_timings or {}
    TUNING_LOG.append(
        {
            "kernel": fn.__name__.strip("_"),
            "key": [str(part) for part in key],
            "chosen": str(best_config),
            "timed_ms": {str(c): t[0] if isinstance(t, (list, tuple)) else t for c, t in timings.items()},
            "tuning_s": duration,
        }
    )


def listen_to_tuning() -> None:
    """Logs every autotuning of this process in :data:`TUNING_LOG`, where Triton has a listener (3.9 has; the GPU
    image's 3.6 may not, and then nothing is logged)."""
    autotuning = getattr(getattr(op.triton, "knobs", None), "autotuning", None)
    if autotuning is not None and hasattr(autotuning, "listener"):
        autotuning.listener = record_tuning


def triton_resources() -> list[dict[str, Any]]:
    """Each compiled variant of the DCMHA kernels in this process: its tile constants, warps and stages, registers
    per thread, spilled registers and shared memory, as ptxas left them (issue 36's resource dump)."""
    rows = []
    for name in TRITON_KERNELS:
        function = getattr(jit, name)
        for kernel_cache, *_ in function.device_caches.values():
            for compiled in kernel_cache.values():
                compiled._init_handles()  # loads the binary, which fills n_regs and n_spills
                constants = {function.arg_names[key[0]]: value for key, value in compiled.src.constants.items()}
                rows.append(
                    {
                        "kernel": name.strip("_"),
                        **{constant: constants.get(constant) for constant in TILE_CONSTANTS},
                        "num_warps": compiled.metadata.num_warps,
                        "num_stages": compiled.metadata.num_stages,
                        "registers": compiled.n_regs,
                        "spills": compiled.n_spills,
                        "shared_bytes": compiled.metadata.shared,
                    }
                )
    return rows


def kernel_report() -> dict[str, Any]:
    """What the kernels compiled in this process use (``triton_kernels``, or ``triton_kernels_error`` where Triton's
    cache, no public API, could not be read), how they were tuned (``triton_tuning``) and which fell back to their
    untuned tiles after a tuning failed (``untunable``)."""
    try:
        report: dict[str, Any] = {"triton_kernels": triton_resources()}
    except Exception as err:
        report = {"triton_kernels_error": f"{type(err).__name__}: {err}"}
    return report | {"triton_tuning": list(TUNING_LOG), "untunable": sorted(tuning.UNTUNABLE)}


def kernel_report_lines(report: dict[str, Any]) -> list[str]:
    """:func:`kernel_report` in markdown: a table of the compiled variants, then each tuning."""
    lines = ["What each compiled Triton kernel uses (ptxas):", ""]
    if "triton_kernels" in report:
        header = ["kernel", *TILE_CONSTANTS, "warps", "stages", "registers/thread", "spills", "shared KiB"]
        body = [
            [
                row["kernel"],
                *(str(row[constant]) for constant in TILE_CONSTANTS),
                str(row["num_warps"]),
                str(row["num_stages"]),
                str(row["registers"]),
                str(row["spills"]),
                f"{row['shared_bytes'] / 1024:.1f}",
            ]
            for row in report["triton_kernels"]
        ]
        lines.append(Table(header, body).to_markdown())
    else:
        lines.append(f"not read: {report['triton_kernels_error']}")
    lines.append("")
    tuning = report["triton_tuning"]
    if report.get("untunable"):
        lines += [f"- tuning failed, so these ran untuned: {', '.join(report['untunable'])} (the warning names why)"]
    lines += [
        f"- autotuned {row['kernel']} at ({', '.join(row['key'])}): {row['chosen']}; timed (ms): "
        + ", ".join(f"{config} {ms:.3g}" for config, ms in row["timed_ms"].items())
        for row in tuning
    ]
    return lines + ([""] if tuning else [])


def table(rows: list[Row]) -> Table:
    def cell(value: float | None, fmt: str) -> str:
        return "OOM" if value is None else format(value, fmt)

    baseline = {(r.window_type, r.seq_len): r for r in rows if r.path == "mha-flash"}
    body = []
    for r in rows:
        base = baseline.get((r.window_type, r.seq_len))
        speed = None if r.ms is None or base is None or base.ms is None else base.ms / r.ms
        memory = None if r.peak_mb is None or base is None or not base.peak_mb else r.peak_mb / base.peak_mb
        body.append(
            [
                r.path,
                r.window_type,
                str(r.seq_len),
                str(r.batch),
                cell(r.ms, ".2f") + ("" if r.ms is None else f" ({r.ms_min:.2f}–{r.ms_max:.2f})"),
                cell(r.tokens_per_s, ",.0f"),
                cell(r.peak_mb, ",.0f"),
                cell(speed, ".2f") + ("" if speed is None else "×"),
                cell(memory, ".2f") + ("" if memory is None else "×"),
                "–" if r.max_diff is None else f"{r.max_diff:.2e}",
            ]
        )
    header = ["path", "layers", "T", "batch", "ms/step (min–max)", "tok/s", "peak MB"]
    header += ["speed vs mha-flash (>1 faster)", "memory vs mha-flash", "max |Δ| vs dcmha-pytorch"]
    return Table(header, body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lens", type=positive_int, nargs="+", default=[2048, 4096, 8192, 16384])
    parser.add_argument("--tokens", type=positive_int, default=16384, help="batch × T per step (batch at least 1)")
    parser.add_argument("--window-types", nargs="+", choices=["G", "L"], default=["G", "L"])
    parser.add_argument("--repeats", type=positive_int, default=5)
    parser.add_argument("--warmup", type=positive_int, default=2, help="untimed steps first (>= 1: compiles)")
    parser.add_argument("--out", type=Path, default=None, help="markdown table; JSON beside it")
    args = parser.parse_args(argv)
    refusal = cuda_refusal()
    if refusal is not None:
        print(f"bench_dcmha_triton: {refusal}; nothing was measured", file=sys.stderr)
        return 2

    device = torch.cuda.get_device_name()
    listen_to_tuning()
    rows = []
    for window_type in args.window_types:
        for seq_len in args.seq_lens:
            batch = max(1, args.tokens // seq_len)
            results = {path: run_path(path, window_type, seq_len, batch, args.repeats, args.warmup) for path in PATHS}
            fused, reference = results["dcmha-triton"][1], results["dcmha-pytorch"][1]
            if fused is not None and reference is not None:
                results["dcmha-triton"][0].max_diff = (fused - reference).abs().max().item()
            for path in PATHS:
                row = results[path][0]
                rows.append(row)
                took = "OOM" if row.ms is None else f"{row.ms:.2f} ms/step, peak {row.peak_mb:,.0f} MB"
                print(f"{path:13s} {window_type} T={seq_len:6d} batch={batch:3d}  {took}")
    header = (
        f"Machine: {device} (CUDA {torch.version.cuda}), torch {torch.__version__}, triton "
        f"{op.triton.__version__}. One attention layer, dim {DIM}, {HEADS} heads, bf16 autocast, "
        f"forward+backward, {args.tokens} tokens/step."
    )
    kernels = kernel_report()
    markdown = "\n".join([table(rows).to_markdown(), "", *kernel_report_lines(kernels)]).rstrip("\n")
    print(f"\n{header}\n\n{markdown}")
    out = args.out or Path("benchmarks/results") / f"dcmha-triton-{device.lower().replace(' ', '-')}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, f"{header}\n\n{markdown}\n")
    payload = {"header": header, "results": [{**asdict(r), "tokens_per_s": r.tokens_per_s} for r in rows], **kernels}
    atomic_write_text(out.with_suffix(".json"), json.dumps(payload, indent=2))
    print(f"\nwrote {out} and {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
