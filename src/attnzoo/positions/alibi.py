"""ALiBi: attention with linear biases (Press, Smith & Lewis, ICLR 2022)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnzoo.positions.base import POSITIONS, PositionalEncoding


def alibi_slopes(n_heads: int) -> list[float]:
    """Head slopes exactly as the official implementation orders them.

    For a power of two n the slopes are 2^(-8k/n), k = 1..n. Otherwise the n' = 2^floor(log2 n) slopes
    of n' come first, followed by every other slope of 2n', so the list is not sorted: n = 6 gives
    [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125].
    """

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n_heads).is_integer():
        return power_of_two(n_heads)
    closest = 2 ** math.floor(math.log2(n_heads))
    return power_of_two(closest) + alibi_slopes(2 * closest)[0::2][: n_heads - closest]


@POSITIONS.register("alibi")
class ALiBi(PositionalEncoding):
    """Adds −m_h·(i − j) to the scaled logit of query i and key j ≤ i (Press et al., 2022, Eq. in §3).

    In a bidirectional model (``causal`` false) the bias is symmetric, −m_h·|i − j|: a key d positions ahead
    is penalised as one d positions behind. The two agree on every entry a causal query sees.
    The bias is relative, built from absolute query positions, so cached decoding sees exactly the rows
    of the full forward. It has no length limit.
    """

    adds_bias = True
    kernels = ("alibi-flash",)  # on the CPU, SDPA's calls with the bias added inside the tiles (no T×T tensor)

    def bias(
        self,
        n_heads: int,
        q_positions: Tensor,
        k_positions: Tensor,
        causal: bool = True,
        dtype: torch.dtype = torch.float32,
    ) -> Tensor:
        slopes = torch.tensor(alibi_slopes(n_heads), dtype=dtype, device=q_positions.device)
        distance = (q_positions[:, None] - k_positions[None, :]).to(dtype)
        if not causal:
            distance = distance.abs()
        return -slopes[:, None, None] * distance

    def bias_slopes(self, n_heads: int) -> list[float]:
        return alibi_slopes(n_heads)
