"""``run_compare``: benchmark, train and evaluate every variant × seed, run the tasks, and write the report.

The output directory is the state of the comparison, so a compare resumes by running it again::

    OUT/runs/<variant>/seed<k>/           a training run (see attnzoo.training.trainer), plus
        compare_run.json                  its evaluations, written last: the run is complete
        attention_maps.npy                the first seed's maps on the validation prompt
    OUT/bench.json                        throughput and memory, every variant measured back to back
    OUT/bench.partial.json                the cases measured so far, while the bench is unfinished
    OUT/tasks/<task>/<variant>/seed<k>/result.json
    OUT/results.json, report.md, report.html, plots/

A run with ``compare_run.json`` is reused; one with a checkpoint short of the last step resumes from it (the
trainer makes exactly the updates of an uninterrupted run); one without a checkpoint starts over. A run
directory that holds a different model or training configuration is refused rather than overwritten.
Runs go seed by seed, every variant within a seed, so a compare stopped early has whole seeds to show.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from itertools import product
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from attnzoo import __version__
from attnzoo.attention import ATTENTION
from attnzoo.bench import BenchCase, machine_description, measure
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
from attnzoo.compare.merge import FinishedRun, copy_runs, finished_runs, runs_to_copy
from attnzoo.compare.progress import Schedule, duration, final_summary, ladder_summary, progress_table
from attnzoo.compare.report import write_report
from attnzoo.compare.report_ladder import write_ladder_report
from attnzoo.compare.spec import LADDERS, CompareSpec, LadderSpec, resolve_spec
from attnzoo.compare.tasks import context_len, step_seconds, task_configs, train_task
from attnzoo.config import ModelConfig
from attnzoo.convert.directory import group_kv_heads
from attnzoo.data.corpora import Corpus, prepare_corpus
from attnzoo.distributed import Distributed, joined_process_group, resolve_device
from attnzoo.evals.lm import LMEvalConfig, evaluate_lm, length_extrapolation, window_plan
from attnzoo.evals.ngram import NGramLevel, kneser_ney_level
from attnzoo.evals.probes import probe_model
from attnzoo.evals.task import TaskSpec
from attnzoo.interrupts import Interrupted, stop_on_signals
from attnzoo.io import atomic_write_text, locked_directory
from attnzoo.model import Transformer
from attnzoo.records import from_dict, to_dict
from attnzoo.results.checks import check_record
from attnzoo.results.comparison import (
    ATTENTION_MAPS,
    SCHEMA_VERSION,
    BenchMeasurement,
    BenchRecord,
    BenchTiming,
    Budget,
    CompareResults,
    CorpusInfo,
    ExtrapolationResult,
    LMRun,
    MachineInfo,
    Provenance,
    TaskResult,
    TaskRun,
    VariantResult,
)
from attnzoo.results.ladder import Ladder, load_ladder
from attnzoo.training.checkpoint import (
    Checkpoint,
    CheckpointError,
    latest_checkpoint,
    load_pretrained,
    read_checkpoint,
)
from attnzoo.training.config import DataConfig, TrainConfig
from attnzoo.training.metrics import MetricsLog
from attnzoo.training.timing import seconds_per_step
from attnzoo.training.trainer import METRICS, Trainer, check_resumable, load_corpus, resolve_dtype
from attnzoo.variants import Variant, matched_configs

R = TypeVar("R")
RUN_RECORD = "compare_run.json"
BENCH = "bench.json"
BENCH_PARTIAL = "bench.partial.json"  # the cases measured so far, while the bench is unfinished
RESULTS = "results.json"
NGRAM = "ngram.json"  # the corpus's trigram level, counted once
TIMED_STEPS = 6  # a variant's step time where the bench measured none: the median after the first interval


@dataclass(frozen=True)
class CompareResult:
    out_dir: Path
    results: CompareResults | None  # None when interrupted before the report
    interrupted_by: int | None  # the signal that stopped the bench or a training run, if any


def run_compare(
    preset_or_spec: str | CompareSpec,
    out_dir: str | os.PathLike,
    variants: Sequence[str] | None = None,
    *,
    seeds: Sequence[int] | None = None,
    steps: int | None = None,
    corpus: str | None = None,
    tasks: Sequence[str] | None = None,
    device: str | None = None,
    progress: bool = True,
    claims_table: bool = False,
    executor: ExecutorConfig = INLINE,
    pool_commits: bool = False,
    merge_from: Sequence[str | os.PathLike] = (),
) -> CompareResult:
    """Compare ``variants`` (default: the preset's) under one budget and write the report into ``out_dir``.

    Running it again with the same arguments reuses every finished run and resumes an interrupted one.
    SIGINT/SIGTERM during training stop after the current step with a checkpoint, during the bench after the
    cases measured so far, and the call returns with ``interrupted_by`` set and no report. It ends with the
    side-by-side table and the claims counted in one line; ``claims_table`` prints each claim's verdict as well.
    ``executor`` trains the runs elsewhere (local processes, Slurm, Ray: :mod:`attnzoo.compare.executors`) before
    the same loop reads them back. Runs trained by different commits are refused unless ``pool_commits``.
    ``merge_from`` names compare directories of the same comparison made elsewhere whose finished runs are first
    copied in (:mod:`attnzoo.compare.merge`), once every check has passed and the directory is locked.
    """
    spec = resolve_spec(
        preset_or_spec, variants=variants, seeds=seeds, steps=steps, corpus=corpus, tasks=tasks, device=device
    )
    comparison = Comparison(spec, Path(out_dir), progress, claims_table, executor, pool_commits, merge_from=merge_from)
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
            check.runs_to_merge(check.configs(load_corpus(rung.train.data, check.env)))
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


def _evaluated_as_asked(stored: dict[str, Any], asked: dict[str, Any]) -> bool:
    """Whether a run's evaluations are the ones asked for. A run that also kept its attention maps (the first seed
    of the comparison it was made in, e.g. one part of a merged comparison) is as good as one without."""
    return {**stored, "maps": asked["maps"]} == asked and stored["maps"] >= asked["maps"]


def source_commit() -> str | None:
    """The git commit of the attnzoo source this process runs, "-dirty" if it has uncommitted changes; None when
    it is not a git checkout (an installed wheel)."""
    source = Path(__file__).resolve().parent

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(source), *args], capture_output=True, text=True, timeout=30)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return None
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", str(source)).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty else "")


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
        self.started = time.perf_counter()
        self.machine_at_start = machine_description(torch.get_num_threads())  # with the load average now
        self.load_at_start = _load_average()

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
        self.extrapolation_tokens(corpus)  # refuse a too-short corpus now, not after the training
        configs = self.configs(corpus)
        self.merge(configs)
        # Every variant's speed and memory back to back, so the ratios share machine conditions.
        bench, interrupted_by = self.bench(configs)
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
                if not self.finished(variant, seed)
            ]
            self.say(f"{len(todo)} of {len(jobs)} runs to train on executor {self.executor.name}")
            estimates = dict(self.schedule.left)
            run_elsewhere(engine, todo, self.say, lambda job: estimates.get(("lm", job.variant.label, job.seed), 0.0))
        # Runs finished earlier (or by the executor just now) are read back in one line, not a block each: after an
        # executor's 35 runs the screen held 35 headers and growing tables of runs already done.
        done = [self.finished(variant, seed) for seed, variant in jobs]
        if any(done):
            where = "earlier" if self.executor.name == "inline" else f"on executor {self.executor.name} or earlier"
            self.say(f"reusing {sum(done)} of {len(jobs)} runs finished {where}: {self.out_dir / 'runs'}")
        lm_runs: dict[str, dict[int, LMRun]] = {label: {} for label in self.labels}
        for i, ((seed, variant), was_done) in enumerate(zip(jobs, done, strict=True), start=1):
            label = variant.label
            if not was_done:
                self.say(f"\n── [{i}/{len(jobs)}] {label} · seed {seed} · {self._elapsed()} elapsed{self._left()} ──")
            started = time.perf_counter()
            record, interrupted_by, reused = self.lm_run(variant, configs[label], seed, corpus)
            if interrupted_by is not None:
                self.say(f"compare interrupted; run the same command again to continue from {self.out_dir}")
                return CompareResult(self.out_dir, None, interrupted_by)
            assert record is not None
            self.schedule.finish(("lm", label, seed), None if reused else time.perf_counter() - started)
            lm_runs[label][seed] = record
            if not reused:
                self.say(progress_table(lm_runs, self.baseline))

        task_results = {task.name: self.task(task) for task in spec.tasks}
        results = self.assemble(configs, corpus, lm_runs, bench, task_results)
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
        ours = _jsonable(self.spec.to_dict())
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
            stored = _read_record(TaskRun, run.record)
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
        _, train_config, evals = self.run_plan(variant, seed)
        record = _read_record(LMRun, run.record)
        if record is None:
            raise ValueError(f"{where}: {run.record_name} is not a run's record (damaged, or of another schema)")
        if record.provenance is None:
            raise ValueError(
                f"{where}: {run.record_name} records no provenance (the host, device and commit that trained it), "
                "which a run merged from elsewhere must carry: retrain it with this attnzoo, or leave it out"
            )
        if not _evaluated_as_asked(record.evals, evals):
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
        return duration(time.perf_counter() - self.started)

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
            elif all(self.finished(variant, seed) for seed in self.spec.seeds):
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

    # ------------------------------------------------------------------------------------ language model

    def configs(self, corpus: Corpus) -> dict[str, ModelConfig]:
        """Every variant's model, parameter-matched to the baseline's."""
        baseline = self.spec.baseline_config(corpus.tokenizer.vocab_size)
        return matched_configs(self.spec.variants, baseline)

    def run_plan(self, variant: Variant, seed: int) -> tuple[Path, TrainConfig, dict[str, Any]]:
        """Where a run lives, how it trains and how it is evaluated."""
        spec = self.spec
        train_config = dataclasses.replace(spec.train_for(variant), seed=seed, steps=variant.steps(spec.train.steps))
        if variant.uptrain is not None:
            train_config = uptraining_config(dataclasses.replace(spec.train, seed=seed), train_config.steps)
        evals = _jsonable({**asdict(spec.evals), "maps": seed == spec.seeds[0]})
        return self.out_dir / "runs" / variant.label / f"seed{seed}", train_config, evals

    def finished(self, variant: Variant, seed: int) -> bool:
        """Whether the run's record is written, under this comparison's evaluations (its checkpoint is checked
        when the record is read back)."""
        run_dir, _, evals = self.run_plan(variant, seed)
        record = _read_record(LMRun, run_dir / RUN_RECORD)
        return record is not None and _evaluated_as_asked(record.evals, evals)

    def train_one(self, variant: Variant, seed: int) -> None:
        """One run, trained and evaluated where this process is (an executor's worker): its record on disk."""
        corpus = load_corpus(self.spec.train.data, self.env)
        with stop_on_signals():
            record, interrupted_by, _ = self.lm_run(variant, self.configs(corpus)[variant.label], seed, corpus)
        if record is None:
            raise Interrupted(interrupted_by or signal.SIGTERM)

    def lm_run(
        self, variant: Variant, config: ModelConfig, seed: int, corpus: Corpus
    ) -> tuple[LMRun | None, int | None, bool]:
        """Train (or reuse, or resume) one run and evaluate it: its record or the stopping signal, and whether
        the record was reused as it was."""
        run_dir, train_config, evals = self.run_plan(variant, seed)
        found = latest_checkpoint(run_dir)
        checkpoint = read_checkpoint(found) if found is not None else None
        if checkpoint is not None:
            try:
                check_resumable(checkpoint, config, train_config)
            except CheckpointError as err:
                raise CheckpointError(
                    f"{run_dir} holds a run with another configuration than this compare's: {err}. "
                    "Choose another output directory, or delete that run to retrain it."
                ) from None
        finished = checkpoint is not None and checkpoint.step == train_config.steps
        record = _read_record(LMRun, run_dir / RUN_RECORD)
        if finished and record is not None and _evaluated_as_asked(record.evals, evals):
            return record, None, True
        stale = checkpoint is None and run_dir.exists()
        self.env.barrier()  # every process of the run has read its directory before rank 0 changes it
        if stale and self.env.is_main:
            shutil.rmtree(run_dir)  # stopped before its first checkpoint: nothing in it can be continued

        if not finished:
            source = None
            if variant.uptrain is not None and checkpoint is None:
                source = self.converted_source(variant, seed)
            trainer = Trainer(
                config,
                train_config,
                corpus,
                run_dir,
                env=self.env,
                resume=checkpoint,
                init_from=source,
                progress=self.progress,
            )
            result = trainer.fit()
            if result.interrupted_by is not None:
                return None, result.interrupted_by, False
            model = trainer.raw_model
            if self.env.enabled and train_config.parallel == "fsdp":
                # FSDP2 sharded the model in place among the processes; the evaluations read its weights whole.
                model, _ = load_pretrained(run_dir, self.env.device)
        else:
            self.say(f"{run_dir} finished training earlier; evaluating it")
            model, _ = load_pretrained(run_dir, self.env.device)
        record = self.evaluate_lm_run(model, variant.label, seed, train_config, corpus, run_dir, evals)
        if self.env.is_main:
            _write_record(record, run_dir / RUN_RECORD)
        return record, None, False

    def converted_source(self, variant: Variant, seed: int) -> Checkpoint:
        """The same seed's trained source model with its kv heads mean-pooled (``attnzoo convert --kv-heads``): where
        an uptrained variant starts. The source trains first, since it is listed before (CompareSpec checks)."""
        source_dir = self.out_dir / "runs" / variant.source.label / f"seed{seed}"
        converted = self.out_dir / "runs" / variant.label / f"seed{seed}-converted"
        if self.env.is_main:
            shutil.rmtree(converted, ignore_errors=True)  # a conversion cut off midway is simply redone
            group_kv_heads(source_dir, converted, variant.n_kv_heads)  # type: ignore[arg-type]
        self.env.barrier()  # the other processes of the run read the conversion rank 0 wrote
        return read_checkpoint(converted)

    def extrapolation_tokens(self, corpus: Corpus) -> np.ndarray:
        """The start of the validation split that every length is scored on: whole blocks of the longest."""
        evals = self.spec.evals
        longest = max(evals.extrapolation_multiples) * self.spec.train.seq_len
        n_tokens = evals.extrapolation_blocks * longest + 1
        if len(corpus.val) < n_tokens:
            raise ValueError(
                f"the validation split of {corpus.name!r} has {len(corpus.val):,} tokens; length extrapolation "
                f"needs {n_tokens:,} ({evals.extrapolation_blocks} blocks of {longest}): use more text"
            )
        return np.asarray(corpus.val[:n_tokens], dtype=np.int64)

    def evaluate_lm_run(
        self,
        model: Transformer,
        label: str,
        seed: int,
        train_config: TrainConfig,
        corpus: Corpus,
        run_dir: Path,
        evals: dict[str, Any],
    ) -> LMRun:
        spec, device = self.spec, self.env.device
        started = time.perf_counter()
        token_bytes = corpus.tokenizer.token_bytes()
        # Every run is scored on the same tokens, at the comparison's length and its multiples, whatever length it
        # trained at (+lenN): the whole validation split, in contiguous blocks whose losses let the verdicts count
        # the text's sampling noise as well as the seeds'; the trainer's curve scored a sample of its windows.
        length = spec.train.seq_len
        val_config = LMEvalConfig(length, batch_size=spec.train.batch_size, max_windows=spec.evals.val_windows)
        windows_scored = len(window_plan(len(corpus.val), val_config)[0]) // self.env.world_size * self.env.world_size
        blocks = min(spec.evals.val_blocks, windows_scored)
        val = evaluate_lm(model, corpus.val, token_bytes, val_config, env=self.env, blocks=blocks)
        extrapolation_config = LMEvalConfig(length, batch_size=spec.evals.extrapolation_batch_size)
        points = length_extrapolation(
            model,
            self.extrapolation_tokens(corpus),
            token_bytes,
            extrapolation_config,
            spec.evals.extrapolation_multiples,
            blocks=spec.evals.extrapolation_blocks,
        )
        windows = np.asarray(corpus.val[: spec.evals.probe_windows * length], dtype=np.int64)
        probes = lm_probes(model, torch.from_numpy(windows).view(-1, length))
        has_maps = seed == spec.seeds[0]
        if has_maps and self.env.is_main:
            prompt = torch.from_numpy(np.asarray(corpus.val[: spec.evals.map_tokens], dtype=np.int64))[None]
            model.eval()
            maps = model.attention_maps(prompt.to(device))  # each (1, heads, T, T): the effective, mixing map
            np.save(run_dir / ATTENTION_MAPS, torch.stack([m[0] for m in maps]).cpu().numpy())
        metrics = MetricsLog(run_dir / METRICS).read()
        train_records = [r for r in metrics if "train_loss" in r]
        self.say(
            f"evaluated {label} seed {seed} in {time.perf_counter() - started:.1f} s: val loss {val.loss:.4f}, "
            + ", ".join(f"{p.multiple}×: {p.result.loss:.3f}" if p.result else f"{p.multiple}×: N/A" for p in points)
        )
        return LMRun(
            variant=label,
            seed=seed,
            run_dir=str(run_dir.relative_to(self.out_dir)),
            parameters=model.num_parameters(),
            steps=train_config.steps,
            tokens=train_config.steps * train_config.tokens_per_step,
            train_seconds=_training_seconds(train_records, train_config.tokens_per_step),
            final_train_loss=train_records[-1]["train_loss"],
            final_lr=train_records[-1]["lr"],
            val=val,
            extrapolation=[ExtrapolationResult(p.multiple, p.block_len, p.result, p.reason) for p in points],
            train_curve=[(r["step"], r["train_loss"]) for r in train_records],
            val_curve=[(r["step"], r["val_loss"]) for r in metrics if "val_loss" in r],
            evals=evals,
            has_maps=has_maps,
            probes=probes,
            provenance=self.provenance(),
        )

    def provenance(self) -> Provenance:
        device = self.env.device
        threads = f"cpu, {torch.get_num_threads()} thread(s)"
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else threads
        return Provenance(platform.node(), name, source_commit(), self.executor.name)

    # -------------------------------------------------------------------------------------------- bench

    def bench(self, configs: dict[str, ModelConfig]) -> tuple[BenchRecord | None, int | None]:
        """Every variant's throughput and peak memory, the case list measured in turn ``bench_rounds`` times so
        that a change in the machine's load falls on every variant alike; reused only if nothing about the
        measurement has changed. The record, or ``None`` and the signal that stopped it.

        Each finished round of a case is kept in ``bench.partial.json`` as it ends, so a compare stopped during the
        bench measures only the rounds left when run again; its record's machine line then names every sitting.
        """
        spec, train = self.spec.evals, self.spec.train
        threads = torch.get_num_threads()
        # The dtype the runs train in (bf16 autocast on CUDA): a bench in fp32 there times another regime.
        dtype = str(resolve_dtype(train.dtype, self.env.device)).removeprefix("torch.")
        key = _jsonable(
            {
                "configs": {label: configs[label].to_dict() for label in self.labels},
                "cases": [list(case) for case in spec.bench_cases],
                "batch_size": train.batch_size,
                "seq_len": train.seq_len,
                "repeats": spec.bench_repeats,
                "rounds": spec.bench_rounds,
                "warmup": spec.bench_warmup,
                "threads": threads,
                "device": str(self.env.device),
                "dtype": dtype,
            }
        )
        stored = _read_record(BenchRecord, self.out_dir / BENCH)
        if stored is not None and stored.key == key:
            self.say(f"reusing {self.out_dir / BENCH}")
            return stored, None
        # A variant trained with more compute is another variant's model: measured once, under the model's label.
        models: dict[str, str] = {}  # the model's label → the first variant that trains it
        for variant in self.spec.variants:
            models.setdefault(variant.model_label, variant.label)
        cases = [
            BenchCase(
                model, configs[label], max(1, train.batch_size // multiple), train.seq_len * multiple, mode, dtype=dtype
            )
            for (mode, multiple), (model, label) in product(spec.bench_cases, models.items())
        ]
        partial = _read_record(BenchRecord, self.out_dir / BENCH_PARTIAL)
        kept = {_case_key(m): m for m in partial.measurements} if partial is not None and partial.key == key else {}
        machine = machine_description(threads)
        rounds = spec.bench_rounds
        if cases:  # a ladder's rungs bench nothing
            self.say(
                f"── throughput and memory of the untrained models: {rounds} round(s) over the cases, each case in a "
                "fresh process ──"
            )
        if kept and partial is not None:
            self.say(f"keeping the {len(kept)} of {len(cases)} cases measured before the interruption")
            machine = f"{partial.machine}; resumed after an interruption on {machine}"
        wheres = [(case.label, case.mode, case.seq_len) for case in cases]
        measured = {where: kept.get(where) for where in wheres}
        try:
            with stop_on_signals():
                for round_number in range(1, rounds + 1):
                    for case, where in zip(cases, wheres, strict=True):
                        done = measured[where]
                        if done is not None and (done.timing is None or done.timing.rounds >= round_number):
                            continue  # measured in an earlier sitting, or unavailable
                        measured[where] = self.measure_round(case, None if done is None else done.timing, round_number)
                        partial = BenchRecord(key, machine, [m for m in measured.values() if m is not None])
                        _write_record(partial, self.out_dir / BENCH_PARTIAL)  # atomic: a stop leaves the last one
        except Interrupted as stop:
            return None, stop.signum
        bench = BenchRecord(key, machine, [m for m in measured.values() if m is not None])
        _write_record(bench, self.out_dir / BENCH)
        (self.out_dir / BENCH_PARTIAL).unlink(missing_ok=True)
        return bench, None

    def measure_round(self, case: BenchCase, earlier: BenchTiming | None, round_number: int) -> BenchMeasurement:
        """One more round of ``case``, pooled with its ``earlier`` rounds (None: this is its first)."""
        spec = self.spec.evals
        where = {"variant": case.label, "mode": case.mode, "seq_len": case.seq_len, "batch_size": case.batch_size}
        try:
            result = measure(
                case,
                repeats=-(-spec.bench_repeats // spec.bench_rounds),  # ceil: every round times at least one
                warmup=spec.bench_warmup,
                threads=torch.get_num_threads(),
                device=str(self.env.device),
            )
        except RuntimeError as err:  # e.g. learned positions past max_seq_len: N/A, with the reason
            self.say(f"{case.mode} T={case.seq_len} {case.label}: N/A")
            return BenchMeasurement(**where, timing=None, unavailable=str(err))
        load = result.extra.get("load_average")
        rates = result.extra["rates"]
        if earlier is None:
            loads = [] if load is None else [load]
            timing = BenchTiming.of_rounds(rates, result.peak_mem_mb, loads, os.cpu_count())
        else:
            timing = earlier.with_round(rates, result.peak_mem_mb, load)
        shown = "unknown" if load is None else f"{load:.2f}"
        busy = " (unreliable: busy machine)" if timing.busy else ""
        self.say(
            f"round {round_number}/{spec.bench_rounds} {case.mode} T={case.seq_len} {case.label}: "
            f"{result.tokens_per_s:,.0f} tok/s ({result.tokens_per_s_min:,.0f}–{result.tokens_per_s_max:,.0f}), "
            f"load average {shown}{busy}"
        )
        return BenchMeasurement(**where, timing=timing)

    # -------------------------------------------------------------------------------------------- tasks

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
            stored = _read_record(TaskRun, path)
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
            _write_record(result, path)
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

    # ------------------------------------------------------------------------------------------ results

    def ngram_level(self, corpus: Corpus) -> NGramLevel:
        """The corpus's trigram level, kept beside the runs: counting a large corpus takes a while, once."""
        path = self.out_dir / NGRAM
        stored = _read_record(NGramLevel, path)
        counted = (min(len(corpus.train), NGRAM_TRAIN_TOKENS), len(corpus.val))
        if stored is not None and (stored.train_tokens, stored.val_tokens) == counted:
            return stored
        level = corpus_ngram_level(corpus)
        _write_record(level, path)
        return level

    def assemble(
        self,
        configs: dict[str, ModelConfig],
        corpus: Corpus,
        lm_runs: dict[str, dict[int, LMRun]],
        bench: BenchRecord,
        task_results: dict[str, TaskResult],
    ) -> CompareResults:
        spec, train = self.spec, self.spec.train
        runs = {label: [lm_runs[label][seed] for seed in spec.seeds] for label in self.labels}
        self.refuse_mixed_commits([run for by_seed in runs.values() for run in by_seed])
        return CompareResults(
            schema_version=SCHEMA_VERSION,
            attnzoo_version=__version__,
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            command=sys.argv,
            preset=spec.name,
            spec=_jsonable(spec.to_dict()),
            baseline=self.baseline,
            seeds=list(spec.seeds),
            budget=Budget(
                steps=train.steps,
                batch_size=train.batch_size,
                seq_len=train.seq_len,
                lr=train.lr,
                warmup_steps=train.warmup_steps,
                min_lr=train.lr * train.min_lr_ratio,
                tokens_per_run=train.steps * train.tokens_per_step,
                runs=len(spec.seeds) * len(self.labels),
                train_seconds_total=sum(r.train_seconds for by_seed in runs.values() for r in by_seed),
                wall_seconds_this_invocation=time.perf_counter() - self.started,
            ),
            evals=spec.evals,
            corpus=CorpusInfo(
                corpus.name, corpus.tokenizer.kind, len(corpus.train), len(corpus.val), self.ngram_level(corpus)
            ),
            machine=MachineInfo(
                description=self.machine_at_start,
                platform=platform.platform(),
                python=platform.python_version(),
                torch=torch.__version__,
                device=str(self.env.device),
                cpu_count=os.cpu_count(),
                torch_threads=torch.get_num_threads(),
                load_average_start=self.load_at_start,
                load_average_end=_load_average(),
            ),
            variants={
                label: VariantResult(
                    config=configs[label].to_dict(),
                    parameters=runs[label][0].parameters,
                    kv_cache_bytes_per_token=kv_cache_bytes_per_token(configs[label]),
                    map_note=ATTENTION.get(configs[label].attention).map_note,
                    runs=runs[label],
                )
                for label in self.labels
            },
            bench=bench,
            tasks=task_results,
        )


def lm_probes(model: Transformer, windows: Tensor) -> dict[str, float]:
    """The trained model's probes (attnzoo.evals.probes) as flat values: each layer's, and the summaries the
    claims read: the largest attention logit and hidden-state outlier ratio over layers, and the spikiness of
    rows that see at least half the window (a local layer's longest rows, where its window is shorter),
    averaged over layers."""
    layers = probe_model(model, windows)
    values = {
        f"layer{p.layer}/{name}": getattr(p, name)
        for p in layers
        for name in ("top_logit", "hidden_top", "hidden_ratio", "entropy", "spikiness")
    }
    half = windows.shape[1] // 2
    long_rows = []
    for p in layers:
        # Buckets are lengths [low, 2·low − 1]; in a fresh causal window each length up to T has one row.
        buckets = [(int(b.split("-")[0]), v) for b, v in p.spikiness_by_length.items() if b != "1"]
        weighted = [(min(2 * low - 1, windows.shape[1]) - low + 1, v) for low, v in buckets if low >= half]
        weighted = weighted or [(1, buckets[-1][1])]
        long_rows.append(sum(n * v for n, v in weighted) / sum(n for n, _ in weighted))
    return values | {
        "top1_attention_logit": max(p.top_logit for p in layers),
        "hidden_outlier_ratio": max(p.hidden_ratio for p in layers),
        "spikiness_long": sum(long_rows) / len(long_rows),
    }


# --------------------------------------------------------------------------------------------------- summaries


def kv_cache_bytes_per_token(config: ModelConfig) -> int:
    """What the model's static cache allocates per position, over all layers, at its parameters' dtype."""
    with torch.device("meta"):
        cache = Transformer(config).new_cache(1, config.max_seq_len)
    total = sum(b.numel() * b.element_size() for layer in cache.layers for b in layer.buffers.values())
    return total // config.max_seq_len


# The trigram is fitted on at most this many tokens from the start of the training split: all of Shakespeare, and a
# bounded cost on pysource (hundreds of millions of tokens, minutes of sorting on a GPU lease's host). A trigram
# fitted on 8M tokens is weaker than one on all of them, so the competent-model gate is, if anything, lenient there.
NGRAM_TRAIN_TOKENS = 8_000_000


def corpus_ngram_level(corpus: Corpus) -> NGramLevel:
    """The level every judged language model must beat: a trigram count model (attnzoo.evals.ngram)."""
    train = corpus.train[:NGRAM_TRAIN_TOKENS]
    return kneser_ney_level(train, corpus.val, corpus.tokenizer.vocab_size, order=3)


def with_ngram_level(results: CompareResults) -> CompareResults:
    """``results`` with its corpus's trigram level, counted from the corpus its spec names where the file (written
    before the level was kept) lacks it; refused where that corpus no longer tokenizes to the same splits."""
    if results.corpus.ngram is not None:
        return results
    data = DataConfig(**results.spec["train"]["data"])
    corpus = prepare_corpus(data.corpus, data.tokenizer, data.val_fraction)
    found, stored = (len(corpus.train), len(corpus.val)), (results.corpus.train_tokens, results.corpus.val_tokens)
    if found != stored:
        raise ValueError(
            f"the corpus {data.corpus!r} now gives {found[0]:,} training and {found[1]:,} validation tokens, where "
            f"the results were trained on {stored[0]:,} and {stored[1]:,}: its n-gram level cannot be counted here"
        )
    return dataclasses.replace(results, corpus=dataclasses.replace(results.corpus, ngram=corpus_ngram_level(corpus)))


def uptraining_config(pretraining: TrainConfig, steps: int) -> TrainConfig:
    """GQA uptraining as Ainslie et al. (2023, arXiv 2305.13245) describe it: the pre-training recipe again, for a
    fraction α of its steps (``steps``). The converted model's fresh optimiser re-warms to the peak learning rate
    over the same share of its steps as pre-training's warmup and decays on the same cosine to the same floor;
    it is evaluated four times so the gates can read its curve."""
    schedule = pretraining.with_steps(steps)
    return dataclasses.replace(
        schedule,
        warmup_steps=min(max(1, schedule.warmup_steps), steps - 1),
        eval_interval=max(1, steps // 4),
        checkpoint_interval=steps,
    )


# ------------------------------------------------------------------------------------------------------ helpers


def _training_seconds(train_records: list[dict[str, Any]], tokens_per_step: int) -> float:
    """Time spent in training steps, from the throughput logged with each record: evaluation, checkpoints
    and the steps of an interrupted session that a resume redid are not counted."""
    seconds, previous = 0.0, 0
    for record in train_records:
        seconds += (record["step"] - previous) * tokens_per_step / record["tokens_per_s"]
        previous = record["step"]
    return seconds


def _case_key(measurement: BenchMeasurement) -> tuple[str, str, int]:
    return measurement.variant, measurement.mode, measurement.seq_len


def _read_record(cls: type[R], path: Path) -> R | None:
    """The record stored at ``path``, or None if it is missing, damaged or of another schema: then the work
    it records is redone. One that reads but holds a number that cannot be (edited by hand, or by a bug) is
    refused by name (:func:`attnzoo.results.checks.check_record`): redoing it would hide what happened."""
    try:
        record = from_dict(cls, json.loads(path.read_text(encoding="utf-8")), str(path))
    except (OSError, ValueError, TypeError):
        return None
    check_record(record, str(path))
    return record


def _task_identity(spec: TaskSpec, config: ModelConfig) -> dict[str, Any]:
    """What a task run is reused under: its budget and model."""
    return _jsonable({"budget": asdict(spec.budget), "model": config.to_dict()})


def _write_record(record: Any, path: Path) -> None:
    atomic_write_text(path, json.dumps(to_dict(record), indent=2) + "\n")


def _jsonable(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists), so stored and fresh values compare equal."""
    return json.loads(json.dumps(value))


def _load_average() -> list[float] | None:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None
