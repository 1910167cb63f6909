"""``alibi-flash``: ALiBi's fused CPU kernel (``csrc/alibi_flash.cpp``), causal attention with the linear bias added
inside its tiles.

:func:`alibi_flash_attention` is softmax(q·kᵀ/√d + m_h·(j − i))·V with the official slopes m_h (Press et al., 2022),
by a flash-style kernel that adds the bias as it computes each score tile, so neither the forward nor the backward
pass holds a (H, T, T) tensor: the forward pass keeps each query tile's online-softmax statistics and saves only the
output and the row log-sum-exp; the backward pass recomputes the probabilities from them (FlashAttention-2).
``csrc/alibi_flash.cpp`` derives it. Where it cannot run, SDPA's CPU flash kernel takes the bias as a (1, H, T, T)
tensor with the causal flag (``sdpa.py``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnzoo.attention.kernels import build, cpu

KERNEL_NAME = "alibi-flash (fused C++, CPU)"


def runs_alibi(q: Tensor, k: Tensor, v: Tensor, dropout_p: float) -> bool:
    """Whether :func:`alibi_flash_attention` serves these operands: on CPU, fp32 or bf16, without dropout (which it
    does not draw), outside ``torch.compile`` (the op has no fake kernel to trace, so a compiled graph keeps SDPA's
    path whole rather than breaking around it), once the extension is built (building it the first time)."""
    return (
        q.device.type == "cpu"
        and not torch.compiler.is_compiling()
        and dropout_p == 0
        and q.dtype in cpu.DTYPES
        and q.dtype == k.dtype == v.dtype
        and build.available()
    )


class AlibiFlash(torch.autograd.Function):
    """softmax(scale·q·kᵀ + m_h·(j − i), causal)·V through ``torch.ops.attnzoo.alibi_flash_forward``; the backward
    pass recomputes the probabilities from the saved log-sum-exp (``alibi_flash_backward``)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, slopes: Tensor, scale: float) -> Tensor:
        operands = cpu.fp32_operands(q, k, v, slopes)
        out, lse = torch.ops.attnzoo.alibi_flash_forward(*operands, scale, cpu.Q_TILE, cpu.K_TILE)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, slopes, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, slopes, out, lse = ctx.saved_tensors
        q32, k32, v32, slopes32 = cpu.fp32_operands(q, k, v, slopes)
        grads = torch.ops.attnzoo.alibi_flash_backward(
            grad_out.float().contiguous(), q32, k32, v32, out, lse, slopes32, ctx.scale, cpu.Q_TILE, cpu.K_TILE
        )
        return *(grad.to(x.dtype) for grad, x in zip(grads, (q, k, v), strict=True)), None, None


def alibi_flash_attention(q: Tensor, k: Tensor, v: Tensor, slopes: Tensor, scale: float) -> Tensor:
    """Causal ALiBi attention of q (B, H, T, d) over k (B, H_kv, T, d) and v (B, H_kv, T, d_v), H a multiple of H_kv
    (query head h reads kv head h // (H / H_kv)): softmax(scale·q·kᵀ + m_h·(j − i))·V over keys j ≤ i, with
    ``slopes`` (H,) the m_h. Call only where :func:`runs_alibi` holds. Returns (B, H, T, d_v) in q's dtype."""
    return AlibiFlash.apply(q, k, v, slopes, scale)
