"""The budgeted worker: the cases run in turn in one process, which is stopped when a case overruns the budget."""

from __future__ import annotations

import multiprocessing
import signal
import time
from multiprocessing.connection import Connection
from types import FrameType
from typing import Any

import bench_dcmha_triton

from gpu.measure import run_case
from gpu.plan import ERROR, Case, Settings

GRACE_S = 10.0  # how long past its budget a case may run before the worker is stopped


def worker_main(conn: Connection, settings: Settings) -> None:
    # The parent alone answers timeout's SIGTERM and a Ctrl-C: it records the case in flight, then stops this process.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    bench_dcmha_triton.listen_to_tuning()
    while (message := conn.recv()) is not None:
        case, seconds = message
        conn.send(run_case(case, settings, seconds))


class Worker:
    """The worker process, seen from the parent."""

    def __init__(self, settings: Settings):
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        # Not a daemon: inductor compiles in a pool of processes, which a daemon may not start.
        self.process = context.Process(target=worker_main, args=(child, settings))
        self.process.start()
        child.close()

    def run(self, case: Case, seconds: float) -> dict[str, Any] | None:
        """The case's record, or None when it ran ``GRACE_S`` past ``seconds`` (the worker is then stopped)."""
        self.conn.send((case, seconds))
        limit = time.perf_counter() + seconds + GRACE_S
        while not self.conn.poll(0.5):
            if not self.process.is_alive():
                return {"status": ERROR, "reason": f"the worker process died (exit code {self.process.exitcode})"}
            if time.perf_counter() > limit:
                self.stop()
                return None
        try:
            return self.conn.recv()
        except EOFError:
            return {"status": ERROR, "reason": f"the worker process died (exit code {self.process.exitcode})"}

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()


class Stopped(Exception):
    """SIGTERM (timeout's) or SIGINT arrived."""


def on_signal(signum: int, frame: FrameType | None) -> None:
    raise Stopped(signal.Signals(signum).name)


def skip_before_start(case: Case, left: float, done: list[tuple[Case, dict[str, Any]]]) -> str | None:
    """Why ``case`` is not started with ``left`` seconds of the budget, or None: when the quickest finished case of
    its kind took longer than that."""
    if left <= 0:
        return "the budget was spent before it"
    times = [(record["wall_s"], other.name) for other, record in done if other.similar == case.similar]
    if times and min(times)[0] > left:
        seconds, name = min(times)
        return f"{name} took {seconds:.0f} s and {left:.0f} s of the budget were left"
    return None
