"""Multi-query associative recall (MQAR), as in Zoology (Arora et al., 2023).

Protocol: HazyResearch/zoology ``zoology/data/multiquery_ar.py`` and ``train.py::compute_metrics`` at
d88d6f5; eval_protocols.md §3. K key-value pairs open the sequence, keys drawn without replacement from
[1, V/2) and values from [V/2, V); each key is queried once later, at slot gaps drawn without replacement
with p(i) ∝ a·i^(a-1), which favours short key-to-query distances. The query position predicts the value::

    inputs   k1 v1 k2 v2 … kK vK  · · k2 · · · k1 · ·
    targets   -  -  -  -      -   - - v2 - - - v1 - -

Non-query slots are 0 or, with ``random_non_queries`` (Zoology's default), uniform tokens of the whole
vocabulary. Train on fresh batches every step: a fixed training set is memorised at our sizes (§9).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnzoo.evals.base import IGNORE_INDEX, TINY_LOOP, TaskBatch, as_generator, greedy_predictions, scored_accuracy
from attnzoo.evals.task import Task, TaskBudget, register_task
from attnzoo.validation import require


@dataclass(frozen=True)
class MQARConfig:
    vocab_size: int = 256
    seq_len: int = 64  # L, the tokens the model reads
    num_kv_pairs: int = 4  # K
    power_a: float = 0.01
    random_non_queries: bool = True

    def __post_init__(self) -> None:
        require(self.seq_len % 2 == 0, "seq_len", self.seq_len, "must be even (queries sit on even slots)")
        require(self.vocab_size > self.seq_len, "vocab_size", self.vocab_size, f"must be > seq_len={self.seq_len}")
        require(self.num_kv_pairs >= 1, "num_kv_pairs", self.num_kv_pairs, "must be >= 1")
        require(
            4 * self.num_kv_pairs <= self.seq_len,
            "num_kv_pairs",
            self.num_kv_pairs,
            f"must be <= seq_len / 4 = {self.seq_len // 4} (K pairs, then K query slots among the rest)",
        )
        require(0 < self.power_a <= 1, "power_a", self.power_a, "must be in (0, 1]")


def vocab_size(cfg: MQARConfig) -> int:
    return cfg.vocab_size


def _sample_without_replacement(n: int, k: int, batch_size: int, generator: torch.Generator) -> Tensor:
    """(batch_size, k) distinct draws from range(n), uniformly, in random order."""
    return torch.rand(batch_size, n, generator=generator).argsort(dim=1)[:, :k]


def mqar_batch(cfg: MQARConfig, batch_size: int, seed: int | torch.Generator) -> TaskBatch:
    generator = as_generator(seed)
    K, L, half = cfg.num_kv_pairs, cfg.seq_len, cfg.vocab_size // 2
    keys = _sample_without_replacement(half - 1, K, batch_size, generator) + 1
    values = _sample_without_replacement(cfg.vocab_size - half, K, batch_size, generator) + half

    n_slots = (L - 2 * K) // 2
    slot_weights = cfg.power_a * torch.arange(1, n_slots + 1, dtype=torch.float64) ** (cfg.power_a - 1)
    gaps = torch.multinomial(slot_weights.expand(batch_size, -1), K, replacement=False, generator=generator)
    query_positions = 2 * K + 2 * gaps

    inputs = torch.zeros(batch_size, L, dtype=torch.long)
    inputs[:, 0 : 2 * K : 2], inputs[:, 1 : 2 * K : 2] = keys, values
    inputs.scatter_(1, query_positions, keys)
    targets = torch.full_like(inputs, IGNORE_INDEX).scatter_(1, query_positions, values)
    if cfg.random_non_queries:
        # Keys are never 0, so 0 marks exactly the filler slots.
        filler = inputs == 0
        inputs[filler] = torch.randint(cfg.vocab_size, inputs.shape, generator=generator)[filler]
    return TaskBatch(inputs=inputs, targets=targets)


def evaluate_mqar(
    model: nn.Module, cfg: MQARConfig, n_samples: int = 1000, seed: int = 0, batch_size: int = 64
) -> dict[str, float]:
    """Accuracy over queries; every example has K queries, so this is also Zoology's per-example mean."""
    batch = mqar_batch(cfg, n_samples, seed)
    return {"accuracy": scored_accuracy(greedy_predictions(model, batch.inputs, batch_size), batch.targets)}


def steps_to_threshold(history: Sequence[tuple[int, float]], threshold: float = 0.99) -> int | None:
    """The first step whose accuracy reaches ``threshold``, from (step, accuracy) pairs; None if none does.

    Report it next to the final accuracy: attention learns MQAR through a sudden phase transition whose
    step varies by variant and seed (eval_protocols.md §3.5).
    """
    for step, accuracy in sorted(history):
        if accuracy >= threshold:
            return step
    return None


# The §9 calibration: MQAR (64, 4) reaches 0.99 in about 1,250-1,500 steps on 2 CPU cores.
_STANDARD = TaskBudget(
    model={"dim": 64, "n_layers": 2, "n_heads": 2},
    steps=2500,
    batch_size=64,
    lr=3e-3,
    warmup_steps=100,
    eval_interval=250,
    eval_samples=1000,
    stop_at=0.99,
)
register_task(
    Task(
        name="mqar",
        config=MQARConfig,
        make_batch=mqar_batch,
        evaluate=evaluate_mqar,
        vocab_size=vocab_size,
        measures="associative recall: the value bound to each of K keys, queried later in the sequence",
        paper="Zoology (Arora et al., 2023)",
        chance=lambda cfg: 2 / cfg.vocab_size,  # values are drawn from the upper half of the vocabulary
        solved=1.0,
        shortcut=lambda cfg: 1 / cfg.num_kv_pairs,  # one of the K values in context: the 1/K plateau (§3.5)
        budgets={
            "micro": TaskBudget(
                options={"vocab_size": 64, "seq_len": 16, "num_kv_pairs": 2}, **TINY_LOOP, stop_at=0.99
            ),
            "standard": _STANDARD,
            "full": dataclasses.replace(_STANDARD, steps=3000),
        },
    )
)
