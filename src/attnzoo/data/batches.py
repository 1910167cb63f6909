"""Training batches as a pure function of (seed, step), and the fixed windows of evaluation.

The global batch of step k is drawn by a generator seeded with (seed, k) alone. Nothing carries over from
one step to the next, so resuming at step k needs only k, and every data-parallel rank computes the same
global batch and takes its own disjoint slice of it.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def window_starts(num_tokens: int, seq_len: int, batch_size: int, seed: int, step: int) -> np.ndarray:
    """Start offsets of the ``batch_size`` training windows of ``step``: uniform over the split."""
    if num_tokens < seq_len + 1:
        raise ValueError(f"{num_tokens} tokens cannot fill one window of seq_len + 1 = {seq_len + 1} tokens")
    return np.random.default_rng((seed, step)).integers(0, num_tokens - seq_len, size=batch_size)


def eval_window_starts(num_tokens: int, seq_len: int, max_windows: int | None = None) -> np.ndarray:
    """Non-overlapping windows over the split; at most ``max_windows`` of them, spread evenly across it."""
    available = (num_tokens - 1) // seq_len
    if available < 1:
        raise ValueError(f"{num_tokens} tokens cannot fill one window of seq_len + 1 = {seq_len + 1} tokens")
    count = available if max_windows is None else min(max_windows, available)
    return (np.arange(count) * available // count) * seq_len


def gather_windows(tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> tuple[Tensor, Tensor]:
    """Inputs and next-token targets, each (len(starts), seq_len) int64."""
    windows = torch.from_numpy(tokens[starts[:, None] + np.arange(seq_len + 1)].astype(np.int64))
    return windows[:, :-1], windows[:, 1:]


class BatchSchedule:
    """This rank's micro-batches of every step for a global batch of ``batch_size`` sequences.

    The global batch is cut into ``world_size`` contiguous rank slices and each slice into ``grad_accum``
    micro-batches, so one process with ``grad_accum = a·w`` sees exactly the sequences that ``w`` ranks
    with ``grad_accum = a`` see together.
    """

    def __init__(
        self,
        tokens: np.ndarray,
        *,
        seq_len: int,
        batch_size: int,
        grad_accum: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
    ):
        if batch_size % (grad_accum * world_size):
            raise ValueError(
                f"batch_size={batch_size} is invalid: must be a multiple of grad_accum × world_size = "
                f"{grad_accum} × {world_size}, so every rank and micro-step gets the same number of sequences"
            )
        self.tokens, self.seq_len, self.batch_size, self.seed = tokens, seq_len, batch_size, seed
        self.grad_accum, self.rank, self.world_size = grad_accum, rank, world_size
        self.micro_batch_size = batch_size // (grad_accum * world_size)

    def global_starts(self, step: int) -> np.ndarray:
        return window_starts(len(self.tokens), self.seq_len, self.batch_size, self.seed, step)

    def micro_batches(self, step: int) -> list[tuple[Tensor, Tensor]]:
        per_rank = self.batch_size // self.world_size
        starts = self.global_starts(step)[self.rank * per_rank : (self.rank + 1) * per_rank]
        return [gather_windows(self.tokens, chunk, self.seq_len) for chunk in np.split(starts, self.grad_accum)]
