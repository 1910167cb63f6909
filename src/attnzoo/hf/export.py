"""An attnzoo model, model directory, checkpoint or run → a transformers directory of the ``attnzoo`` type."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from attnzoo.hf.modeling import AttnzooForCausalLM
from attnzoo.model import Transformer
from attnzoo.training.checkpoint import TOKENIZER, load_pretrained


def save_hf(model_or_dir: Transformer | str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write ``model_or_dir`` (a ``Transformer``, or a run, checkpoint or model directory, whose latest
    checkpoint is read) to ``out`` as an :class:`AttnzooForCausalLM`: ``config.json`` and ``model.safetensors``
    (tied weights stored once), with the source directory's ``tokenizer.json`` where it has one.
    ``AutoModelForCausalLM.from_pretrained(out)`` loads it after :func:`attnzoo.hf.register`.

    ``out`` must not exist yet: the directory is written beside it and renamed into place, so it is never half
    written. Returns ``out``.
    """
    out = Path(out)
    if out.exists():
        raise ValueError(f"out={out} already exists: pick a new directory, nothing is overwritten")
    tokenizer = None
    if isinstance(model_or_dir, Transformer):
        model = model_or_dir
    else:
        model, checkpoint = load_pretrained(model_or_dir)
        tokenizer = checkpoint.directory / TOKENIZER if (checkpoint.directory / TOKENIZER).is_file() else None
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        AttnzooForCausalLM.from_attnzoo(model).save_pretrained(staging)
        if tokenizer is not None:
            shutil.copyfile(tokenizer, staging / TOKENIZER)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out
