"""Where a comparison's training runs execute: ``inline`` (in the driver, one after another: the default and the
reference), ``local`` processes, ``slurm`` through submitit, or a ``ray`` cluster.

A run is a pure function of (spec, output directory, variant, seed): the driver's ``work``
(:func:`attnzoo.compare.runner.train_run`) trains and evaluates it on a worker and writes its records under
``OUT/runs/<variant>/seed<k>`` exactly as the inline loop does, its output in ``OUT/logs/<variant>/seed<k>.log``.
The driver submits the runs not yet finished, then reads every record back through the inline loop ("reusing ...
finished earlier"), so the report is assembled by the same code whichever engine trained the runs, and a driver
that died resubmits only what is still missing. The output directory must be one that every worker can write (a
shared filesystem on a cluster).

The engines are the ones researchers already run, not a scheduler of our own: :mod:`concurrent.futures` processes,
`submitit <https://github.com/facebookincubator/submitit>`_ (Slurm; its ``cluster="local"`` runs the same jobs as
local processes) and `Ray <https://docs.ray.io>`_. Each is an optional extra.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from attnzoo.compare.progress import duration
from attnzoo.variants import Variant

if TYPE_CHECKING:
    from attnzoo.compare.spec import CompareSpec

EXECUTORS = ("inline", "local", "slurm", "ray")
# The [executor] options each engine takes; submitit checks its own (None), and names what it does not know.
OPTIONS: dict[str, frozenset[str] | None] = {
    "inline": frozenset(),
    "local": frozenset({"threads"}),
    "slurm": None,
    "ray": frozenset({"address", "num_cpus", "num_gpus"}),
}


@dataclass(frozen=True)
class ExecutorConfig:
    """How the runs execute. ``options`` is the engine's own (the ``[executor]`` table of a compare TOML): for
    ``slurm`` submitit's ``update_parameters`` keywords (``slurm_partition``, ``timeout_min``, ``gpus_per_node``,
    ``cpus_per_task``, ...) plus ``cluster`` ("local" runs them as local processes); for ``ray`` ``address`` and
    the resources of each run (``num_cpus``, ``num_gpus``); for ``local`` ``threads`` per run."""

    name: str = "inline"
    jobs: int | None = None  # local only: runs at once (default: one per GPU, else one per core)
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name not in EXECUTORS:
            raise ValueError(f"executor={self.name!r} is unknown; choose one of {list(EXECUTORS)}")
        if self.jobs is not None and (self.name != "local" or not 1 <= self.jobs <= 1024):
            raise ValueError(f"jobs={self.jobs} is invalid: --jobs is an integer in [1, 1024], for --executor local")
        allowed = OPTIONS[self.name]
        unknown = sorted(set(self.options) - allowed) if allowed is not None else []
        if unknown:
            raise ValueError(
                f"[executor] option(s) {unknown} mean nothing to executor {self.name!r}; it takes "
                f"{sorted(allowed) or 'none'}"  # type: ignore[arg-type]
            )


INLINE = ExecutorConfig()


@dataclass(frozen=True)
class RunJob:
    """One language-model run of a comparison."""

    variant: Variant
    seed: int
    executor: str  # the engine it runs on, recorded with the run

    def log_path(self, out_dir: Path) -> Path:
        return out_dir / "logs" / self.variant.label / f"seed{self.seed}.log"

    def __str__(self) -> str:
        return f"{self.variant.label} · seed {self.seed}"


# A run on a worker: (spec, output directory, run, threads or None for the engine's default). A module-level
# function, so that every engine can pickle it.
Work = Callable[["CompareSpec", str, RunJob, "int | None"], None]


class RunsFailed(RuntimeError):
    """Runs that raised on their workers twice; every other run was finished and kept."""


class Executor(ABC):
    """Submits runs and yields each as it ends: ``(job, None)`` or ``(job, the error it raised)``."""

    def __init__(self, spec: CompareSpec, out_dir: Path, work: Work):
        self.spec, self.out_dir, self.work = spec, out_dir.resolve(), work

    @abstractmethod
    def execute(self, jobs: list[RunJob]) -> Iterator[tuple[RunJob, str | None]]:
        """Every job of ``jobs`` exactly once, in the order they end."""

    @abstractmethod
    def close(self) -> None:
        """Release the engine (a pool of processes, a Ray connection)."""


class LocalProcesses(Executor):
    """``jobs`` processes on this machine: each run on one GPU where there are as many, else on
    ``cores // jobs`` threads (or the ``threads`` option)."""

    def __init__(self, spec: CompareSpec, out_dir: Path, work: Work, jobs: int | None, threads: int | None):
        super().__init__(spec, out_dir, work)
        device = spec.train.device
        gpus = torch.cuda.device_count() if device.startswith("cuda") or device == "auto" else 0
        self.jobs = jobs or gpus or os.cpu_count() or 1
        self.threads = threads or max(1, (os.cpu_count() or 1) // self.jobs)
        self.gpus = gpus >= self.jobs > 1  # one GPU each
        self.pool = self._new_pool()

    def _new_pool(self) -> ProcessPoolExecutor:
        context = multiprocessing.get_context("spawn")  # a fork would share torch's threads and CUDA state
        slots = context.Queue()
        for slot in range(self.jobs):
            slots.put(slot)
        return ProcessPoolExecutor(self.jobs, context, initializer=_take_slot, initargs=(slots, self.gpus))

    def execute(self, jobs: list[RunJob]) -> Iterator[tuple[RunJob, str | None]]:
        pending = {self.pool.submit(self.work, self.spec, str(self.out_dir), job, self.threads): job for job in jobs}
        broken = False
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                error = future.exception()
                broken |= isinstance(error, BrokenProcessPool)
                yield pending.pop(future), None if error is None else _described(error)
        if broken:  # a dead worker takes the pool with it: the runs tried again get a fresh one
            self.pool.shutdown(cancel_futures=True)
            self.pool = self._new_pool()

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)


def _described(error: BaseException) -> str:
    if isinstance(error, BrokenProcessPool):
        return (
            "BrokenProcessPool: a worker process died outside the run, so it may have written no log: out of memory, "
            'a crash in native code, or a script that calls run_compare without `if __name__ == "__main__":` '
            "(the workers are spawned, and each imports the calling script)"
        )
    return f"{type(error).__name__}: {error}"


def _take_slot(slots: Any, one_gpu_each: bool) -> None:
    """A worker's first act, before torch touches CUDA: its own GPU, where each has one."""
    slot = slots.get()
    if one_gpu_each:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = visible.split(",")[slot] if visible else str(slot)


class Submitit(Executor):
    """Each run a submitit job (Slurm by default), its submitit logs under ``OUT/logs/submitit``."""

    def __init__(self, spec: CompareSpec, out_dir: Path, work: Work, options: dict[str, Any]):
        super().__init__(spec, out_dir, work)
        submitit = _engine("submitit", "slurm")
        options = dict(options)
        cluster = options.pop("cluster", None)
        self.executor = submitit.AutoExecutor(folder=self.out_dir / "logs" / "submitit", cluster=cluster)
        self.executor.update_parameters(name=f"attnzoo-{spec.name}", **options)
        self.threads = options.get("cpus_per_task")

    def execute(self, jobs: list[RunJob]) -> Iterator[tuple[RunJob, str | None]]:
        out = str(self.out_dir)
        submitted = {job: self.executor.submit(self.work, self.spec, out, job, self.threads) for job in jobs}
        while submitted:
            for job, handle in list(submitted.items()):
                if handle.done():
                    del submitted[job]
                    try:
                        handle.result()
                        yield job, None
                    except Exception as err:  # submitit's FailedJobError carries the worker's traceback
                        yield job, f"{type(err).__name__}: {str(err).strip().splitlines()[-1]}"
            time.sleep(1.0)

    def close(self) -> None:
        pass  # jobs already submitted belong to the cluster; a run that did not finish resumes from its checkpoint


class Ray(Executor):
    """Each run a Ray task holding ``num_cpus`` (default 1) and ``num_gpus`` (default 0) of the cluster at
    ``address`` (default: a local runtime)."""

    def __init__(self, spec: CompareSpec, out_dir: Path, work: Work, options: dict[str, Any]):
        super().__init__(spec, out_dir, work)
        self.ray = _engine("ray", "ray")
        if not self.ray.is_initialized():
            self.ray.init(address=options.get("address"), include_dashboard=False, log_to_driver=False)
        self.cpus = int(options.get("num_cpus", 1))
        self.task = self.ray.remote(num_cpus=self.cpus, num_gpus=options.get("num_gpus", 0), max_retries=0)(work)

    def execute(self, jobs: list[RunJob]) -> Iterator[tuple[RunJob, str | None]]:
        pending = {self.task.remote(self.spec, str(self.out_dir), job, self.cpus): job for job in jobs}
        while pending:
            done, _ = self.ray.wait(list(pending), num_returns=1)
            job = pending.pop(done[0])
            try:
                self.ray.get(done[0])
                yield job, None
            except self.ray.exceptions.RayTaskError as err:
                yield job, f"{type(err.cause).__name__}: {err.cause}"

    def close(self) -> None:
        self.ray.shutdown()


def _engine(module: str, extra: str) -> Any:
    try:
        return __import__(module)
    except ImportError:
        raise ValueError(
            f'--executor {extra} runs on {module}, which is not installed: pip install -e ".[{extra}]" in your '
            f"attnzoo clone (or pip install {module})"
        ) from None


def make_executor(config: ExecutorConfig, spec: CompareSpec, out_dir: Path, work: Work) -> Executor:
    if config.name == "local":
        return LocalProcesses(spec, out_dir, work, config.jobs, config.options.get("threads"))
    if config.name == "slurm":
        return Submitit(spec, out_dir, work, config.options)
    if config.name == "ray":
        return Ray(spec, out_dir, work, config.options)
    raise ValueError(f"executor {config.name!r} runs in the driver itself")


def run_elsewhere(
    config: ExecutorConfig,
    spec: CompareSpec,
    out_dir: Path,
    todo: list[RunJob],
    work: Work,
    say: Callable[[str], None],
) -> None:
    """``work`` each run of ``todo`` on ``config``'s engine: the runs an uptrained variant starts from first, then
    the uptrained ones; a run that fails is reported with its log and tried once more, and the others are kept.
    Raises :class:`RunsFailed` naming each run that failed twice."""
    waves = [
        [job for job in todo if job.variant.uptrain is None],
        [job for job in todo if job.variant.uptrain is not None],
    ]
    executor = make_executor(config, spec, out_dir, work)
    started, finished = time.perf_counter(), 0
    try:
        for wave in waves:
            for attempt in (1, 2):
                failed = []
                for job, error in executor.execute(wave):
                    if error is None:
                        finished += 1
                        elapsed = time.perf_counter() - started
                        left = elapsed / finished * (len(todo) - finished)
                        say(
                            f"[{finished}/{len(todo)}] {job} finished on {config.name} · {duration(elapsed)} "
                            f"elapsed{f' · about {duration(left)} left' if left else ''}"
                        )
                    else:
                        failed.append(job)
                        again = "trying it once more" if attempt == 1 else "not trying again"
                        say(f"{job} failed on its worker ({error}); log: {job.log_path(out_dir)}; {again}")
                wave = failed
                if not wave:
                    break
            if wave:
                raise RunsFailed(
                    f"{len(wave)} run(s) failed twice: "
                    + "; ".join(f"{job} (log: {job.log_path(out_dir)})" for job in wave)
                    + f". Every other run is kept in {out_dir}: fix the cause and run the same command again"
                )
    finally:
        executor.close()
