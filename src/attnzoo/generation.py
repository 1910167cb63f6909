"""Next-token sampling: greedy, temperature, top-k and top-p (nucleus)."""

from __future__ import annotations

import torch
from torch import Tensor


def check_sampling_args(temperature: float, top_k: int | None, top_p: float | None) -> None:
    if not temperature >= 0:
        raise ValueError(f"temperature={temperature!r} is invalid: must be >= 0 (0 means greedy)")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k={top_k!r} is invalid: must be None or an integer >= 1")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p!r} is invalid: must be None or in (0, 1]")


def sample_next_token(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """(B, vocab) logits → (B,) token ids. Temperature 0 is greedy (argmax)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth_largest = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if top_p is not None and top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p; the first always stays.
        drop_sorted = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
