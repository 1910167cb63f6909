"""Crash-safe file writes: a reader sees either the old file or the complete new one, never a torn write."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success fsync it and rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        # mkstemp creates files readable by their owner alone; give the permissions open() would.
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> None:
    """Atomically create ``path`` with ``write(tmp_path)``, for writers that take a file name."""
    with atomic_path(path) as tmp:
        write(tmp)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# Read once at import: setting the umask to read it would race with other threads creating files.
_UMASK = _read_umask()


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; not every platform lets a directory be opened.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
