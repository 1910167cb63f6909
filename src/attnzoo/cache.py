"""A static, preallocated KV cache in the style of gpt-fast.

Each layer owns a :class:`LayerCache` of named buffers whose sequence axis is dim 2, e.g. keys
(B, H_kv, max_len, d). Mechanisms decide what they store (keys and values, scaled values, key-side
composition matrices ...); the model-level :class:`KVCache` only tracks how many positions are filled.
"""

from __future__ import annotations

import torch
from torch import Tensor

SEQ_DIM = 2


class LayerCache:
    """Named buffers of one layer, each shaped (B, heads, max_len, ...)."""

    def __init__(self, **buffers: Tensor):
        self.buffers = buffers

    @classmethod
    def allocate(cls, batch_size: int, max_len: int, *, device, dtype, **shapes: tuple[int, ...]) -> LayerCache:
        """``shapes`` maps a buffer name to its per-position shape around the sequence axis: (heads, *rest)."""
        return cls(
            **{
                name: torch.zeros(batch_size, shape[0], max_len, *shape[1:], device=device, dtype=dtype)
                for name, shape in shapes.items()
            }
        )

    def update(self, start: int, **new: Tensor) -> tuple[Tensor, ...]:
        """Write ``new[name]`` at positions ``start ..`` and return every named buffer up to the last one written.

        Returns views in the order of the keyword arguments, so ``k, v = cache.update(start, k=k, v=v)``.
        """
        views = []
        for name, value in new.items():
            buffer = self.buffers[name]
            end = start + value.shape[SEQ_DIM]
            buffer[:, :, start:end] = value.to(buffer.dtype)
            views.append(buffer[:, :, :end])
        return tuple(views)


class KVCache:
    """The per-layer caches of one model plus the number of positions already processed.

    Create it with ``model.new_cache(batch_size, max_len)`` and pass it as ``model(idx, cache=cache)``:
    each call appends ``idx`` and continues positions from ``cache.length``.
    """

    def __init__(self, layers: list[LayerCache], batch_size: int, max_len: int):
        self.layers = layers
        self.batch_size = batch_size
        self.max_len = max_len
        self.length = 0

    def check_fits(self, batch_size: int, new_tokens: int) -> None:
        if batch_size != self.batch_size:
            raise ValueError(f"input batch size {batch_size} differs from the cache's batch_size={self.batch_size}")
        if self.length + new_tokens > self.max_len:
            raise ValueError(
                f"cache holds {self.length} of max_len={self.max_len} positions; {new_tokens} more do not fit. "
                "Create the cache with a larger max_len."
            )

    def reset(self) -> None:
        """Forget the cached positions (buffers are overwritten, not cleared)."""
        self.length = 0
