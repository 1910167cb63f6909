"""The record every subcommand is (what ``attnzoo --help`` lists and what ``attnzoo NAME`` runs), and the checks
the command modules share."""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnzoo.validation import MAX_SEED, is_seed, require_count


@dataclass(frozen=True)
class Command:
    """A subcommand: its flags and what running it does are ``add_arguments`` and ``run`` of the module
    ``attnzoo.cli.NAME``, imported only when the command is asked for (its imports, torch among them, take
    seconds that ``attnzoo --help`` need not wait for)."""

    name: str
    summary: str  # one line, lower case, no full stop: the --help listing and the command's description
    example: str  # shown under "example:" in the command's --help; further lines indented by two spaces
    computes: bool = False  # computes for long: takes one torch thread per free core (attnzoo.machine)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        importlib.import_module(f"attnzoo.cli.{self.name}").add_arguments(parser)

    def run(self, args: argparse.Namespace) -> int:
        """The exit code."""
        return importlib.import_module(f"attnzoo.cli.{self.name}").run(args)


def path_argument(text: str) -> Path:
    """An argparse ``type`` for paths: ``Path("")`` is the current directory, so ``--out ''`` (an unset shell
    variable) would write there."""
    if not text:
        raise argparse.ArgumentTypeError("the path is empty: name a file or directory ('.' for this one)")
    return Path(text)


def check_out_dir(path: Path | None, flag: str = "--out") -> None:
    """A directory to write into: absent (it is created) or a directory, never an existing file."""
    if path is not None and path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {path} is a file, not a directory: name a directory to write into")


def check_int(flag: str, value: Any, minimum: int = 1) -> None:
    """A flag's integer of at least ``minimum`` (``None``: not given, its default applies)."""
    if value is not None:
        require_count(flag, value, minimum)


def check_seed(flag: str, value: Any) -> None:
    if value is not None and not is_seed(value):
        raise ValueError(f"{flag}={value!r} is invalid: must be an integer in [0, {MAX_SEED}]")


def check_text(flag: str, text: str) -> None:
    """Text a tokenizer can encode: a lone surrogate (from undecodable bytes in argv) is not Unicode text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        char = text[err.start]
        raise ValueError(
            f"{flag} holds U+{ord(char):04X} at index {err.start}, a lone surrogate: not valid Unicode text "
            "(was it typed in another encoding than UTF-8?)"
        ) from None
