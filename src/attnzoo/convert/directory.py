"""A local HF (or official DCFormer) directory, or an attnzoo model, → an attnzoo model directory, what
``attnzoo convert`` writes, optionally with its kv heads mean-pooled to GQA/MQA (:mod:`attnzoo.convert.kv_heads`).

The source's tokenizer files are copied beside the model, so the directory is self-contained:
``attnzoo train --init-from`` reads its ``tokenizer.json`` as the model's tokenizer.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from attnzoo.convert.hf import from_hf
from attnzoo.convert.kv_heads import pool_kv_heads
from attnzoo.data.tokenizers import HF_TOKENIZER_FILE, HFTokenizer
from attnzoo.model import CONFIG_NAME, WEIGHTS_NAME, Transformer
from attnzoo.training.checkpoint import TOKENIZER, load_pretrained

# What save_pretrained writes for a tokenizer, besides the vocabulary files whose content tokenizer.json holds.
TOKENIZER_FILES = (
    HF_TOKENIZER_FILE,
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
)


@dataclass(frozen=True)
class Conversion:
    """What :func:`convert_model` wrote to ``out``."""

    source: Path
    out: Path
    model: Transformer
    tokenizer: HFTokenizer | None  # None: the source has no tokenizer.json, or is an attnzoo model
    tokenizer_files: tuple[str, ...]  # copied from the source
    source_kv_heads: int | None = None  # the source's kv heads, when ``kv_heads`` pooled them


def _check_out(out: Path) -> None:
    existing = [name for name in (CONFIG_NAME, WEIGHTS_NAME) if (out / name).exists()]
    if existing:
        raise ValueError(f"--out {out} already holds {existing}: pick another directory, nothing is overwritten")


def convert_model(source: Path, out: Path, *, kv_heads: int | None = None) -> Conversion:
    """Convert the model in ``source`` (read locally, nothing is downloaded) and write it to ``out`` in fp32,
    with a copy of the source's tokenizer files; with ``kv_heads``, mean-pool its kv heads to that many first.
    ``out`` must not hold a model already: nothing is overwritten."""
    source, out = Path(source), Path(out)
    _check_out(out)
    try:
        model = from_hf(source)
    except (ImportError, OSError) as err:
        # A missing transformers, or a file transformers cannot read: the user's to fix, so one line, no traceback.
        raise ValueError(f"cannot convert {source}: {err}") from None
    tokenizer = _source_tokenizer(source, model.config.vocab_size)  # checked before anything is written
    source_kv_heads = None
    if kv_heads is not None:
        source_kv_heads, model = model.config.n_kv_heads, pool_kv_heads(model, kv_heads)
    model.save_pretrained(out)
    copied = tuple(name for name in TOKENIZER_FILES if (source / name).is_file()) if tokenizer else ()
    for name in copied:
        shutil.copyfile(source / name, out / name)
    return Conversion(source, out, model, tokenizer, copied, source_kv_heads)


def group_kv_heads(source: Path, out: Path, kv_heads: int) -> Conversion:
    """The attnzoo model in ``source`` (a run directory's latest checkpoint, a checkpoint or a model directory)
    with its kv heads mean-pooled to ``kv_heads`` (MHA → GQA/MQA), written to ``out`` in fp32 with a copy of the
    source's tokenizer.json: the start of GQA uptraining (``attnzoo train --init-from out``)."""
    source, out = Path(source), Path(out)
    _check_out(out)
    model, checkpoint = load_pretrained(source)
    grouped = pool_kv_heads(model, kv_heads)
    grouped.save_pretrained(out)
    copied = (TOKENIZER,) if (checkpoint.directory / TOKENIZER).is_file() else ()
    for name in copied:
        shutil.copyfile(checkpoint.directory / name, out / name)
    return Conversion(checkpoint.directory, out, grouped, None, copied, model.config.n_kv_heads)


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
