"""Evaluation tasks and metrics: pure, seeded, torch-only building blocks for ``attnzoo eval`` and ``compare``.

Each synthetic task is one module: a config dataclass, a generator ``make_batch(cfg, batch_size,
seed_or_generator)`` that returns inputs and targets (``IGNORE_INDEX`` where unscored) plus metadata, an
evaluator ``evaluate(model, cfg, n_samples, seed, batch_size) -> {metric: value}``, and at its end one
:func:`~attnzoo.evals.task.register_task` call that declares the task as a record (:class:`Task`: its metric,
direction, sweep, probe, report columns and budgets). Pass an int seed for a fixed evaluation set, or one
``torch.Generator`` for fresh batches every training step. The language-model metrics (``lm``) read a token
stream instead and are not a registered task; the selective-attention paper's ``denoising`` and ``graph`` tasks
train their own attention-only models (``Task.build_model``, one layer from ``single_layer``). Protocols:
``eval_protocols.md``, cited per module.
"""

from __future__ import annotations

from attnzoo.evals import (  # noqa: F401  (each registers its task)
    composition,
    denoising,
    graph,
    mqar,
    needles,
    passkey,
    random_walk,
)
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
from attnzoo.evals.denoising import DenoisingBatch, DenoisingConfig, bayes_optimal, denoising_batch, evaluate_denoising
from attnzoo.evals.graph import GraphConfig, clique_graph, evaluate_graph, graph_batch
from attnzoo.evals.lm import ExtrapolationPoint, LMEvalConfig, LMScore, evaluate_lm, length_extrapolation
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
    noise_probe,
)
from attnzoo.evals.passkey import PasskeyBatch, PasskeyConfig, evaluate_passkey, passkey_batch, passkey_sweep
from attnzoo.evals.random_walk import (
    RandomWalkConfig,
    entropy_floor,
    evaluate_random_walk,
    make_graph,
    random_walk_batch,
)
from attnzoo.evals.task import SCALES, TASKS, Task, TaskBudget, TaskSpec, get_task, register_task

__all__ = [
    "IGNORE_INDEX",
    "SCALES",
    "TASKS",
    "AttentionShares",
    "CompositionConfig",
    "DenoisingBatch",
    "DenoisingConfig",
    "ExtrapolationPoint",
    "GraphConfig",
    "LMEvalConfig",
    "LMScore",
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
    "TaskBudget",
    "TaskSpec",
    "WordVocab",
    "attention_noise_probe",
    "attention_shares",
    "bayes_optimal",
    "clique_graph",
    "composition_batch",
    "denoising_batch",
    "entropy_floor",
    "evaluate_composition",
    "evaluate_denoising",
    "evaluate_graph",
    "evaluate_lm",
    "evaluate_mqar",
    "evaluate_needles",
    "evaluate_passkey",
    "evaluate_random_walk",
    "exact_match",
    "get_task",
    "graph_batch",
    "greedy_predictions",
    "largest_passing_length",
    "length_extrapolation",
    "make_graph",
    "mqar_batch",
    "needles_batch",
    "needles_sweep",
    "noise_probe",
    "passkey_batch",
    "passkey_sweep",
    "random_walk_batch",
    "register_task",
    "scored_accuracy",
    "steps_to_threshold",
]
