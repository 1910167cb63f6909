"""Positional schemes, registered by name: none, learned, sinusoidal, rope, alibi."""

from attnzoo.positions import absolute, alibi, rope  # noqa: F401  (registers the schemes)
from attnzoo.positions.alibi import alibi_slopes
from attnzoo.positions.base import POSITIONS, PositionalEncoding
from attnzoo.positions.rope import RoPE, rope_inv_freq

__all__ = ["POSITIONS", "PositionalEncoding", "RoPE", "alibi_slopes", "rope_inv_freq"]
