"""What every synthetic task shares: batches, seeding, a word-level vocabulary, and teacher-forced scoring.

A task's generator returns inputs and targets aligned as the model reads them: ``model(inputs, targets)``
scores the prediction at position t against ``targets[t]``, and ``targets`` is ``IGNORE_INDEX`` wherever
nothing is scored. Every answer in these tasks is a fixed token string, so exact match under greedy
decoding is decided by one teacher-forced forward pass: greedy decoding with the gold prefix diverges
exactly at the first wrong argmax (eval_protocols.md §8.1), and no generation loop is needed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

IGNORE_INDEX = -100
# The model and loop of every task's micro budget: a smoke test that trains for 3 steps.
TINY_MODEL = {"dim": 32, "n_layers": 2, "n_heads": 2}
TINY_LOOP = {"model": TINY_MODEL, "steps": 3, "batch_size": 4, "warmup_steps": 1, "eval_interval": 3, "eval_samples": 8}
# The model and loop of the full budgets of the tasks that need depth (needles, composition).
FULL_LOOP = {
    "model": {"dim": 128, "n_layers": 4, "n_heads": 4},
    "steps": 4000,
    "batch_size": 32,
    "lr": 1e-3,
    "warmup_steps": 200,
    "eval_interval": 250,
}
# The model and loop of the claims budgets: small enough for 3 seeds of every claim's task in minutes on a CPU.
CLAIMS_LOOP = {
    "model": {"dim": 64, "n_layers": 2, "n_heads": 2},
    "steps": 600,
    "batch_size": 32,
    "lr": 3e-3,
    "warmup_steps": 50,
    "eval_interval": 200,
    "eval_samples": 200,
}


@dataclass
class TaskBatch:
    inputs: Tensor  # (B, T) token ids; a task with its own model (Task.build_model): its features
    targets: Tensor  # (B, T) the token each position must predict, IGNORE_INDEX where unscored; or that model's


def as_generator(seed: int | torch.Generator) -> torch.Generator:
    """A CPU generator: a fresh one from an int seed, or the caller's own, which advances (online data)."""
    if isinstance(seed, torch.Generator):
        return seed
    return torch.Generator().manual_seed(seed)


def randint(low: int, high: int, generator: torch.Generator) -> int:
    """One integer uniform in [low, high)."""
    return int(torch.randint(low, high, (), generator=generator))


def random_number(n_digits: int, generator: torch.Generator) -> list[int]:
    """Uniform decimal digits, the first nonzero so that the number has exactly ``n_digits`` digits."""
    return [randint(1, 10, generator)] + [randint(0, 10, generator) for _ in range(n_digits - 1)]


class WordVocab:
    """A closed word-level vocabulary: the i-th word has id i, and text is split on whitespace."""

    def __init__(self, words: Sequence[str]):
        self.words = list(words)
        self.ids = {word: i for i, word in enumerate(self.words)}
        if len(self.ids) != len(self.words):
            raise ValueError("a vocabulary cannot list a word twice")

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, text: str) -> list[int]:
        return [self.ids[word] for word in text.split()]

    def decode(self, ids: Sequence[int] | Tensor) -> str:
        return " ".join(self.words[int(i)] for i in ids)


def unique_words(*texts: str) -> list[str]:
    """The words of ``texts`` in order of first appearance, each once."""
    return list(dict.fromkeys(word for text in texts for word in text.split()))


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


@contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) and no autograd for the duration; the caller's training mode is restored."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def greedy_predictions(model: nn.Module, inputs: Tensor, batch_size: int = 32) -> Tensor:
    """The argmax next-token prediction at every position, (B, T), on the inputs' device."""
    device = model_device(model)
    with evaluating(model):
        chunks = [model(chunk.to(device)).argmax(-1).to(inputs.device) for chunk in inputs.split(batch_size)]
    return torch.cat(chunks)


def summed_loss(model: nn.Module, inputs: Tensor, targets: Tensor, batch_size: int = 32) -> tuple[float, int]:
    """Total cross-entropy in nats over the scored targets, and how many there are."""
    device = model_device(model)
    total, count = 0.0, 0
    with evaluating(model):
        for x, y in zip(inputs.split(batch_size), targets.split(batch_size), strict=True):
            y = y.to(device)
            logits = model(x.to(device))
            loss = F.cross_entropy(
                logits.float().flatten(0, 1), y.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
            )
            total += loss.item()
            count += int((y != IGNORE_INDEX).sum())
    return total, count


def scored_accuracy(predictions: Tensor, targets: Tensor) -> float:
    """Fraction of scored positions predicted right; every MQAR query, passkey digit, ... counts once."""
    scored = targets != IGNORE_INDEX
    if not scored.any():
        raise ValueError("targets score no position (all are IGNORE_INDEX)")
    return (predictions[scored] == targets[scored]).float().mean().item()


def exact_match(predictions: Tensor, targets: Tensor) -> Tensor:
    """(B,) bool: every scored position of the sequence predicted right, i.e. greedy decoding reproduces it."""
    return ((predictions == targets) | (targets == IGNORE_INDEX)).all(dim=1)


@dataclass
class SweepCell:
    context_len: int
    depth: float
    accuracy: float | None  # None where the model cannot run this length
    token_accuracy: float | None


@dataclass
class LengthDepthSweep:
    """Retrieval accuracy by (context length, needle depth); lengths the model refuses are N/A with the reason."""

    cells: list[SweepCell]
    unavailable: dict[int, str] = field(default_factory=dict)

    def accuracy_by_length(self) -> dict[int, float | None]:
        """Mean over depths; every cell holds the same number of samples, so this is the length's accuracy."""
        by_length: dict[int, list[float | None]] = {}
        for cell in self.cells:
            by_length.setdefault(cell.context_len, []).append(cell.accuracy)
        return {length: _mean_or_none(accs) for length, accs in by_length.items()}

    def largest_length(self, threshold: float = 0.9) -> int | None:
        return largest_passing_length(self.accuracy_by_length(), threshold)


def _mean_or_none(values: list[float | None]) -> float | None:
    if not values or any(v is None for v in values):
        return None
    return sum(values) / len(values)  # type: ignore[arg-type]


def largest_passing_length(accuracy_by_length: Mapping[int, float | None], threshold: float = 0.9) -> int | None:
    """The largest length L such that every evaluated length up to L reaches ``threshold`` (PI's k_max rule).

    A length that fails, or that the model cannot run (None), ends the run, so one lucky long length does
    not count. None when even the shortest length fails.
    """
    largest = None
    for length in sorted(accuracy_by_length):
        accuracy = accuracy_by_length[length]
        if accuracy is None or accuracy < threshold:
            break
        largest = length
    return largest


def length_depth_sweep(
    model: nn.Module,
    cfg: Any,
    make_batch: Callable[[Any, int, int | torch.Generator], TaskBatch],
    score: Callable[[Tensor, Any], tuple[float, float]],
    *,
    lengths: Sequence[int],
    depths: Sequence[float],
    samples_per_cell: int,
    seed: int = 0,
    batch_size: int = 32,
) -> LengthDepthSweep:
    """Score ``cfg`` (a dataclass with ``context_len`` and ``depth``) at every (length, depth).

    Every cell draws its samples from the same seed, so cells differ only in length and depth. A
    ``ValueError`` from the model (e.g. learned positions past ``max_seq_len``) marks the length N/A;
    one from building the batch is the caller's error and propagates.
    """
    sweep = LengthDepthSweep(cells=[])
    for length in lengths:
        for depth in depths:
            accuracy = token_accuracy = None
            if length not in sweep.unavailable:
                batch = make_batch(dataclasses.replace(cfg, context_len=length, depth=depth), samples_per_cell, seed)
                try:
                    predictions = greedy_predictions(model, batch.inputs, batch_size)
                except ValueError as err:
                    sweep.unavailable[length] = str(err)
                else:
                    accuracy, token_accuracy = score(predictions, batch)
            sweep.cells.append(SweepCell(length, depth, accuracy, token_accuracy))
    return sweep
