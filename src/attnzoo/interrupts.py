"""What a long command does with SIGINT and SIGTERM while it measures: stop with the signal's name, so the caller
keeps what it has measured (:func:`stop_on_signals`), or leave the signal to the parent while a child process is
spawned (:func:`sigint_ignored`).

A leaf, so that whatever runs long can use it without importing what measures.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived while :func:`stop_on_signals` was in force."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Raise :class:`Interrupted` on SIGINT or SIGTERM while the block runs (SIGTERM alone would end the process
    without its cleanup), so a caller can keep what it has measured and name the signal."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted(signum)

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            if handler is not None:
                signal.signal(s, handler)


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        if previous is not None:  # None: a handler installed outside Python, which cannot be put back
            signal.signal(signal.SIGINT, previous)
