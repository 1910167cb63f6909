"""A static, preallocated KV cache in the style of gpt-fast.

Each layer owns a :class:`LayerCache` of named buffers whose sequence axis is dim 2, e.g. keys
(B, H_kv, max_len, d). Mechanisms decide what they store (keys and values, scaled values, key-side
composition matrices ...); the model-level :class:`KVCache` only tracks how many positions are filled. A layer
whose queries see only a window of keys keeps a ring of that window (:class:`WindowCache`).

A call reads the buffers in one of two ways, chosen by its :class:`~attnzoo.attention.AttentionContext`:

* growing (the default): views up to the last position written, so each decoding step has a new shape;
* static (``ctx.static``, a one-token step on a cache made with ``static=True``): the whole buffers, every step
  the same shape, with the slots a query may not see (not yet written, or out of its window) excluded by the
  context's mask, which it builds from the step's position tensor. Nothing in such a step depends on a Python
  int that changes from step to step, so ``torch.compile`` captures it once (``Transformer.generate(compile=True)``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from attnzoo.attention.base import AttentionContext

SEQ_DIM = 2


class LayerCache:
    """Named buffers of one layer, each shaped (B, heads, max_len, ...): slot s holds position s."""

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

    def update(self, ctx: AttentionContext, **new: Tensor) -> tuple[Tensor, ...]:
        """Write ``new[name]`` at the call's positions and return every named buffer over the keys its queries
        may see: up to the last position written, or on a static step the whole buffer, whose slots past the
        query the causal mask excludes (``ctx.key_positions`` is then 0 .. max_len−1).

        Returns the buffers in the order of the keyword arguments, so ``k, v = cache.update(ctx, k=k, v=v)``.
        """
        if ctx.static:
            self._write_slots(ctx.positions, new)
            return tuple(self.buffers[name] for name in new)
        views = []
        for name, value in new.items():
            buffer = self.buffers[name]
            end = ctx.start + value.shape[SEQ_DIM]
            buffer[:, :, ctx.start : end] = value.to(buffer.dtype)
            views.append(buffer[:, :, :end])
        return tuple(views)

    def _write_slots(self, slots: Tensor, new: dict[str, Tensor]) -> None:
        """Write each value's positions along the sequence axis into ``slots``, a tensor: no host sync."""
        for name, value in new.items():
            buffer = self.buffers[name]
            buffer.index_copy_(SEQ_DIM, slots, value.to(buffer.dtype))


class WindowCache(LayerCache):
    """Per-position buffers of a layer whose queries see at most ``window`` keys (None: all).

    Position p lives in slot p % capacity. A global layer's capacity is max_len, so slots are positions; a
    local layer keeps only its last ``window`` positions in a ring.
    """

    def __init__(self, window: int | None, **buffers: Tensor):
        super().__init__(**buffers)
        self.window = window
        self.capacity = next(iter(buffers.values())).shape[SEQ_DIM]

    def extend(self, ctx: AttentionContext, **new: Tensor) -> tuple[Tensor, ...]:
        """Store the chunk at the call's positions and return (key positions, *entries) its queries may see.

        Entries come in slot order, with their positions; slots the window excludes are masked by position. A
        static step returns the whole ring, with ``ctx.key_positions(capacity)``: what each slot holds, and for
        a slot not yet written a position past the query, so the causal mask excludes it.
        """
        if ctx.static:
            self._write_slots(ctx.positions % self.capacity, new)
            return ctx.key_positions(self.capacity), *(self.buffers[name] for name in new)
        start = ctx.start
        length = next(iter(new.values())).shape[SEQ_DIM]
        end = start + length
        first = 0 if self.window is None else max(0, start - self.window + 1)
        device = self.buffers[next(iter(new))].device
        if end - first <= self.capacity:
            # All visible positions survive the write, so the buffers are read in place.
            self._write(start, new)
            filled = min(end, self.capacity)
            slots = torch.arange(filled, device=device)
            # Until the ring wraps (always, in a global layer), slot s holds position s.
            positions = slots if end <= self.capacity else end - 1 - (end - 1 - slots) % self.capacity
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
        first = next(iter(new.values()))  # every entry holds the same positions: one set of slots serves all
        end = start + first.shape[SEQ_DIM]
        kept = min(first.shape[SEQ_DIM], self.capacity)
        slots = torch.arange(end - kept, end, device=first.device) % self.capacity
        for name, value in new.items():
            buffer = self.buffers[name]
            buffer.index_copy_(SEQ_DIM, slots, value[:, :, -kept:].to(buffer.dtype))


class KVCache:
    """The per-layer caches of one model plus the number of positions already processed.

    Create it with ``model.new_cache(batch_size, max_len)`` and pass it as ``model(idx, cache=cache)``:
    each call appends ``idx`` and continues positions from ``cache.length``. With ``static=True`` its one-token
    calls take the static path (the module docstring), and its buffers are marked as static addresses, so
    CUDA graphs write them in place instead of copying them in and out.
    """

    def __init__(self, layers: list[LayerCache], batch_size: int, max_len: int, *, static: bool = False):
        self.layers = layers
        self.batch_size = batch_size
        self.max_len = max_len
        self.static = static
        self.length = 0
        if static:
            for layer in layers:
                for buffer in layer.buffers.values():
                    torch._dynamo.mark_static_address(buffer)

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
        """Forget the cached positions. A growing cache's buffers are overwritten, not cleared; a static one's are
        zeroed, since its steps read every slot and a masked slot still enters a product as 0·x, which a NaN left
        by an earlier sequence would turn into NaN."""
        self.length = 0
        if self.static:
            for layer in self.layers:
                for buffer in layer.buffers.values():
                    buffer.zero_()
