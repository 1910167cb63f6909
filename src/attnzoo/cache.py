"""A static, preallocated KV cache in the style of gpt-fast.

Each layer owns a :class:`LayerCache` of named buffers whose sequence axis is dim 2, e.g. keys
(B, H_kv, max_len, d). Mechanisms decide what they store (keys and values, scaled values, key-side
composition matrices ...); the model-level :class:`KVCache` only tracks how many positions are filled. A layer
whose queries see only a window of keys keeps a ring of that window (:class:`WindowCache`).
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

    @property
    def nbytes(self) -> int:
        """Bytes the buffers hold, allocated up front."""
        return sum(buffer.nbytes for buffer in self.buffers.values())

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


class WindowCache(LayerCache):
    """Per-position buffers of a layer whose queries see at most ``window`` keys (None: all).

    Position p lives in slot p % capacity. A global layer's capacity is max_len, so slots are positions; a
    local layer keeps only its last ``window`` positions in a ring.
    """

    def __init__(self, window: int | None, **buffers: Tensor):
        super().__init__(**buffers)
        self.window = window
        self.capacity = next(iter(buffers.values())).shape[SEQ_DIM]

    def extend(self, start: int, **new: Tensor) -> tuple[Tensor, ...]:
        """Store the chunk at positions start.. and return (key positions, *entries) the chunk's queries may see.

        Entries come in slot order, with their positions; slots the window excludes are masked by position.
        """
        length = next(iter(new.values())).shape[SEQ_DIM]
        end = start + length
        first = 0 if self.window is None else max(0, start - self.window + 1)
        device = self.buffers[next(iter(new))].device
        if end - first <= self.capacity:
            # All visible positions survive the write, so the buffers are read in place.
            self._write(start, new)
            filled = min(end, self.capacity)
            slots = torch.arange(filled, device=device)
            positions = end - 1 - (end - 1 - slots) % self.capacity
            return positions, *(self.buffers[name][:, :, :filled] for name in new)
        # A chunk longer than the ring: read the cached part of the window before the write overwrites it.
        cached = torch.arange(first, start, device=device)
        entries = [
            torch.cat((self.buffers[name].index_select(SEQ_DIM, cached % self.capacity), value), dim=SEQ_DIM)
            for name, value in new.items()
        ]
        self._write(start, new)
        return torch.arange(first, end, device=device), *entries

    def _write(self, start: int, new: dict[str, Tensor]) -> None:
        for name, value in new.items():
            kept = min(value.shape[SEQ_DIM], self.capacity)
            end = start + value.shape[SEQ_DIM]
            slots = torch.arange(end - kept, end, device=value.device) % self.capacity
            buffer = self.buffers[name]
            buffer.index_copy_(SEQ_DIM, slots, value[:, :, -kept:].to(buffer.dtype))


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

    @property
    def nbytes(self) -> int:
        """Bytes every layer's buffers hold: the measured counterpart of ``Attention.cache_bytes``."""
        return sum(layer.nbytes for layer in self.layers)

    def reset(self) -> None:
        """Forget the cached positions (buffers are overwritten, not cleared)."""
        self.length = 0
