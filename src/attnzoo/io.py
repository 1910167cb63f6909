"""Crash-safe file writes (a reader sees either the old file or the complete new one, never a torn write) and
directory locks (one writer per run or compare directory)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success fsync it and rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        try:
            yield tmp
        except OSError as err:
            if err.filename in (None, str(tmp)):  # a failed close names no file; the temp name means nothing
                raise OSError(err.errno, err.strerror, str(path)) from err
            raise
        except Exception as err:
            # safetensors and torch.save report a full disk as SafetensorError / RuntimeError: name it as the
            # OSError it is, so that callers handle it like any other failed write.
            if free_bytes(tmp.parent) < DISK_FULL_MARGIN:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from err
            raise
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        # mkstemp creates files readable by their owner alone; give the permissions open() would.
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


# A writer that failed with less than this left to the user ran out of space: a write fails only once the
# file system cannot hold its next block, and writers' buffers are smaller than this.
DISK_FULL_MARGIN = 1 << 20
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def free_bytes(path: str | os.PathLike) -> int:
    """Bytes an unprivileged writer can still put on the file system holding ``path``."""
    return shutil.disk_usage(path).free


def mount_point(path: str | os.PathLike) -> Path:
    """The mount point of the file system holding ``path``: what a full disk is named by."""
    path = Path(path).resolve()
    while not path.exists():
        path = path.parent
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def describe_os_error(err: OSError) -> str:
    """One line for an OSError: what failed, on which file and, for a full disk, which disk (every file is
    written atomically, so the file it was replacing is intact)."""
    where = f"{err.filename}" + (f" → {err.filename2}" if err.filename2 else "") if err.filename else ""
    text = f"{err.strerror or err}" + (f": {where}" if where else "")
    if err.errno in DISK_FULL and err.filename:
        text += (
            f" (the disk mounted at {mount_point(err.filename)}). Nothing was lost: a file is replaced only once "
            "its new version is written in full. Free some space and run the command again."
        )
    return text


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> None:
    """Atomically create ``path`` with ``write(tmp_path)``, for writers that take a file name."""
    with atomic_path(path) as tmp:
        write(tmp)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def file_kind(path: Path) -> str:
    """What ``path`` is, for a message refusing it where a regular file is needed: 'FIFO', 'directory' ..."""
    mode = path.stat().st_mode
    kinds = ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
             (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"))  # fmt: skip
    return next((name for test, name in kinds if test(mode)), "special file")


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


class TooLarge(MemoryError):
    """An allocation refused before it was tried: its size, the memory there is, and the settings that set it."""

    def __init__(self, what: str, nbytes: int, available: int, device: torch.device, settings: dict[str, Any]):
        self.what, self.nbytes, self.available, self.device, self.settings = what, nbytes, available, device, settings
        super().__init__(self.describe())

    def describe(self, spell: Callable[[str], str] = str) -> str:
        """The refusal, each setting's name written by ``spell`` (the CLI writes ``n_layers`` as ``--n-layers``)."""
        lower = " or ".join(f"{spell(name)}={value}" for name, value in self.settings.items())
        return (
            f"{self.what} needs {self.nbytes / 2**30:,.1f} GiB but {self.device} has "
            f"{self.available / 2**30:,.1f} GiB available: lower {lower}"
        )


def check_memory(nbytes: int, what: str, device: torch.device | str, settings: dict[str, Any]) -> None:
    """Refuse, before allocating, ``nbytes`` that ``device`` does not have (:class:`TooLarge`), naming the
    ``settings`` (name: value) the size grows with."""
    available = available_memory(device)
    if available is not None and nbytes > available:
        raise TooLarge(what, nbytes, available, torch.device(device), settings)


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


# ------------------------------------------------------------------------------------------ directory locks

LOCK_NAME = ".attnzoo.lock"


class DirectoryLocked(RuntimeError):
    """Another live process is writing to the directory."""

    def __init__(self, directory: Path, pid: int | None, what: str):
        self.directory, self.pid = directory, pid
        holder = f"pid {pid}" if pid is not None else "a process that has not written its pid yet"
        super().__init__(
            f"{directory} is in use: another attnzoo process ({holder}) is writing this {what}. Wait for it to "
            f"finish or stop it, or choose another directory. The lock ({directory / LOCK_NAME}) is released "
            "when that process exits, even if it crashes."
        )


def _read_pid(fd: int) -> int | None:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 64).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


# The directories this process holds, with how many nested holds each: a flock belongs to one open file,
# so a second flock from this same process would refuse itself.
_HELD: dict[str, int] = {}
_HELD_LOCK = threading.Lock()


@contextlib.contextmanager
def locked_directory(directory: str | os.PathLike, what: str = "directory") -> Iterator[Path]:
    """Hold an exclusive lock on ``directory`` (created if needed) while the block runs.

    The lock is ``fcntl.flock`` on ``directory/.attnzoo.lock``, which holds the holder's pid. The OS drops a
    flock when its process dies, however it dies, so a crashed writer never leaves the directory stuck. Another
    process that asks for it gets :class:`DirectoryLocked` naming the holder's pid; within the holding process
    the lock nests (the CLI takes it early, the trainer again where it writes). Where there is no ``fcntl``
    (Windows) the block runs unlocked.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(directory)
    with _HELD_LOCK:
        nested = key in _HELD
        if nested:
            _HELD[key] += 1
    if nested or fcntl is None:
        try:
            yield directory
        finally:
            _release(key, nested)
        return
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        _acquire(fd, directory, what)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        with _HELD_LOCK:
            _HELD[key] = 1
        try:
            yield directory
        finally:
            _release(key, nested)
            os.ftruncate(fd, 0)  # no stale pid for the readers of the next holder's lock
    finally:
        os.close(fd)  # releases the flock


# How long a refused process waits for a lock file without a pid to change. A holder writes its pid just after it
# takes the lock and clears it just before it lets go: a contender that came in either window read no pid and was
# refused naming none (a two-process test failed so, once in many runs). Within the wait the holder's pid appears
# or the lock is free.
PID_WAIT_S = 2.0


def _acquire(fd: int, directory: Path, what: str) -> None:
    """Take the flock on ``fd`` or raise :class:`DirectoryLocked` naming the holder's pid, waiting up to
    :data:`PID_WAIT_S` while the lock is held by a process whose pid the file does not show."""
    deadline = time.monotonic() + PID_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pid = _read_pid(fd)
            if pid is not None or time.monotonic() >= deadline:
                raise DirectoryLocked(directory, pid, what) from None
        time.sleep(0.01)


def _release(key: str, nested: bool) -> None:
    with _HELD_LOCK:
        if nested:
            _HELD[key] -= 1
        elif key in _HELD:
            del _HELD[key]
