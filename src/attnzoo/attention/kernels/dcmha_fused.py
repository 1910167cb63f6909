"""``dcmha-fused`` and ``dcmha-decode``: DCMHA's fused CPU kernels (``csrc/dcmha_fused.cpp``), the layer's attention
with no (B, N, T, S) tensor.

One task computes one query tile of one composition group against every key the tile sees: the logits of its M
heads, the pre-composition with the merged per-token matrices QW[t] + KW[s] (``dcmha.query_matrices``,
``dcmha.key_matrices``), the exact softmax of each row, the post-composition and the product with V, all in
per-thread scratch of O(M·rows·T) floats. The forward pass keeps only the output and each row's log-sum-exp; the
backward pass recomputes a tile and runs the chain rule through the composition, the softmax and the second
composition (the equations are in the source's header). Gradients flow to q, k, v and to QW and KW, whose own
graph (the dynamic-weight projection) autograd differentiates as before.

Why this and not the chunked path (``kernels/chunked.py``): there a block's composition is a chain of
einsums, each a pass over the scores with its own copies, recorded by autograd and recomputed for the backward
pass; here each row's composition is one vectorised loop over the M heads' scores while they are in cache, and
the backward pass is written out rather than recorded. Why C++ (``attention/build.py`` builds it with the
ALiBi kernel): inductor gave no gain on these loops' shape on CPU and Triton has no CPU backend in the wheels.

Cached decoding uses the same library. A prefill into an empty cache is a fresh sequence, so it runs this kernel (a
1,024-token prompt of a 4-layer model about 10× faster than on the chunked path); each later token runs
``dcmha_decode_forward`` (:func:`decode_attention`), one task per (batch, group) that composes, normalises and
multiplies the new query's row over the cache's slots in place, reading the cached key-side matrices where they lie;
the token's own matrices come from ``dcmha_step_weights`` (:func:`step_weights`), one call for what the PyTorch
path does in about 85 operators a layer: a kernel of the layer's composition weights (:data:`DCMHA_STEP_WEIGHTS`),
which the dispatcher chooses for each call as it does the attention's, by the record's reasons.

The records' reasons say where each runs; the layer otherwise takes its next kernel (the chunked PyTorch path), which is
also the reference the tests hold the kernels to.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attnzoo.attention.kernels import build, cpu, dcmha_compiled
from attnzoo.attention.kernels.cpu import register_cpu_kernel
from attnzoo.attention.kernels.kernel import Kernel

if TYPE_CHECKING:
    from attnzoo.attention.base import AttentionContext
    from attnzoo.attention.dcmha import Composed, CompositionWeights, DynamicallyComposableAttention
    from attnzoo.attention.kernels.kernel import Call
    from attnzoo.config import ModelConfig

KERNEL_NAME = "dcmha-fused (C++, CPU)"
DECODE_KERNEL_NAME = "dcmha-decode (C++, CPU)"
MAX_HEADS_PER_GROUP = 32  # the source's kMaxHeads: a row's M head scores are held as M vectors
# A task keeps up to three (M, rows, T) fp32 tile buffers (S, P and dP in the backward pass), written once and read
# once per pass, while each key block of K_BLOCK columns is worked on in cache. Rows per tile: as many as keep one
# buffer within SCRATCH_BYTES, between MIN_ROWS and MAX_ROWS. Wider blocks give the tile GEMMs better shapes and
# fewer calls; buffers past about 2 MB fall out of cache between the passes, and 64-row tiles trained about 10%
# slower than the budget's 16 or 32 at T = 2048 and 4096 (benchmarks/results/source-comments.md).
SCRATCH_BYTES = 2 << 20
MIN_ROWS, MAX_ROWS = 16, 64
K_BLOCK = 1024


def query_tile(heads_per_group: int, keys: int) -> int:
    """Rows per query tile for M heads against up to ``keys`` keys: the largest power of 2 in
    [MIN_ROWS, MAX_ROWS] whose (M, rows, keys) fp32 buffer fits :data:`SCRATCH_BYTES`."""
    rows = SCRATCH_BYTES // (4 * heads_per_group * keys)
    return max(MIN_ROWS, min(MAX_ROWS, 1 << max(0, rows.bit_length() - 1)))


class FusedDCMHA(torch.autograd.Function):
    """Causal DCMHA attention through ``torch.ops.attnzoo.dcmha_fused_forward``; the backward pass recomputes each
    tile from the saved inputs and log-sum-exp (``dcmha_fused_backward``)."""

    @staticmethod
    def forward(
        ctx,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        slopes: Tensor | None,
        groups: int,
        window: int | None,
        *matrices: Tensor | None,
    ) -> Tensor:
        q32, k32, v32 = cpu.fp32_rows(q, k, v)
        matrices = tuple(None if m is None else m.detach() for m in matrices)
        rows = query_tile(q.shape[1] // groups, q.shape[2] if window is None else min(q.shape[2], window))
        scale = 1.0 / math.sqrt(q.shape[-1])
        settings = (groups, window or 0, scale, rows, K_BLOCK)
        out, lse = torch.ops.attnzoo.dcmha_fused_forward(q32, k32, v32, *matrices, slopes, *settings)
        ctx.save_for_backward(q, k, v, slopes, lse, *matrices)
        ctx.settings = settings
        return out.to(q.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, slopes, lse, *matrices = ctx.saved_tensors
        groups = ctx.settings[0]
        # Enough (batch, group, part) tasks for every thread; each part's key-side sums are its own.
        parts = max(1, min(math.ceil(torch.get_num_threads() / (q.shape[0] * groups)), q.shape[2] // ctx.settings[3]))
        q32, k32, v32 = cpu.fp32_rows(q, k, v)
        grads = torch.ops.attnzoo.dcmha_fused_backward(
            *cpu.fp32_rows(grad_out), q32, k32, v32, *matrices, slopes, lse, *ctx.settings, parts
        )
        grad_q, grad_k, grad_v = (grad.to(x.dtype) for grad, x in zip(grads[:3], (q, k, v), strict=True))
        grad_matrices = [None if m is None else grad for grad, m in zip(grads[3:], matrices, strict=True)]
        return grad_q, grad_k, grad_v, None, None, None, *grad_matrices


def dcmha_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    matrices: list[Tensor | None],
    *,
    slopes: Tensor | None,
    groups: int,
    window: int | None,
) -> Tensor:
    """Causal DCMHA attention of q (B, H, T, d) over k (B, H_kv, T, d), v (B, H_kv, T, d_v) by the fused kernel,
    differentiable in q, k, v and the matrices. ``matrices``: [QW, KW] of the pre- and of the post-composition, QW
    (B, G, T, M, M) and KW (B, G, M, M, T), fp32, None where a composition is off (KW also where query-wise);
    ``slopes`` (H,) adds ALiBi's m_h·(s − t) to the logits; ``window``: a query sees its last ``window`` keys.
    Query head h reads kv head h // (H / H_kv). Returns (B, H, T, d_v) in q's dtype; raises where the extension
    cannot be built (the record's reasons say so beforehand)."""
    build.ensure_built()
    matrices = [None if m is None else m.contiguous() for m in matrices]
    return FusedDCMHA.apply(q, k, v, slopes, groups, window, *matrices)


def decode_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    matrices: list[Tensor | None],
    *,
    slopes: Tensor | None,
    key_positions: Tensor,
    query_position: int,
    groups: int,
    window: int | None,
) -> Tensor:
    """One decoding step of DCMHA attention by ``dcmha_decode_forward``, no autograd: q (B, H, 1, d) at
    ``query_position`` over a cache's k (B, H_kv, S, d), v (B, H_kv, S, d_v) whose slot s holds position
    ``key_positions[s]``, in any order (a local layer's ring), fp32. ``matrices`` as :func:`dcmha_attention`'s, QW
    (B, G, 1, M, M) and KW (B, G, M, M, S) read in place from the cache. Returns (B, H, 1, d_v)."""
    build.ensure_built()
    query_side = [None if m is None else m.contiguous() for m in matrices[::2]]
    matrices = [query_side[0], matrices[1], query_side[1], matrices[3]]
    scale = 1.0 / math.sqrt(q.shape[-1])
    return torch.ops.attnzoo.dcmha_decode_forward(
        q.contiguous(), k, v, *matrices, slopes, key_positions.contiguous(), query_position, groups, window or 0, scale
    )


def step_weights(layer: DynamicallyComposableAttention, x: Tensor) -> tuple[dict[int, Tensor], dict[int, Tensor]]:
    """The composition matrices of one token per sequence by ``dcmha_step_weights``: ({composition: QW (B, G, 1, M,
    M)}, {composition: KW (B, G, M, M, 1)}), the values ``query_matrices`` and ``key_matrices`` give after the
    layer's dynamic-weight projection of ``x`` (B, 1, D). The PyTorch path runs about 85 operators a layer here, whose
    dispatch took about 1.2 ms of a 4.1 ms step of a 4-layer model (1,024-token context, 1 thread). The matrices serve
    whichever kernel then attends (this module's decoding kernel, or the chunked one where the compiled composition
    leaves it out); the record :data:`DCMHA_STEP_WEIGHTS` says where it runs."""
    opts = layer.options
    compositions = composed(layer)
    query_w, key_w = torch.ops.attnzoo.dcmha_step_weights(
        x[:, 0].contiguous(), *projection_weights(layer)[:3], layer.static_w, compositions, opts.query_wise
    )
    queries = {which: query_w[i] for i, which in enumerate(compositions)}
    keys = {} if opts.query_wise else {which: key_w[:, i, ..., None] for i, which in enumerate(compositions)}
    return queries, keys


def composed(layer: DynamicallyComposableAttention) -> list[int]:
    """The compositions the layer runs: 0 pre, 1 post."""
    return [which for which, on in enumerate((layer.options.pre_compose, layer.options.post_compose)) if on]


def projection_weights(layer: DynamicallyComposableAttention) -> list[Tensor]:
    """dw1, qkw, dd of the dynamic-weight projection, and W_b where the layer has it."""
    projection = layer.dyn_w_proj
    return [projection.dw1, projection.qkw, projection.dd] + ([] if layer.static_w is None else [layer.static_w])


def step_static_reasons(cfg: ModelConfig) -> Iterator[str]:
    opts = cfg.attention_opts
    if opts.static_only:
        yield "static_only: the matrices are I + W_b, with no projection to run"
    if not (opts.pre_compose or opts.post_compose):
        yield "no composition is on"
    if cfg.attn_backend == "eager":
        yield "the eager reference runs throughout"


def step_call_reasons(layer: DynamicallyComposableAttention, call: Call) -> Iterator[str]:
    """Asked lazily and in order, so the extension is built only where every cheaper reason passed."""
    if not call.cached:
        yield "the call continues no cache"
    if call.queries != 1:
        yield "the call has several tokens"
    if call.device_type != "cpu":
        yield "the tensors are not on the CPU"
    if call.static:
        yield "a static step (compiled decoding)"
    if call.compiling:
        yield "torch.compile is tracing (the op has no fake kernel)"
    if torch.is_autocast_enabled(call.device_type):
        yield "autocast is on: the PyTorch path's matmuls run in its dtype"
    weights = projection_weights(layer)
    if any(dtype != torch.float32 for dtype in (call.dtype, *(weight.dtype for weight in weights))):
        yield "the input or the weights are not fp32"
    if call.autograd or (torch.is_grad_enabled() and any(weight.requires_grad for weight in weights)):
        yield "autograd wants the weights' gradients"
    yield from cpu.extension_reasons(call)


def run_step_weights(layer: DynamicallyComposableAttention, x: Tensor) -> CompositionWeights:
    return (None, None), *step_weights(layer, x)


def run_pytorch_weights(layer: DynamicallyComposableAttention, x: Tensor) -> CompositionWeights:
    return layer.composition_weights(x)


# The kernels of DCMHA's composition weights (``stage_chain``: the mechanism's ``weight_kernels``), which form the
# call's composition matrices before it attends: QW of its queries and KW of its keys, which the cache keeps. They are
# not attention kernels (no attn_backend, so not registered): ``run(layer, x)`` returns the (pre, post) mixings
# (None where not formed), {composition: QW} and {composition: KW}. The fused op forms a decoding step's token in one
# call; the layer's PyTorch projection, the reference, forms the rest.
DCMHA_STEP_WEIGHTS = Kernel(
    name="dcmha-step-weights",
    display_name="dcmha-step-weights (C++, CPU)",
    run=run_step_weights,
    serves=("dcmha",),
    static_reasons=step_static_reasons,
    call_reasons=step_call_reasons,
    masks_padding=True,  # one token's matrices: a padding mask changes nothing
    ops=("dcmha_step_weights",),
)
PYTORCH_WEIGHTS = Kernel(
    name="dcmha-weights",
    display_name="DCMHA's dynamic-weight projection (PyTorch)",
    run=run_pytorch_weights,
    serves=("dcmha",),
    masks_padding=True,
)
WEIGHT_KERNELS = (DCMHA_STEP_WEIGHTS, PYTORCH_WEIGHTS)


def static_reasons(cfg: ModelConfig) -> Iterator[str]:
    opts = cfg.attention_opts
    yield from dcmha_compiled.static_reasons(cfg)
    if not cfg.causal:
        yield "the model is bidirectional"
    heads_per_group = cfg.n_heads // opts.num_groups
    if heads_per_group > MAX_HEADS_PER_GROUP:
        yield f"{heads_per_group} heads per group exceed {MAX_HEADS_PER_GROUP}"


def layer_reasons(layer: DynamicallyComposableAttention, call: Call, dtypes: tuple[torch.dtype, ...]) -> Iterator[str]:
    if call.position.adds_bias and call.position.bias_slopes(layer.n_heads) is None:
        yield "the positional bias is not a linear one (ALiBi)"
    if call.dropout > 0:
        yield "attention dropout is on"
    if call.dtype not in dtypes or call.key_dtype != call.dtype:
        yield f"dtype {call.dtype} is not one of {list(dtypes)}"


def fused_reasons(layer: DynamicallyComposableAttention, call: Call) -> Iterator[str]:
    if call.start != 0:  # a prefill into an empty cache is a fresh sequence
        yield "the queries continue a cache"
    yield from layer_reasons(layer, call, cpu.DTYPES)


def decode_reasons(layer: DynamicallyComposableAttention, call: Call) -> Iterator[str]:
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
    return dcmha_attention(
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
    return decode_attention(
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


DCMHA_FUSED = register_cpu_kernel(
    name="dcmha-fused",
    display_name=KERNEL_NAME,
    run=run_fused,
    serves=("dcmha",),
    static_reasons=static_reasons,
    call_reasons=fused_reasons,
    ops=("dcmha_fused_forward",),
)
DCMHA_DECODE = register_cpu_kernel(
    name="dcmha-decode",
    display_name=DECODE_KERNEL_NAME,
    run=run_decode,
    serves=("dcmha",),
    static_reasons=static_reasons,
    call_reasons=decode_reasons,
    ops=("dcmha_decode_forward",),
)
