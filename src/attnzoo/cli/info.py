"""``attnzoo info``: parameter counts by component and the configuration of a run or of the flags given."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from attnzoo.cli.command import Command
from attnzoo.cli.flags import (
    add_config_argument,
    add_model_arguments,
    add_train_arguments,
    model_settings_from_args,
    train_config_from_args,
)
from attnzoo.config import ModelConfig
from attnzoo.data.corpora import prepare_corpus
from attnzoo.data.tokenizers import tokenizer_from_name
from attnzoo.model import Transformer
from attnzoo.training.checkpoint import read_checkpoint


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", nargs="?", type=Path, help="run or checkpoint directory; omit to describe the flags")
    add_config_argument(parser)
    add_model_arguments(parser)
    add_train_arguments(parser)


def parameters_by_component(model: Transformer) -> dict[str, int]:
    """Parameter counts keyed by module path with layer indices folded: ``layers.*.self_attn`` etc."""
    counts: dict[str, int] = {}
    for name, param in model.named_parameters():
        parts = name.split(".")
        component = f"layers.*.{parts[2]}" if parts[0] == "layers" else parts[0]
        counts[component] = counts.get(component, 0) + param.numel()
    return counts


def run(args: argparse.Namespace) -> int:
    if args.path is not None:
        checkpoint = read_checkpoint(args.path)
        model_config, train_config = checkpoint.model_config, checkpoint.train_config
        print(f"checkpoint {checkpoint.directory}" + (f" (step {checkpoint.step})" if checkpoint.step else ""))
    else:
        train_config = train_config_from_args(args)
        settings = model_settings_from_args(args, train_config)
        data = train_config.data
        if data.tokenizer == "char":  # the corpus's characters (read from the cache once prepared)
            vocab_size = prepare_corpus(data.corpus, "char").tokenizer.vocab_size
        else:
            vocab_size = tokenizer_from_name(data.tokenizer).vocab_size
        model_config = ModelConfig.from_dict({**settings, "vocab_size": vocab_size})
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        model = Transformer(model_config)
    total = model.num_parameters()
    print(f"\nparameters by component ({total:,} in all)")
    for component, count in parameters_by_component(model).items():
        note = " (tied with lm_head)" if component == "embed_tokens" and model_config.tie_embeddings else ""
        print(f"  {component + note:<38} {count:>12,}  {100 * count / total:5.1f}%")
    print("\nmodel config\n" + model_config.to_json())
    if train_config is not None:
        print("train config\n" + train_config.to_json())
    return 0


COMMAND = Command(
    name="info",
    summary="parameter counts by component and the configuration of a run or of the given flags",
    example="attnzoo info runs/mha-rope-20250101-120000\n  attnzoo info --attention mha --n-kv-heads 2 --dim 256",
    add_arguments=add_arguments,
    run=run,
)
