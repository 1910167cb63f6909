"""A stored ``results.json`` read for a report: the file itself refused by name where it is no results file, its
numbers checked on loading (:mod:`attnzoo.results.checks`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from attnzoo.io import file_kind
from attnzoo.results.comparison import CompareResults


def load_results(path: Path) -> CompareResults:
    """The results file at ``path``, refused by name when it is not a regular file, not JSON text, not of this
    schema, or holds a number that cannot be."""
    if not path.exists():
        raise ValueError(f"{path} does not exist; run the compare first (or name its --out)")
    if not path.is_file():
        raise ValueError(f"{path} is a {file_kind(path)}, not a results file: --out names the compare's directory")
    if os.path.getsize(path) == 0:
        raise ValueError(f"{path} is empty, not a compare's results (a write cut short?); run the compare again")
    try:
        return CompareResults.load(path)
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{path} is not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset {err.start}): not a compare's "
            "results"
        ) from None
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{path} is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}): cut short or edited? "
            "run the compare again to rewrite it"
        ) from None
