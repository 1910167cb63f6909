"""The ``attnzoo`` command line (also ``python -m attnzoo``).

Every subcommand is a :class:`Command`: a name, a one-line summary, an example, a function that adds its
arguments and a function that runs it. A new subcommand (compare, bench, viz, convert ...) is one more
``Command``, usually defined beside the code it drives, listed in :data:`COMMANDS`. The option groups of
``train`` (:func:`add_model_arguments`, :func:`add_train_arguments`) are public so such commands can
reuse them, with :func:`model_settings_from_args` and :func:`train_config_from_args` to read them back.

Model and training options come from three layers, later ones winning: the defaults, a TOML file
(``--config``), and the flags given on the command line.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import sys
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from attnzoo import __version__, bench, viz
from attnzoo.attention import ATTENTION
from attnzoo.compare import cli as compare_cli
from attnzoo.config import ATTN_BACKENDS, MLP_KINDS, NORM_KINDS, ModelConfig
from attnzoo.convert import cli as convert_cli
from attnzoo.data.corpora import CorpusError, prepare_corpus
from attnzoo.data.tokenizers import HF_PREFIX, MissingDependencyError, Tokenizer, tokenizer_from_name
from attnzoo.evals import TASKS
from attnzoo.evals.lm import LMEvalConfig, evaluate_lm, length_extrapolation
from attnzoo.model import Transformer
from attnzoo.positions import POSITIONS
from attnzoo.records import to_dict
from attnzoo.training.checkpoint import (
    Checkpoint,
    CheckpointError,
    latest_checkpoint,
    load_pretrained,
    read_checkpoint,
)
from attnzoo.training.config import (
    DEFAULT_MODEL,
    DTYPES,
    PARALLEL_STRATEGIES,
    DataConfig,
    TrainConfig,
    default_model_settings,
    load_toml,
)
from attnzoo.training.distributed import Distributed, init_distributed, resolve_device, shutdown_distributed
from attnzoo.training.trainer import Trainer, TrainingDiverged, load_corpus, resolve_dtype

# Errors that are the user's to fix: shown as one line, without a traceback.
USER_ERRORS = (ValueError, FileNotFoundError, CorpusError, CheckpointError, TrainingDiverged, MissingDependencyError)


@dataclass(frozen=True)
class Command:
    name: str
    summary: str
    example: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


# ------------------------------------------------------------------------------------- shared option groups

MODEL_HELP = {
    "dim": "width of the residual stream",
    "n_layers": "number of Transformer blocks",
    "n_heads": "query heads per layer",
    "n_kv_heads": "key/value heads: n_heads gives MHA, 1 MQA, a divisor in between GQA (default: n_heads)",
    "head_dim": "size of each head (default: dim / n_heads)",
    "mlp": "feed-forward kind",
    "mlp_hidden_dim": "feed-forward width (default: 8/3·dim rounded up to 32 for swiglu, 4·dim for gelu)",
    "norm": "normalisation layer",
    "norm_eps": "epsilon of the normalisation layers",
    "dropout": "dropout probability on residual branches and attention",
    "bias": "biases in linear layers and LayerNorm",
    "tie_embeddings": "share the input embedding and the output projection",
    "max_seq_len": "longest sequence the model serves (default: --seq-len)",
    "attention": "attention mechanism; configure it with --attention-option",
    "position": "positional scheme; configure it with --position-option",
    "attn_backend": "attention kernel: auto (SDPA where the mechanism allows), eager or sdpa",
    "init_std": "standard deviation of the initial weights",
    "parallel_residual": "attention and MLP read the same block input (GPT-J, GPT-NeoX)",
    "embedding_norm": "normalise the token embeddings (BLOOM)",
}
MODEL_CHOICES = {
    "attention": ATTENTION.names(),
    "position": POSITIONS.names(),
    "mlp": list(MLP_KINDS),
    "norm": list(NORM_KINDS),
    "attn_backend": list(ATTN_BACKENDS),
}
TRAIN_CHOICES = {"dtype": list(DTYPES), "parallel": list(PARALLEL_STRATEGIES)}
# Fields set otherwise: the vocabulary by the tokenizer, the options by --attention-option/--position-option.
MODEL_FIELDS_WITHOUT_FLAGS = ("vocab_size", "attention_options", "position_options")


def _plain_type(annotation: Any) -> type:
    """``int | None`` → ``int``: the type a flag's value is parsed as."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return next(a for a in typing.get_args(annotation) if a is not type(None))
    return annotation


def _add_dataclass_flags(
    group: argparse._ArgumentGroup,
    cls: type,
    section: str,
    *,
    help_for: Callable[[dataclasses.Field], str],
    choices: dict[str, list[str]],
    skip: tuple[str, ...] = (),
    aliases: dict[str, str] | None = None,
) -> None:
    """One flag per field (``--n-kv-heads``), stored as ``section.field`` and only when given."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip or dataclasses.is_dataclass(hints[f.name]):
            continue
        kind = _plain_type(hints[f.name])
        flag = f"--{f.name.replace('_', '-')}"
        flags = [aliases[f.name], flag] if aliases and f.name in aliases else [flag]
        options: dict[str, Any] = {"dest": f"{section}.{f.name}", "default": argparse.SUPPRESS, "help": help_for(f)}
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(kind) is tuple:  # tuple[str, ...]: one or more values
            options.update(nargs="+", type=typing.get_args(kind)[0], metavar=f.name.upper())
        else:
            options.update(type=kind, metavar=f.name.upper())
            if f.name in choices:
                options.update(choices=choices[f.name], metavar="{" + ",".join(choices[f.name]) + "}")
        group.add_argument(*flags, **options)


def _key_value(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value  # a bare word is a string: variant=v2 as well as variant="v2"


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model (ModelConfig; unset fields take the defaults shown)")

    def help_for(f: dataclasses.Field) -> str:
        default = DEFAULT_MODEL.get(f.name, f.default)
        shown = "" if default is None or f.name == "max_seq_len" else f" (default: {default})"
        return MODEL_HELP.get(f.name, f"ModelConfig.{f.name}") + shown

    _add_dataclass_flags(
        group, ModelConfig, "model", help_for=help_for, choices=MODEL_CHOICES, skip=MODEL_FIELDS_WITHOUT_FLAGS
    )
    for kind in ("attention", "position"):
        group.add_argument(
            f"--{kind}-option",
            dest=f"{kind}_options",
            metavar="KEY=VALUE",
            type=_key_value,
            action="append",
            default=[],
            help=f'an option of the {kind} scheme; VALUE is JSON (1, 0.5, true, "x") or a bare string; repeatable',
        )


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    def help_for(f: dataclasses.Field) -> str:
        return f.metadata.get("help", "") + ("" if f.default == () else f" (default: {f.default})")

    data = parser.add_argument_group("data (the [data] table)")
    _add_dataclass_flags(
        data, DataConfig, "data", help_for=help_for, choices=TRAIN_CHOICES, aliases={"corpus": "--data"}
    )
    train = parser.add_argument_group("training (the [train] table)")
    _add_dataclass_flags(train, TrainConfig, "train", help_for=help_for, choices=TRAIN_CHOICES)


def _given(args: argparse.Namespace, section: str) -> dict[str, Any]:
    return {key.split(".", 1)[1]: value for key, value in vars(args).items() if key.startswith(section + ".")}


def train_config_from_args(args: argparse.Namespace, base: dict[str, Any] | None = None) -> TrainConfig:
    """``base`` (a TrainConfig dict) or the ``--config`` file, overridden by the flags given."""
    if base is None:
        file = load_toml(args.config) if getattr(args, "config", None) else {"train": {}, "data": {}}
        base = {**file["train"], "data": file["data"]}
    data = {**base.get("data", {}), **_given(args, "data")}
    return TrainConfig.from_dict({**base, **_given(args, "train"), "data": data})


def model_settings_from_args(
    args: argparse.Namespace, train: TrainConfig, base: dict[str, Any] | None = None
) -> dict[str, Any]:
    """ModelConfig fields from ``base`` (the defaults, without vocab_size, unless given: e.g. a pretrained
    model's config), the ``--config`` file and the flags. A scheme's options are kept only with the scheme:
    ``--attention selective`` over a base with another attention starts from selective's defaults."""
    base = default_model_settings(train) if base is None else base
    file = load_toml(args.config)["model"] if getattr(args, "config", None) else {}
    settings = {**base, **file, **_given(args, "model")}
    for kind in ("attention", "position"):
        inherited = base.get(f"{kind}_options", {}) if settings.get(kind) == base.get(kind) else {}
        options = {**inherited, **file.get(f"{kind}_options", {})}
        options.update(getattr(args, f"{kind}_options", []))
        settings[f"{kind}_options"] = options
    return settings


def _model_flags_given(args: argparse.Namespace) -> list[str]:
    flags = [f"--{name.replace('_', '-')}" for name in _given(args, "model")]
    flags += [f"--{kind}-option" for kind in ("attention", "position") if getattr(args, f"{kind}_options", [])]
    return flags + (["--config"] if args.config else [])


# -------------------------------------------------------------------------------------------------- train


def _add_train(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE.toml", help="TOML file with [model], [data] and [train] tables")
    parser.add_argument(
        "--out", metavar="DIR", type=Path, help="run directory (default: runs/ATTENTION-POSITION-YYYYmmdd-HHMMSS)"
    )
    parser.add_argument(
        "--resume",
        metavar="RUN_DIR",
        type=Path,
        help="continue the run in RUN_DIR from its latest checkpoint, with its saved configuration",
    )
    parser.add_argument(
        "--init-from",
        metavar="DIR",
        type=Path,
        help="start from a pretrained model (a run, a checkpoint, or a directory of `attnzoo convert` or "
        "save_pretrained): its configuration, overridden by the model flags given, and its weights. A mechanism "
        "that extends its attention (--attention selective or dcmha over mha) adds parameters that start at "
        "identity where the math allows",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (evaluation lines still print)")
    add_model_arguments(parser)
    add_train_arguments(parser)


def _tokenizer_named(args: argparse.Namespace) -> bool:
    """Whether --tokenizer or the --config file names the tokenizer."""
    return "data.tokenizer" in vars(args) or bool(args.config and "tokenizer" in load_toml(args.config)["data"])


def _init_tokenizer(
    args: argparse.Namespace, train_config: TrainConfig, pretrained: Checkpoint
) -> tuple[TrainConfig, Tokenizer | None]:
    """The tokenizer of a run started from ``pretrained`` (``None``: the one ``train_config`` names).

    By default the model's own, since its ids mean that tokenizer's tokens; the config then names it as it
    came (``hf:`` the pretrained directory). A named Hugging Face tokenizer counts the model's padded
    embedding rows, if any; the Trainer refuses a named tokenizer that is not the model's.
    """
    if _tokenizer_named(args):
        name = train_config.data.tokenizer
        if not name.startswith(HF_PREFIX):
            return train_config, None  # byte or char, built as prepare_corpus builds them
        return train_config, tokenizer_from_name(name).padded_to(pretrained.model_config.vocab_size)
    own = pretrained.tokenizer
    if own is None:
        return train_config, None
    name = f"{HF_PREFIX}{args.init_from}" if own.kind == "hf" else own.kind
    return dataclasses.replace(train_config, data=dataclasses.replace(train_config.data, tokenizer=name)), own


def _run_train(args: argparse.Namespace) -> int:
    checkpoint = pretrained = tokenizer = None
    if args.resume is not None:
        if args.init_from is not None:
            raise ValueError("--resume continues a run from its own checkpoint; drop --init-from")
        if _model_flags_given(args):
            raise ValueError(
                f"--resume continues a run with its saved model; drop {', '.join(_model_flags_given(args))}"
            )
        found = latest_checkpoint(args.resume)
        if found is None:
            raise CheckpointError(f"{args.resume} holds no complete checkpoint to resume from")
        checkpoint = read_checkpoint(found)
        train_config = train_config_from_args(args, base=checkpoint.train_config.to_dict())
        tokenizer = checkpoint.tokenizer  # what the run was trained with, wherever its files are now
        run_dir = args.resume
    else:
        train_config = train_config_from_args(args)
        if args.init_from is not None:
            pretrained = read_checkpoint(args.init_from)
            train_config, tokenizer = _init_tokenizer(args, train_config, pretrained)
            settings = model_settings_from_args(args, train_config, base=pretrained.model_config.to_dict())
        else:
            settings = model_settings_from_args(args, train_config)
        ModelConfig.from_dict({**settings, "vocab_size": 256})  # refuse a bad model before fetching any data
        run_dir = args.out
    env = init_distributed(train_config.device)
    try:
        corpus = load_corpus(train_config.data, env, tokenizer)
        if checkpoint is None:
            # A pretrained model keeps its vocabulary, which the Trainer checks against the corpus's tokenizer.
            vocab_size = pretrained.model_config.vocab_size if pretrained else corpus.tokenizer.vocab_size
            model_config = ModelConfig.from_dict({**settings, "vocab_size": vocab_size})
            run_dir = env.broadcast(run_dir or _default_run_dir(model_config))
            if latest_checkpoint(run_dir) is not None:
                raise ValueError(f"{run_dir} already holds a run: continue it with --resume {run_dir}, or pick --out")
        else:
            model_config = checkpoint.model_config
        trainer = Trainer(
            model_config,
            train_config,
            corpus,
            run_dir,
            env=env,
            resume=checkpoint,
            init_from=pretrained,
            progress=not args.no_progress,
        )
        result = trainer.fit()
    finally:
        shutdown_distributed()
    # Like a shell, report a stop by signal as 128 + its number, so scripts can tell it from completion.
    return 128 + result.interrupted_by if result.interrupted_by is not None else 0


def _default_run_dir(model_config: ModelConfig) -> Path:
    return Path("runs") / f"{model_config.attention}-{model_config.position}-{datetime.now():%Y%m%d-%H%M%S}"


TRAIN = Command(
    name="train",
    summary="train a model (the default: ~0.84M parameters on Shakespeare, a few minutes on a CPU)",
    example=(
        "attnzoo train\n"
        "  attnzoo train --attention mha --n-kv-heads 1 --position alibi --steps 3000 --out runs/mqa\n"
        "  attnzoo train --config run.toml --lr 1e-3\n"
        "  attnzoo train --resume runs/mqa\n"
        "  attnzoo train --init-from models/llama --attention selective --attention-option "
        "position_coefficient=linear --train-only temperature\n"
        "  torchrun --nproc_per_node=2 -m attnzoo train --parallel ddp"
    ),
    add_arguments=_add_train,
    run=_run_train,
)


# ----------------------------------------------------------------------------------------------- generate


def _add_generate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path, help="run directory (its latest checkpoint) or checkpoint directory")
    parser.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    parser.add_argument("--max-new-tokens", type=int, default=500, help="tokens to sample (default: 500)")
    parser.add_argument("--temperature", type=float, default=0.8, help="0 is greedy (default: 0.8)")
    parser.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens")
    parser.add_argument("--top-p", type=float, default=None, help="sample from the smallest set with this mass")
    parser.add_argument("--num-samples", type=int, default=1, help="independent continuations (default: 1)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")


def _run_generate(args: argparse.Namespace) -> int:
    if args.num_samples < 1:
        raise ValueError(f"--num-samples={args.num_samples} is invalid: must be >= 1")
    if not args.prompt:
        raise ValueError("--prompt is empty: the model needs at least one token to continue")
    device = resolve_device(args.device)
    model, checkpoint = load_pretrained(args.path, device)
    tokenizer = checkpoint.require_tokenizer()
    prompt = torch.from_numpy(tokenizer.encode(args.prompt).astype("int64")).to(device)
    generator = torch.Generator(device).manual_seed(args.seed)
    out = model.generate(
        prompt.repeat(args.num_samples, 1),
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        generator=generator,
    )
    for i, ids in enumerate(out.tolist()):
        if args.num_samples > 1:
            print(f"─── sample {i + 1} ───")
        print(tokenizer.decode(ids))
    return 0


GENERATE = Command(
    name="generate",
    summary="sample text from a trained model",
    example='attnzoo generate runs/mha-rope-20250101-120000 --prompt "ROMEO:" --max-new-tokens 300 --top-k 40',
    add_arguments=_add_generate,
    run=_run_generate,
)


# --------------------------------------------------------------------------------------------------- eval


EVAL_TASKS = ("lm", "extrapolation", *sorted(TASKS))


def _add_eval(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "path",
        type=Path,
        nargs="?",
        help="run directory (its latest checkpoint) or checkpoint directory; not used by the synthetic tasks",
    )
    parser.add_argument(
        "--task",
        choices=EVAL_TASKS,
        default="lm",
        help="lm: loss, perplexity, bits/byte (default); extrapolation: lm at 1, 2, 4, 8, 16× the training length; "
        "a synthetic task trains --variant from scratch on it (the standard preset's budget) and scores it",
    )
    parser.add_argument("--data", help="corpus to score (default: the one the model was trained on)")
    parser.add_argument("--split", choices=("val", "train"), default="val", help="split to score (default: val)")
    parser.add_argument("--seq-len", type=int, help="window length (default: the training seq_len)")
    parser.add_argument("--max-windows", type=int, help="score at most this many windows, spread evenly")
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


def _run_eval(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    if args.task in TASKS:
        return _run_task_eval(args, device)
    if args.path is None:
        raise ValueError(f"--task {args.task} scores a trained model: give its run or checkpoint directory")
    model, checkpoint = load_pretrained(args.path, device)
    trained_on = checkpoint.train_config.data if checkpoint.train_config else None
    if args.data is None and trained_on is None:
        raise ValueError(f"{checkpoint.directory} does not record its training corpus; name one with --data")
    data = dataclasses.replace(trained_on or DataConfig(), **({"corpus": args.data} if args.data else {}))
    seq_len = args.seq_len or (checkpoint.train_config.seq_len if checkpoint.train_config else model.config.max_seq_len)
    tokenizer = checkpoint.require_tokenizer()
    corpus = prepare_corpus(data.corpus, tokenizer, data.val_fraction)
    if args.task == "extrapolation":
        return _print_extrapolation(args, model, tokenizer, getattr(corpus, args.split), seq_len, corpus.name)
    trained_dtype = checkpoint.train_config.dtype if checkpoint.train_config else "auto"
    dtype = resolve_dtype(args.dtype or trained_dtype, device)
    autocast = None if dtype == torch.float32 else torch.autocast(device.type, dtype=dtype)
    result = evaluate_lm(
        model,
        getattr(corpus, args.split),
        tokenizer.token_bytes(),
        LMEvalConfig(seq_len, batch_size=args.batch_size, max_windows=args.max_windows),
        env=Distributed(device=device),
        autocast=autocast,
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


def _print_extrapolation(args, model: Transformer, tokenizer, stream, seq_len: int, corpus_name: str) -> int:
    """Train short, test long (ALiBi §4): nonoverlapping blocks at multiples of the training length."""
    multiples = (1, 2, 4, 8, 16)
    if args.blocks < 1:
        raise ValueError(f"--blocks={args.blocks} is invalid: must be >= 1")
    tokens = stream[: args.blocks * max(multiples) * seq_len + 1]
    cfg = LMEvalConfig(block_len=seq_len, batch_size=args.batch_size)
    points = length_extrapolation(model, tokens, tokenizer.token_bytes(), cfg, multiples)
    if args.json:
        rows = [
            {"multiple": p.multiple, "length": p.block_len, "reason": p.reason}
            | ({"loss": p.result.loss, "bits_per_byte": p.result.bits_per_byte} if p.result else {})
            for p in points
        ]
        print(json.dumps({"corpus": corpus_name, "split": args.split, "points": rows}, indent=2))
        return 0
    print(f"{corpus_name} {args.split}, trained at {seq_len} tokens, {args.blocks} blocks per length:")
    for p in points:
        score = f"loss {p.result.loss:.4f} | {p.result.bits_per_byte:.4f} bits/byte" if p.result else f"N/A: {p.reason}"
        print(f"  {p.multiple:2d}× = {p.block_len:6d} tokens: {score}")
    return 0


def _run_task_eval(args: argparse.Namespace, device: torch.device) -> int:
    """A synthetic task is a protocol for training from scratch: train --variant on it, then score it."""
    from attnzoo.compare import run_task

    if args.path is not None:
        raise ValueError(f"--task {args.task} trains a fresh model on the task; it takes no run directory")
    result = run_task(args.task, args.variant, seed=args.seed, steps=args.steps, device=device)
    if args.json:
        print(json.dumps(to_dict(result), indent=2))
    else:
        final = " | ".join(f"{name} {value:.4f}" for name, value in result.final.items())
        took = f"after {result.steps} steps ({result.seconds:.0f} s)"
        print(f"{args.task} {result.variant} seed {args.seed}: {final} {took}")
        if result.stop_at is not None:
            metric = TASKS[args.task].metric
            print(f"steps to {metric} {result.stop_at}: {result.steps_to_threshold or 'not reached'}")
    return 0


EVAL = Command(
    name="eval",
    summary="score a trained model (loss, perplexity, bits per byte, length extrapolation) or a synthetic task",
    example="attnzoo eval runs/mha-rope-20250101-120000 --seq-len 512\n"
    "  attnzoo eval runs/mha-alibi-20250101-120000 --task extrapolation\n"
    "  attnzoo eval --task mqar --variant diff+rope --steps 500",
    add_arguments=_add_eval,
    run=_run_eval,
)


# --------------------------------------------------------------------------------------------------- info


def _add_info(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", nargs="?", type=Path, help="run or checkpoint directory; omit to describe the flags")
    parser.add_argument("--config", metavar="FILE.toml", help="TOML file with [model], [data] and [train] tables")
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


def _run_info(args: argparse.Namespace) -> int:
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


INFO = Command(
    name="info",
    summary="parameter counts by component and the configuration of a run or of the given flags",
    example="attnzoo info runs/mha-rope-20250101-120000\n  attnzoo info --attention mha --n-kv-heads 2 --dim 256",
    add_arguments=_add_info,
    run=_run_info,
)


# ------------------------------------------------------------------------------------------------ convert

CONVERT = Command(
    name="convert",
    summary=convert_cli.SUMMARY,
    example=convert_cli.EXAMPLE,
    add_arguments=convert_cli.add_arguments,
    run=convert_cli.run,
)


# ---------------------------------------------------------------------------------------------- compare

COMPARE = Command(
    name="compare",
    summary=compare_cli.SUMMARY,
    example=compare_cli.EXAMPLE,
    add_arguments=compare_cli.add_arguments,
    run=compare_cli.run,
)


# ------------------------------------------------------------------------------------------ bench and viz

BENCH = Command(
    name="bench",
    summary="measure training, prefill and decode throughput and peak memory as ratios to a baseline",
    example="attnzoo bench --variants mha+rope diff+rope dcmha+rope --seq-lens 256 1024 --out bench",
    add_arguments=bench.add_arguments,
    run=bench.run,
)

VIZ = Command(
    name="viz",
    summary="attention heatmaps per layer and head for a prompt and a trained model (PNG)",
    example='attnzoo viz runs/diff-rope-20250101-120000 --prompt "ROMEO: But soft" --out maps',
    add_arguments=viz.add_arguments,
    run=viz.run,
)


# ---------------------------------------------------------------------------------------------- entry point

COMMANDS: tuple[Command, ...] = (COMPARE, TRAIN, GENERATE, EVAL, INFO, CONVERT, BENCH, VIZ)


@contextlib.contextmanager
def _library_messages() -> Iterator[None]:
    """Show the library's INFO messages (downloads, tokenization) as plain lines on stderr while a command runs."""
    logger = logging.getLogger("attnzoo")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def build_parser(commands: tuple[Command, ...] = COMMANDS) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnzoo",
        description="Attention mechanisms for decoder-only Transformers: train, sample, evaluate and inspect.",
        epilog="Run `attnzoo COMMAND --help` for a command's options and an example.",
    )
    parser.add_argument("--version", action="version", version=f"attnzoo {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    for command in commands:
        sub = subparsers.add_parser(
            command.name,
            help=command.summary,
            description=command.summary[0].upper() + command.summary[1:] + ".",
            epilog=f"example:\n  {command.example}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add_arguments(sub)
        sub.set_defaults(command=command)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with _library_messages():
        try:
            return args.command.run(args)
        except USER_ERRORS as err:
            print(f"attnzoo {args.command.name}: error: {err}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:  # outside the training loop, which handles SIGINT itself
            print(f"attnzoo {args.command.name}: interrupted", file=sys.stderr)
            return 130
