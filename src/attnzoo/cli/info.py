"""``attnzoo info``: parameter counts by component, KV-cache bytes and the configuration of a run or of the flags
given."""

from __future__ import annotations

import argparse

import torch

from attnzoo import machine
from attnzoo.attention import ATTENTION
from attnzoo.cli.command import check_int, path_argument
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
from attnzoo.model import Transformer, cache_bytes
from attnzoo.training.checkpoint import read_checkpoint

CACHE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "path", nargs="?", type=path_argument, help="run or checkpoint directory; omit to describe the flags"
    )
    parser.add_argument(
        "--context", type=int, help="KV cache size at this many positions per sequence (default: max_seq_len)"
    )
    parser.add_argument(
        "--cache-batch", type=int, default=1, help="KV cache size for this many sequences at once (default: 1)"
    )
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


def _size(n_bytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= scale:
            return f"{n_bytes:,} B ({n_bytes / scale:.2f} {unit})"
    return f"{n_bytes:,} B"


def cache_lines(cfg: ModelConfig, context: int, batch_size: int) -> list[str]:
    """What the KV cache holds per token, per layer and for the model, and its size at ``context`` × ``batch_size``,
    at float32 (the weights' dtype, which ``generate`` allocates) and bfloat16; from ``Attention.cache_layout``."""
    attention = ATTENTION.get(cfg.attention)
    layout = attention.cache_layout(cfg)
    lines = [f"{buffer.name:<3} {buffer.numbers:,} numbers = {buffer.formula}" for buffer in layout]
    numbers = sum(buffer.numbers for buffer in layout)
    per_layer = {name: attention.cache_bytes_per_token(cfg, dtype) for name, dtype in CACHE_DTYPES.items()}
    lines.append(
        f"per token per layer: {numbers:,} numbers = " + ", ".join(f"{n:,} B {name}" for name, n in per_layer.items())
    )
    lines.append(
        f"per token, {cfg.n_layers} layers: {numbers * cfg.n_layers:,} numbers = "
        + ", ".join(f"{n * cfg.n_layers:,} B {name}" for name, n in per_layer.items())
    )
    windows = {i: attention.key_window(cfg, i) for i in range(cfg.n_layers)}
    local = {i: w for i, w in windows.items() if w is not None}
    if local:
        sizes = sorted(set(local.values()))
        lines.append(
            f"local layers {sorted(local)} keep a ring of their window ({', '.join(map(str, sizes))} positions); "
            "past it they cache nothing more per token"
        )
    for name, dtype in CACHE_DTYPES.items():
        total = sum(cache_bytes(cfg, batch_size, context, dtype))
        lines.append(f"at context {context:,} × batch {batch_size}, {name}: {_size(total)}")
    return lines


def cpu_kernels(model: Transformer) -> list[str]:
    """The kernel each layer's attention runs on a fresh fp32 training sequence on the CPU, as a run on the CPU
    records it (:meth:`~attnzoo.Transformer.planned_kernels`, here without building anything): its name, what runs,
    and the layers where the layers differ."""
    chosen: dict[str, list[int]] = {}
    described = {}
    for layer, kernel in enumerate(model.planned_kernels()):
        chosen.setdefault(kernel.name, []).append(layer)
        described[kernel.name] = kernel.description(model.config, model.position)
    if len(chosen) == 1:
        return [f"{name}: {described[name]}" for name in chosen]
    return [f"{name}: {described[name]} (layers {layers})" for name, layers in chosen.items()]


def run(args: argparse.Namespace) -> int:
    check_int("--context", args.context)
    check_int("--cache-batch", args.cache_batch)
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
    context = model_config.max_seq_len if args.context is None else args.context
    print("\nKV cache")
    if not model_config.causal:
        print("  none: a bidirectional model (causal=False) has no cache and does not generate")
    for line in cache_lines(model_config, context, args.cache_batch) if model_config.causal else ():
        print(f"  {line}")
    print("\nattention kernel (CPU, fp32 training)")
    for line in cpu_kernels(model):
        print(f"  {line}")
    print(f"\nCPU\n  bf16: {machine.bf16_support()}")
    print("\nmodel config\n" + model_config.to_json())
    if train_config is not None:
        print("train config\n" + train_config.to_json())
    return 0
