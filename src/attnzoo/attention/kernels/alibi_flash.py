"""``alibi-flash``: ALiBi's fused CPU kernel (``csrc/alibi_flash.cpp``), which the scheme brings (``ALiBi.kernels``):
SDPA's calls of a fresh causal sequence, with the linear bias added inside the kernel's tiles.

:func:`alibi_flash_attention` is softmax(q·kᵀ/√d + m_h·(j − i))·V with the official slopes m_h (Press et al., 2022),
by a flash-style kernel that adds the bias as it computes each score tile, so neither the forward nor the backward
pass holds a (H, T, T) tensor: the forward pass keeps each query tile's online-softmax statistics and saves only the
output and the row log-sum-exp; the backward pass recomputes the probabilities from them (FlashAttention-2).
``csrc/alibi_flash.cpp`` derives it.

The record specialises ``sdpa``: with "auto" it is tried just before SDPA, in training and inference, and where it
refuses a call (a cached step, dropout, float64, no compiler) SDPA runs it with the bias as a (1, H, T, T) tensor
(``sdpa.py``). ``attn_backend="alibi-flash"`` pins it (the eager reference running what it refuses, as for any kernel
named), and ``attn_backend="sdpa"`` runs SDPA without it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from attnzoo.attention.kernels import cpu
from attnzoo.attention.kernels.cpu import register_cpu_kernel

if TYPE_CHECKING:
    from attnzoo.attention.base import Attention, AttentionContext
    from attnzoo.attention.kernels.kernel import Call
    from attnzoo.config import ModelConfig

KERNEL_NAME = "alibi-flash (fused C++, CPU)"


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
    ``slopes`` (H,) the m_h, on the CPU in fp32 or bf16. Returns (B, H, T, d_v) in q's dtype."""
    return AlibiFlash.apply(q, k, v, slopes, scale)


def alibi_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ctx: AttentionContext,
    *,
    scale: float | None = None,
    dropout_p: float = 0.0,
    bias_repeat: int = 1,
    query_scale: Tensor | None = None,
    record: bool = True,
) -> tuple[Tensor, None]:
    """SDPA's call (:func:`~attnzoo.attention.kernels.sdpa.sdpa_attention`'s arguments) on the fused kernel, as a
    PyTorch kernel (:data:`~attnzoo.attention.kernels.eager.PyTorchKernel`) that records no map. The kernel takes
    wider values (Diff's) and shared kv heads as they are, and adjacent heads sharing a slope (``bias_repeat``)
    through the slopes; ``dropout_p`` is 0 wherever the record lets it run."""
    if query_scale is not None:
        # Scaling query row t scales logit row t before the bias is added: the eager kernel's row scale.
        q = q * query_scale[..., None].to(q.dtype)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return alibi_flash_attention(q, k, v, ctx.bias_slopes(q.shape[1], bias_repeat), scale), None


def run(layer: Attention, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, **inputs: Any) -> Tensor:
    return layer.pytorch_attention(alibi_attention, q, k, v, ctx, **inputs)


def static_reasons(cfg: ModelConfig) -> Iterator[str]:
    if not cfg.causal:
        yield "the model is bidirectional"


def call_reasons(layer: Attention, call: Call) -> Iterator[str]:
    if call.queries != call.keys or call.queries == 1:
        yield "the call is not a fresh sequence of several tokens (a cached step takes the bias as one mask)"
    if call.dropout > 0:
        yield "attention dropout is on (the kernel draws none)"
    if call.dtype not in cpu.DTYPES or call.key_dtype != call.dtype:
        yield f"dtype {call.dtype} is not one of {list(cpu.DTYPES)}"


ALIBI_FLASH = register_cpu_kernel(
    name="alibi-flash",
    display_name=KERNEL_NAME,
    run=run,
    static_reasons=static_reasons,
    call_reasons=call_reasons,
    ops=("alibi_flash_forward",),
    specialises="sdpa",
)
