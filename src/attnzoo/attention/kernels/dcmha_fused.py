"""``dcmha-fused`` and ``dcmha-decode``: DCMHA's fused C++ kernels (:mod:`attnzoo.attention.dcmha_cpu`), a fresh
causal sequence's attention with no (B, N, T, S) tensor and one cached decoding step over the cache in place."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attnzoo.attention import dcmha_cpu, fused_cpu
from attnzoo.attention.kernels.cpu import cpu_reasons, extension_reasons
from attnzoo.attention.kernels.kernel import Call, Kernel, register_kernel

if TYPE_CHECKING:
    from attnzoo.attention.base import AttentionContext
    from attnzoo.attention.dcmha import Composed, DynamicallyComposableAttention
    from attnzoo.config import ModelConfig
    from attnzoo.positions import PositionalEncoding


def static_reasons(cfg: ModelConfig) -> Iterator[str]:
    opts = cfg.attention_opts
    if opts.compile_composition:
        yield "compile_composition asks for the compiled PyTorch composition"
    if not cfg.causal:
        yield "the model is bidirectional"
    heads_per_group = cfg.n_heads // opts.num_groups
    if heads_per_group > dcmha_cpu.MAX_HEADS_PER_GROUP:
        yield f"{heads_per_group} heads per group exceed {dcmha_cpu.MAX_HEADS_PER_GROUP}"


def layer_reasons(layer: DynamicallyComposableAttention, call: Call, dtypes: tuple[torch.dtype, ...]) -> Iterator[str]:
    if call.position.adds_bias and call.position.bias_slopes(layer.n_heads) is None:
        yield "the positional bias is not a linear one (ALiBi)"
    if call.dropout > 0:
        yield "attention dropout is on"
    if call.dtype not in dtypes or call.key_dtype != call.dtype:
        yield f"dtype {call.dtype} is not one of {list(dtypes)}"
    yield from extension_reasons(call)


def fused_reasons(layer: DynamicallyComposableAttention, call: Call) -> Iterator[str]:
    yield from cpu_reasons(call)
    if call.start != 0:  # a prefill into an empty cache is a fresh sequence
        yield "the queries continue a cache"
    yield from layer_reasons(layer, call, fused_cpu.DTYPES)


def decode_reasons(layer: DynamicallyComposableAttention, call: Call) -> Iterator[str]:
    yield from cpu_reasons(call)
    if not call.cached or call.start == 0:
        yield "the queries do not continue a cache"
    if call.queries != 1 or call.static:
        yield "a cached call of several queries (a chunked prefill) or a static step"
    yield from layer_reasons(layer, call, (torch.float32,))  # a step in bf16 would upcast the whole cache


def run_fused(
    layer: DynamicallyComposableAttention,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ctx: AttentionContext,
    *,
    composed: Composed,
) -> Tensor:
    """The call's own keys and values (a prefill's, not the cache's buffers) and KW of its own tokens."""
    return dcmha_cpu.dcmha_attention(
        q,
        composed.fresh_k,
        composed.fresh_v,
        layer.composition_matrices(composed.query_w, composed.new_kw),
        slopes=ctx.bias_slopes(layer.n_heads),
        groups=layer.num_groups,
        window=layer.window,
    )


def run_decode(
    layer: DynamicallyComposableAttention,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ctx: AttentionContext,
    *,
    composed: Composed,
) -> Tensor:
    return dcmha_cpu.decode_attention(
        q,
        k,
        v,
        layer.composition_matrices(composed.query_w, composed.key_w),
        slopes=ctx.bias_slopes(layer.n_heads),
        key_positions=composed.key_positions,
        query_position=ctx.start,
        groups=layer.num_groups,
        window=layer.window,
    )


def describe_fused(cfg: ModelConfig, position: PositionalEncoding) -> str:
    return f"{dcmha_cpu.KERNEL_NAME}, {fused_cpu.status()}"


def describe_decode(cfg: ModelConfig, position: PositionalEncoding) -> str:
    return f"{dcmha_cpu.DECODE_KERNEL_NAME}, {fused_cpu.status()}"


DCMHA_FUSED = register_kernel(
    Kernel(
        name="dcmha-fused",
        display_name=dcmha_cpu.KERNEL_NAME,
        run=run_fused,
        serves=("dcmha",),
        static_reasons=static_reasons,
        call_reasons=fused_reasons,
        describe=describe_fused,
    )
)
DCMHA_DECODE = register_kernel(
    Kernel(
        name="dcmha-decode",
        display_name=dcmha_cpu.DECODE_KERNEL_NAME,
        run=run_decode,
        serves=("dcmha",),
        static_reasons=static_reasons,
        call_reasons=decode_reasons,
        describe=describe_decode,
    )
)
