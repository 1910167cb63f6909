"""Language-model evaluation: loss, perplexity and bits per byte over non-overlapping windows."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from attnzoo.data.batches import eval_window_starts, gather_windows
from attnzoo.training.distributed import Distributed


@dataclass(frozen=True)
class EvalResult:
    loss: float  # mean cross-entropy, nats per token
    tokens: int
    bytes: int  # UTF-8 bytes of the scored tokens: what bits per byte divides by

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss)

    @property
    def bits_per_byte(self) -> float:
        """Comparable across tokenizers: total information in bits over the text's UTF-8 length."""
        return self.loss * self.tokens / (self.bytes * math.log(2))

    def to_dict(self) -> dict[str, float]:
        return {
            "loss": self.loss,
            "perplexity": self.perplexity,
            "bits_per_byte": self.bits_per_byte,
            "tokens": self.tokens,
        }


@torch.no_grad()
def evaluate(
    model: nn.Module,
    tokens: np.ndarray,
    token_bytes: np.ndarray,
    *,
    seq_len: int,
    batch_size: int,
    max_windows: int | None = None,
    env: Distributed | None = None,
    autocast: contextlib.AbstractContextManager | None = None,
) -> EvalResult:
    """Score every token of ``max_windows`` evenly spread non-overlapping windows (all of them by default).

    Each rank scores a disjoint share of the windows and the sums are all-reduced. Shares are equal, so
    every rank runs the same number of forward passes, as FSDP requires.
    """
    env = env or Distributed()
    starts = eval_window_starts(len(tokens), seq_len, max_windows)
    per_rank = len(starts) // env.world_size
    if per_rank == 0:
        raise ValueError(f"{len(starts)} evaluation window(s) cannot be shared by {env.world_size} ranks")
    starts = starts[env.rank * per_rank : (env.rank + 1) * per_rank]
    byte_lengths = torch.from_numpy(token_bytes).to(env.device)
    was_training = model.training
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=env.device)  # nats, tokens, bytes
    for i in range(0, len(starts), batch_size):
        inputs, targets = (t.to(env.device) for t in gather_windows(tokens, starts[i : i + batch_size], seq_len))
        with autocast or contextlib.nullcontext():
            logits = model(inputs)
        nats = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum")
        totals[0] += nats.double()
        totals[1] += targets.numel()
        totals[2] += byte_lengths[targets].sum()
    model.train(was_training)
    nats, count, num_bytes = env.all_reduce_sum(totals).tolist()
    return EvalResult(loss=nats / count, tokens=int(count), bytes=int(num_bytes))
