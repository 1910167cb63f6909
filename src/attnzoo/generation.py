"""Next-token sampling: greedy, temperature, top-k and top-p (nucleus)."""

from __future__ import annotations

import torch
from torch import Tensor

from attnzoo.validation import MAX_COUNT, is_int, is_number, require


def check_sampling_args(temperature: float, top_k: int | None, top_p: float | None) -> None:
    require(
        is_number(temperature) and temperature >= 0,
        "temperature",
        temperature,
        "must be a finite number >= 0 (0 means greedy)",
    )
    require(top_k is None or (is_int(top_k) and top_k >= 1), "top_k", top_k, "must be None or an integer >= 1")
    require(top_k is None or top_k <= MAX_COUNT, "top_k", top_k, f"must be None or an integer in [1, {MAX_COUNT}]")
    require(top_p is None or (is_number(top_p) and 0 < top_p <= 1), "top_p", top_p, "must be None or in (0, 1]")


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
    # Shifted so the largest logit is 0 before scaling: a tiny temperature sends the others to -inf, never the
    # largest to inf, so the probabilities stay finite (sampling tends to argmax, as it should).
    logits = logits.float()
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature
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
