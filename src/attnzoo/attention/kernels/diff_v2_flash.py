"""``diff-v2-flash``: DIFF V2's attention on the fused CPU kernel of Diff (``csrc/diff_flash.cpp``), for a fresh causal
sequence (issue 52).

DIFF V2 is one causal attention over 2h query heads, whose head pair (2i, 2i + 1) shares kv head i // (h / h_kv), then
a_2i − λ_i(t)·a_2i+1 with one λ per token and head (``DiffV2Attention``). Its PyTorch path makes that one SDPA call
with the kv heads repeated to 2h, then subtracts the pairs: twice MHA's attention FLOPs, forward and backward, and
1.34× MHA's training step on the CPU. The pair is Diff's two maps with shared keys and a per-row λ, which Diff's
kernel takes (its ``flash_attention``): it holds both maps of a query tile in one task, multiplies their stacked
probabilities by V in one product, and in the backward pass shares dP = dO·Vᵀ between the maps and takes
dV = (A1 − ΛA2)ᵀ·dO once, where the PyTorch path takes each twice; no kv head is copied. ALiBi's slope of
differential head i serves both heads of the pair, as ``bias_repeat=2`` does on the PyTorch path, which is the
reference the tests hold this kernel to.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from torch import Tensor

from attnzoo.attention.kernels import cpu, diff_flash
from attnzoo.attention.kernels.cpu import register_cpu_kernel

if TYPE_CHECKING:
    from attnzoo.attention.base import AttentionContext
    from attnzoo.attention.diff_v2 import DiffV2Attention
    from attnzoo.attention.kernels.kernel import Call

KERNEL_NAME = "diff-v2-flash (fused C++, CPU)"


def call_reasons(layer: DiffV2Attention, call: Call) -> Iterator[str]:
    if call.start != 0 or call.queries != call.keys:
        yield "the queries continue a cache"
    if call.position.adds_bias and call.position.bias_slopes(layer.n_heads) is None:
        yield "the positional bias is not a linear one (ALiBi)"
    if call.dropout > 0:
        yield "attention dropout is on"
    if call.dtype not in cpu.DTYPES or call.key_dtype != call.dtype:
        yield f"dtype {call.dtype} is not fp32 or bf16"


def diff_v2_attention(q: Tensor, k: Tensor, v: Tensor, lam: Tensor, slopes: Tensor | None) -> Tensor:
    """q (B, 2h, T, d) rotated, k and v (B, h_kv, T, d), λ (B, h, T, 1), ``slopes`` (h,) ALiBi's or None →
    a_2i − λ_i·a_2i+1, (B, h, T, d); differentiable in q, k, v and λ."""
    return diff_flash.flash_attention(q, k, v, lam.squeeze(-1), slopes)


def run(layer: DiffV2Attention, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, *, lam: Tensor) -> Tensor:
    slopes = ctx.bias_slopes(layer.n_heads) if ctx.position.adds_bias else None
    return diff_v2_attention(q, k, v, lam, slopes)


DIFF_V2_FLASH = register_cpu_kernel(
    name="diff-v2-flash",
    display_name=KERNEL_NAME,
    run=run,
    serves=("diff_v2",),
    static_reasons=diff_flash.static_reasons,
    call_reasons=call_reasons,
    ops=("diff_v2_flash_forward",),
)
