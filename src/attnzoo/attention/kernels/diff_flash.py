"""``diff-flash``: differential attention's fused CPU kernel (``csrc/diff_flash.cpp``), both softmax maps of a head in
one task, for a fresh causal sequence.

The PyTorch path computes (A1 − λ·A2)·V as A1·V − λ·A2·V with two SDPA calls, so V is multiplied twice forward and,
backward, dP = dO·Vᵀ and dV are each taken once per map. The kernel holds both maps of a query tile at once: the
forward pass multiplies them by V stacked in one product, and the backward pass shares one dP between the maps and
takes dV = (A1 − λA2)ᵀ·dO once, which saves about a fifth of the attention's FLOPs. Neither pass holds a T×T
tensor; ALiBi's bias, shared by both maps, is added inside the tiles. ``csrc/diff_flash.cpp`` derives it.

The record's reasons say where it runs; the layer otherwise takes its next kernel (two SDPA calls), whose PyTorch
path is also the reference the tests hold the kernel to.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attnzoo.attention.kernels import build, cpu
from attnzoo.attention.kernels.cpu import register_cpu_kernel

if TYPE_CHECKING:
    from attnzoo.attention.base import AttentionContext
    from attnzoo.attention.diff import DifferentialAttention
    from attnzoo.attention.kernels.kernel import Call
    from attnzoo.config import ModelConfig

KERNEL_NAME = "diff-flash (fused C++, CPU)"


class FusedDiff(torch.autograd.Function):
    """(softmax(S1) − Λ·softmax(S2))·V through ``torch.ops.attnzoo.diff_flash_forward``, Λ = diag(λ) one weight per
    (sequence, head, row); the backward pass recomputes both maps from the saved log-sum-exp
    (``diff_flash_backward``) and returns dλ = −rowsum(dO ∘ O2)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, lambdas: Tensor, slopes: Tensor) -> Tensor:
        q32, k32, v32, lambdas32, slopes32 = cpu.fp32_operands(q, k, v, lambdas, slopes)
        settings = (1.0 / math.sqrt(q.shape[-1]), cpu.Q_TILE, cpu.K_TILE)
        # DIFF V2's shared keys run the same functions under its own names, which a trace of the ops tells apart.
        name = "diff_v2_flash" if k.shape[1] == v.shape[1] else "diff_flash"
        forward = getattr(torch.ops.attnzoo, f"{name}_forward")
        out, out2, lse = forward(q32, k32, v32, lambdas32, slopes32, *settings)
        # The contiguous fp32 operands, which the backward pass reads as they are: saving the inputs copied each of
        # them a second time there (a DIFF V2 training step spent 7% of its time in copies, MHA's 1.4%).
        ctx.save_for_backward(q32, k32, v32, lambdas32, slopes32, out, out2, lse)
        ctx.settings, ctx.name = settings, name
        ctx.dtypes = (q.dtype, k.dtype, v.dtype, lambdas.dtype)
        return out.to(q.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, lambdas, slopes, out, out2, lse = ctx.saved_tensors
        grad_out = grad_out.float().contiguous()
        # D_m = rowsum(dO ∘ O_m), O1 = O + Λ·O2: the softmax Jacobian's term of each map, (B, H, 2, T).
        delta2 = (grad_out * out2).sum(-1)
        delta = torch.stack(((grad_out * out).sum(-1) + lambdas * delta2, delta2), dim=2).contiguous()
        backward = getattr(torch.ops.attnzoo, f"{ctx.name}_backward")
        grads = backward(grad_out, q, k, v, lse, delta, lambdas, slopes, *ctx.settings)
        grad_q, grad_k, grad_v = (grad.to(dtype) for grad, dtype in zip(grads, ctx.dtypes, strict=False))
        return grad_q, grad_k, grad_v, (-delta2).to(ctx.dtypes[3]), None


def flash_attention(q: Tensor, k: Tensor, v: Tensor, lambdas: Tensor, slopes: Tensor | None) -> Tensor:
    """Causal attention of two maps per head by the fused kernel, (A1 − Λ·A2)·V: q (B, 2H, T, d) holds the sub-heads of
    head h at 2h (map 1) and 2h + 1 (map 2); k (B, 2H_kv, T, d) the key sub-heads of kv head g at 2g and 2g + 1, or
    (B, H_kv, T, d) one key head both maps share (DIFF V2); v (B, H_kv, T, dv); head h reads kv head h // (H / H_kv);
    ``lambdas`` (B, H, T) the weight of each row's second map. Returns (B, H, T, dv) in q's dtype, with S_m =
    q_m·k_mᵀ/√d plus ALiBi's m_h·(j − i) where ``slopes`` (H,) is given; differentiable in q, k, v and the λs. Raises
    where the extension cannot be built (the records' reasons say so beforehand)."""
    build.ensure_built()
    if slopes is None:
        slopes = torch.zeros(q.shape[1] // 2, dtype=torch.float32)
    return FusedDiff.apply(q, k, v, lambdas, slopes)


def diff_attention(q: Tensor, k: Tensor, v: Tensor, lam: Tensor, slopes: Tensor | None) -> Tensor:
    """Diff's causal attention (softmax(S1) − λ·softmax(S2))·V by the fused kernel, λ a scalar (:func:`flash_attention`
    with k's two sub-heads per kv head and v (B, H_kv, T, 2d)); differentiable in λ too."""
    batch, sub_heads, length, _ = q.shape
    return flash_attention(q, k, v, lam.expand(batch, sub_heads // 2, length), slopes)


def static_reasons(cfg: ModelConfig) -> Iterator[str]:
    if not cfg.causal:
        yield "the model is bidirectional"


def call_reasons(layer: DifferentialAttention, call: Call) -> Iterator[str]:
    if call.start != 0 or call.queries != call.keys:
        yield "the queries continue a cache"
    if call.position.adds_bias and call.position.bias_slopes(layer.n_heads) is None:
        yield "the positional bias is not a linear one (ALiBi)"
    if call.dropout > 0:
        yield "attention dropout is on"
    if call.dtype not in cpu.DTYPES or call.key_dtype != call.dtype:
        yield f"dtype {call.dtype} is not fp32 or bf16"


def run(layer: DifferentialAttention, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, *, lam: Tensor) -> Tensor:
    slopes = ctx.bias_slopes(layer.n_heads) if ctx.position.adds_bias else None
    return diff_attention(q, k, v, lam, slopes)


DIFF_FLASH = register_cpu_kernel(
    name="diff-flash",
    display_name=KERNEL_NAME,
    run=run,
    serves=("diff",),
    static_reasons=static_reasons,
    call_reasons=call_reasons,
    ops=("diff_flash_forward",),
)
