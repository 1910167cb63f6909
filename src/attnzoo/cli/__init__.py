"""The ``attnzoo`` command line (also ``python -m attnzoo``).

One module per subcommand, each holding its flags and what running it does as one :class:`Command`
(``COMMAND``): :mod:`~attnzoo.cli.train`, :mod:`~attnzoo.cli.generate`, :mod:`~attnzoo.cli.eval`,
:mod:`~attnzoo.cli.info`, :mod:`~attnzoo.cli.compare`, :mod:`~attnzoo.cli.convert`, :mod:`~attnzoo.cli.bench`
and :mod:`~attnzoo.cli.viz`. The flags that mirror the config dataclasses come from :mod:`attnzoo.cli.flags`.
A command module reads the Namespace and calls the library with typed arguments; a new subcommand is one
more module, listed in :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Iterator

from attnzoo import __version__
from attnzoo.cli import bench, compare, convert, eval, generate, info, train, viz
from attnzoo.cli.command import Command
from attnzoo.data.corpora import CorpusError
from attnzoo.data.tokenizers import MissingDependencyError
from attnzoo.io import DirectoryLocked, TooLarge, describe_os_error
from attnzoo.training.checkpoint import CheckpointError
from attnzoo.training.trainer import TrainingDiverged

COMMANDS: tuple[Command, ...] = tuple(
    module.COMMAND for module in (compare, train, generate, eval, info, convert, bench, viz)
)

# Errors that are the user's to fix: shown as one line, without a traceback.
USER_ERRORS = (
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
    try:
        args = build_parser().parse_args(argv)
    except KeyboardInterrupt:
        print("attnzoo: interrupted", file=sys.stderr)
        return 130
    with _library_messages():
        try:
            return args.command.run(args)
        except BrokenPipeError:
            return _closed_pipe()
        except TooLarge as err:
            print(f"attnzoo {args.command.name}: error: {err.describe(_flag)}", file=sys.stderr)
            return 1
        except USER_ERRORS as err:
            # A MemoryError from an allocation too large for the allocator to even try carries no message.
            print(f"attnzoo {args.command.name}: error: {err or type(err).__name__}", file=sys.stderr)
            return 1
        except OSError as err:  # the machine's doing (disk full, permissions ...): one line naming the file
            print(f"attnzoo {args.command.name}: error: {describe_os_error(err)}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:  # outside the training loop, which handles SIGINT itself
            print(f"attnzoo {args.command.name}: interrupted", file=sys.stderr)
            return 130


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
