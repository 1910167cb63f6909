"""The record every subcommand is: what ``attnzoo --help`` lists and what ``attnzoo NAME`` runs.

It lives apart from :mod:`attnzoo.cli` because each command module builds one and the package lists them all.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    name: str
    summary: str  # one line, lower case, no full stop: the --help listing and the command's description
    example: str  # shown under "example:" in the command's --help; further lines indented by two spaces
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]  # the exit code
