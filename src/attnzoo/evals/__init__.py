"""Evaluation tasks and metrics: pure, seeded, torch-only building blocks for ``attnzoo eval`` and ``compare``.

Each synthetic task has a config dataclass, a generator ``make_batch(cfg, batch_size, seed_or_generator)``
that returns inputs and targets (``IGNORE_INDEX`` where unscored) plus metadata, and an evaluator
``evaluate(model, cfg, n_samples, seed, batch_size) -> {metric: value}``. Pass an int seed for a fixed
evaluation set, or one ``torch.Generator`` for fresh batches every training step. ``TASKS`` maps the task
names to these. The language-model metrics (``lm``) read a token stream instead, and the denoising task
(``ssa_tasks``) feeds vectors rather than tokens to its own small model, so neither is in ``TASKS``.
Protocols: ``eval_protocols.md``, cited per module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from attnzoo.evals import composition, mqar, needles, passkey, ssa_tasks
from attnzoo.evals.base import (
    IGNORE_INDEX,
    LengthDepthSweep,
    SweepCell,
    TaskBatch,
    WordVocab,
    exact_match,
    greedy_predictions,
    largest_passing_length,
    scored_accuracy,
)
from attnzoo.evals.composition import CompositionConfig, composition_batch, evaluate_composition
from attnzoo.evals.lm import ExtrapolationPoint, LMEvalConfig, LMResult, evaluate_lm, length_extrapolation
from attnzoo.evals.mqar import MQARConfig, evaluate_mqar, mqar_batch, steps_to_threshold
from attnzoo.evals.needles import (
    AttentionShares,
    NeedlesBatch,
    NeedlesConfig,
    attention_noise_probe,
    attention_shares,
    evaluate_needles,
    needles_batch,
    needles_sweep,
)
from attnzoo.evals.passkey import PasskeyBatch, PasskeyConfig, evaluate_passkey, passkey_batch, passkey_sweep
from attnzoo.evals.ssa_tasks import (
    DenoisingBatch,
    DenoisingConfig,
    RandomWalkConfig,
    denoising_batch,
    denoising_risks,
    entropy_floor,
    evaluate_denoising,
    evaluate_random_walk,
    make_graph,
    random_walk_batch,
)


@dataclass(frozen=True)
class Task:
    config: type  # the task's config dataclass; its defaults are the CPU preset of eval_protocols.md §8.1
    make_batch: Callable[[Any, int, int | torch.Generator], TaskBatch]
    evaluate: Callable[..., dict[str, float]]
    vocab_size: Callable[[Any], int]  # the ModelConfig.vocab_size a model for this config needs


TASKS: dict[str, Task] = {
    "passkey": Task(PasskeyConfig, passkey_batch, evaluate_passkey, passkey.vocab_size),
    "needles": Task(NeedlesConfig, needles_batch, evaluate_needles, needles.vocab_size),
    "mqar": Task(MQARConfig, mqar_batch, evaluate_mqar, mqar.vocab_size),
    "random_walk": Task(RandomWalkConfig, random_walk_batch, evaluate_random_walk, ssa_tasks.vocab_size),
    "composition": Task(CompositionConfig, composition_batch, evaluate_composition, composition.vocab_size),
}

__all__ = [
    "IGNORE_INDEX",
    "TASKS",
    "AttentionShares",
    "CompositionConfig",
    "DenoisingBatch",
    "DenoisingConfig",
    "ExtrapolationPoint",
    "LMEvalConfig",
    "LMResult",
    "LengthDepthSweep",
    "MQARConfig",
    "NeedlesBatch",
    "NeedlesConfig",
    "PasskeyBatch",
    "PasskeyConfig",
    "RandomWalkConfig",
    "SweepCell",
    "Task",
    "TaskBatch",
    "WordVocab",
    "attention_noise_probe",
    "attention_shares",
    "composition_batch",
    "denoising_batch",
    "denoising_risks",
    "entropy_floor",
    "evaluate_composition",
    "evaluate_denoising",
    "evaluate_lm",
    "evaluate_mqar",
    "evaluate_needles",
    "evaluate_passkey",
    "evaluate_random_walk",
    "exact_match",
    "greedy_predictions",
    "largest_passing_length",
    "length_extrapolation",
    "make_graph",
    "mqar_batch",
    "needles_batch",
    "needles_sweep",
    "passkey_batch",
    "passkey_sweep",
    "random_walk_batch",
    "scored_accuracy",
    "steps_to_threshold",
]
