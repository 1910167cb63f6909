"""What a comparison trains and measures: typed, validated specs.

A :class:`CompareSpec` fixes everything that must be equal across variants for the comparison to be fair:
the baseline model (every variant is parameter-matched to it), the training budget and data, the seeds,
and the evaluations. The variants are the only thing that differs. A :class:`LadderSpec` is the same comparison
at several sizes. The named ones are data in :mod:`attnzoo.compare.presets`; :mod:`attnzoo.compare.resolve`
gives one with parts replaced."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from attnzoo.config import ModelConfig
from attnzoo.evals.spec import EvalSpec
from attnzoo.evals.task import TaskSpec, check_model_settings
from attnzoo.training.config import TrainConfig
from attnzoo.validation import is_int, require
from attnzoo.variants import Variant

DEFAULT_VARIANTS = ("mha+rope", "mha+alibi", "diff+rope", "selective+rope", "dcmha+rope")


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
    variants: tuple[Variant, ...] = DEFAULT_VARIANTS  # labels ("mha+rope") are parsed here, once
    evals: EvalSpec = field(default_factory=EvalSpec)
    tasks: tuple[TaskSpec, ...] = ()
    # The synthetic tasks' seeds; None: the same as ``seeds``. A task run costs seconds to a minute on a CPU, so
    # a preset can afford more seeds for its tasks than for its language models.
    task_seeds: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        require(
            len(self.seeds) > 0 and all(is_int(s) and s >= 0 for s in self.seeds),
            "seeds",
            self.seeds,
            "must be one or more integers >= 0",
        )
        require(len(set(self.seeds)) == len(self.seeds), "seeds", self.seeds, "must be distinct")
        if self.task_seeds is not None:
            require(
                len(self.task_seeds) > 0
                and all(is_int(s) and s >= 0 for s in self.task_seeds)
                and len(set(self.task_seeds)) == len(self.task_seeds),
                "task_seeds",
                self.task_seeds,
                "must be one or more distinct integers >= 0, or None for the same as seeds",
            )
        object.__setattr__(self, "variants", Variant.parse_all(self.variants))  # a bad label raises its own error
        labels = self.variant_labels
        require(len(labels) > 0, "variants", labels, "must name at least one variant")
        duplicates = sorted({label for label in labels if labels.count(label) > 1})
        require(not duplicates, "variants", labels, f"name {duplicates} more than once")
        for i, variant in enumerate(self.variants):
            require(
                variant.uptrain is None or variant.source.label in labels[:i],
                "variants",
                labels,
                f"uptrain {variant.label} from {variant.source.label}, which must be compared too and listed before it",
            )
            require(
                self.train.batch_size % variant.length == 0,
                "train.batch_size",
                self.train.batch_size,
                f"must be a multiple of {variant.length}: {variant.label} trains on sequences {variant.length}× as "
                f"long, {variant.length}× fewer a step",
            )
        check_model_settings(self.model, "model")
        names = [task.name for task in self.tasks]
        require(len(set(names)) == len(names), "tasks", names, "must name each task at most once")

    @property
    def task_seed_list(self) -> tuple[int, ...]:
        return self.task_seeds if self.task_seeds is not None else self.seeds

    def task_variants(self, task: TaskSpec) -> tuple[Variant, ...]:
        """The variants that train ``task``, the first its baseline: the task's own (which need not train the
        language model, e.g. a mechanism's ablation that only the task measures, or an attention-only model with
        no positions), or every variant."""
        return tuple(dict.fromkeys(task.variants)) or self.variants

    @property
    def variant_labels(self) -> list[str]:
        return [variant.label for variant in self.variants]

    def train_for(self, variant: Variant) -> TrainConfig:
        """The comparison's training as ``variant`` runs it: on sequences ``variant.length`` times as long, that
        many times fewer a step, so every variant trains on the same tokens; at ``variant.lr`` times the peak
        learning rate (the floor follows, its ratio to the peak kept)."""
        return dataclasses.replace(
            self.train,
            seq_len=self.train.seq_len * variant.length,
            batch_size=self.train.batch_size // variant.length,
            lr=self.train.lr * variant.lr,
        )

    def baseline_config(self, vocab_size: int) -> ModelConfig:
        """The MHA + RoPE model every variant is matched to (the model's own defaults apply)."""
        return ModelConfig.from_dict({**self.model, "vocab_size": vocab_size, "max_seq_len": self.train.seq_len})

    def to_dict(self) -> dict[str, Any]:
        """The spec as a config file writes it: variants by their labels."""
        data = dataclasses.asdict(self)
        data["variants"] = self.variant_labels
        for task, written in zip(self.tasks, data["tasks"], strict=True):
            written["variants"] = [variant.label for variant in task.variants]
        return data


@dataclass(frozen=True)
class LadderSpec:
    """Comparisons of the same variants at several model sizes under one protocol (the same corpus, sequence
    length, learning rate and schedule shape; tokens in proportion to parameters), each a rung written to its own
    directory, judged together (:class:`attnzoo.results.ladder.Ladder`)."""

    name: str
    description: str
    rungs: tuple[CompareSpec, ...]

    def __post_init__(self) -> None:
        names = [rung.name for rung in self.rungs]
        require(len(self.rungs) >= 2, "rungs", names, "must be at least two sizes")
        require(len(set(names)) == len(names), "rungs", names, "must have distinct names (their directories)")
