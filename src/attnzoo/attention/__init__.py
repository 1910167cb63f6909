"""Attention mechanisms, registered by name."""

from attnzoo.attention import dcmha, diff, diff_v2, mha, selective  # noqa: F401  (registers the mechanism)
from attnzoo.attention.base import ATTENTION, Attention, AttentionContext
from attnzoo.attention.kernels import Hooks, attend, eager_attention, repeat_kv, sdpa_attention

__all__ = [
    "ATTENTION",
    "Attention",
    "AttentionContext",
    "Hooks",
    "attend",
    "eager_attention",
    "repeat_kv",
    "sdpa_attention",
]
