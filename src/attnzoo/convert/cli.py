"""The ``attnzoo convert`` subcommand: a local HF (or official DCFormer) directory → an attnzoo model directory."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnzoo.convert import CONVERTERS, from_hf
from attnzoo.model import CONFIG_NAME, WEIGHTS_NAME

SUMMARY = "convert a local Hugging Face or official DCFormer model directory into an attnzoo model directory"
EXAMPLE = (
    "attnzoo convert --from-hf ~/models/llama --out models/llama\n"
    "  attnzoo train --init-from models/llama --attention selective --attention-option "
    "position_coefficient=linear --train-only temperature"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--from-hf",
        metavar="DIR",
        type=Path,
        required=True,
        help=f"a directory written by transformers' save_pretrained ({', '.join(sorted(CONVERTERS))}) or an "
        "official DCFormer checkpoint; read locally, nothing is downloaded",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        type=Path,
        required=True,
        help=f"where to write {CONFIG_NAME} and {WEIGHTS_NAME} (fp32); it must not hold a model already",
    )


def run(args: argparse.Namespace) -> int:
    existing = [name for name in (CONFIG_NAME, WEIGHTS_NAME) if (args.out / name).exists()]
    if existing:
        raise ValueError(f"--out {args.out} already holds {existing}: pick another directory, nothing is overwritten")
    try:
        model = from_hf(args.from_hf)
    except (ImportError, OSError) as err:
        # A missing transformers, or a file transformers cannot read: the user's to fix, so one line, no traceback.
        raise ValueError(f"cannot convert {args.from_hf}: {err}") from None
    model.save_pretrained(args.out)
    cfg = model.config
    kv = f" ({cfg.n_kv_heads} kv)" if cfg.n_kv_heads != cfg.n_heads else ""
    print(
        f"converted {args.from_hf} → {args.out}: {model.num_parameters():,} parameters, {cfg.attention} attention + "
        f"{cfg.position} positions, dim {cfg.dim}, {cfg.n_layers} layers, {cfg.n_heads} heads{kv}, "
        f"vocab {cfg.vocab_size}\nfine-tune it with: attnzoo train --init-from {args.out} ..."
    )
    return 0
