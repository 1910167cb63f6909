"""The ``attnzoo convert`` subcommand: a local HF (or official DCFormer) directory → an attnzoo model directory.

The source's tokenizer files are copied beside the model, so the directory is self-contained:
``attnzoo train --init-from`` reads its ``tokenizer.json`` as the model's tokenizer.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from attnzoo.convert import CONVERTERS, from_hf
from attnzoo.data.tokenizers import HF_TOKENIZER_FILE, HFTokenizer
from attnzoo.model import CONFIG_NAME, WEIGHTS_NAME

# What save_pretrained writes for a tokenizer, besides the vocabulary files whose content tokenizer.json holds.
TOKENIZER_FILES = (
    HF_TOKENIZER_FILE,
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
)

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
        help=f"where to write {CONFIG_NAME} and {WEIGHTS_NAME} (fp32), with a copy of the source's tokenizer files "
        "if it has them; it must not hold a model already",
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
    cfg = model.config
    tokenizer = _source_tokenizer(args.from_hf, cfg.vocab_size)  # checked before anything is written
    model.save_pretrained(args.out)
    kv = f" ({cfg.n_kv_heads} kv)" if cfg.n_kv_heads != cfg.n_heads else ""
    print(
        f"converted {args.from_hf} → {args.out}: {model.num_parameters():,} parameters, {cfg.attention} attention + "
        f"{cfg.position} positions, dim {cfg.dim}, {cfg.n_layers} layers, {cfg.n_heads} heads{kv}, "
        f"vocab {cfg.vocab_size}"
    )
    if tokenizer is None:
        print(
            f"{args.from_hf} has no {HF_TOKENIZER_FILE}, so {args.out} has no tokenizer: name the model's with "
            "--tokenizer hf:PATH when training it"
        )
    else:
        copied = [name for name in TOKENIZER_FILES if (args.from_hf / name).is_file()]
        for name in copied:
            shutil.copyfile(args.from_hf / name, args.out / name)
        padding = cfg.vocab_size - tokenizer.num_ids
        padded = f"; the model's other {padding} embedding rows are padding" if padding else ""
        print(f"tokenizer: copied {', '.join(copied)} ({tokenizer.num_ids:,} ids{padded})")
    print(f"fine-tune it with: attnzoo train --init-from {args.out} ...")
    return 0


def _source_tokenizer(directory: Path, vocab_size: int) -> HFTokenizer | None:
    """The tokenizer of the model in ``directory`` (``None`` if it has none), checked to fit its vocabulary."""
    file = directory / HF_TOKENIZER_FILE
    if not file.is_file():
        return None
    try:
        tokenizer = HFTokenizer.from_file(file)
    except ValueError as err:
        raise ValueError(f"cannot use {file} as the model's tokenizer: {err}") from None
    if tokenizer.num_ids > vocab_size:
        raise ValueError(
            f"cannot use {file} as the model's tokenizer: it produces ids up to {tokenizer.num_ids - 1}, past the "
            f"model's vocab_size {vocab_size}"
        )
    return tokenizer
