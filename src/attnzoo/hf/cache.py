"""``AttnzooCache``: transformers' ``Cache`` interface over attnzoo's own :class:`~attnzoo.cache.KVCache`.

transformers' generation loop asks a cache only how many positions it holds, passes it back to the model each
step, and reorders it for beam search; what a layer stores is the model's business. So the layers keep storing
what attnzoo stores (keys and values, DCMHA's key-side composition weights, a window's ring), through the same
code as ``Transformer.generate``, and the cached tokens are those attnzoo generates.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from transformers import Cache

from attnzoo.cache import KVCache
from attnzoo.model import Transformer


class AttnzooCache(Cache):
    """Room for ``max_len`` positions, allocated by the first forward that uses it: at that call's batch size (so
    after ``generate`` has expanded the batch for beams or several samples) and the model's dtype and device."""

    def __init__(self, max_len: int):
        super().__init__(layers=[])  # attnzoo's KVCache holds the layers
        if max_len < 1:
            raise ValueError(f"max_len={max_len} must be >= 1")
        self.max_len = max_len
        self.kv: KVCache | None = None

    def for_model(self, model: Transformer, batch_size: int) -> KVCache:
        """The attnzoo cache ``model`` reads and extends, allocated on first use."""
        if self.kv is None:
            self.kv = model.new_cache(batch_size, self.max_len)
        return self.kv

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0 if self.kv is None else self.kv.length

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return self.max_len

    @property
    def batch_size(self) -> int:
        return -1 if self.kv is None else self.kv.batch_size

    # Every layer is an attention layer whose buffers are preallocated, growing views of which each step reads.
    @property
    def is_linear(self) -> list[bool]:
        return [False]

    @property
    def is_sliding(self) -> list[bool]:
        return [False]

    @property
    def is_compileable(self) -> bool:
        return False

    @property
    def is_croppable(self) -> bool:
        return False  # a window's ring overwrites what a rollback would need

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove != 0:
            raise ValueError("an attnzoo cache cannot be cropped: a window's ring has overwritten the positions")

    def reset(self) -> None:
        if self.kv is not None:
            self.kv.reset()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: sequence i continues sequence ``beam_idx[i]``."""
        self._map_sequences(lambda buffer: buffer.index_select(0, beam_idx.to(buffer.device)))

    def batch_select_indices(self, indices: Tensor) -> None:
        self._map_sequences(lambda buffer: buffer[indices.to(buffer.device)])

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map_sequences(lambda buffer: buffer.repeat_interleave(repeats, dim=0))

    def _map_sequences(self, select: Callable[[Tensor], Tensor]) -> None:
        """Apply ``select`` to the batch axis of every buffer of every layer."""
        if self.kv is None:
            return
        for layer in self.kv.layers:
            layer.buffers = {name: select(buffer) for name, buffer in layer.buffers.items()}
        self.kv.batch_size = next(iter(self.kv.layers[0].buffers.values())).shape[0]

    def __repr__(self) -> str:
        held = "unallocated" if self.kv is None else f"{self.kv.length} positions of batch {self.kv.batch_size}"
        return f"AttnzooCache(max_len={self.max_len}, {held})"
