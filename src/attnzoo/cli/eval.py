"""``attnzoo eval``: a trained model's loss, perplexity and bits per byte, its length extrapolation, or a
synthetic task trained from scratch (through :func:`attnzoo.compare.run_task`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging

import numpy as np
import torch

from attnzoo.cli.command import check_int, check_seed, path_argument
from attnzoo.compare import run_task
from attnzoo.data.batches import eval_window_starts, gather_windows
from attnzoo.data.corpora import prepare_corpus
from attnzoo.data.tokenizers import Tokenizer
from attnzoo.distributed import Distributed, resolve_device
from attnzoo.evals import TASKS
from attnzoo.evals.lm import LMEvalConfig, evaluate_lm, length_extrapolation
from attnzoo.evals.probes import probe_model, probe_tables
from attnzoo.machine import emulated_bf16
from attnzoo.model import Transformer
from attnzoo.records import to_dict
from attnzoo.training.checkpoint import load_pretrained
from attnzoo.training.config import DTYPES, DataConfig
from attnzoo.training.trainer import resolve_dtype
from attnzoo.variants import Variant

logger = logging.getLogger(__name__)

EVAL_TASKS = ("lm", "extrapolation", "probes", *sorted(TASKS))
PROBE_WINDOWS = 8  # windows probed by default: every map of every layer is held at once
EXTRAPOLATION_MULTIPLES = (1, 2, 4, 8, 16)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "path",
        type=path_argument,
        nargs="?",
        help="run directory (its latest checkpoint) or checkpoint directory; not used by the synthetic tasks",
    )
    parser.add_argument(
        "--task",
        choices=EVAL_TASKS,
        default="lm",
        help="lm: loss, perplexity, bits/byte (default); extrapolation: lm at 1, 2, 4, 8, 16× the training length; "
        "probes: per layer, the top attention logit, hidden-state outliers, attention entropy and spikiness; "
        "a synthetic task trains --variant from scratch on it (the standard preset's budget) and scores it",
    )
    parser.add_argument("--data", help="corpus to score (default: the one the model was trained on)")
    parser.add_argument("--split", choices=("val", "train"), default="val", help="split to score (default: val)")
    parser.add_argument("--seq-len", type=int, help="window length (default: the training seq_len)")
    parser.add_argument(
        "--max-windows",
        type=int,
        help=f"score at most this many windows, spread evenly (probes: default {PROBE_WINDOWS}, in one batch)",
    )
    parser.add_argument("--batch-size", type=int, default=16, help="windows per forward pass (default: 16)")
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        help="float32, bfloat16 (autocast) or auto (default: the dtype the model was trained with)",
    )
    parser.add_argument(
        "--blocks", type=int, default=8, help="extrapolation: blocks of the longest length scored (default: 8)"
    )
    parser.add_argument("--variant", default="mha+rope", help="synthetic tasks: ATTENTION[+POSITION][+kvN]")
    parser.add_argument("--steps", type=int, help="synthetic tasks: training steps (default: the preset's)")
    parser.add_argument("--seed", type=int, default=0, help="synthetic tasks: seed of the model and its data")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar while scoring (it is on stderr)")


def run(args: argparse.Namespace) -> int:
    for flag in ("--batch-size", "--seq-len", "--max-windows", "--blocks", "--steps"):
        check_int(flag, getattr(args, flag[2:].replace("-", "_")))
    check_seed("--seed", args.seed)
    device = resolve_device(args.device)
    if args.task in TASKS:
        return _run_task(args, device)
    if args.path is None:
        raise ValueError(f"--task {args.task} scores a trained model: give its run or checkpoint directory")
    model, checkpoint = load_pretrained(args.path, device)
    trained_on = checkpoint.train_config.data if checkpoint.train_config else None
    if args.data is None and trained_on is None:
        raise ValueError(f"{checkpoint.directory} does not record its training corpus; name one with --data")
    # `--data ""` is refused by DataConfig by name, not read as "not given".
    data = dataclasses.replace(trained_on or DataConfig(), **({"corpus": args.data} if args.data is not None else {}))
    seq_len = args.seq_len or (checkpoint.train_config.seq_len if checkpoint.train_config else model.config.max_seq_len)
    tokenizer = checkpoint.require_tokenizer()
    corpus = prepare_corpus(data.corpus, tokenizer, data.val_fraction)
    split_tokens = len(getattr(corpus, args.split))
    if seq_len + 1 > split_tokens:
        given = f"--seq-len={seq_len}" if args.seq_len else f"the trained seq_len {seq_len} (set it with --seq-len)"
        raise ValueError(
            f"{given} is too long for the {args.split} split of {corpus.name} ({split_tokens:,} tokens): a window "
            f"scores seq_len + 1 tokens, so it must be at most {split_tokens - 1:,}"
        )
    if args.task == "extrapolation":
        return _print_extrapolation(args, model, tokenizer, getattr(corpus, args.split), seq_len, corpus.name)
    if args.task == "probes":
        return _print_probes(args, model, getattr(corpus, args.split), seq_len, corpus.name)
    trained_dtype = checkpoint.train_config.dtype if checkpoint.train_config else "auto"
    dtype = resolve_dtype(args.dtype or trained_dtype, device)
    emulated = emulated_bf16(device.type) if dtype == torch.bfloat16 else None
    if emulated is not None:
        logger.warning("warning: %s", emulated)
    autocast = None if dtype == torch.float32 else torch.autocast(device.type, dtype=dtype)
    result = evaluate_lm(
        model,
        getattr(corpus, args.split),
        tokenizer.token_bytes(),
        LMEvalConfig(seq_len, batch_size=args.batch_size, max_windows=args.max_windows),
        env=Distributed(device=device),
        autocast=autocast,
        progress=not args.no_progress,
    )
    where = {"checkpoint": str(checkpoint.directory), "corpus": corpus.name, "split": args.split, "seq_len": seq_len}
    if args.json:
        print(json.dumps({**where, **result.metrics(), "bytes": result.bytes}, indent=2))
    else:
        print(
            f"{corpus.name} {args.split}: loss {result.loss:.4f} nats/token | perplexity {result.perplexity:.3f} | "
            f"{result.bits_per_byte:.4f} bits/byte | {result.tokens:,} tokens in windows of {seq_len}"
        )
    return 0


def _print_extrapolation(
    args: argparse.Namespace, model: Transformer, tokenizer: Tokenizer, stream: np.ndarray, seq_len: int, corpus: str
) -> int:
    """Train short, test long (ALiBi §4): nonoverlapping blocks at multiples of the training length."""
    if args.blocks < 1:
        raise ValueError(f"--blocks={args.blocks} is invalid: must be >= 1")
    tokens = stream[: args.blocks * max(EXTRAPOLATION_MULTIPLES) * seq_len + 1]
    cfg = LMEvalConfig(block_len=seq_len, batch_size=args.batch_size)
    points = length_extrapolation(model, tokens, tokenizer.token_bytes(), cfg, EXTRAPOLATION_MULTIPLES)
    if args.json:
        rows = [
            {"multiple": p.multiple, "length": p.block_len, "reason": p.reason}
            | ({"loss": p.result.loss, "bits_per_byte": p.result.bits_per_byte} if p.result else {})
            for p in points
        ]
        print(json.dumps({"corpus": corpus, "split": args.split, "points": rows}, indent=2))
        return 0
    print(f"{corpus} {args.split}, trained at {seq_len} tokens, {args.blocks} blocks per length:")
    for p in points:
        score = f"loss {p.result.loss:.4f} | {p.result.bits_per_byte:.4f} bits/byte" if p.result else f"N/A: {p.reason}"
        print(f"  {p.multiple:2d}× = {p.block_len:6d} tokens: {score}")
    return 0


def _print_probes(args: argparse.Namespace, model: Transformer, stream: np.ndarray, seq_len: int, corpus: str) -> int:
    """The outlier, entropy and spikiness probes of every layer on evenly spread windows of the split."""
    windows = args.max_windows or PROBE_WINDOWS
    if windows < 1:
        raise ValueError(f"--max-windows={windows} is invalid: must be >= 1")
    inputs, _ = gather_windows(stream, eval_window_starts(len(stream), seq_len, windows), seq_len)
    probes = probe_model(model, inputs)
    where = {"corpus": corpus, "split": args.split, "seq_len": seq_len, "windows": inputs.shape[0]}
    if args.json:
        print(json.dumps({**where, "layers": to_dict(probes)}, indent=2))
        return 0
    print(f"{corpus} {args.split}: {inputs.shape[0]} windows of {seq_len} tokens")
    print("\n\n".join(table.to_text() for table in probe_tables(probes)))
    return 0


def _run_task(args: argparse.Namespace, device: torch.device) -> int:
    """A synthetic task is a protocol for training from scratch: train --variant on it, then score it."""
    if args.path is not None:
        raise ValueError(f"--task {args.task} trains a fresh model on the task; it takes no run directory")
    Variant.parse(args.variant).require_model_only("a task trains each variant on its own budget and length")
    result = run_task(args.task, args.variant, seed=args.seed, steps=args.steps, device=device)
    if args.json:
        print(json.dumps(to_dict(result), indent=2))
        return 0
    final = " | ".join(f"{name} {value:.4f}" for name, value in result.final.items())
    print(f"{args.task} {result.variant} seed {args.seed}: {final} after {result.steps} steps ({result.seconds:.0f} s)")
    if result.stop_at is not None:
        print(f"steps to {TASKS[args.task].metric} {result.stop_at}: {result.steps_to_threshold or 'not reached'}")
    return 0
