"""``attnzoo train``: a run from the defaults, a TOML file and flags; resumed, or started from a pretrained model."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from datetime import datetime
from pathlib import Path

from attnzoo.cli.command import check_out_dir, path_argument
from attnzoo.cli.flags import (
    add_config_argument,
    add_model_arguments,
    add_train_arguments,
    given,
    model_flags_given,
    model_settings_from_args,
    train_config_from_args,
)
from attnzoo.config import ModelConfig
from attnzoo.data.tokenizers import HF_PREFIX, Tokenizer, tokenizer_from_name
from attnzoo.distributed import init_distributed, shutdown_distributed
from attnzoo.training.checkpoint import Checkpoint, CheckpointError, latest_checkpoint, read_checkpoint
from attnzoo.training.config import TrainConfig, load_toml
from attnzoo.training.metrics import require_tensorboard
from attnzoo.training.trainer import Trainer, load_corpus, lock_run_directory


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument(
        "--out",
        metavar="DIR",
        type=path_argument,
        help="run directory (default: runs/ATTENTION-POSITION-YYYYmmdd-HHMMSS)",
    )
    parser.add_argument(
        "--resume",
        metavar="RUN_DIR",
        type=path_argument,
        help="continue the run in RUN_DIR from its latest checkpoint, with its saved configuration",
    )
    parser.add_argument(
        "--init-from",
        metavar="DIR",
        type=path_argument,
        help="start from a pretrained model (a run, a checkpoint, or a directory of `attnzoo convert` or "
        "save_pretrained): its configuration, overridden by the model flags given, and its weights. A mechanism "
        "that extends its attention (--attention selective or dcmha over mha) adds parameters that start at "
        "identity where the math allows",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (evaluation lines still print)")
    parser.add_argument(
        "--tensorboard",
        metavar="DIR",
        type=path_argument,
        help="also write the metrics as TensorBoard scalars into DIR, beside metrics.jsonl (off by default; needs "
        'the optional tensorboard package: pip install -e ".[tensorboard]")',
    )
    add_model_arguments(parser)
    add_train_arguments(parser)


def _tokenizer_named(args: argparse.Namespace) -> bool:
    """Whether --tokenizer or the --config file names the tokenizer."""
    return "tokenizer" in given(args, "data") or bool(args.config and "tokenizer" in load_toml(args.config)["data"])


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


def run(args: argparse.Namespace) -> int:
    check_out_dir(args.out)
    if args.tensorboard is not None:
        require_tensorboard()  # before any data or model work
    checkpoint = pretrained = tokenizer = None
    if args.resume is not None:
        if args.init_from is not None:
            raise ValueError("--resume continues a run from its own checkpoint; drop --init-from")
        if model_flags_given(args):
            raise ValueError(
                f"--resume continues a run with its saved model; drop {', '.join(model_flags_given(args))}"
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
        with contextlib.ExitStack() as lock:
            if checkpoint is not None:
                lock.enter_context(lock_run_directory(run_dir, env))  # before loading data: fail fast
            corpus = load_corpus(train_config.data, env, tokenizer)
            if checkpoint is None:
                # A pretrained model keeps its vocabulary, which the Trainer checks against the corpus's tokenizer.
                vocab_size = pretrained.model_config.vocab_size if pretrained else corpus.tokenizer.vocab_size
                model_config = ModelConfig.from_dict({**settings, "vocab_size": vocab_size})
                run_dir = env.broadcast(run_dir or _default_run_dir(model_config))
                # Held from here to the end of training, so that two runs started together into one --out
                # cannot both pass the check below: the second is refused with the first one's pid.
                lock.enter_context(lock_run_directory(run_dir, env))
                if latest_checkpoint(run_dir) is not None:
                    raise ValueError(
                        f"{run_dir} already holds a run: continue it with --resume {run_dir}, or pick --out"
                    )
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
                tensorboard=args.tensorboard,
            )
            result = trainer.fit()
    except BaseException:
        shutdown_distributed()
        raise
    shutdown_distributed(synchronize=True)  # every rank finished: leave together
    # Like a shell, report a stop by signal as 128 + its number, so scripts can tell it from completion.
    return 128 + result.interrupted_by if result.interrupted_by is not None else 0


def _default_run_dir(model_config: ModelConfig) -> Path:
    return Path("runs") / f"{model_config.attention}-{model_config.position}-{datetime.now():%Y%m%d-%H%M%S}"
