"""``F.scaled_dot_product_attention`` with the semantics of the eager reference, for everything SDPA can express:
GQA, a positional bias, a per-row logit scale (selective's τ_q), values wider than queries (Diff). A positional
scheme's own kernel may run SDPA's calls instead, tried just before it by "auto" (ALiBi's ``alibi-flash``:
``alibi_flash.py``); ``attn_backend="sdpa"`` runs SDPA alone."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnzoo.attention.base import ATTENTION, AttentionContext, visible
from attnzoo.attention.kernels.eager import repeat_kv
from attnzoo.attention.kernels.kernel import Call, Kernel, register_kernel

if TYPE_CHECKING:
    from attnzoo.attention.base import Attention
    from attnzoo.config import ModelConfig
    from attnzoo.positions import PositionalEncoding


def sdpa_pads_queries(device: torch.device) -> bool:
    """Whether SDPA on ``device`` needs queries and keys zero-padded to the width of wider values.

    CUDA's memory-efficient kernel takes a value head size different from the query/key size, so Diff's 2d
    values need no change there (the official ``flashdiff_1``). On CPU, unequal sizes silently fall back to
    SDPA's math path, which materialises the T×S map. Padding q and k with zeros leaves every logit
    unchanged and lets the fused kernel run: for Diff on CPU it beat the official four calls on value halves
    (``flashdiff_2``) by about 20% (fwd+bwd, T=1024, 2 threads), since both do twice MHA's QKᵀ work but
    padding launches half the calls.
    """
    return device.type != "cuda"


def sdpa_takes_bias_with_causal(q: Tensor, k: Tensor, v: Tensor, dropout_p: float) -> bool:
    """Whether SDPA's causal kernel can also add a positional bias for these inputs.

    The CPU flash kernel (``aten._scaled_dot_product_flash_attention_for_cpu``) takes an ``attn_mask`` together
    with ``is_causal`` and keeps its causal block skipping; its public entry point refuses the pair, which PyTorch
    documents as exclusive, so the kernel is called directly, on CPU only, without dropout (which it does not
    run), for equal dtypes (the entry point would cast them under autocast) and equal head sizes (unless
    ``sdpa_pads_queries``, Diff's wider values). Elsewhere the bias and the causal
    mask become one additive mask, which loses the block skipping: fwd+bwd of (4, 8, 1024, 32) ALiBi attention
    took 267 ms with the bias and the causal flag, 753 ms with one additive mask and 109 ms for plain causal
    attention (CPU, 1 thread, contended), and the 4-layer training step at T = 1024 1.7× plain causal against
    3.4×. What is left is the kernel's backward pass with a mask, 3× its causal one (forward 1.6×). Folding ALiBi
    into q·k (an extra head dimension holding m·j, softmax dropping the row's m·i) would run the plain kernel but
    round the logits of nearby keys to the precision of m·T, so it is not done.
    """
    return (
        q.device.type == "cpu"
        and dropout_p == 0
        and q.dtype == k.dtype == v.dtype
        and q.shape[-1] == v.shape[-1]
        and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")
    )


def sdpa_with_causal_bias(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: float | None) -> Tensor:
    """Causal attention of q over k, v (B, H, T, d) with the additive ``bias`` (1, H, T, T) on the scaled logits,
    by the CPU flash kernel (:func:`sdpa_takes_bias_with_causal` says when it applies)."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, attn_mask=bias, scale=scale)[
        0
    ]


# Query rows per block of sdpa_biased_in_blocks. One layer's forward at T = 8192 (8 heads, d = 32, 1 thread) took
# 2.8 / 2.2 / 3.1 s in blocks of 256 / 512 / 1024 rows, biases included, and 1.8 s as one call with the whole bias
# (its build shared by 4 layers).
BIAS_BLOCK_ROWS = 512


def sdpa_biased_in_blocks(
    q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, *, scale: float | None, dropout_p: float, bias_repeat: int
) -> Tensor:
    """Causal attention with a positional bias over a fresh sequence, without a (1, H, T, T) tensor: the queries in
    blocks of :data:`BIAS_BLOCK_ROWS`, each against the keys up to its last row with its own bias and causal mask, so
    masks take O(H·T·rows) memory. The whole bias is 2 GB at T = 8192 and 8 heads, and grows with T²: this is the
    path of inference (evaluating ALiBi's extrapolation, prefilling a long prompt), which keeps no mask for a
    backward pass. Each row sees the same keys and bias as in one call, so the output is the same (measured bit
    for bit on CPU); a block pays for its diagonal tile's masked half and its own bias.

    q, k, v: (B, H, T, ·) with k and v already repeated to H heads.
    """
    n_heads, query_len = q.shape[1], q.shape[2]
    key_positions = ctx.key_positions(query_len)
    outs = []
    for first in range(0, query_len, BIAS_BLOCK_ROWS):
        rows = slice(first, min(query_len, first + BIAS_BLOCK_ROWS))
        q_positions, k_positions = ctx.positions[rows], key_positions[: rows.stop]
        bias = ctx.position_bias(n_heads, q_positions, k_positions, bias_repeat)
        mask = bias.masked_fill(~visible(q_positions, k_positions), float("-inf"))[None].to(q.dtype)
        keys, values = k[:, :, : rows.stop], v[:, :, : rows.stop]
        outs.append(
            F.scaled_dot_product_attention(
                q[:, :, rows], keys, values, attn_mask=mask, dropout_p=dropout_p, scale=scale
            )
        )
    return torch.cat(outs, dim=2)


def sdpa_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ctx: AttentionContext,
    *,
    scale: float | None = None,
    dropout_p: float = 0.0,
    bias_repeat: int = 1,
    query_scale: Tensor | None = None,
) -> Tensor:
    """``F.scaled_dot_product_attention`` with the semantics of :func:`eager_attention` without hooks.

    Plain causal attention over a fresh sequence uses ``is_causal`` (block skipping, no T×S mask), and
    bidirectional attention (``ctx.causal`` false) no mask at all. With a positional bias, a fresh causal sequence
    passes the bias with the causal flag where the kernel takes both (:func:`sdpa_takes_bias_with_causal`: CPU);
    otherwise, and on a non-empty cache, bias and mask enter as one additive mask. Without autograd recording, a
    fresh biased sequence longer than :data:`BIAS_BLOCK_ROWS` runs in query blocks (:func:`sdpa_biased_in_blocks`),
    so inference never builds the T×T bias.
    """
    if query_scale is not None:
        # Scaling query row t scales logit row t before the bias is added: the eager kernel's row scale.
        q = q * query_scale[..., None].to(q.dtype)
    has_bias = ctx.position.adds_bias
    fresh_biased = has_bias and ctx.causal and q.shape[2] == k.shape[2] > 1
    if v.shape[-1] > q.shape[-1] and sdpa_pads_queries(q.device):
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale  # the scale of the true width
        width = v.shape[-1] - q.shape[-1]
        q, k = F.pad(q, (0, width)), F.pad(k, (0, width))  # zeros add nothing to q·k
    n_heads, query_len, key_len = q.shape[1], q.shape[2], k.shape[2]
    k, v = repeat_kv(k, n_heads // k.shape[1]), repeat_kv(v, n_heads // v.shape[1])
    if not ctx.static and not has_bias and query_len in (1, key_len):
        # A fresh sequence is plain causal (or bidirectional); a single new token sees every cached key (on a
        # growing cache: a static step's keys include slots only its mask excludes).
        is_causal = query_len > 1 and ctx.causal
        return sdpa_step(q, k, v, dropout_p=dropout_p, is_causal=is_causal, scale=scale)
    records = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
    if fresh_biased and query_len > BIAS_BLOCK_ROWS and not records:  # inference: no (1, H, T, T) bias
        return sdpa_biased_in_blocks(q, k, v, ctx, scale=scale, dropout_p=dropout_p, bias_repeat=bias_repeat)
    if fresh_biased and sdpa_takes_bias_with_causal(q, k, v, dropout_p):
        # A fresh causal sequence with a bias (ALiBi): the causal kernel adds the bias itself.
        return sdpa_with_causal_bias(q, k, v, ctx.sdpa_bias(n_heads, key_len, bias_repeat, q.dtype), scale)
    mask = ctx.sdpa_mask(n_heads, key_len, bias_repeat, q.dtype)
    return sdpa_step(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)


# A decode step on CUDA leaves cuDNN out: cuDNN's attention builds an execution graph for each new key length, and
# a growing cache brings one at every step, which made an eager step on an H100 about 12× slower
# (benchmarks/results/gpu-2026-11-26). Flash and memory-efficient attention take any length.
DECODE_BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)


def sdpa_step(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
    """``F.scaled_dot_product_attention``, restricted to :data:`DECODE_BACKENDS` for one query row on CUDA in
    eager mode (a compiled step has static shapes, so cuDNN builds its graph once)."""
    if q.shape[2] == 1 and q.is_cuda and not torch.compiler.is_compiling():
        with sdpa_kernel(list(DECODE_BACKENDS)):
            return F.scaled_dot_product_attention(q, k, v, **kwargs)
    return F.scaled_dot_product_attention(q, k, v, **kwargs)


def sdpa_call(
    q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, *, record: bool = True, **kernel: Any
) -> tuple[Tensor, Tensor | None]:
    """:func:`sdpa_attention` as a PyTorch kernel (:data:`~attnzoo.attention.kernels.eager.PyTorchKernel`): it
    records no map (``record`` is the eager reference's)."""
    return sdpa_attention(q, k, v, ctx, **kernel), None


def run_sdpa(layer: Attention, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, **inputs: Any) -> Tensor:
    return layer.pytorch_attention(sdpa_call, q, k, v, ctx, **inputs)


def sdpa_static_reasons(cfg: ModelConfig) -> Iterator[str]:
    if ATTENTION.get(cfg.attention).needs_scores:
        yield f"{cfg.attention} acts on the attention scores, which SDPA does not expose"


def records_scores(layer: Attention, call: Call) -> Iterator[str]:
    """The one per-call reason of the PyTorch kernels other than the reference."""
    if call.records_scores:
        yield "attention maps or logits are recorded: only the eager reference returns them"


def describe_sdpa(cfg: ModelConfig, position: PositionalEncoding) -> str:
    if not (position.adds_bias and cfg.causal):
        return "SDPA flash (CPU)"
    return "SDPA flash (CPU) with a (1, H, T, T) bias"


SDPA = register_kernel(
    Kernel(
        name="sdpa",
        display_name="SDPA",
        run=run_sdpa,
        static_reasons=sdpa_static_reasons,
        call_reasons=records_scores,
        describe=describe_sdpa,
    )
)
