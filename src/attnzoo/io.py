"""Crash-safe file writes: a reader sees either the old file or the complete new one, never a torn write."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import torch


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


def available_memory(device: torch.device | str) -> int | None:
    """Bytes that can still be allocated on ``device``: free GPU memory, or the host's available RAM (Linux's
    MemAvailable); ``None`` where it cannot be told."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def check_memory(nbytes: int, what: str, device: torch.device | str) -> None:
    """Refuse, before allocating, ``nbytes`` that ``device`` does not have: name the size and the memory."""
    available = available_memory(device)
    if available is not None and nbytes > available:
        raise MemoryError(
            f"{what} needs {nbytes / 2**30:,.1f} GiB but {torch.device(device)} has {available / 2**30:,.1f} GiB "
            "available: ask for less"
        )


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
