"""The positional-scheme interface.

A scheme may act at three places, and each hook defaults to "does nothing":

* ``embed``: a (T, dim) tensor added to the token embeddings (learned, sinusoidal);
* ``rotate``: a rotation of queries and keys inside attention (RoPE);
* ``bias``: an additive (H, T, S) bias on the scaled attention logits (ALiBi).

``prepare`` runs once per model forward, so per-position tables are built once and shared by layers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from attnzoo.registry import NoOptions, Registry

if TYPE_CHECKING:
    from attnzoo.config import ModelConfig

POSITIONS: Registry[type[PositionalEncoding]] = Registry("positional scheme", "position", "attnzoo.positions")


class PositionalEncoding(nn.Module):
    Options: type = NoOptions
    registry_name: str
    adds_bias: bool = False  # whether ``bias`` returns a tensor: kernels choose their path without building one
    rotates: bool = False  # whether ``rotate`` turns queries and keys by their positions (RoPE)
    # The kernels (``attention.kernels.KERNELS`` names) the scheme brings: each is tried just before the kernel it
    # specialises (``Kernel.specialises``), wherever a layer's chain holds that one.
    kernels: tuple[str, ...] = ()

    def __init__(self, cfg: ModelConfig, qk_head_dim: int):
        super().__init__()
        self.options = cfg.position_opts

    @classmethod
    def validate_config(cls, cfg: ModelConfig, qk_head_dim: int) -> None:
        """Refuse configurations the scheme cannot serve; ``qk_head_dim`` is the size attention rotates."""

    def check_length(self, end: int) -> None:
        """Raise ``ValueError`` if positions ``0 .. end-1`` are beyond what the scheme can encode."""

    def embed(self, positions: Tensor) -> Tensor | None:
        return None

    def prepare(self, positions: Tensor, end: int | Tensor, dtype: torch.dtype = torch.float32) -> Any:
        """Per-forward state for ``rotate``; ``end`` is one past the last position of the sequence so far (a
        tensor on a static decoding step, which must not branch on it on the host); ``dtype`` the model's compute
        dtype (:func:`attnzoo.precision.compute_dtype`), fp32 or float64."""
        return None

    def rotate(self, x: Tensor, state: Any) -> Tensor:
        return x

    def bias(
        self,
        n_heads: int,
        q_positions: Tensor,
        k_positions: Tensor,
        causal: bool = True,
        dtype: torch.dtype = torch.float32,
    ) -> Tensor | None:
        """The (n_heads, T, S) additive bias in ``dtype`` (the model's compute dtype), or None; ``causal`` false
        for a bidirectional model."""
        return None

    def bias_slopes(self, n_heads: int) -> list[float] | None:
        """The slopes m_h when ``bias`` is m_h·(j − i) for query i and key j ≤ i (a causal linear bias), else None:
        a kernel can then add the bias as it computes each score instead of reading an (n_heads, T, S) tensor."""
        return None
