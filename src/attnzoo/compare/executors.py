"""Where a comparison's training runs execute: ``inline`` (in the driver, one after another: the default and the
reference), ``local`` processes, ``slurm`` through submitit, or a ``ray`` cluster.

A run is a pure function of (spec, output directory, variant, seed): the driver's ``work``
(:func:`attnzoo.compare.runner.train_run`) trains and evaluates it on a worker and writes its records under
``OUT/runs/<variant>/seed<k>`` exactly as the inline loop does, its output in ``OUT/logs/<variant>/seed<k>.log``.
The driver submits the runs not yet finished, then reads every record back through the inline loop ("reusing N of
M runs finished on executor ..." in one line), so the report is assembled by the same code whichever engine trained
the runs, and a driver that died resubmits only what is still missing. The output directory must be one that every
worker can write (a shared filesystem on a cluster).

The engines are the ones researchers already run, not a scheduler of our own: :mod:`concurrent.futures` processes,
`submitit <https://github.com/facebookincubator/submitit>`_ (Slurm; its ``cluster="local"`` runs the same jobs as
local processes) and `Ray <https://docs.ray.io>`_. Each is an optional extra.

A run may train on several processes (``nproc_per_run`` in the ``[executor]`` table, torchrun's
``--nproc_per_node``): its worker then launches ``python -m torch.distributed.run --standalone`` on the run's
processes (:func:`launch_ranks`), each joins one process group and trains with the spec's ``parallel`` strategy,
rank 0 alone writes the run's records, and every rank's output goes to the run's log. The engine reserves the run's
GPUs: ``local`` gives each run ``nproc_per_run`` of the visible ones, ``slurm`` asks for as many per job,
``ray`` per task.
"""

from __future__ import annotations

import ctypes
import math
import multiprocessing
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from attnzoo.compare.progress import duration
from attnzoo.distributed import Distributed
from attnzoo.validation import is_int
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
# The processes (torchrun ranks) of each run: an option of every engine, taken by attnzoo rather than passed on.
NPROC_PER_RUN = "nproc_per_run"
MAX_PROCESSES = 1024  # --jobs and nproc_per_run: more is a typo, not a machine
MAX_THREADS = 4096  # threads: likewise


@dataclass(frozen=True)
class ExecutorConfig:
    """How the runs execute. ``options`` is the engine's own (the ``[executor]`` table of a compare TOML): for
    ``slurm`` submitit's ``update_parameters`` keywords (``slurm_partition``, ``timeout_min``, ``gpus_per_node``,
    ``cpus_per_task``, ...) plus ``cluster`` ("local" runs them as local processes); for ``ray`` ``address`` and
    the resources of each run (``num_cpus``, ``num_gpus``); for ``local`` ``threads`` per process. Every engine
    but ``inline`` also takes ``nproc_per_run``, the processes each run trains on under torchrun (default 1)."""

    name: str = "inline"
    jobs: int | None = None  # local only: runs at once (default: one per GPU, else one per core)
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name not in EXECUTORS:
            raise ValueError(f"executor={self.name!r} is unknown; choose one of {list(EXECUTORS)}")
        if self.jobs is not None and (self.name != "local" or not 1 <= self.jobs <= MAX_PROCESSES):
            raise ValueError(
                f"jobs={self.jobs} is invalid: --jobs is an integer in [1, {MAX_PROCESSES}], for --executor local"
            )
        nproc = self.options.get(NPROC_PER_RUN, 1)
        if not (is_int(nproc) and 1 <= nproc <= MAX_PROCESSES):
            raise ValueError(
                f"[executor] {NPROC_PER_RUN}={nproc!r} is invalid: the processes (torchrun ranks) each run trains "
                f"on, an integer in [1, {MAX_PROCESSES}]"
            )
        if nproc > 1 and self.name == "inline":
            raise ValueError(
                f"[executor] {NPROC_PER_RUN}={nproc} launches each run's processes under torchrun, which the inline "
                "executor does not: use --executor local, slurm or ray (a whole compare under torchrun is refused: "
                "every rank would train every run)"
            )
        threads = self.options.get("threads")
        if threads is not None and not (is_int(threads) and 1 <= threads <= MAX_THREADS):
            raise ValueError(
                f"[executor] threads={threads!r} is invalid: the torch threads of each process, an integer in "
                f"[1, {MAX_THREADS}]"
            )
        allowed = OPTIONS[self.name]
        unknown = sorted(set(self.engine_options) - allowed) if allowed is not None else []
        if unknown:
            raise ValueError(
                f"[executor] option(s) {unknown} mean nothing to executor {self.name!r}; it takes "
                f"{sorted(allowed) or 'none'}"  # type: ignore[arg-type]
            )

    @property
    def nproc_per_run(self) -> int:
        return self.options.get(NPROC_PER_RUN, 1)

    @property
    def engine_options(self) -> dict[str, Any]:
        """The options passed on to the engine: all but ``nproc_per_run``."""
        return {key: value for key, value in self.options.items() if key != NPROC_PER_RUN}


INLINE = ExecutorConfig()


@dataclass(frozen=True)
class RunJob:
    """One language-model run of a comparison."""

    variant: Variant
    seed: int
    executor: str  # the engine it runs on, recorded with the run
    nproc_per_run: int = 1  # its processes: more than one are launched by torchrun (launch_ranks)

    def log_path(self, out_dir: Path) -> Path:
        return out_dir / "logs" / self.variant.label / f"seed{self.seed}.log"

    def __str__(self) -> str:
        return f"{self.variant.label} · seed {self.seed}"


# A run on a worker: (spec, output directory, run, threads of each of its processes or None for the engine's
# default). A module-level function, so that every engine can pickle it.
Work = Callable[["CompareSpec", str, RunJob, "int | None"], None]
# One process of a run that trains on several: (spec, output directory, run, its place in the process group).
RankWork = Callable[["CompareSpec", str, RunJob, Distributed], None]


class RunsFailed(RuntimeError):
    """Runs that raised on their workers twice; every other run was finished and kept."""


class RanksFailed(RuntimeError):
    """A run's processes under torchrun ended in failure: the first error a rank recorded, or torchrun's exit code."""


def check_runs_fit(config: ExecutorConfig, spec: CompareSpec) -> None:
    """Refuse, before the bench and the first run, runs whose processes one GPU, the batch or (``local``) the visible
    GPUs cannot share."""
    nproc, train = config.nproc_per_run, spec.train
    if nproc > 1 and ":" in train.device:
        raise ValueError(
            f"device={train.device!r} names one GPU, and each of a run's {NPROC_PER_RUN}={nproc} processes takes a "
            "GPU of its own: use device 'cuda' or 'auto' (the engine chooses the GPUs)"
        )
    for variant in spec.variants if nproc > 1 else ():
        # A variant trained on longer sequences (+lenN) takes a batch that many times smaller: each is shared.
        batch = spec.train_for(variant).batch_size
        if batch % (train.grad_accum * nproc):
            whose = "" if variant.length == 1 else f" of {variant.label} (batch_size / {variant.length}, its length)"
            raise ValueError(
                f"[executor] {NPROC_PER_RUN}={nproc} shares each step's batch_size={batch}{whose} among {nproc} "
                f"processes × grad_accum={train.grad_accum} micro-steps: it must be a multiple of "
                f"{train.grad_accum * nproc}"
            )
    if config.name == "local":
        LocalLayout.of(config, train.device)


@dataclass(frozen=True)
class LocalLayout:
    """How ``local`` shares this machine: the runs at once, the torch threads of each process, and the GPUs each run
    is given (0: none assigned, so the runs train on the CPU or share the visible GPUs)."""

    jobs: int
    threads: int
    gpus_per_run: int

    @classmethod
    def of(cls, config: ExecutorConfig, device: str) -> LocalLayout:
        nproc, cores = config.nproc_per_run, os.cpu_count() or 1
        gpus = torch.cuda.device_count() if device.startswith("cuda") or device == "auto" else 0
        jobs = config.jobs or max(1, (gpus or cores) // nproc)
        # A run's ranks each need a GPU of their own (nccl binds one device per rank); one-process runs may share.
        if gpus and nproc > 1 and jobs * nproc > gpus:
            raise ValueError(
                f"{jobs} run(s) at once (--jobs) × [executor] {NPROC_PER_RUN}={nproc} need {jobs * nproc} GPUs, one "
                f"a process; {gpus} are visible: lower --jobs or {NPROC_PER_RUN} to fit {gpus}"
            )
        threads = config.options.get("threads") or max(1, cores // (jobs * nproc))
        return cls(jobs, threads, nproc if gpus >= jobs * nproc > 1 else 0)


class Executor(ABC):
    """Submits runs and yields each as it ends: ``(job, None)`` or ``(job, the error it raised)``."""

    name: str  # as --executor names it

    def __init__(self, spec: CompareSpec, out_dir: Path, work: Work):
        self.spec, self.out_dir, self.work = spec, out_dir.resolve(), work

    @abstractmethod
    def execute(self, jobs: list[RunJob]) -> Iterator[tuple[RunJob, str | None]]:
        """Every job of ``jobs`` exactly once, in the order they end."""

    @abstractmethod
    def close(self) -> None:
        """Release the engine (a pool of processes, a Ray connection)."""


class LocalProcesses(Executor):
    """``jobs`` workers on this machine: each run on its ``nproc_per_run`` GPUs where there are as many, else on
    ``cores // (jobs × nproc_per_run)`` threads a process (or the ``threads`` option). A worker ends when the
    driver dies, however it dies (:func:`end_with`), and so do the ranks of a run they launched."""

    name = "local"

    def __init__(self, spec: CompareSpec, out_dir: Path, work: Work, config: ExecutorConfig):
        super().__init__(spec, out_dir, work)
        self.layout = LocalLayout.of(config, spec.train.device)
        self.pool = self._new_pool()

    def _new_pool(self) -> ProcessPoolExecutor:
        context = multiprocessing.get_context("spawn")  # a fork would share torch's threads and CUDA state
        slots = context.Queue()
        jobs = self.layout.jobs
        for slot in range(jobs):
            slots.put(slot)
        initargs = (slots, self.layout.gpus_per_run, os.getpid())
        return ProcessPoolExecutor(jobs, context, initializer=_start_worker, initargs=initargs)

    def execute(self, jobs: list[RunJob]) -> Iterator[tuple[RunJob, str | None]]:
        out, threads = str(self.out_dir), self.layout.threads
        pending = {self.pool.submit(self.work, self.spec, out, job, threads): job for job in jobs}
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


def _start_worker(slots: Any, gpus_per_run: int, driver: int) -> None:
    """A local worker's first acts: to end with its ``driver`` (a pool's workers otherwise outlive a driver killed
    with SIGKILL, idle on their pipe for good), then to take its GPUs."""
    end_with(driver)
    _take_slot(slots, gpus_per_run)


# prctl(2) option: the signal the kernel sends this process when the thread that started it ends.
PR_SET_PDEATHSIG = 1
WATCH_INTERVAL_S = 1.0


def end_with(process: int) -> None:
    """End this process with SIGKILL when ``process`` ends (a local worker's driver; the worker that launched a
    run's ranks), however it ends: within a second, watched from a thread, and on Linux at once when this process's
    own parent ends (``PR_SET_PDEATHSIG``). SIGKILL, as the driver's death was: a run stopped mid-step resumes from
    its last checkpoint when the compare is run again."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    parent = os.getppid()

    def alive() -> bool:
        try:
            os.kill(process, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # alive, and another user's: no pid is reused within a second
            pass
        return os.getppid() == parent  # a process whose parent ends is handed to another

    def watch() -> None:
        while alive():
            time.sleep(WATCH_INTERVAL_S)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="attnzoo-end-with", daemon=True).start()


def _take_slot(slots: Any, gpus_per_run: int) -> None:
    """Before torch touches CUDA: this worker's own GPUs, where each has some (a run's processes under torchrun
    inherit them)."""
    slot = slots.get()
    if gpus_per_run:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        mine = range(slot * gpus_per_run, (slot + 1) * gpus_per_run)
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(visible.split(",")[i] if visible else str(i) for i in mine)


class Submitit(Executor):
    """Each run a submitit job (Slurm by default), its submitit logs under ``OUT/logs/submitit``. Where Slurm is not
    installed it refuses, naming what is missing, rather than take submitit's fallback (local processes, without a
    word); ``cluster = "local"`` in the ``[executor]`` table asks for that fallback by name."""

    name = "slurm"

    def __init__(self, spec: CompareSpec, out_dir: Path, work: Work, config: ExecutorConfig):
        super().__init__(spec, out_dir, work)
        submitit = _engine("submitit", "slurm")
        options, nproc = config.engine_options, config.nproc_per_run
        cluster = options.pop("cluster", "slurm")
        clusters = submitit.core.plugins.get_executors()
        if cluster not in clusters:
            raise ValueError(f"[executor] cluster = {cluster!r} is unknown to submitit; it knows {sorted(clusters)}")
        _check_submitit_options(options, clusters)
        if cluster == "slurm" and shutil.which("sbatch") is None:
            raise ValueError(
                "--executor slurm: Slurm is not installed here (no sbatch on PATH): run the compare on a Slurm login "
                'node, or set cluster = "local" in the --config file\'s [executor] table to run its jobs as '
                "processes on this machine"
            )
        if nproc > 1:
            if spec.train.device != "cpu":
                options.setdefault("gpus_per_node", nproc)
            tasks = options.setdefault("tasks_per_node", 1)
            if tasks != 1:
                raise ValueError(
                    f"[executor] tasks_per_node={tasks!r} with {NPROC_PER_RUN}={nproc}: a run's torchrun starts its "
                    f"{nproc} processes inside one task; leave tasks_per_node out"
                )
        self.executor = submitit.AutoExecutor(folder=self.out_dir / "logs" / "submitit", cluster=cluster)
        try:
            self.executor.update_parameters(name=f"attnzoo-{spec.name}", **options)
        except AssertionError as err:  # submitit asserts each shared option's type
            raise ValueError(f"[executor] {str(err).strip().splitlines()[0]}") from None
        cpus = options.get("cpus_per_task")
        self.threads = max(1, cpus // nproc) if cpus else None

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


def _check_submitit_options(options: dict[str, Any], clusters: dict[str, Any]) -> None:
    """Each option one submitit takes: a shared one (``timeout_min``, ``gpus_per_node``, ...) or one of a cluster,
    prefixed with its name (``slurm_partition``); else refused naming it and the ones allowed, where submitit
    ended in its own traceback."""
    import submitit

    shared = set(submitit.AutoExecutor._valid_parameters())
    own = {f"{name}_{key}" for name, cluster in clusters.items() for key in cluster._valid_parameters()}
    unknown = sorted(set(options) - shared - own)
    if unknown:
        raise ValueError(
            f"[executor] option(s) {unknown} mean nothing to executor 'slurm'; it takes cluster, "
            f"{NPROC_PER_RUN}, submitit's shared options {sorted(shared)}, and a cluster's own prefixed with its name: "
            f"{sorted(key for key in own if key.startswith('slurm_'))}"
        )


class Ray(Executor):
    """Each run a Ray task holding ``num_cpus`` (default: one a process) and ``num_gpus`` (default: one a process
    of a run on several, on a device other than the CPU; else 0) of the cluster at ``address`` (default: a local
    runtime)."""

    name = "ray"

    def __init__(self, spec: CompareSpec, out_dir: Path, work: Work, config: ExecutorConfig):
        super().__init__(spec, out_dir, work)
        self.ray = _engine("ray", "ray")
        options, nproc = config.engine_options, config.nproc_per_run
        if not self.ray.is_initialized():
            self.ray.init(address=options.get("address"), include_dashboard=False, log_to_driver=False)
        cluster = self.ray.cluster_resources()
        cpus = options.get("num_cpus", nproc)
        # "auto" trains on a GPU only where the cluster has them: asking a cluster without for one would never run.
        on_gpu = spec.train.device.startswith("cuda") or (spec.train.device == "auto" and cluster.get("GPU", 0) > 0)
        gpus = options.get("num_gpus", nproc if nproc > 1 and on_gpu else 0)
        for name, asked, resource in (("num_cpus", cpus, "CPU"), ("num_gpus", gpus, "GPU")):
            have = cluster.get(resource, 0)
            if not isinstance(asked, int | float) or isinstance(asked, bool) or not 0 <= asked < math.inf:
                raise ValueError(f"[executor] {name}={asked!r} is invalid: a run's share of the cluster, a number >= 0")
            if asked > have:
                raise ValueError(
                    f"[executor] {name}={asked:g} per run is more than the Ray cluster at "
                    f"{options.get('address') or 'a local runtime'} has ({have:g}): no run could ever start; ask for "
                    f"at most {have:g} (an autoscaling cluster: start it at the size a run needs)"
                )
        self.threads = max(1, int(cpus) // nproc)
        self.task = self.ray.remote(num_cpus=cpus, num_gpus=gpus, max_retries=0)(work)

    def execute(self, jobs: list[RunJob]) -> Iterator[tuple[RunJob, str | None]]:
        pending = {self.task.remote(self.spec, str(self.out_dir), job, self.threads): job for job in jobs}
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
    engines = {"local": LocalProcesses, "slurm": Submitit, "ray": Ray}
    if config.name not in engines:
        raise ValueError(f"executor {config.name!r} runs in the driver itself")
    return engines[config.name](spec, out_dir, work, config)


@contextmanager
def started_engine(config: ExecutorConfig, spec: CompareSpec, out_dir: Path, work: Work) -> Iterator[Executor | None]:
    """``config``'s engine, started (None for ``inline``, which has none) and released at the end."""
    if config.name == "inline":
        yield None
        return
    engine = make_executor(config, spec, out_dir, work)
    try:
        yield engine
    finally:
        engine.close()


# Each process of a run on several runs this module (which nothing imports, so that runpy runs it fresh), given a
# scratch directory that holds the pickled work and receives each failed rank's error.
RANKS_MODULE = "attnzoo.compare.ranks"
JOB_FILE = "job.pkl"
RANK_ERROR = "rank{rank}.error"


def launch_ranks(rank_work: RankWork, spec: CompareSpec, out_dir: str, job: RunJob, threads: int | None) -> None:
    """``rank_work`` on each of the run's ``job.nproc_per_run`` processes, launched by torchrun on this machine (on
    the GPUs this worker sees, one a process), ``threads`` torch threads each (default: this machine's cores
    shared among them). Every process's output is appended to the run's log. Raises :class:`RanksFailed` with the
    first error a rank recorded when any failed."""
    nproc = job.nproc_per_run
    threads = threads or max(1, _usable_cores() // nproc)
    log = job.log_path(Path(out_dir))
    log.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="attnzoo-ranks-") as scratch, open(log, "ab") as stream:
        # This worker's pid: its run's ranks end with it (end_with), where torchrun would keep them running.
        work = (rank_work, spec, out_dir, job, threads, os.getpid())
        (Path(scratch) / JOB_FILE).write_bytes(pickle.dumps(work))
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        ended = subprocess.run(
            [*command, "-m", RANKS_MODULE, scratch],
            stdout=stream,
            stderr=subprocess.STDOUT,
            env=os.environ | {"OMP_NUM_THREADS": str(threads)},
            check=False,
        )
        if ended.returncode != 0:
            raise RanksFailed(_first_rank_error(Path(scratch), ended.returncode))


def _usable_cores() -> int:
    """The cores this process may run on: a Slurm job's allocation, not the whole node's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _first_rank_error(scratch: Path, code: int) -> str:
    """The error the first failing rank recorded: the others' are most often their peer's disappearance."""
    errors = sorted(scratch.glob(RANK_ERROR.format(rank="*")), key=lambda path: path.stat().st_mtime_ns)
    if errors:
        return errors[0].read_text(encoding="utf-8")
    return (
        f"torchrun ended with exit code {code} and no rank recorded an error: a process died outside the run (out "
        "of memory, a crash in native code, a signal)"
    )


def run_elsewhere(
    engine: Executor,
    todo: list[RunJob],
    say: Callable[[str], None],
    estimated_s: Callable[[RunJob], float] | None = None,
) -> None:
    """Each run of ``todo`` on ``engine`` (:func:`started_engine`): the runs an uptrained variant starts from first,
    then the uptrained ones; a run that fails is reported with its log and tried once more, and the others are kept.
    Raises :class:`RunsFailed` naming each run that failed twice.

    The time left is the work left at the rate the finished work went, the work of a run being ``estimated_s`` of
    it (every run alike without): an uptrained run at 5% of the steps no longer counts as a whole one, and the
    runs that share the engine's processes are counted by the rate, not by the number of processes."""
    work_of = estimated_s or (lambda job: 1.0)
    work_left, work_done = sum(work_of(job) for job in todo), 0.0
    waves = [
        [job for job in todo if job.variant.uptrain is None],
        [job for job in todo if job.variant.uptrain is not None],
    ]
    out_dir = engine.out_dir
    started, finished = time.perf_counter(), 0
    for wave in waves:
        for attempt in (1, 2):
            failed = []
            for job, error in engine.execute(wave):
                if error is None:
                    finished += 1
                    work_done, work_left = work_done + work_of(job), work_left - work_of(job)
                    elapsed = time.perf_counter() - started
                    left = elapsed / work_done * work_left if work_done > 0 else 0.0
                    say(
                        f"[{finished}/{len(todo)}] {job} finished on {engine.name} · {duration(elapsed)} "
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
