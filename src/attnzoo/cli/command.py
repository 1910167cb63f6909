"""The record every subcommand is: what ``attnzoo --help`` lists and what ``attnzoo NAME`` runs.

It lives apart from :mod:`attnzoo.cli` because each command module builds one and the package lists them all.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnzoo.validation import MAX_SEED, is_int, is_seed


@dataclass(frozen=True)
class Command:
    name: str
    summary: str  # one line, lower case, no full stop: the --help listing and the command's description
    example: str  # shown under "example:" in the command's --help; further lines indented by two spaces
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]  # the exit code


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
    if value is not None and not (is_int(value) and value >= minimum):
        raise ValueError(f"{flag}={value!r} is invalid: must be an integer >= {minimum}")


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
