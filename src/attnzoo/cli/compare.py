"""``attnzoo compare``: the flags of :func:`attnzoo.compare.run_compare`."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnzoo.cli.command import Command, check_out_dir
from attnzoo.compare import DEFAULT_VARIANTS, PRESETS, run_compare
from attnzoo.evals import TASKS
from attnzoo.variants import SPEC_FORMAT


def _variant_list(values: list[str]) -> list[str]:
    """``a b`` and ``a,b`` alike."""
    return [spec for value in values for spec in value.split(",") if spec]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    presets = "; ".join(f"{name}: {spec.description}" for name, spec in PRESETS.items())
    parser.add_argument(
        "--preset", choices=list(PRESETS), default="quick", help=f"the budget (default: quick). {presets}"
    )
    parser.add_argument(
        "--out", metavar="DIR", type=Path, help="output directory; run again to resume (default: runs/compare-PRESET)"
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        metavar="SPEC",
        help=f"variants to compare, the first the baseline; each {SPEC_FORMAT} (default: {' '.join(DEFAULT_VARIANTS)})",
    )
    parser.add_argument(
        "--seeds", type=int, metavar="N", help="train each variant with seeds 0..N-1 (default: the preset's)"
    )
    parser.add_argument("--steps", type=int, metavar="N", help="training steps per run (default: the preset's)")
    parser.add_argument(
        "--data", metavar="CORPUS", help="'shakespeare' (default), 'pystdlib', or a path to a text file or directory"
    )
    parser.add_argument(
        "--tasks",
        nargs="*",
        metavar="TASK",
        help=f"synthetic tasks to train from scratch, from {sorted(TASKS)}; none if the flag is given alone "
        "(default: the preset's)",
    )
    parser.add_argument("--device", help="auto, cpu, cuda or cuda:N (default: auto)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (status lines still print)")


def run(args: argparse.Namespace) -> int:
    check_out_dir(args.out)
    if args.seeds is not None and args.seeds < 1:
        raise ValueError(f"--seeds={args.seeds} is invalid: must be >= 1 (and >= 2 for any ranking)")
    result = run_compare(
        args.preset,
        args.out or Path("runs") / f"compare-{args.preset}",
        variants=_variant_list(args.variants) if args.variants else None,
        seeds=range(args.seeds) if args.seeds is not None else None,
        steps=args.steps,
        corpus=args.data,
        tasks=args.tasks,
        device=args.device,
        progress=not args.no_progress,
    )
    # As `attnzoo train` does: a stop by signal is 128 + its number, so scripts can tell it from completion.
    return 128 + result.interrupted_by if result.interrupted_by is not None else 0


COMMAND = Command(
    name="compare",
    summary="train attention variants side by side under one budget and write a report (quick: 5-8 min on 2 CPU cores)",
    example=(
        "attnzoo compare\n"
        "  attnzoo compare --preset standard --out runs/compare-standard\n"
        "  attnzoo compare --variants mha+rope mha+rope+kv1 diff+alibi --seeds 3 --tasks mqar"
    ),
    add_arguments=add_arguments,
    run=run,
)
