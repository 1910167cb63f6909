"""What a comparison found, as typed records: the schema of ``results.json``.

The runner builds these records; the report is a pure function of a loaded :class:`CompareResults`. Derived
numbers (means over seeds, differences from the baseline, speed and memory ratios) are methods, never stored,
so a file cannot disagree with itself. :data:`SCHEMA_VERSION` changes whenever a field does; a file of another
version is refused by name rather than read wrongly.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnzoo.evals.base import LengthDepthSweep, largest_passing_length
from attnzoo.evals.lm import LMScore
from attnzoo.evals.ngram import NGramLevel
from attnzoo.evals.spec import EvalSpec
from attnzoo.evals.task import TaskBudget
from attnzoo.io import atomic_write_text
from attnzoo.machine import is_busy
from attnzoo.records import from_dict, to_dict
from attnzoo.results.checks import check_results
from attnzoo.stats import PairedDifference, Summary, paired_over_seeds, paired_over_seeds_and_blocks
from attnzoo.validation import is_int

ATTENTION_MAPS = "attention_maps.npy"  # beside each first-seed run: (layers, heads, T, T)
# 1: the implicit nested dicts of attnzoo 0.1.0, which carried no version; 2: these records; 3: the validation
# loss over the whole split with its per-block losses (a version-2 file reads as one without them); 4: the corpus's
# n-gram level (an older file reads as one without it, which `compare --report-only` adds); 5: each run's learning
# rate at its last step, as its log recorded it (an older file reads as one without it).
SCHEMA_VERSION = 5
READABLE_VERSIONS = (2, 3, 4, 5)


# ---------------------------------------------------------------------------------------------- language model


@dataclass(frozen=True)
class ExtrapolationResult:
    multiple: int  # of the training length
    block_len: int
    score: LMScore | None  # None: the model cannot run this length
    unavailable: str | None = None  # why not


@dataclass(frozen=True)
class Provenance:
    """Where and from what code a run was trained: runs made elsewhere (an executor's workers, another machine,
    another lease) are pooled only from one commit unless the comparison is told otherwise."""

    host: str
    device: str  # "cpu, 1 thread(s)" or the GPU's name
    commit: str | None  # the source checkout's git commit (with "-dirty" for uncommitted changes); None: no checkout
    executor: str  # inline, local, slurm or ray


@dataclass(frozen=True)
class LMRun:
    """One variant × seed trained on the corpus, and its evaluations."""

    variant: str
    seed: int
    run_dir: str  # relative to the compare's directory
    parameters: int
    steps: int
    tokens: int
    train_seconds: float  # time in training steps only, from the throughput logged with each record
    final_train_loss: float
    val: LMScore
    extrapolation: list[ExtrapolationResult]
    train_curve: list[tuple[int, float]]  # (step, training loss)
    val_curve: list[tuple[int, float]]  # (step, validation loss)
    evals: dict[str, Any]  # the evaluation settings; a stored run is reused only under the same ones
    has_maps: bool = False  # attention_maps.npy beside the run
    probes: dict[str, float] = field(default_factory=dict)  # of the trained model: outliers, spikiness
    provenance: Provenance | None = None  # None in a file written before runs recorded it
    # The learning rate the last step applied, from the run's own log: whether its schedule reached its floor (the
    # language-model gate's (a)). None in a file written before runs recorded it.
    final_lr: float | None = None

    @property
    def train_tokens_per_s(self) -> float:
        return self.tokens / self.train_seconds

    def extrapolation_loss(self, multiple: int) -> float | None:
        point = next(p for p in self.extrapolation if p.multiple == multiple)
        return point.score.loss if point.score is not None else None


@dataclass(frozen=True)
class VariantResult:
    config: dict[str, Any]  # the ModelConfig
    parameters: int
    kv_cache_bytes_per_token: int  # over all layers, as the model's new_cache allocates it
    map_note: str  # how the mechanism's effective attention map is read off it
    runs: list[LMRun]  # one per seed, in seed order

    def metric_values(self) -> dict[str, list[float]]:
        """Every lower-is-better metric over the seeds; a metric N/A in any run is left out."""
        values: dict[str, list[float | None]] = {
            "val_loss": [r.val.loss for r in self.runs],
            "val_bits_per_byte": [r.val.bits_per_byte for r in self.runs],
            "val_perplexity": [r.val.perplexity for r in self.runs],
            "final_train_loss": [r.final_train_loss for r in self.runs],
        }
        for point in self.runs[0].extrapolation:
            values[f"loss_at_{point.multiple}x"] = [r.extrapolation_loss(point.multiple) for r in self.runs]
        return {name: vs for name, vs in values.items() if all(v is not None for v in vs)}  # type: ignore[misc]

    def summary(self) -> dict[str, Summary]:
        return {name: Summary.of(values) for name, values in self.metric_values().items()}


# ------------------------------------------------------------------------------------------------------ bench


@dataclass(frozen=True)
class BenchTiming:
    """One case's speed and memory, pooled over the rounds that measured it (each in a fresh process)."""

    tokens_per_s: float  # median over every round's repeats
    tokens_per_s_min: float
    tokens_per_s_max: float
    peak_mem_mb: float  # the highest round's
    # The highest of the rounds' 1-minute load averages, each taken as its round ended, and the machine's cores
    # (None in records written before they were kept): a case measured while more work was runnable than cores
    # shared the CPU (attnzoo.machine).
    load_average: float | None = None
    cores: int | None = None
    rates: tuple[float, ...] = ()  # every timed repeat's tokens/s (empty in records written before rounds)
    round_load_averages: tuple[float, ...] = ()
    rounds: int = 1

    @property
    def busy(self) -> bool:
        return self.cores is not None and is_busy(self.load_average, self.cores)

    @staticmethod
    def of_rounds(
        rates: Sequence[float], peak_mem_mb: float, round_loads: Sequence[float], cores: int | None, rounds: int = 1
    ) -> BenchTiming:
        """The pooled timing of ``rounds`` rounds: the median, min and max over all their repeats' ``rates``, the
        highest peak memory and the highest load average."""
        return BenchTiming(
            statistics.median(rates),
            min(rates),
            max(rates),
            peak_mem_mb,
            max(round_loads) if round_loads else None,
            cores,
            tuple(rates),
            tuple(round_loads),
            rounds,
        )

    def with_round(self, rates: Sequence[float], peak_mem_mb: float, load_average: float | None) -> BenchTiming:
        """This timing with one more round's repeats pooled in."""
        loads = [*self.round_load_averages, *([] if load_average is None else [load_average])]
        return BenchTiming.of_rounds(
            [*self.rates, *rates], max(self.peak_mem_mb, peak_mem_mb), loads, self.cores, self.rounds + 1
        )


@dataclass(frozen=True)
class BenchMeasurement:
    variant: str
    mode: str
    seq_len: int
    batch_size: int
    timing: BenchTiming | None  # None when unavailable
    unavailable: str | None = None  # why


@dataclass(frozen=True)
class BenchRatio:
    measurement: BenchMeasurement
    speed: float | None  # tokens/s ÷ the baseline's in the same case: above 1 is faster
    speed_low: float | None  # the same from the slowest and the fastest repeat: the spread
    speed_high: float | None
    memory: float | None  # peak ÷ the baseline's: above 1 is more
    busy: bool = False  # the case or the baseline's was measured on a busy machine: the speed is unreliable


@dataclass(frozen=True)
class BenchRecord:
    """Every variant's throughput and peak memory, measured back to back (the machine line names every sitting)."""

    key: dict[str, Any]  # what was measured and how; a stored record is reused only under the same key
    machine: str
    measurements: list[BenchMeasurement]

    def ratios(self, baseline: str) -> list[BenchRatio]:
        base = {(m.mode, m.seq_len): m.timing for m in self.measurements if m.variant == baseline and m.timing}
        rows = []
        for m in self.measurements:
            ours, theirs = m.timing, base.get((m.mode, m.seq_len))
            if ours is None or theirs is None:
                rows.append(BenchRatio(m, None, None, None, None))
                continue
            rows.append(
                BenchRatio(
                    m,
                    ours.tokens_per_s / theirs.tokens_per_s,
                    ours.tokens_per_s_min / theirs.tokens_per_s,
                    ours.tokens_per_s_max / theirs.tokens_per_s,
                    ours.peak_mem_mb / theirs.peak_mem_mb if theirs.peak_mem_mb else None,
                    ours.busy or theirs.busy,
                )
            )
        return rows


# ------------------------------------------------------------------------------------------------------ tasks


@dataclass(frozen=True)
class SweepResult:
    """Accuracy on a (context length × needle depth) grid; None where the model cannot run the length."""

    lengths: list[int]
    depths: list[float]
    accuracy: list[list[float | None]]  # [length][depth]
    unavailable: dict[str, str]  # length → why not

    @classmethod
    def of(cls, sweep: LengthDepthSweep) -> SweepResult:
        lengths = sorted({cell.context_len for cell in sweep.cells})
        depths = sorted({cell.depth for cell in sweep.cells})
        grid = {(cell.context_len, cell.depth): cell.accuracy for cell in sweep.cells}
        accuracy = [[grid[length, depth] for depth in depths] for length in lengths]
        return cls(lengths, depths, accuracy, {str(k): v for k, v in sweep.unavailable.items()})

    def accuracy_by_length(self) -> dict[int, float | None]:
        """Mean over depths (every cell holds as many samples); None where the model cannot run the length."""
        return {
            length: None if None in row else sum(row) / len(row)  # type: ignore[arg-type]
            for length, row in zip(self.lengths, self.accuracy, strict=True)
        }

    def largest_length(self, threshold: float = 0.9) -> int | None:
        return largest_passing_length(self.accuracy_by_length(), threshold)


@dataclass(frozen=True)
class TaskRun:
    """One variant × seed trained from scratch on a task, and its scores."""

    task: str
    variant: str
    seed: int
    parameters: int
    steps: int  # run, which is fewer than the budget's when the metric reached stop_at
    tokens: int
    seconds: float  # training and the evaluations along the way
    final_train_loss: float
    history: list[tuple[int, float]]  # (step, metric) on the fixed evaluation set
    final: dict[str, float]  # every value the task's evaluator returns, for the final model
    stop_at: float | None = None  # the budget's early stop, if any
    steps_to_threshold: int | None = None  # the first evaluated step that reached stop_at
    sweep: SweepResult | None = None
    probe: dict[str, float] = field(default_factory=dict)
    identity: dict[str, Any] = field(default_factory=dict)  # the budget and model; reused only under the same


@dataclass(frozen=True)
class TaskResult:
    """A task as it was run: its record's fields that the report reads, its budget, and every run."""

    name: str
    measures: str
    paper: str
    metric: str
    higher_is_better: bool
    probe_columns: dict[str, str]
    budget: TaskBudget
    context_len: int
    runs: dict[str, list[TaskRun]]  # by variant, one per seed
    chance: float | None = None  # the metric of a uniform guess at this budget's config
    solved: float | None = None
    shortcut: float | None = None  # the metric of skipping the tested step (Task.shortcut), at this config

    def summary(self, variant: str) -> Summary:
        return Summary.of([run.final[self.metric] for run in self.runs[variant]])

    def probe_summary(self, variant: str, key: str) -> Summary:
        return Summary.of([run.probe[key] for run in self.runs[variant]])


# ------------------------------------------------------------------------------------------------- the whole


@dataclass(frozen=True)
class Budget:
    steps: int
    batch_size: int
    seq_len: int
    lr: float
    warmup_steps: int
    min_lr: float
    tokens_per_run: int
    runs: int
    train_seconds_total: float
    wall_seconds_this_invocation: float  # a resumed compare counts only its own work


@dataclass(frozen=True)
class CorpusInfo:
    name: str
    tokenizer: str
    train_tokens: int
    val_tokens: int
    # A trigram count model fitted on the training split and scored on the validation split: the level every
    # language model of a judged comparison must beat (attnzoo.claims.gates.LanguageModelGate, part d).
    ngram: NGramLevel | None = None


@dataclass(frozen=True)
class MachineInfo:
    description: str
    platform: str
    python: str
    torch: str
    device: str
    cpu_count: int | None
    torch_threads: int
    load_average_start: list[float] | None
    load_average_end: list[float] | None


@dataclass(frozen=True)
class CompareResults:
    schema_version: int
    attnzoo_version: str
    created: str
    command: list[str]
    preset: str
    spec: dict[str, Any]  # the CompareSpec as run, for the record; the fields below are what the report reads
    baseline: str
    seeds: list[int]
    budget: Budget
    evals: EvalSpec
    corpus: CorpusInfo
    machine: MachineInfo
    variants: dict[str, VariantResult]
    bench: BenchRecord
    tasks: dict[str, TaskResult]

    def versus_baseline(self, variant: str, metric: str) -> PairedDifference | None:
        """``variant − baseline`` in a metric both have, paired by seed (and by validation block for the validation
        loss, where the runs stored them); None where either lacks it."""
        ours, base = self.variants[variant], self.variants[self.baseline]
        shared = sorted({r.seed for r in ours.runs} & {r.seed for r in base.runs})
        ours_runs = [next(r for r in ours.runs if r.seed == s) for s in shared]
        base_runs = [next(r for r in base.runs if r.seed == s) for s in shared]
        if not shared:
            return None
        if metric == "val_loss" and all(r.val.block_losses is not None for r in ours_runs + base_runs):
            return paired_over_seeds_and_blocks(
                np.array([r.val.block_losses for r in ours_runs]), np.array([r.val.block_losses for r in base_runs])
            )
        mine = dict(zip((r.seed for r in ours.runs), ours.metric_values().get(metric) or [], strict=False))
        theirs = dict(zip((r.seed for r in base.runs), base.metric_values().get(metric) or [], strict=False))
        if not mine or not theirs:
            return None
        return paired_over_seeds([mine[s] for s in shared], [theirs[s] for s in shared])

    def save(self, path: str | os.PathLike) -> None:
        atomic_write_text(path, json.dumps(to_dict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> CompareResults:
        """The results stored at ``path``, their numbers checked (:mod:`attnzoo.results.checks`): every way a stored
        comparison comes back in reads it here."""
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        results = cls.from_dict(data, str(path))
        check_results(results, str(path))
        return results

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "results") -> CompareResults:
        if not isinstance(data, dict):
            raise ValueError(f"{source} holds a JSON {type(data).__name__}, not a compare's results (an object)")
        version = data.get("schema_version", 1)
        if not is_int(version):
            raise ValueError(
                f"{source}: schema_version = {version!r} is invalid: must be the integer "
                f"{', '.join(map(str, READABLE_VERSIONS))} (a number, not {type(version).__name__})"
            )
        if version not in READABLE_VERSIONS:
            raise ValueError(
                f"{source} has results schema version {version}; this attnzoo reads versions "
                f"{', '.join(map(str, READABLE_VERSIONS))}. "
                "Run the same compare with this version to rewrite it; finished training runs are reused."
            )
        return from_dict(cls, {**data, "schema_version": SCHEMA_VERSION}, source)
