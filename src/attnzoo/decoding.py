"""Compiled decoding: the one-token step of a static cache under ``torch.compile``, in the style of gpt-fast.

``Transformer.generate(compile=True)`` prefills the prompt eagerly, then runs every later token through
:meth:`~attnzoo.model.Transformer.decode_step` compiled once: on CUDA in mode "reduce-overhead" (CUDA graphs),
elsewhere in inductor's default mode. The step reads a static cache (``attnzoo.cache``), so every step has the
same shapes, and takes its position as a tensor that is filled in place, so the compiled step is captured once
and replayed without recompiling or waiting on the host. A :class:`CompiledDecoder` keeps the compiled step and
its cache on the model between ``generate`` calls.
"""

from __future__ import annotations

from collections.abc import Callable
from types import FunctionType
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from attnzoo.cache import KVCache
    from attnzoo.model import Transformer

# A new cache is rounded up to a multiple of this many positions (within max_seq_len), so that generate calls of
# somewhat different lengths reuse one compiled step instead of recompiling for each cache shape.
CAPACITY_QUANTUM = 256


def _step(model: Transformer, token: Tensor, position: Tensor, cache: KVCache) -> Tensor:
    # A function of the model rather than its bound method, so the compiled function holds no model: a copy of
    # the model that shares it still runs on its own weights.
    return model.decode_step(token, position, cache)


def _own_step() -> Callable[[Transformer, Tensor, Tensor, KVCache], Tensor]:
    """:func:`_step` with a code object of its own. Dynamo keeps compiled entries, and counts recompiles against
    its limit (8), per code object: shared by every decoder, they would fail (fullgraph) once a process had
    decoded with 9 models or batch sizes, as a check over every mechanism and scheme does."""
    return FunctionType(_step.__code__.replace(), _step.__globals__, _step.__name__)


def compile_mode(device: torch.device) -> str | None:
    """CUDA graphs on CUDA, where a decoding step is launch-bound; inductor's default mode elsewhere."""
    return "reduce-overhead" if device.type == "cuda" else None


def cache_capacity(needed: int, max_seq_len: int) -> int:
    """Positions to allocate for ``needed``: rounded up to ``CAPACITY_QUANTUM`` within ``max_seq_len`` (which the
    learned positions cannot pass), and never less than needed."""
    rounded = -(-needed // CAPACITY_QUANTUM) * CAPACITY_QUANTUM
    return max(needed, min(rounded, max_seq_len))


class CompiledDecoder:
    """The compiled one-token step and the static cache it decodes into, for ``batch_size`` sequences of up to
    ``capacity`` positions on the model's device and dtype. ``backend``: torch.compile's (inductor; the tests
    trace with dynamo alone)."""

    def __init__(self, model: Transformer, batch_size: int, capacity: int, *, backend: str | Callable = "inductor"):
        weight = model.embed_tokens.weight
        self.device, self.dtype = weight.device, weight.dtype
        self.cache = model.new_cache(batch_size, capacity, static=True)
        # The position is a tensor filled in place each step: an input whose value changes and whose address
        # does not, so a CUDA graph reads it where it is.
        self.position = torch.zeros(1, dtype=torch.long, device=self.device)
        torch._dynamo.mark_static_address(self.position)
        mode = compile_mode(self.device) if backend == "inductor" else None
        self.compiled = torch.compile(_own_step(), backend=backend, mode=mode, fullgraph=True, dynamic=False)

    def fits(self, model: Transformer, batch_size: int, length: int) -> bool:
        """Whether this decoder serves ``batch_size`` sequences of ``length`` positions of ``model`` as it is now."""
        weight = model.embed_tokens.weight
        return (
            self.cache.batch_size == batch_size
            and self.cache.max_len >= length
            and (weight.device, weight.dtype) == (self.device, self.dtype)
        )

    def step(self, model: Transformer, token: Tensor) -> Tensor:
        """Logits (B, vocab) of ``token`` (B, 1) appended to the cache, through the compiled step."""
        cache = self.cache
        cache.check_fits(token.shape[0], 1)
        self.position.fill_(cache.length)  # a fill on the device: no host sync
        if self.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's outputs are no longer read
        logits = self.compiled(model, token, self.position, cache)
        cache.length += 1
        return logits
