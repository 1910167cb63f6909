"""What a comparison trains and measures: typed, validated specs and the four presets.

A :class:`CompareSpec` fixes everything that must be equal across variants for the comparison to be fair:
the baseline model (every variant is parameter-matched to it), the training budget and data, the seeds,
and the evaluations. The variants are the only thing that differs. ``micro`` exists for tests; ``quick``
is the README's main job (5-8 minutes on 2 CPU cores, measured; see ``quick``'s description);
``standard`` and ``full`` spend more steps, seeds and evaluation samples and are meant for longer jobs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from attnzoo.config import ModelConfig, is_int, require
from attnzoo.evals import TASKS
from attnzoo.training.config import TrainConfig
from attnzoo.variants import Variant

DEFAULT_VARIANTS = ("mha+rope", "mha+alibi", "diff+rope", "selective+rope", "dcmha+rope")
# Set per variant (attention, position) or from the data (vocab_size) and the training length (max_seq_len).
MODEL_FIELDS_SET_BY_COMPARE = ("vocab_size", "attention", "position", "max_seq_len")
BENCH_MODES = ("train", "prefill")
# The metric each task is judged by and whether higher is better; "accuracy" (higher) unless listed.
TASK_METRICS: dict[str, tuple[str, bool]] = {"random_walk": ("excess_loss", False)}
SWEEP_TASKS = ("passkey", "needles")  # tasks scored by context length × needle depth


def task_metric(name: str) -> tuple[str, bool]:
    return TASK_METRICS.get(name, ("accuracy", True))


@dataclass(frozen=True)
class EvalSpec:
    """The evaluations run on each trained language model, beside the validation loss the trainer computes."""

    # Train short, test long (ALiBi §4): nonoverlapping evaluation at these multiples of the training length.
    extrapolation_multiples: tuple[int, ...] = (1, 2, 4, 8, 16)
    # Blocks of the longest length scored, from the start of the validation split; every length scores
    # the same tokens, so the curves differ only by the context each token gets.
    extrapolation_blocks: int = 4
    extrapolation_batch_size: int = 4
    map_tokens: int = 64  # attention maps are drawn on the first this-many validation tokens
    # Throughput and peak memory: (mode, multiple of the training length), each case in a fresh process and
    # with batch_size / multiple sequences, so every case processes as many tokens; the longer case shows how
    # memory grows with length.
    bench_cases: tuple[tuple[str, int], ...] = (("train", 1), ("train", 8))
    bench_repeats: int = 5
    bench_warmup: int = 1

    def __post_init__(self) -> None:
        multiples = self.extrapolation_multiples
        require(
            len(multiples) > 0 and all(is_int(m) and m >= 1 for m in multiples) and 1 in multiples,
            "extrapolation_multiples",
            multiples,
            "must be integers >= 1 that include 1 (the training length)",
        )
        for name in ("extrapolation_blocks", "extrapolation_batch_size", "map_tokens", "bench_repeats"):
            value = getattr(self, name)
            require(is_int(value) and value >= 1, name, value, "must be an integer >= 1")
        require(is_int(self.bench_warmup) and self.bench_warmup >= 0, "bench_warmup", self.bench_warmup, "must be >= 0")
        for case in self.bench_cases:
            require(
                len(case) == 2 and case[0] in BENCH_MODES and is_int(case[1]) and case[1] >= 1,
                "bench_cases",
                self.bench_cases,
                f"must be (mode, multiple) pairs with mode in {list(BENCH_MODES)} and multiple >= 1",
            )


@dataclass(frozen=True)
class TaskSpec:
    """A synthetic task, trained from scratch for every variant × seed on fresh batches (online data)."""

    name: str  # a key of attnzoo.evals.TASKS
    options: dict[str, Any] = field(default_factory=dict)  # fields of the task's config; the rest keep defaults
    model: dict[str, Any] = field(default_factory=lambda: {"dim": 64, "n_layers": 2, "n_heads": 2})
    steps: int = 1000
    batch_size: int = 32
    lr: float = 1e-3
    warmup_steps: int = 50
    eval_interval: int = 250
    eval_samples: int = 500  # a fixed evaluation set, the same for every variant and seed
    stop_at: float | None = None  # stop once the evaluation accuracy reaches this (Zoology's 0.99 for MQAR)
    sweep_lengths: tuple[int, ...] = ()  # passkey, needles: accuracy by context length and needle depth
    sweep_depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    sweep_samples: int = 20  # per (length, depth) cell
    probe_samples: int = 32  # needles: samples read by the attention-noise probe

    def __post_init__(self) -> None:
        require(self.name in TASKS, "task", self.name, f"choose one of {sorted(TASKS)}")
        try:
            self.config()
        except TypeError as err:  # an unknown option
            raise ValueError(f"task {self.name!r}: bad options {self.options}: {err}") from None
        _check_model_settings(self.model, f"task {self.name!r} model")
        for name in ("steps", "batch_size", "eval_interval", "eval_samples", "sweep_samples", "probe_samples"):
            value = getattr(self, name)
            require(is_int(value) and value >= 1, name, value, "must be an integer >= 1")
        require(is_int(self.warmup_steps) and self.warmup_steps >= 0, "warmup_steps", self.warmup_steps, ">= 0")
        require(self.lr > 0, "lr", self.lr, "must be > 0")
        metric, higher_is_better = task_metric(self.name)
        require(
            self.stop_at is None or (higher_is_better and 0 < self.stop_at <= 1),
            "stop_at",
            self.stop_at,
            f"must be null or an accuracy in (0, 1]; {self.name} is judged by {metric}, which cannot stop early",
        )
        require(
            not self.sweep_lengths or self.name in SWEEP_TASKS,
            "sweep_lengths",
            self.sweep_lengths,
            f"only {list(SWEEP_TASKS)} are swept by length and depth",
        )

    def config(self) -> Any:
        """The task's config dataclass (its own validation applies)."""
        return TASKS[self.name].config(**self.options)


@dataclass(frozen=True)
class CompareSpec:
    """One comparison: variants × seeds trained under one budget, then evaluated the same way.

    ``model`` holds the baseline's ModelConfig fields except those compare sets itself; each variant is the
    baseline with its attention and positions, paired as its paper does, then parameter-matched to it
    within 2%. ``train.seed`` is replaced by each run's seed: seed k fixes the initialisation and the data
    order, so every variant trained with seed k sees the same batches in the same order. The first variant
    is the baseline that differences and ratios refer to.
    """

    name: str
    description: str
    model: dict[str, Any]
    train: TrainConfig
    seeds: tuple[int, ...]
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    evals: EvalSpec = field(default_factory=EvalSpec)
    tasks: tuple[TaskSpec, ...] = ()

    def __post_init__(self) -> None:
        require(
            len(self.seeds) > 0 and all(is_int(s) and s >= 0 for s in self.seeds),
            "seeds",
            self.seeds,
            "must be one or more integers >= 0",
        )
        require(len(set(self.seeds)) == len(self.seeds), "seeds", self.seeds, "must be distinct")
        require(len(self.variants) > 0, "variants", self.variants, "must name at least one variant")
        labels = [Variant.parse(spec).label for spec in self.variants]  # a bad spec raises its own clear error
        duplicates = sorted({label for label in labels if labels.count(label) > 1})
        require(not duplicates, "variants", self.variants, f"name {duplicates} more than once")
        _check_model_settings(self.model, "model")
        names = [task.name for task in self.tasks]
        require(len(set(names)) == len(names), "tasks", names, "must name each task at most once")

    @property
    def variant_labels(self) -> list[str]:
        return [Variant.parse(spec).label for spec in self.variants]

    def baseline_config(self, vocab_size: int) -> ModelConfig:
        """The MHA + RoPE model every variant is matched to (the model's own defaults apply)."""
        return ModelConfig.from_dict({**self.model, "vocab_size": vocab_size, "max_seq_len": self.train.seq_len})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check_model_settings(model: dict[str, Any], what: str) -> None:
    clash = sorted(set(model) & set(MODEL_FIELDS_SET_BY_COMPARE))
    require(not clash, what, model, f"must not set {clash}: compare sets them per variant, data and length")
    ModelConfig.from_dict({**model, "vocab_size": 256})  # unknown or invalid fields fail here, by name


# ----------------------------------------------------------------------------------------------------- presets
#
# Every task's defaults are the CPU recipe of eval_protocols.md §8.1; the presets shrink or keep them.

_TINY_TASK_MODEL = {"dim": 32, "n_layers": 2, "n_heads": 2}
_TINY_TASK = {"model": _TINY_TASK_MODEL, "steps": 3, "batch_size": 4, "warmup_steps": 1, "eval_interval": 3}

MICRO_TASKS = {
    "passkey": TaskSpec(
        "passkey",
        {"context_len": 64, "n_digits": 2},
        **_TINY_TASK,
        eval_samples=8,
        sweep_lengths=(64, 128),
        sweep_depths=(0.0, 1.0),
        sweep_samples=2,
    ),
    "needles": TaskSpec(
        "needles",
        {"context_len": 48, "n_needles": 2, "n_queries": 1, "n_digits": 2, "n_keys": 8, "n_noise_words": 16},
        **_TINY_TASK,
        eval_samples=8,
        sweep_lengths=(48, 96),
        sweep_depths=(0.0, 1.0),
        sweep_samples=2,
        probe_samples=4,
    ),
    "mqar": TaskSpec(
        "mqar", {"vocab_size": 64, "seq_len": 16, "num_kv_pairs": 2}, **_TINY_TASK, eval_samples=8, stop_at=0.99
    ),
    "random_walk": TaskSpec(
        "random_walk", {"n_nodes": 8, "degrees": (1, 2, 4), "walk_len": 16}, **_TINY_TASK, eval_samples=8
    ),
    "composition": TaskSpec(
        "composition", {"n_facts": 2, "n_bindings": 2, "n_heldout_objects": 4}, **_TINY_TASK, eval_samples=8
    ),
}

# One layer, as the SSA reconstruction (§5.2): the task needs only the current node, so it is cheap.
QUICK_RANDOM_WALK = TaskSpec(
    "random_walk",
    {"walk_len": 32},
    model={"dim": 32, "n_layers": 1, "n_heads": 2},
    steps=150,
    batch_size=32,
    lr=3e-3,
    warmup_steps=15,
    eval_interval=50,
    eval_samples=256,
)

# eval_protocols.md §8.1 and the §9 calibration (MQAR (64, 4) reaches 0.99 in about 1,250-1,500 steps).
STANDARD_TASKS = {
    "mqar": TaskSpec(
        "mqar",
        {},
        model={"dim": 64, "n_layers": 2, "n_heads": 2},
        steps=2500,
        batch_size=64,
        lr=3e-3,
        warmup_steps=100,
        eval_interval=250,
        eval_samples=1000,
        stop_at=0.99,
    ),
    "random_walk": dataclasses.replace(QUICK_RANDOM_WALK, options={}, steps=1000, eval_interval=100, eval_samples=512),
    "passkey": TaskSpec(
        "passkey",
        {},
        model={"dim": 128, "n_layers": 2, "n_heads": 4},
        steps=2000,
        batch_size=32,
        lr=1e-3,
        warmup_steps=100,
        eval_interval=250,
        eval_samples=200,
        stop_at=0.99,
        sweep_lengths=(128, 256, 512, 1024),
        sweep_samples=20,
    ),
}
FULL_TASKS = {
    **STANDARD_TASKS,
    "mqar": dataclasses.replace(STANDARD_TASKS["mqar"], steps=3000),
    "passkey": dataclasses.replace(
        STANDARD_TASKS["passkey"], steps=3000, sweep_lengths=(128, 256, 512, 1024, 2048), sweep_samples=20
    ),
    "needles": TaskSpec(
        "needles",
        {},
        model={"dim": 128, "n_layers": 4, "n_heads": 4},
        steps=4000,
        batch_size=32,
        lr=1e-3,
        warmup_steps=200,
        eval_interval=250,
        eval_samples=200,
        stop_at=0.99,
        sweep_lengths=(256, 512, 1024),
        sweep_samples=50,
        probe_samples=50,
    ),
    "composition": TaskSpec(
        "composition",
        {},
        model={"dim": 128, "n_layers": 4, "n_heads": 4},
        steps=4000,
        batch_size=32,
        lr=1e-3,
        warmup_steps=200,
        eval_interval=250,
        eval_samples=500,
    ),
}

_TRAIN_DEFAULTS = {"lr": 2e-3, "keep_checkpoints": 1}

PRESETS: dict[str, CompareSpec] = {
    "micro": CompareSpec(
        name="micro",
        description="a smoke test in seconds: a 35k-parameter model, 6 steps, every task for 3 steps",
        model={"dim": 32, "n_layers": 2, "n_heads": 2},
        train=TrainConfig(
            seq_len=32,
            batch_size=8,
            steps=6,
            warmup_steps=2,
            eval_interval=3,
            eval_windows=8,
            log_interval=1,
            checkpoint_interval=3,
            keep_checkpoints=2,
        ),
        seeds=(0, 1),
        evals=EvalSpec(
            extrapolation_multiples=(1, 2, 4),
            extrapolation_blocks=2,
            map_tokens=16,
            bench_cases=(("train", 1),),
            bench_repeats=2,
            bench_warmup=0,
        ),
        tasks=tuple(MICRO_TASKS.values()),
    ),
    "quick": CompareSpec(
        name="quick",
        description=(
            "about 5-8 minutes on 2 CPU cores: the 0.84M-parameter default model, 2 seeds × 250 steps × 16 × 64 "
            "tokens per variant, extrapolation to 16×, throughput, attention maps and the random-walk task"
        ),
        model={"dim": 128, "n_layers": 4, "n_heads": 4},
        train=TrainConfig(
            seq_len=64,
            batch_size=16,
            steps=250,
            warmup_steps=25,
            eval_interval=50,
            eval_windows=256,
            log_interval=10,
            checkpoint_interval=50,
            **_TRAIN_DEFAULTS,
        ),
        seeds=(0, 1),
        tasks=(QUICK_RANDOM_WALK,),
    ),
    "standard": CompareSpec(
        name="standard",
        description=(
            "5-6 hours on 2 CPU cores (estimated from the quick calibration): 3 seeds × 1,500 steps × 16 × 128 "
            "tokens, longer evaluations, and MQAR, random walks and passkey retrieval trained from scratch"
        ),
        model={"dim": 128, "n_layers": 4, "n_heads": 4},
        train=TrainConfig(
            seq_len=128,
            batch_size=16,
            steps=1500,
            warmup_steps=100,
            eval_interval=100,
            eval_windows=512,
            checkpoint_interval=250,
            **_TRAIN_DEFAULTS,
        ),
        seeds=(0, 1, 2),
        evals=EvalSpec(extrapolation_blocks=8, bench_cases=(("train", 1), ("train", 8), ("prefill", 8))),
        tasks=tuple(STANDARD_TASKS.values()),
    ),
    "full": CompareSpec(
        name="full",
        description=(
            "days on 2 CPU cores (estimated; meant for a GPU): a 3.3M-parameter model, 5 seeds × 4,000 steps × "
            "32 × 128 tokens, and every task at its full CPU budget"
        ),
        model={"dim": 256, "n_layers": 4, "n_heads": 8},
        train=TrainConfig(
            seq_len=128,
            batch_size=32,
            steps=4000,
            warmup_steps=200,
            eval_interval=200,
            eval_windows=1024,
            checkpoint_interval=500,
            lr=1e-3,
            keep_checkpoints=1,
        ),
        seeds=(0, 1, 2, 3, 4),
        evals=EvalSpec(
            extrapolation_blocks=16,
            bench_cases=(("train", 1), ("train", 8), ("prefill", 16)),
            bench_repeats=7,
        ),
        tasks=tuple(FULL_TASKS.values()),
    ),
}
PRESET_TASKS: dict[str, dict[str, TaskSpec]] = {
    "micro": MICRO_TASKS,
    # Any task can be added to any preset (--tasks); those a preset does not run come at the next budget up.
    "quick": {**FULL_TASKS, **STANDARD_TASKS, "random_walk": QUICK_RANDOM_WALK},
    "standard": {**FULL_TASKS, **STANDARD_TASKS},
    "full": FULL_TASKS,
}


def resolve_spec(
    preset_or_spec: str | CompareSpec,
    *,
    variants: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    steps: int | None = None,
    corpus: str | None = None,
    tasks: Sequence[str] | None = None,
    device: str | None = None,
) -> CompareSpec:
    """A preset by name (or a spec) with the given parts replaced; every override is validated.

    ``tasks`` names the tasks to run (empty: none), at the preset's budgets for them; a custom spec has
    no task budgets to pick from, so set its ``tasks`` directly.
    """
    if isinstance(preset_or_spec, str):
        if preset_or_spec not in PRESETS:
            raise ValueError(f"preset {preset_or_spec!r} is unknown; choose one of {list(PRESETS)}")
        spec = PRESETS[preset_or_spec]
    elif isinstance(preset_or_spec, CompareSpec):
        spec = preset_or_spec
    else:
        raise TypeError(f"expected a preset name or a CompareSpec, got {type(preset_or_spec).__name__}")
    changes: dict[str, Any] = {}
    if variants is not None:
        changes["variants"] = tuple(variants)
    if seeds is not None:
        changes["seeds"] = tuple(seeds)
    train_changes: dict[str, Any] = {}
    if steps is not None:
        train_changes["steps"] = steps
    if corpus is not None:
        train_changes["data"] = dataclasses.replace(spec.train.data, corpus=corpus)
    if device is not None:
        train_changes["device"] = device
    if train_changes:
        changes["train"] = dataclasses.replace(spec.train, **train_changes)
    if tasks is not None:
        budgets = PRESET_TASKS.get(spec.name, {task.name: task for task in spec.tasks})
        unknown = sorted(set(tasks) - set(budgets))
        if unknown:
            raise ValueError(f"task(s) {unknown} have no budget in preset {spec.name!r}; choose from {sorted(budgets)}")
        changes["tasks"] = tuple(budgets[name] for name in tasks)
    return dataclasses.replace(spec, **changes) if changes else spec
