"""The ``attnzoo`` command line (also ``python -m attnzoo``).

One module per subcommand, each holding its flags (``add_arguments``) and what running it does (``run``):
:mod:`~attnzoo.cli.train`, :mod:`~attnzoo.cli.generate`, :mod:`~attnzoo.cli.eval`, :mod:`~attnzoo.cli.info`,
:mod:`~attnzoo.cli.compare`, :mod:`~attnzoo.cli.convert`, :mod:`~attnzoo.cli.bench` and :mod:`~attnzoo.cli.viz`.
The flags that mirror the config dataclasses come from :mod:`attnzoo.cli.flags`. A command module reads the
Namespace and calls the library with typed arguments; a new subcommand is one more module, listed with its
summary in :data:`COMMANDS`. Only the module of the command run is imported: ``attnzoo --help`` loads no torch.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Collection, Iterator

from attnzoo import __version__
from attnzoo.cli.command import Command

COMMANDS: tuple[Command, ...] = (
    Command(
        name="compare",
        computes=True,
        summary="train attention variants side by side under one budget and write a report "
        "(quick: 5-8 min on 2 CPU cores)",
        example=(
            "attnzoo compare\n"
            "  attnzoo compare --preset standard --out runs/compare-standard\n"
            "  attnzoo compare --variants mha+rope mha+rope+kv1 diff+alibi --seeds 3 --tasks mqar\n"
            "  attnzoo compare --config examples/compare.toml --seeds 2\n"
            "  attnzoo compare --out docs/claims-one-size --report-only"
        ),
    ),
    Command(
        name="train",
        computes=True,
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
    ),
    Command(
        name="generate",
        summary="sample text from a trained model",
        example='attnzoo generate runs/mha-rope-20250101-120000 --prompt "ROMEO:" --max-new-tokens 300 --top-k 40',
    ),
    Command(
        name="eval",
        computes=True,
        summary="score a trained model (loss, perplexity, bits per byte, length extrapolation) or a synthetic task",
        example="attnzoo eval runs/mha-rope-20250101-120000 --seq-len 512\n"
        "  attnzoo eval runs/mha-alibi-20250101-120000 --task extrapolation\n"
        "  attnzoo eval runs/diff-rope-20250101-120000 --task probes --json\n"
        "  attnzoo eval --task mqar --variant diff+rope --steps 500",
    ),
    Command(
        name="info",
        summary="parameter counts by component, KV-cache bytes and the configuration of a run or of the given flags",
        example="attnzoo info runs/mha-rope-20250101-120000\n  attnzoo info --attention mha --n-kv-heads 2 --dim 256"
        "\n  attnzoo info --attention dcmha --context 4096 --cache-batch 8",
    ),
    Command(
        name="convert",
        summary="convert a local Hugging Face or official DCFormer model directory into an attnzoo model directory, "
        "an MHA model into GQA/MQA, or an attnzoo model into a transformers checkpoint",
        example=(
            "attnzoo convert --from-hf ~/models/llama --out models/llama\n"
            "  attnzoo convert --from runs/mha --out models/mha-gqa2 --kv-heads 2\n"
            "  attnzoo convert --from runs/mha --to-hf hf/mha\n"
            "  attnzoo train --init-from models/llama --attention selective --attention-option "
            "position_coefficient=linear --train-only temperature"
        ),
    ),
    Command(
        name="bench",
        computes=True,
        summary="measure training, prefill and decode throughput and peak memory as ratios to a baseline",
        example="attnzoo bench --variants mha+rope diff+rope dcmha+rope --seq-lens 256 1024 --out runs/bench",
    ),
    Command(
        name="viz",
        summary="attention heatmaps per layer and head for a prompt and a trained model (PNG)",
        example='attnzoo viz runs/diff-rope-20250101-120000 --prompt "ROMEO: But soft" --out maps',
    ),
)


def user_errors() -> tuple[type[BaseException], ...]:
    """Errors that are the user's to fix: shown as one line, without a traceback. Imported when an error is
    handled, by which time the command has loaded their modules."""
    from attnzoo.data.corpora import CorpusError
    from attnzoo.data.tokenizers import MissingDependencyError
    from attnzoo.io import DirectoryLocked
    from attnzoo.training.checkpoint import CheckpointError
    from attnzoo.training.trainer import TrainingDiverged

    return (
        ValueError,
        FileNotFoundError,
        CorpusError,
        CheckpointError,
        TrainingDiverged,
        MissingDependencyError,
        MemoryError,  # check_memory's refusals, named before allocating
        DirectoryLocked,
    )


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


def build_parser(
    commands: tuple[Command, ...] = COMMANDS, only: Collection[str] | None = None
) -> argparse.ArgumentParser:
    """The parser of every command, or, with ``only``, one that knows the flags of those commands alone (the
    others are listed but take none): what parsing one command's arguments needs, without importing the rest."""
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
        if only is None or command.name in only:
            command.add_arguments(sub)
        sub.set_defaults(command=command)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser(only=argv[:1]).parse_args(argv)  # the command, if any, comes first
    except KeyboardInterrupt:
        print("attnzoo: interrupted", file=sys.stderr)
        return 130
    with _library_messages():
        try:
            if args.command.computes:
                _take_free_cores()
            return args.command.run(args)
        except BrokenPipeError:
            return _closed_pipe()
        except KeyboardInterrupt:  # outside the training loop, which handles SIGINT itself
            print(f"attnzoo {args.command.name}: interrupted", file=sys.stderr)
            return 130
        except Exception as err:
            said = _one_line(err)
            if said is None:
                raise  # a bug: its traceback is what to report
            print(f"attnzoo {args.command.name}: error: {said}", file=sys.stderr)
            return 1


def _take_free_cores() -> None:
    """One torch thread per core the load leaves free (OMP_NUM_THREADS wins); a choice the load made is said in
    one line on stderr."""
    import torch

    from attnzoo.machine import THREADS_VARIABLE, CpuLoad, choose_threads

    choice = choose_threads(CpuLoad.now(), os.environ.get(THREADS_VARIABLE))
    torch.set_num_threads(choice.threads)
    if choice.reason is not None:
        print(choice.reason, file=sys.stderr)


def _one_line(err: Exception) -> str | None:
    """The line an error the user can act on is shown as; ``None`` for any other."""
    from attnzoo.io import TooLarge, describe_os_error

    if isinstance(err, TooLarge):
        return err.describe(_flag)
    if isinstance(err, user_errors()):
        return str(err) or type(err).__name__  # a MemoryError from an allocation too large to try has no message
    if isinstance(err, OSError):  # the machine's doing (disk full, permissions ...): one line naming the file
        return describe_os_error(err)
    return None


# The settings a size grows with, as the flags that set them (TooLarge names a setting by its field's name).
FLAG_OF_SETTING = {"vocab_size": "--tokenizer's vocab_size", "batch": "--num-samples"}


def _flag(setting: str) -> str:
    return FLAG_OF_SETTING.get(setting, "--" + setting.replace("_", "-"))


def _closed_pipe() -> int:
    """The reader of stdout went away (``attnzoo info RUN | head -1``): stop quietly, as Unix tools do."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's flush at exit would raise again on the closed pipe
    except (OSError, ValueError):
        pass
    return 141  # 128 + SIGPIPE, what a shell reports for a command killed by the closed pipe


__all__ = ["COMMANDS", "Command", "build_parser", "main"]
