"""``attnzoo viz``: the flags of :func:`attnzoo.viz.draw_attention_maps`, and the paths it wrote."""

from __future__ import annotations

import argparse

from attnzoo.cli.command import check_out_dir, check_text, path_argument
from attnzoo.distributed import resolve_device
from attnzoo.viz import draw_attention_maps


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "path", type=path_argument, help="run directory (its latest checkpoint) or checkpoint directory"
    )
    parser.add_argument(
        "--prompt",
        default="ROMEO: But soft, what light through yonder window breaks?",
        help="text the model reads; one row and one column per token (default: a line of Romeo and Juliet)",
    )
    parser.add_argument(
        "--out",
        type=path_argument,
        metavar="DIR",
        default=None,
        help="directory for the PNGs (default: PATH/attention)",
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")


def run(args: argparse.Namespace) -> int:
    check_out_dir(args.out)
    check_text("--prompt", args.prompt)
    resolve_device(args.device)
    paths = draw_attention_maps(args.path, args.prompt, args.out, args.device)
    print(f"wrote {len(paths)} attention heatmap(s), one PNG per layer with a panel per head, into {paths[0].parent}:")
    for path in paths:
        print(f"  {path}")
    return 0
