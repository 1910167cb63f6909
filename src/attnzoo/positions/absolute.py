"""Positions added to the token embeddings: none, learned (GPT-2), and sinusoidal (Vaswani et al., 2017)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnzoo.positions.base import POSITIONS, PositionalEncoding
from attnzoo.validation import require


@POSITIONS.register("none")
class NoPositions(PositionalEncoding):
    """No positional information beyond what the causal mask implies (NoPE)."""


@POSITIONS.register("learned")
class LearnedPositions(PositionalEncoding):
    """A trained embedding per absolute position, as in GPT-2. It cannot serve positions past ``max_seq_len``."""

    def __init__(self, cfg, qk_head_dim):
        super().__init__(cfg, qk_head_dim)
        self.embedding = nn.Embedding(cfg.max_seq_len, cfg.dim)

    def check_length(self, end: int) -> None:
        if end > self.embedding.num_embeddings:
            raise ValueError(
                f"sequence length {end} exceeds max_seq_len={self.embedding.num_embeddings}: learned absolute "
                "positions have no embedding past it. Use a shorter input, a larger max_seq_len, or a scheme "
                "that extrapolates (rope, alibi, sinusoidal, none)."
            )

    def embed(self, positions: Tensor) -> Tensor:
        return self.embedding(positions)


@POSITIONS.register("sinusoidal")
class SinusoidalPositions(PositionalEncoding):
    """PE(n, 2i) = a·sin(n / 10000^(2i/dim)), PE(n, 2i+1) = a·cos(n / 10000^(2i/dim)) (Vaswani et al., 2017, §3.5).

    The amplitude a = √2·init_std gives the table an RMS of exactly init_std per element (sin² + cos² = 1 over a
    pair), the scale of the token embeddings and of learned positions at initialisation. Vaswani et al. keep the
    two of one order by multiplying the token embeddings by √d_model (§3.4), and so does fairseq, the ALiBi paper's
    code: with ``scale_embeddings`` the model does that and the table has a = 1. The unit table next to attnzoo's
    unscaled N(0, 0.02) embeddings would be 35 times larger and drown them, and such a model does not learn beyond
    the unigram loss. Computed in fp32 for any position, so it has no length limit.
    """

    def __init__(self, cfg, qk_head_dim):
        super().__init__(cfg, qk_head_dim)
        exponent = torch.arange(0, cfg.dim, 2, dtype=torch.float32) / cfg.dim
        self.register_buffer("inv_freq", torch.exp(-math.log(10000.0) * exponent), persistent=False)
        self.amplitude = 1.0 if cfg.scale_embeddings else math.sqrt(2) * cfg.init_std

    @classmethod
    def validate_config(cls, cfg, qk_head_dim):
        require(cfg.dim % 2 == 0, "dim", cfg.dim, "must be even for sinusoidal positions (sin/cos pairs)")

    def embed(self, positions: Tensor) -> Tensor:
        angles = positions.float()[:, None] * self.inv_freq[None, :]
        return self.amplitude * torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)
