"""``diff-flash``: differential attention's fused CPU kernel (:mod:`attnzoo.attention.diff_cpu`), both softmax maps
of a head in one task, for a fresh causal sequence."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from torch import Tensor

from attnzoo.attention import diff_cpu, fused_cpu
from attnzoo.attention.kernels.cpu import cpu_reasons, extension_reasons
from attnzoo.attention.kernels.kernel import Call, Kernel, register_kernel

if TYPE_CHECKING:
    from attnzoo.attention.base import AttentionContext
    from attnzoo.attention.diff import DifferentialAttention
    from attnzoo.config import ModelConfig
    from attnzoo.positions import PositionalEncoding


def static_reasons(cfg: ModelConfig) -> Iterator[str]:
    if not cfg.causal:
        yield "the model is bidirectional"


def call_reasons(layer: DifferentialAttention, call: Call) -> Iterator[str]:
    yield from cpu_reasons(call)
    if call.start != 0 or call.queries != call.keys:
        yield "the queries continue a cache"
    if call.position.adds_bias and call.position.bias_slopes(layer.n_heads) is None:
        yield "the positional bias is not a linear one (ALiBi)"
    if call.dropout > 0:
        yield "attention dropout is on"
    if call.dtype not in fused_cpu.DTYPES or call.key_dtype != call.dtype:
        yield f"dtype {call.dtype} is not fp32 or bf16"
    yield from extension_reasons(call)


def run(layer: DifferentialAttention, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, *, lam: Tensor) -> Tensor:
    slopes = ctx.bias_slopes(layer.n_heads) if ctx.position.adds_bias else None
    return diff_cpu.diff_attention(q, k, v, lam, slopes)


def describe(cfg: ModelConfig, position: PositionalEncoding) -> str:
    return f"{diff_cpu.KERNEL_NAME}, {fused_cpu.status()}"


DIFF_FLASH = register_kernel(
    Kernel(
        name="diff-flash",
        display_name=diff_cpu.KERNEL_NAME,
        run=run,
        serves=("diff",),
        static_reasons=static_reasons,
        call_reasons=call_reasons,
        describe=describe,
    )
)
