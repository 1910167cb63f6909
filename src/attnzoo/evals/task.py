"""A synthetic task as a record: what it generates, how it is scored, and what it costs to train, in one place.

Each task module ends with one :func:`register_task` call that declares everything the harness needs:

* the generator and evaluator (``make_batch``, ``evaluate``) and the vocabulary a model for it needs, or its
  own model (``build_model``) where its inputs are not tokens;
* the metric it is judged by, its direction, and its chance and solved levels;
* optionally a ``sweep`` over context length × needle depth, and a ``probe`` of the trained model whose values
  the report shows as the columns ``probe_columns`` names;
* a training budget per scale (:data:`SCALES`): a compare preset runs every task with a budget at its scale,
  and ``--tasks`` or ``attnzoo eval --task`` take any other at the nearest larger one.

``compare`` and its report read only these fields, so adding a task is one file and its registration.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from attnzoo.evals.base import LengthDepthSweep, TaskBatch
from attnzoo.records import check_keys
from attnzoo.validation import MAX_COUNT, is_count, is_int, is_number, require
from attnzoo.variants import Variant

# From a smoke test to a GPU-sized budget; a task without a budget at a scale uses the nearest larger one.
SCALES = ("micro", "quick", "claims", "standard", "full")
MODEL_FIELDS_SET_PER_RUN = ("vocab_size", "attention", "position", "max_seq_len")


@dataclass(frozen=True)
class TaskBudget:
    """How a task is trained from scratch for one variant × seed, on fresh batches every step (online data)."""

    options: dict[str, Any] = field(default_factory=dict)  # fields of the task's config; the rest keep defaults
    model: dict[str, Any] = field(default_factory=lambda: {"dim": 64, "n_layers": 2, "n_heads": 2})
    steps: int = 1000
    batch_size: int = 32
    lr: float = 1e-3
    warmup_steps: int = 50
    eval_interval: int = 250
    eval_samples: int = 500  # a fixed evaluation set, the same for every variant and seed
    stop_at: float | None = None  # stop once the evaluation metric reaches this (Zoology's 0.99 for MQAR)
    sweep_lengths: tuple[int, ...] = ()  # tasks with a sweep: accuracy by context length and needle depth
    sweep_depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    sweep_samples: int = 20  # per (length, depth) cell
    probe_samples: int = 32  # tasks with a probe: samples it reads

    def __post_init__(self) -> None:
        check_model_settings(self.model, "task model")
        for name in ("steps", "batch_size", "eval_interval", "eval_samples", "sweep_samples", "probe_samples"):
            value = getattr(self, name)
            require(is_int(value) and value >= 1, name, value, "must be an integer >= 1")
        require(is_count(self.steps), "steps", self.steps, f"must be an integer in [1, {MAX_COUNT}]")
        require(is_int(self.warmup_steps) and self.warmup_steps >= 0, "warmup_steps", self.warmup_steps, ">= 0")
        require(is_number(self.lr) and self.lr > 0, "lr", self.lr, "must be a finite number > 0")
        require(
            all(is_int(length) and length >= 1 for length in self.sweep_lengths),
            "sweep_lengths",
            self.sweep_lengths,
            "must be integers >= 1",
        )


def check_model_settings(model: dict[str, Any], what: str) -> None:
    """``model`` holds valid ModelConfig fields other than those every run sets itself."""
    from attnzoo.config import ModelConfig  # the config imports the mechanisms; a task module need not

    clash = sorted(set(model) & set(MODEL_FIELDS_SET_PER_RUN))
    require(not clash, what, model, f"must not set {clash}: they are set per variant, data and length")
    ModelConfig.from_dict({**model, "vocab_size": 256})  # unknown or invalid fields fail here, by name


ModelBuilder = Callable[[Any, Any], nn.Module]  # (ModelConfig, the task's config) → the model the task trains
Sweep = Callable[..., LengthDepthSweep]  # (model, cfg, *, lengths, depths, samples_per_cell, seed) → the grid
Probe = Callable[[nn.Module, Any, int], dict[str, float]]  # (model, cfg, n_samples) → named values


@dataclass(frozen=True)
class Task:
    name: str
    config: type  # the task's config dataclass
    make_batch: Callable[[Any, int, int | torch.Generator], TaskBatch]
    evaluate: Callable[..., dict[str, float]]  # (model, cfg, n_samples, seed, batch_size) → {metric: value}
    vocab_size: Callable[[Any], int]  # the ModelConfig.vocab_size a model for this config needs
    measures: str  # one sentence: what the task measures
    paper: str  # where the task comes from
    budgets: Mapping[str, TaskBudget]  # by scale
    metric: str = "accuracy"
    higher_is_better: bool = True
    sweep: Sweep | None = None
    probe: Probe | None = None
    probe_columns: Mapping[str, str] = field(default_factory=dict)  # probe value → report column header
    chance: Callable[[Any], float] | None = None  # the metric of a uniform guess, for a config
    solved: float | None = None  # the metric of a model that has solved it
    # The metric of a model that takes the task's shortcut instead of the step it tests: retrieving a random
    # needle rather than the one asked for, answering from a random binding. Learning curves sit on it before
    # the retrieval circuit forms (eval_protocols.md §3.5), often far above chance, so a baseline has learned
    # the task only clearly above it. None: the task has no such shortcut.
    shortcut: Callable[[Any], float] | None = None
    # Inputs that are not tokens need their own model around the Transformer; ``model(inputs, targets)`` must
    # return (outputs, loss) as the language model does. None: the language model on the task's tokens.
    build_model: ModelBuilder | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.budgets) - set(SCALES))
        require(not unknown, "budgets", unknown, f"scales must be among {list(SCALES)}")
        require(len(self.budgets) > 0, "budgets", self.budgets, "must give at least one scale")
        require(
            set(self.probe_columns) == set() or self.probe is not None,
            "probe_columns",
            self.probe_columns,
            "need a probe",
        )
        for budget in self.budgets.values():
            self.check(budget)

    def check(self, budget: TaskBudget) -> None:
        """Refuse a budget this task cannot run, naming the field."""
        check_keys(self.config, budget.options, "option(s)", f"task {self.name!r}: bad options {budget.options}")
        try:
            self.config(**budget.options)
        except TypeError as err:  # a value of the wrong type, which a check cannot compute with
            raise ValueError(f"task {self.name!r}: bad options {budget.options}: {err}") from None
        require(
            budget.stop_at is None or (self.higher_is_better and 0 < budget.stop_at <= 1),
            "stop_at",
            budget.stop_at,
            f"must be null or an accuracy in (0, 1]; {self.name} is judged by {self.metric}, which cannot stop early",
        )
        require(
            not budget.sweep_lengths or self.sweep is not None,
            "sweep_lengths",
            budget.sweep_lengths,
            f"{self.name} has no length × depth sweep; tasks with one: {[t for t in TASKS if TASKS[t].sweep]}",
        )

    def new_model(self, model_config: Any, cfg: Any) -> nn.Module:
        """A freshly initialised model of ``model_config`` for this task under its config ``cfg``."""
        if self.build_model is not None:
            return self.build_model(model_config, cfg)
        from attnzoo.model import Transformer  # the model imports the mechanisms; a task module need not

        return Transformer(model_config)

    def budget(self, scale: str) -> TaskBudget:
        """The budget at ``scale``, else at the nearest larger scale, else the largest one declared."""
        require(scale in SCALES, "scale", scale, f"choose one of {list(SCALES)}")
        larger = [s for s in SCALES[SCALES.index(scale) :] if s in self.budgets]
        return self.budgets[larger[0]] if larger else self.budgets[max(self.budgets, key=SCALES.index)]


TASKS: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    if task.name in TASKS:
        raise ValueError(f"task {task.name!r} is already registered")
    TASKS[task.name] = task
    return task


def tasks_at_scale(scale: str) -> tuple[TaskSpec, ...]:
    """The tasks a preset of this scale runs: every registered task that declares a budget at exactly it."""
    return tuple(TaskSpec(name, task.budgets[scale]) for name, task in TASKS.items() if scale in task.budgets)


def get_task(name: str) -> Task:
    require(name in TASKS, "task", name, f"choose one of {sorted(TASKS)}")
    return TASKS[name]


@dataclass(frozen=True)
class TaskSpec:
    """A registered task with the budget it is trained under."""

    name: str
    budget: TaskBudget = field(default_factory=TaskBudget)
    # The variants a comparison trains on it, the first the one the others are compared with; empty: every variant
    # of the comparison, its baseline first. Labels ("mha+rope") are parsed here, once.
    variants: tuple[Variant, ...] = ()

    def __post_init__(self) -> None:
        self.task.check(self.budget)
        object.__setattr__(self, "variants", Variant.parse_all(self.variants))

    @classmethod
    def at_scale(cls, name: str, scale: str) -> TaskSpec:
        return cls(name, get_task(name).budget(scale))

    @property
    def task(self) -> Task:
        return get_task(self.name)

    def config(self) -> Any:
        """The task's config dataclass (its own validation applies)."""
        return self.task.config(**self.budget.options)

    def replace(self, **changes: Any) -> TaskSpec:
        """This task with some budget fields changed."""
        return TaskSpec(self.name, dataclasses.replace(self.budget, **changes), self.variants)
