"""attnzoo → Hugging Face transformers: a checkpoint directory ``AutoModelForCausalLM.from_pretrained`` loads
without ``trust_remote_code``, of the native class that holds the model's layout.

* ``LlamaForCausalLM``: mha (MHA/GQA/MQA), half-split RoPE, RMSNorm, SwiGLU;
* ``GPTNeoXForCausalLM``: mha, half-split (partial) RoPE, LayerNorm, GELU, biases, parallel residual or not;
* ``BloomForCausalLM``: mha, ALiBi, LayerNorm (of the embeddings too), 4·dim tanh-GELU, biases;
* ``DiffLlamaForCausalLM``: diff, half-split RoPE, RMSNorm, SwiGLU, a weightless head norm.

Each class's writer is the inverse of its reader in this package (the same renamer, the same head layout), so
HF → attnzoo → HF gives back every tensor. A model no class holds is refused, naming the closest class and every
field it cannot hold; the ``attnzoo`` model type of :mod:`attnzoo.hf` holds any attnzoo model.
:func:`to_hf` builds the transformers model in memory; :func:`export_hf` (``attnzoo convert --to-hf``) writes it
with the run's tokenizer, atomically.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from attnzoo.config import ModelConfig
from attnzoo.convert import bloom, diffllama, gpt_neox, llama
from attnzoo.convert.common import Mismatch, require_transformers
from attnzoo.convert.directory import TOKENIZER_FILES
from attnzoo.convert.tokenizer import hf_tokenizer
from attnzoo.data.tokenizers import HFTokenizer
from attnzoo.model import Transformer
from attnzoo.training.checkpoint import Checkpoint, load_pretrained

if TYPE_CHECKING:
    from transformers import PreTrainedModel

HF_TYPES = ("native", "attnzoo")  # a native transformers class, or the attnzoo model type (attnzoo.hf)
ATTNZOO_TYPE = (
    "write it as the attnzoo model type instead, which holds any attnzoo model and loads after "
    "attnzoo.hf.register() (attnzoo convert --hf-type attnzoo, or export_hf(..., hf_type='attnzoo'))"
)


@dataclass(frozen=True)
class Route:
    """A native transformers class: the attention it computes, what of a config it cannot hold, and the writer."""

    hf_class: str
    attention: str
    mismatches: Callable[[ModelConfig], list[Mismatch]]
    to_hf: Callable[[Transformer], PreTrainedModel]


ROUTES = (
    Route(llama.HF_CLASS, "mha", llama.hf_mismatches, llama.to_hf),
    Route(gpt_neox.HF_CLASS, "mha", gpt_neox.hf_mismatches, gpt_neox.to_hf),
    Route(bloom.HF_CLASS, "mha", bloom.hf_mismatches, bloom.to_hf),
    Route(diffllama.HF_CLASS, "diff", diffllama.hf_mismatches, diffllama.to_hf),
)


def native_route(cfg: ModelConfig) -> Route:
    """The class that holds ``cfg``; when none does, refused naming the model's attention if no class computes
    it, else the closest class (of those computing it, the one that cannot hold the fewest fields) and the
    fields it cannot hold."""
    found = [(route, route.mismatches(cfg)) for route in ROUTES]
    for route, mismatches in found:
        if not mismatches:
            return route
    if all(route.attention != cfg.attention for route in ROUTES):
        raise ValueError(f"no transformers class computes attention={cfg.attention!r}; {ATTNZOO_TYPE}")
    closest, mismatches = min(
        ((route, mismatches) for route, mismatches in found if route.attention == cfg.attention),
        key=lambda pair: len(pair[1]),
    )
    raise ValueError(
        f"no transformers class holds this model: {closest.hf_class}, the closest, cannot hold "
        f"{', '.join(map(str, mismatches))}; {ATTNZOO_TYPE}"
    )


def to_hf(model: Transformer) -> PreTrainedModel:
    """An attnzoo model → the native transformers model with the same logits (:data:`ROUTES`), in fp32."""
    return native_route(model.config).to_hf(model)


@dataclass(frozen=True)
class HFExport:
    """What :func:`export_hf` wrote to ``out``."""

    out: Path
    hf_class: str  # the class in config.json's architectures
    model: Transformer = field(repr=False)  # the attnzoo model written
    source: Path | None  # the checkpoint directory read; None when given a model
    files: tuple[str, ...]  # every file written
    tokenizer_files: tuple[str, ...]  # those of the tokenizer; none where the source has none


def export_hf(source: Transformer | str | os.PathLike, out: str | os.PathLike, *, hf_type: str = "native") -> HFExport:
    """Write ``source`` (a ``Transformer``, or a run directory's latest checkpoint, a checkpoint or a model
    directory) to ``out`` as a transformers checkpoint in fp32: ``config.json``, ``model.safetensors`` and
    ``generation_config.json``, with the source's tokenizer (``tokenizer.json``, ``tokenizer_config.json``: byte,
    char or Hugging Face, :mod:`attnzoo.convert.tokenizer`) where it has one, whose special tokens the configs
    then name.

    ``hf_type="native"`` writes the class that holds the model (:func:`to_hf`, which refuses a model none holds),
    ``"attnzoo"`` the attnzoo model type (:mod:`attnzoo.hf`). ``out`` must be absent or an empty directory: the
    checkpoint is written beside it and renamed into place, so nothing is ever half written or overwritten.
    """
    if hf_type not in HF_TYPES:
        raise ValueError(f"hf_type={hf_type!r} is invalid: choose one of {list(HF_TYPES)}")
    out = Path(out)
    _check_new_directory(out)
    checkpoint = None
    if isinstance(source, Transformer):
        model = source
    else:
        model, checkpoint = load_pretrained(source)
    hf_model = to_hf(model) if hf_type == "native" else _attnzoo_type(model)
    with _new_directory(out) as staging:
        tokenizer_files = _write_tokenizer(checkpoint, staging) if checkpoint is not None else ()
        if tokenizer_files:
            _name_special_tokens(hf_model, staging)
        hf_model.save_pretrained(staging)
        files = tuple(sorted(path.name for path in staging.iterdir()))
    source_dir = checkpoint.directory if checkpoint is not None else None
    return HFExport(out, type(hf_model).__name__, model, source_dir, files, tokenizer_files)


def _attnzoo_type(model: Transformer) -> PreTrainedModel:
    from attnzoo.hf import AttnzooForCausalLM

    return AttnzooForCausalLM.from_attnzoo(model)


def _check_new_directory(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} is a file: name a new or empty directory for the transformers checkpoint")
    held = sorted(path.name for path in out.iterdir()) if out.is_dir() else []
    if held:
        raise ValueError(
            f"{out} already holds {held[:4]}: name a new or empty directory, the checkpoint is written whole and "
            "nothing is overwritten"
        )


@contextlib.contextmanager
def _new_directory(out: Path) -> Iterator[Path]:
    """A staging directory beside ``out``, renamed to ``out`` (absent or empty) once everything in it is on
    disk, and removed if writing fails: a reader never sees a half-written checkpoint."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.{secrets.token_hex(4)}.tmp"
    staging.mkdir()
    try:
        yield staging
        for path in staging.iterdir():
            with open(path, "rb") as file:
                os.fsync(file.fileno())
        staging.rename(out)  # replaces an empty directory; fails on one written to meanwhile
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _write_tokenizer(checkpoint: Checkpoint, staging: Path) -> tuple[str, ...]:
    """The checkpoint's tokenizer, written to ``staging`` as transformers reads it: the Hugging Face files of a
    converted directory as they came (their special tokens and chat template included), else attnzoo's
    tokenizer as a fast tokenizer (:func:`~attnzoo.convert.tokenizer.hf_tokenizer`). None where it has none."""
    directory, tokenizer = checkpoint.directory, checkpoint.tokenizer
    if tokenizer is None:
        return ()
    if isinstance(tokenizer, HFTokenizer) and (directory / "tokenizer_config.json").is_file():
        copied = tuple(name for name in TOKENIZER_FILES if (directory / name).is_file())
        for name in copied:
            shutil.copyfile(directory / name, staging / name)
        return copied
    transformers = require_transformers()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=hf_tokenizer(tokenizer), model_max_length=checkpoint.model_config.max_seq_len
    )
    return tuple(sorted(Path(path).name for path in fast.save_pretrained(staging)))


def _name_special_tokens(hf_model: PreTrainedModel, tokenizer_directory: Path) -> None:
    """Give the model's config and generation config the tokenizer's BOS, EOS and padding ids."""
    transformers = require_transformers()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_directory)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        setattr(hf_model.config, name, getattr(tokenizer, name))
    hf_model.generation_config = transformers.GenerationConfig.from_model_config(hf_model.config)
