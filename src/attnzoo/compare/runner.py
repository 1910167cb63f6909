"""``run_compare``: benchmark, train and evaluate every variant × seed, run the tasks, and write the report.

The output directory is the state of the comparison, so a compare resumes by running it again::

    OUT/runs/<variant>/seed<k>/           a training run and its evaluations (attnzoo.compare.lm_run)
    OUT/bench.json                        throughput and memory, every variant measured back to back
    OUT/bench.partial.json                the cases measured so far, while the bench is unfinished
    OUT/tasks/<task>/<variant>/seed<k>/result.json
    OUT/results.json, report.md, report.html, plots/

A finished run is reused and an interrupted one resumed (:mod:`attnzoo.compare.lm_run`); the bench keeps the
cases it measured (:mod:`attnzoo.compare.throughput`). This module holds the entry points, the order of the work
and its estimates, and the directory's lock; the results are assembled by :mod:`attnzoo.compare.assemble`.
Runs go seed by seed, every variant within a seed, so a compare stopped early has whole seeds to show.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import asdict, dataclass
from itertools import product
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from attnzoo.compare.assemble import RESULTS, Sitting, assemble
from attnzoo.compare.executors import (
    INLINE,
    Executor,
    ExecutorConfig,
    RunJob,
    check_runs_fit,
    launch_ranks,
    run_elsewhere,
    started_engine,
)
from attnzoo.compare.lm_run import LMRuns, evaluated_as_asked
from attnzoo.compare.merge import FinishedRun, copy_runs, finished_runs, runs_to_copy
from attnzoo.compare.presets import LADDERS
from attnzoo.compare.progress import Schedule, duration, final_summary, ladder_summary, progress_table
from attnzoo.compare.report import write_report
from attnzoo.compare.report_ladder import write_ladder_report
from attnzoo.compare.resolve import resolve_spec
from attnzoo.compare.spec import CompareSpec, LadderSpec
from attnzoo.compare.stored import jsonable, read_record, write_record
from attnzoo.compare.tasks import context_len, step_seconds, task_configs, train_task
from attnzoo.compare.throughput import run_bench
from attnzoo.config import ModelConfig
from attnzoo.data.corpora import Corpus
from attnzoo.distributed import Distributed, joined_process_group, resolve_device
from attnzoo.evals.task import TaskSpec
from attnzoo.interrupts import Interrupted, stop_on_signals
from attnzoo.io import locked_directory
from attnzoo.results.comparison import BenchRecord, CompareResults, LMRun, TaskResult, TaskRun
from attnzoo.results.ladder import Ladder, load_ladder
from attnzoo.training.checkpoint import CheckpointError, latest_checkpoint, read_checkpoint
from attnzoo.training.timing import seconds_per_step
from attnzoo.training.trainer import check_resumable, load_corpus
from attnzoo.variants import Variant

TIMED_STEPS = 6  # a variant's step time where the bench measured none: the median after the first interval


@dataclass(frozen=True)
class CompareResult:
    out_dir: Path
    results: CompareResults | None  # None when interrupted before the report
    interrupted_by: int | None  # the signal that stopped the bench or a training run, if any


def run_compare(
    spec: str | CompareSpec,
    out_dir: str | os.PathLike,
    *,
    progress: bool = True,
    claims_table: bool = False,
    executor: ExecutorConfig = INLINE,
    pool_commits: bool = False,
    merge_from: Sequence[str | os.PathLike] = (),
) -> CompareResult:
    """Compare the variants of ``spec`` under one budget and write the report into ``out_dir``: a preset's name, or a
    spec, e.g. a preset with its variants, seeds, steps, corpus, tasks or device replaced by :func:`resolve_spec`.

    Running it again with the same arguments reuses every finished run and resumes an interrupted one.
    SIGINT/SIGTERM during training stop after the current step with a checkpoint, during the bench after the
    cases measured so far, and the call returns with ``interrupted_by`` set and no report. It ends with the
    side-by-side table and the claims counted in one line; ``claims_table`` prints each claim's verdict as well.
    ``executor`` trains the runs elsewhere (local processes, Slurm, Ray: :mod:`attnzoo.compare.executors`) before
    the same loop reads them back. Runs trained by different commits are refused unless ``pool_commits``.
    ``merge_from`` names compare directories of the same comparison made elsewhere whose finished runs are first
    copied in (:mod:`attnzoo.compare.merge`), once every check has passed and the directory is locked.
    """
    resolved = resolve_spec(spec)  # a spec passed whole is checked for its device here
    comparison = Comparison(
        resolved, Path(out_dir), progress, claims_table, executor, pool_commits, merge_from=merge_from
    )
    return comparison.run()


@dataclass(frozen=True)
class LadderResult:
    out_dir: Path
    ladder: Ladder | None  # None when a rung was interrupted
    interrupted_by: int | None


def run_ladder(
    preset_or_spec: str | LadderSpec,
    out_dir: str | os.PathLike,
    progress: bool = True,
    executor: ExecutorConfig = INLINE,
    pool_commits: bool = False,
    merge_from: Sequence[str | os.PathLike] = (),
) -> LadderResult:
    """Every rung of a ladder, smallest first, each a comparison in ``out_dir/<rung>``; then the ladder's report in
    ``out_dir``. Running it again reuses every finished run, as a comparison does. ``merge_from`` names folders of
    the same ladder made elsewhere: each rung merges the runs of its own subfolder of each, and a folder holding
    none of the ladder's rungs is refused before any rung starts."""
    if isinstance(preset_or_spec, str):
        if preset_or_spec not in LADDERS:
            raise ValueError(f"ladder {preset_or_spec!r} is unknown; choose one of {list(LADDERS)}")
        preset_or_spec = LADDERS[preset_or_spec]
    out, names = Path(out_dir), [rung.name for rung in preset_or_spec.rungs]
    for source in map(Path, merge_from):
        if not any((source / name / "runs").is_dir() for name in names):
            raise ValueError(
                f"--merge-from {source} holds no rung of ladder {preset_or_spec.name!r}: its rungs are subfolders "
                f"{names}, each a compare directory with its runs/"
            )
    rungs = [
        (rung, [Path(source) / rung.name for source in merge_from if (Path(source) / rung.name / "runs").is_dir()])
        for rung in preset_or_spec.rungs
    ]
    for rung, sources in rungs:  # every rung's merge checked before the first rung writes (each again as it merges)
        if sources:
            check = Comparison(rung, out / rung.name, progress, merge_from=sources)
            check.runs_to_merge(check.lm.configs(load_corpus(rung.train.data, check.env)))
    for rung, sources in rungs:
        comparison = Comparison(
            rung, out / rung.name, progress, executor=executor, pool_commits=pool_commits, merge_from=sources
        )
        done = comparison.run()
        if done.interrupted_by is not None:
            return LadderResult(out, None, done.interrupted_by)
    ladder, dirs = load_ladder(out)
    paths = write_ladder_report(ladder, dirs, out)
    tqdm.write(ladder_summary(ladder, paths))
    return LadderResult(out, ladder, None)


def train_run(spec: CompareSpec, out_dir: str, job: RunJob, threads: int | None) -> None:
    """One run trained and evaluated on an executor's worker, as the inline loop would, its output appended to
    its log; on ``job.nproc_per_run`` processes under torchrun where that is more than one."""
    if job.nproc_per_run > 1:
        launch_ranks(train_rank, spec, out_dir, job, threads)
        return
    log = job.log_path(Path(out_dir))
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", encoding="utf-8") as stream, redirect_stdout(stream), redirect_stderr(stream):
        if threads is not None:
            torch.set_num_threads(threads)
        Comparison(spec, Path(out_dir), False, executor=ExecutorConfig(job.executor)).train_one(job.variant, job.seed)


def train_rank(spec: CompareSpec, out_dir: str, job: RunJob, env: Distributed) -> None:
    """One process of a run on several (:mod:`attnzoo.compare.ranks`): every rank trains and evaluates, rank 0
    alone writes the run's records, where a run on one process writes them."""
    comparison = Comparison(spec, Path(out_dir), False, executor=ExecutorConfig(job.executor), env=env)
    comparison.train_one(job.variant, job.seed)


class Comparison:
    """One invocation of a compare: the spec, the output directory and the device it runs on. ``env`` is this
    process's place among the processes of one run (:func:`train_rank`); the driver is a world of one."""

    def __init__(
        self,
        spec: CompareSpec,
        out_dir: Path,
        progress: bool,
        claims_table: bool = False,
        executor: ExecutorConfig = INLINE,
        pool_commits: bool = False,
        env: Distributed | None = None,
        merge_from: Sequence[str | os.PathLike] = (),
    ):
        self.spec, self.out_dir, self.progress, self.claims_table = spec, out_dir, progress, claims_table
        self.executor, self.pool_commits, self.merge_from = executor, pool_commits, [Path(p) for p in merge_from]
        self.labels = spec.variant_labels
        self.baseline = self.labels[0]
        self.env = env or Distributed(device=resolve_device(spec.train.device))
        self.sitting = Sitting.now()
        self.lm = LMRuns(spec, out_dir, self.env, executor.name, progress, self.say)

    def say(self, message: str) -> None:
        if self.env.is_main:  # a run's other processes train and evaluate it silently
            tqdm.write(message)  # above any progress bar
            sys.stdout.flush()

    def run(self) -> CompareResult:
        """Locked (see :func:`attnzoo.io.locked_directory`): a second compare into the same directory, or one
        started again while this one runs, is refused with this process's pid rather than sharing its runs."""
        if joined_process_group():
            raise ValueError(
                f"this compare is one of {os.environ['WORLD_SIZE']} processes launched by torchrun, and each would "
                "run the whole comparison: run it without torchrun, and train each run on several processes with "
                "nproc_per_run in the --config file's [executor] table (--executor local, slurm or ray)"
            )
        check_runs_fit(self.executor, self.spec)
        # The engine starts before any work, so that one that cannot (not installed, no Slurm here, a Ray cluster
        # without the resources a run asks for) is refused before the bench, not after it.
        with (
            locked_directory(self.out_dir, "compare directory"),
            started_engine(self.executor, self.spec, self.out_dir, train_run) as engine,
        ):
            try:
                # Training stops by itself at a signal, with a checkpoint; every other phase (evaluations,
                # tasks, the report) stops here, keeping what is already written: each record is written whole.
                with stop_on_signals():
                    return self._run(engine)
            except Interrupted as stop:
                self.say(f"compare interrupted; run the same command again to continue from {self.out_dir}")
                return CompareResult(self.out_dir, None, stop.signum)

    def _run(self, engine: Executor | None) -> CompareResult:
        spec = self.spec
        self.say(
            f"attnzoo compare ({spec.name}: {spec.description}) → {self.out_dir}\n"
            f"variants {', '.join(self.labels)} (baseline {self.baseline}); seeds {list(spec.seeds)}"
        )
        self.refuse_another_comparison()
        corpus = load_corpus(spec.train.data, self.env)
        self.lm.extrapolation_tokens(corpus)  # refuse a too-short corpus now, not after the training
        configs = self.lm.configs(corpus)
        self.merge(configs)
        bench, interrupted_by = run_bench(spec, configs, self.out_dir, self.env.device, self.say)
        if bench is None:
            self.say(f"compare interrupted; run the same command again to continue from {self.out_dir}")
            return CompareResult(self.out_dir, None, interrupted_by)
        jobs = list(product(spec.seeds, spec.variants))
        per_run = self.lm_estimates(bench, configs, corpus)
        self.schedule = Schedule(
            {("lm", variant.label, seed): per_run[variant.label] for seed, variant in jobs}
            | {key: seconds for task in spec.tasks for key, seconds in self.task_estimates(task).items()}
        )
        self.say(
            f"estimated time: about {duration(self.schedule.remaining())} for the training left (from the token "
            "budget and the step times just measured; evaluations come on top)"
        )
        if engine is not None:
            todo = [
                RunJob(variant, seed, self.executor.name, self.executor.nproc_per_run)
                for seed, variant in jobs
                if not self.lm.finished(variant, seed)
            ]
            self.say(f"{len(todo)} of {len(jobs)} runs to train on executor {self.executor.name}")
            estimates = dict(self.schedule.left)
            run_elsewhere(engine, todo, self.say, lambda job: estimates.get(("lm", job.variant.label, job.seed), 0.0))
        # Runs finished earlier (or by the executor just now) are read back in one line, not a block each: after an
        # executor's 35 runs the screen held 35 headers and growing tables of runs already done.
        done = [self.lm.finished(variant, seed) for seed, variant in jobs]
        if any(done):
            where = "earlier" if self.executor.name == "inline" else f"on executor {self.executor.name} or earlier"
            self.say(f"reusing {sum(done)} of {len(jobs)} runs finished {where}: {self.out_dir / 'runs'}")
        lm_runs: dict[str, dict[int, LMRun]] = {label: {} for label in self.labels}
        for i, ((seed, variant), was_done) in enumerate(zip(jobs, done, strict=True), start=1):
            label = variant.label
            if not was_done:
                self.say(f"\n── [{i}/{len(jobs)}] {label} · seed {seed} · {self._elapsed()} elapsed{self._left()} ──")
            started = time.perf_counter()
            record, interrupted_by, reused = self.lm.run(variant, configs[label], seed, corpus)
            if interrupted_by is not None:
                self.say(f"compare interrupted; run the same command again to continue from {self.out_dir}")
                return CompareResult(self.out_dir, None, interrupted_by)
            assert record is not None
            self.schedule.finish(("lm", label, seed), None if reused else time.perf_counter() - started)
            lm_runs[label][seed] = record
            if not reused:
                self.say(progress_table(lm_runs, self.baseline))

        task_results = {task.name: self.task(task) for task in spec.tasks}
        runs = {label: [lm_runs[label][seed] for seed in spec.seeds] for label in self.labels}
        self.refuse_mixed_commits([run for by_seed in runs.values() for run in by_seed])
        results = assemble(
            spec, configs, corpus, runs, bench, task_results, self.out_dir, self.env.device, self.sitting
        )
        results.save(self.out_dir / RESULTS)
        paths = write_report(results, self.out_dir)
        self.say(final_summary(results, paths, self.claims_table))
        return CompareResult(self.out_dir, results, None)

    def refuse_mixed_commits(self, runs: list[LMRun]) -> None:
        """Runs made by different code (merged from other machines, executors or leases) are pooled only when
        asked: a difference between variants could be a change of code."""
        commits = {run.provenance.commit for run in runs if run.provenance is not None}
        if len(commits) > 1 and not self.pool_commits:
            made = "; ".join(
                f"{run.variant} seed {run.seed}: {run.provenance.commit}" for run in runs if run.provenance is not None
            )
            raise ValueError(
                f"the runs in {self.out_dir} were trained by {len(commits)} different commits ({made}): retrain the "
                "odd ones out, or pool them knowingly with --pool-commits (the report lists each run's commit)"
            )

    def refuse_another_comparison(self) -> None:
        """A directory whose report compares something else is never overwritten by this comparison."""
        try:
            stored = json.loads((self.out_dir / RESULTS).read_text(encoding="utf-8")).get("spec")
        except (OSError, ValueError, AttributeError):
            return  # no finished report (or an unreadable one): the runs inside are checked one by one
        ours = jsonable(self.spec.to_dict())
        if stored is not None and stored != ours:
            differs = sorted(key for key in ours if stored.get(key) != ours[key])
            raise ValueError(
                f"{self.out_dir} holds the report of another comparison (it differs in {differs}); choose another "
                "--out, or delete that directory to replace it"
            )

    def merge(self, configs: dict[str, ModelConfig]) -> None:
        """Copy in the finished runs of ``merge_from`` that this directory lacks, once every one of them has been
        checked (:meth:`runs_to_merge`): a merge refused leaves the directory as it was."""
        if not self.merge_from:
            return
        missing, held = self.runs_to_merge(configs)
        copy_runs(missing, self.out_dir)
        self.say(
            f"merged {len(missing)} finished run(s) from {', '.join(map(str, self.merge_from))} into "
            f"{self.out_dir}{f' ({held} held already)' if held else ''}"
        )

    def runs_to_merge(self, configs: dict[str, ModelConfig]) -> tuple[list[FinishedRun], int]:
        """The runs of ``merge_from`` this directory lacks, and how many it holds already, each run checked
        (:meth:`check_merged`, :func:`attnzoo.compare.merge.runs_to_copy`); nothing is written."""
        runs = finished_runs(self.merge_from, self.out_dir)
        for run in runs:
            self.check_merged(run, configs)
        missing = runs_to_copy(runs, self.out_dir)
        return missing, len(runs) - len(missing)

    def check_merged(self, run: FinishedRun, configs: dict[str, ModelConfig]) -> None:
        """Refuse by name a run made elsewhere that this comparison would not reuse as it is: one of another
        comparison (a variant, seed or task it does not have, another model, training or evaluation), a record
        whose numbers cannot be, or one that does not say where and by what code it was trained."""
        where = f"--merge-from {run.path}"
        if run.is_task:
            _, task_name, label, seed_dir = run.relative.parts
            task = next((task for task in self.spec.tasks if task.name == task_name), None)
            configs_of_task = task_configs(task, self.spec.task_variants(task)) if task is not None else {}
            seeds = self.spec.task_seed_list
            if label not in configs_of_task or seed_dir not in {f"seed{seed}" for seed in seeds}:
                raise ValueError(
                    f"{where} is not a task run of this comparison (its tasks: "
                    f"{[task.name for task in self.spec.tasks]}, seeds {list(seeds)}): merge from a directory of "
                    "the same comparison (the same --preset, --variants, --seeds, --steps, --data and --tasks)"
                )
            stored = read_record(TaskRun, run.record)
            if stored is None:
                raise ValueError(f"{where}: {run.record_name} is not a task run's record (damaged, or another schema)")
            if stored.identity != _task_identity(task, configs_of_task[label]):  # type: ignore[arg-type]
                raise ValueError(f"{where} was trained with another task or model configuration than this compare's")
            return
        _, label, seed_dir = run.relative.parts
        variant = next((v for v in self.spec.variants if v.label == label), None)
        seed = next((seed for seed in self.spec.seeds if seed_dir == f"seed{seed}"), None)
        if variant is None or seed is None:
            raise ValueError(
                f"{where} is not a run of this comparison (its variants: {self.labels}, seeds "
                f"{list(self.spec.seeds)}): merge from a directory of the same comparison (the same --preset, "
                "--variants, --seeds, --steps and --data)"
            )
        _, train_config, evals = self.lm.plan(variant, seed)
        record = read_record(LMRun, run.record)
        if record is None:
            raise ValueError(f"{where}: {run.record_name} is not a run's record (damaged, or of another schema)")
        if record.provenance is None:
            raise ValueError(
                f"{where}: {run.record_name} records no provenance (the host, device and commit that trained it), "
                "which a run merged from elsewhere must carry: retrain it with this attnzoo, or leave it out"
            )
        if not evaluated_as_asked(record.evals, evals):
            raise ValueError(f"{where} was evaluated under other settings than this comparison's: {record.evals}")
        found = latest_checkpoint(run.path)
        try:
            if found is None:
                raise CheckpointError("it holds no complete checkpoint")
            checkpoint = read_checkpoint(found)
            check_resumable(checkpoint, configs[label], train_config)
            if checkpoint.step != train_config.steps:
                raise CheckpointError(f"its last checkpoint is step {checkpoint.step} of {train_config.steps}")
        except CheckpointError as err:
            raise ValueError(f"{where} is not a finished run of this comparison: {err}") from None

    def _elapsed(self) -> str:
        return duration(time.perf_counter() - self.sitting.started)

    def _left(self) -> str:
        return f" · about {duration(self.schedule.remaining())} left" if self.schedule.remaining() else ""

    def lm_estimates(self, bench: BenchRecord, configs: dict[str, ModelConfig], corpus: Corpus) -> dict[str, float]:
        """Training seconds of one run of each variant, from its token budget and the throughput the bench just
        measured at its length, or where the bench measured none (a ladder benches nothing), from a few steps
        timed here for each variant with a run still to train."""
        estimates, timed = {}, {}
        for variant in self.spec.variants:
            label, train = variant.label, self.spec.train_for(variant)
            rates = [
                m.timing.tokens_per_s
                for m in bench.measurements
                if m.variant == variant.model_label and m.mode == "train" and m.seq_len == train.seq_len and m.timing
            ]
            if rates:
                per_step = train.tokens_per_step / rates[0]
            elif all(self.lm.finished(variant, seed) for seed in self.spec.seeds):
                per_step = 0.0
            else:  # a model several variants share (uptrained at several fractions) is timed once
                model = json.dumps([configs[label].to_dict(), train.seq_len], sort_keys=True)
                if model not in timed:
                    timed[model] = seconds_per_step(configs[label], train, corpus, self.env, TIMED_STEPS)
                per_step = timed[model]
            estimates[label] = variant.steps(train.steps) * per_step
        return estimates

    def task_estimates(self, spec: TaskSpec) -> dict[tuple, float]:
        """Training seconds of each task run still to do, from a few timed steps of each variant's model."""
        configs = task_configs(spec, self.spec.task_variants(spec))
        estimates = {}
        for label in configs:
            todo = [s for s in self.spec.task_seed_list if not self._task_path(spec, label, s).is_file()]
            if todo:
                per_step = step_seconds(spec, configs[label], self.env.device)
                estimates |= {("task", spec.name, label, s): per_step * spec.budget.steps for s in todo}
        return estimates

    def _task_path(self, spec: TaskSpec, label: str, seed: int) -> Path:
        return self.out_dir / "tasks" / spec.name / label / f"seed{seed}" / "result.json"

    def train_one(self, variant: Variant, seed: int) -> None:
        """One run, trained and evaluated where this process is (an executor's worker): its record on disk."""
        corpus = load_corpus(self.spec.train.data, self.env)
        with stop_on_signals():
            record, interrupted_by, _ = self.lm.run(variant, self.lm.configs(corpus)[variant.label], seed, corpus)
        if record is None:
            raise Interrupted(interrupted_by or signal.SIGTERM)

    def task(self, spec: TaskSpec) -> TaskResult:
        configs = task_configs(spec, self.spec.task_variants(spec))
        runs: dict[str, dict[int, TaskRun]] = {label: {} for label in configs}
        task, budget = spec.task, spec.budget
        self.say(
            f"\n── task {task.name}: {budget.steps} steps × {budget.batch_size} samples · {self._elapsed()} elapsed ──"
        )
        for seed, label in product(self.spec.task_seed_list, configs):
            path = self._task_path(spec, label, seed)
            identity = _task_identity(spec, configs[label])
            stored = read_record(TaskRun, path)
            if stored is not None:
                if stored.identity != identity:
                    raise ValueError(
                        f"{path} was trained with another task or model configuration than this compare's; "
                        "choose another output directory, or delete it to retrain"
                    )
                runs[label][seed] = stored
                continue
            started = time.perf_counter()
            result = dataclasses.replace(
                train_task(spec, configs[label], seed, self.env.device, self.progress, label), identity=identity
            )
            write_record(result, path)
            runs[label][seed] = result
            self.schedule.finish(("task", task.name, label, seed), time.perf_counter() - started)
            self.say(f"{task.name} {label} seed {seed}: {task.metric} {result.final[task.metric]:.4f}{self._left()}")
        return TaskResult(
            name=task.name,
            measures=task.measures,
            paper=task.paper,
            metric=task.metric,
            higher_is_better=task.higher_is_better,
            probe_columns=dict(task.probe_columns),
            budget=budget,
            context_len=context_len(spec),
            runs={label: list(by_seed.values()) for label, by_seed in runs.items()},
            chance=task.chance(spec.config()) if task.chance else None,
            solved=task.solved,
            shortcut=task.shortcut(spec.config()) if task.shortcut else None,
        )


def _task_identity(spec: TaskSpec, config: ModelConfig) -> dict[str, Any]:
    """What a task run is reused under: its budget and model."""
    return jsonable({"budget": asdict(spec.budget), "model": config.to_dict()})
