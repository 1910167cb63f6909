"""``attnzoo bench``: the flags of :class:`attnzoo.bench.BenchSweep`, measured by :func:`attnzoo.bench.run_bench`."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch

from attnzoo.bench import DTYPES, MODES, BenchSweep, run_bench
from attnzoo.cli.command import check_out_dir, path_argument
from attnzoo.distributed import resolve_device
from attnzoo.machine import emulated_bf16

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    default = BenchSweep()
    parser.add_argument(
        "--variants",
        nargs="+",
        metavar="SPEC",
        default=list(default.variants),
        help="variant specs ATTENTION[+POSITION][+kvN]; the first is the baseline every ratio refers to "
        f"(default: {' '.join(default.variants)})",
    )
    parser.add_argument(
        "--seq-lens",
        type=int,
        nargs="+",
        metavar="T",
        default=list(default.seq_lens),
        help=f"sequence lengths T (default: {' '.join(map(str, default.seq_lens))})",
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        default=list(default.modes),
        choices=MODES,
        help="train: forward and backward; train+adamw: and an AdamW step; prefill: forward; decode: new tokens one "
        "at a time after T tokens, with a KV cache; decode-nocache: the same, recomputing the prefix "
        f"(default: {' '.join(default.modes)})",
    )
    parser.add_argument(
        "--tokens-per-step",
        type=int,
        metavar="N",
        default=default.tokens_per_step,
        help=f"training and prefill batch = N // T sequences (default: {default.tokens_per_step})",
    )
    parser.add_argument(
        "--decode-tokens",
        type=int,
        metavar="N",
        default=default.decode_tokens,
        help=f"new tokens timed per decode measurement (default: {default.decode_tokens})",
    )
    parser.add_argument(
        "--dim", type=int, default=default.dim, help=f"width of the baseline MHA model (default: {default.dim})"
    )
    parser.add_argument(
        "--n-layers", type=int, default=default.n_layers, help=f"Transformer blocks (default: {default.n_layers})"
    )
    parser.add_argument(
        "--n-heads", type=int, default=default.n_heads, help=f"query heads per layer (default: {default.n_heads})"
    )
    parser.add_argument(
        "--dtype",
        choices=list(DTYPES),
        default=default.dtype,
        help=f"bfloat16 runs under autocast, as training does on CUDA (default: {default.dtype})",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=default.repeats,
        help=f"timed repeats per case, after one warm-up; the median is reported (default: {default.repeats})",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=default.rounds,
        help="measure the case list in turn this many times, each case's repeats spread over the rounds and pooled, "
        f"so a change in the machine's load falls on every case alike (default: {default.rounds})",
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="CPU threads per case (default: one per core the load average leaves free, or OMP_NUM_THREADS)",
    )
    parser.add_argument(
        "--device", default=default.device, help="cpu, cuda or cuda:N (default: cuda where there is one, else cpu)"
    )
    parser.add_argument(
        "--out",
        type=path_argument,
        metavar="DIR",
        default=Path("runs") / "bench",
        help="writes bench.json and bench.md here (default: runs/bench)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (the line per case still prints)")


def run(args: argparse.Namespace) -> int:
    check_out_dir(args.out)
    sweep = BenchSweep(
        variants=tuple(args.variants),
        seq_lens=tuple(args.seq_lens),
        modes=tuple(args.modes),
        tokens_per_step=args.tokens_per_step,
        decode_tokens=args.decode_tokens,
        dim=args.dim,
        n_layers=args.n_layers,
        n_heads=args.n_heads,
        dtype=args.dtype,
        repeats=args.repeats,
        rounds=args.rounds,
        threads=torch.get_num_threads() if args.threads is None else args.threads,  # the CLI chose it from the load
        device=args.device,
    )
    emulated = emulated_bf16(resolve_device(sweep.device).type) if sweep.dtype == "bfloat16" else None
    if emulated is not None:
        logger.warning("warning: %s", emulated)
    run_bench(sweep, args.out, progress=not args.no_progress)
    return 0
