"""What a comparison stores, read back and written: each record of its directory (a run's, the bench's, a task
run's), reused only when it reads whole, and a stored ``results.json`` read for a report, the file itself refused by
name where it is no results file. Numbers are checked on reading (:mod:`attnzoo.results.checks`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TypeVar

from attnzoo.io import atomic_write_text, file_kind
from attnzoo.records import from_dict, to_dict
from attnzoo.results.checks import check_record
from attnzoo.results.comparison import CompareResults

R = TypeVar("R")


def read_record(cls: type[R], path: Path) -> R | None:
    """The record stored at ``path``, or None if it is missing, damaged or of another schema: then the work
    it records is redone. One that reads but holds a number that cannot be (edited by hand, or by a bug) is
    refused by name (:func:`attnzoo.results.checks.check_record`): redoing it would hide what happened."""
    try:
        record = from_dict(cls, json.loads(path.read_text(encoding="utf-8")), str(path))
    except (OSError, ValueError, TypeError):
        return None
    check_record(record, str(path))
    return record


def write_record(record: Any, path: Path) -> None:
    atomic_write_text(path, json.dumps(to_dict(record), indent=2) + "\n")


def jsonable(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists), so stored and fresh values compare equal."""
    return json.loads(json.dumps(value))


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
