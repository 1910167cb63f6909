"""``attnzoo convert``: the flags of :func:`attnzoo.convert.convert_model`, and what it wrote."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnzoo.cli.command import Command
from attnzoo.convert import CONVERTERS, convert_model
from attnzoo.data.tokenizers import HF_TOKENIZER_FILE
from attnzoo.model import CONFIG_NAME, WEIGHTS_NAME


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
        help=f"where to write {CONFIG_NAME} and {WEIGHTS_NAME} (fp32), with a copy of the source's tokenizer files "
        "if it has them; it must not hold a model already",
    )


def run(args: argparse.Namespace) -> int:
    done = convert_model(args.from_hf, args.out)
    cfg = done.model.config
    kv = f" ({cfg.n_kv_heads} kv)" if cfg.n_kv_heads != cfg.n_heads else ""
    print(
        f"converted {done.source} → {done.out}: {done.model.num_parameters():,} parameters, {cfg.attention} "
        f"attention + {cfg.position} positions, dim {cfg.dim}, {cfg.n_layers} layers, {cfg.n_heads} heads{kv}, "
        f"vocab {cfg.vocab_size}"
    )
    if done.tokenizer is None:
        print(
            f"{done.source} has no {HF_TOKENIZER_FILE}, so {done.out} has no tokenizer: name the model's with "
            "--tokenizer hf:PATH when training it"
        )
    else:
        padding = cfg.vocab_size - done.tokenizer.num_ids
        padded = f"; the model's other {padding} embedding rows are padding" if padding else ""
        print(f"tokenizer: copied {', '.join(done.tokenizer_files)} ({done.tokenizer.num_ids:,} ids{padded})")
    print(f"fine-tune it with: attnzoo train --init-from {done.out} ...")
    return 0


COMMAND = Command(
    name="convert",
    summary="convert a local Hugging Face or official DCFormer model directory into an attnzoo model directory",
    example=(
        "attnzoo convert --from-hf ~/models/llama --out models/llama\n"
        "  attnzoo train --init-from models/llama --attention selective --attention-option "
        "position_coefficient=linear --train-only temperature"
    ),
    add_arguments=add_arguments,
    run=run,
)
