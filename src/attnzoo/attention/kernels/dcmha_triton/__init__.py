"""``dcmha-triton``: DCMHA's fused Triton kernel for a fresh causal sequence on CUDA; composed scores never reach
memory. This record says where it serves; ``op.py`` is the operator, ``jit.py`` its Triton programs, ``tuning.py`` how
they are tiled and launched."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING

from torch import Tensor

from attnzoo.attention.kernels.kernel import Call, Kernel, register_kernel

if TYPE_CHECKING:
    from attnzoo.attention.base import AttentionContext
    from attnzoo.attention.dcmha import Composed, DynamicallyComposableAttention
    from attnzoo.config import ModelConfig

MAX_HEADS_PER_GROUP = 32  # M: every tile holds (M, BT, BS) scores and (R, M, BT, BS) mixing products
MAX_HEAD_DIM = 128


def implementation() -> ModuleType:
    """The operator (:mod:`~attnzoo.attention.kernels.dcmha_triton.op`), imported at the first call that may use it:
    importing Triton loads torch._dynamo, seconds that every command (``attnzoo --help`` too) would otherwise pay at
    start-up."""
    from attnzoo.attention.kernels.dcmha_triton import op

    return op


def static_reasons(cfg: ModelConfig) -> Iterator[str]:
    opts = cfg.attention_opts
    if not cfg.causal:
        yield "the model is bidirectional"
    if opts.static_proj:
        yield "static_proj adds the static matrix W_b"
    if opts.static_only:
        yield "static_only composes with the static matrix W_b alone; the kernel composes with dynamic weights only"
    heads_per_group = cfg.n_heads // opts.num_groups
    if heads_per_group > MAX_HEADS_PER_GROUP:
        yield f"{heads_per_group} heads per group exceed {MAX_HEADS_PER_GROUP}"
    if cfg.head_dim > MAX_HEAD_DIM:
        yield f"head_dim {cfg.head_dim} exceeds {MAX_HEAD_DIM}"


def call_reasons(layer: DynamicallyComposableAttention, call: Call) -> Iterator[str]:
    if call.cached:
        yield "a cached call's keys sit at ring positions, which the kernel does not take"
    if not implementation().runs_on(call.device_type):
        yield "the kernel runs on CUDA, with Triton installed"
    if call.records_scores:
        yield "attention maps or logits are recorded"
    if call.position.adds_bias:
        yield "the positional scheme adds a score bias"
    if call.dropout > 0:
        yield "attention dropout is on"
    kernel_dtypes = implementation().KERNEL_DTYPES
    if call.dtype not in kernel_dtypes or call.key_dtype != call.dtype:
        yield f"dtype {call.dtype} is not fp32, bf16 or fp16"


def run(
    layer: DynamicallyComposableAttention,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ctx: AttentionContext,
    *,
    composed: Composed,
) -> Tensor:
    pre, post = composed.mixings
    return implementation().dcmha_attention(q, k, v, pre, post, num_groups=layer.num_groups, window=layer.window)


DCMHA_TRITON = register_kernel(
    Kernel(
        name="dcmha-triton",
        display_name="dcmha-triton (fused Triton, CUDA)",
        run=run,
        serves=("dcmha",),
        static_reasons=static_reasons,
        call_reasons=call_reasons,
    )
)
