"""``diff-decode``: differential attention's decoding step on the CPU, one query row against a growing cache, by the
fused C++ op ``diff_decode_forward`` (``csrc/diff_flash.cpp``; issue 52).

The two-SDPA-call path (``sdpa``) serves a one-token step badly: the values are 2d wide and the queries and keys d
wide, so on the CPU each call zero-pads the query and the whole cache's keys to 2d (``sdpa_pads_queries``), a copy of
the cache's keys per map and per step, and V is multiplied once per map. A 4-layer model's step at a context of
1,024 spent 28% of its time padding (``benchmarks/results/diff-speed.md``). For one query row there is nothing to
tile, so the op computes Eq. 1 of the paper directly, one task per (sequence, differential head)::

    O = (softmax(q1·K1ᵀ/√d + B) − λ·softmax(q2·K2ᵀ/√d + B))·V

reading the cache's keys and values where they lie: both maps' score rows, their softmaxes and their difference in
one buffer, then one product with V. (A1 − λA2)·V equals the reference's A1·V − λ·A2·V up to rounding. Differential
head i reads kv head i // (H / H_kv), whose key sub-heads are 2j and 2j + 1 (the flash semantics of
``DifferentialAttention``); ALiBi's bias m_i·(j − t), shared by both maps, is added in the op.

It serves fp32 steps on a growing cache, where every slot is a key the query sees, outside autograd (the op has no
backward); a static step (whose buffers hold slots the mask excludes), a step under torch.compile and a bf16 cache
(which the op would have to copy to fp32 each step) take the next kernel, two SDPA calls.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attnzoo.attention.kernels import build, diff_flash
from attnzoo.attention.kernels.cpu import register_cpu_kernel

if TYPE_CHECKING:
    from attnzoo.attention.base import AttentionContext
    from attnzoo.attention.diff import DifferentialAttention
    from attnzoo.attention.kernels.kernel import Call

KERNEL_NAME = "diff-decode (fused C++, CPU)"


def decode_attention(q: Tensor, k: Tensor, v: Tensor, lam: Tensor, slopes: Tensor | None) -> Tensor:
    """One decoding step: q (B, 2H, 1, d) rotated, the sub-heads of head h at 2h and 2h + 1; k (B, 2H_kv, S, d) and
    v (B, H_kv, S, 2d) the cache's so far, the query at position S − 1; λ a scalar; ``slopes`` (H,) ALiBi's, or None.
    Returns (A1 − λ·A2)·V, (B, H, 1, 2d), fp32. Raises where the extension cannot be built (the record's reasons say
    so beforehand)."""
    build.ensure_built()
    if slopes is None:
        slopes = torch.zeros(q.shape[1] // 2, dtype=torch.float32)
    scale = 1.0 / math.sqrt(q.shape[-1])
    return torch.ops.attnzoo.diff_decode_forward(q.contiguous(), k, v, slopes, float(lam), scale)


def call_reasons(layer: DifferentialAttention, call: Call) -> Iterator[str]:
    if call.queries != 1 or not call.cached:
        yield "it serves one query over a cache (a decoding step)"
    if call.autograd:
        yield "autograd records the call, and the op has no backward"
    if call.static:
        yield "a static step's buffers hold slots the query may not see"
    if call.position.adds_bias and call.position.bias_slopes(layer.n_heads) is None:
        yield "the positional bias is not a linear one (ALiBi)"
    if call.dropout > 0:
        yield "attention dropout is on"
    if call.dtype != torch.float32 or call.key_dtype != torch.float32:
        yield f"dtype {call.dtype} is not fp32 (the op would copy a bf16 cache to fp32 every step)"


def run(layer: DifferentialAttention, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, *, lam: Tensor) -> Tensor:
    slopes = ctx.bias_slopes(layer.n_heads) if ctx.position.adds_bias else None
    return decode_attention(q, k, v, lam, slopes)


DIFF_DECODE = register_cpu_kernel(
    name="diff-decode",
    display_name=KERNEL_NAME,
    run=run,
    serves=("diff",),
    static_reasons=diff_flash.static_reasons,  # a causal model's, as the fused kernel's
    call_reasons=call_reasons,
    ops=("diff_decode_forward",),
)
