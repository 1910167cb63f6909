"""The eager reference: explicit fp32 scores and softmax (float64 in a float64 model), and the hooks through which a
mechanism that acts on the scores or the probabilities (DCMHA's composition) reuses it."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from attnzoo.attention.base import AttentionContext, visible
from attnzoo.attention.kernels.kernel import Kernel, register_kernel
from attnzoo.precision import compute_dtype

if TYPE_CHECKING:
    from attnzoo.attention.base import Attention

ScoreHook = Callable[[Tensor], Tensor]
# A PyTorch kernel as a mechanism calls it (``Attention.pytorch_attention``): (q, k, v, ctx, **arguments) → the
# output and, where the eager reference records maps, the probabilities.
PyTorchKernel = Callable[..., tuple[Tensor, "Tensor | None"]]


class Hooks(NamedTuple):
    """A mechanism's changes inside the eager kernel, for one block of queries × keys; (B, H, T, S) in the compute
    dtype (fp32, or float64 for a float64 model)."""

    scores: ScoreHook | None = None  # on the scaled logits plus bias, before the mask
    probs: ScoreHook | None = None  # on the softmax probabilities: the map that weighs V and is recorded
    mask: Tensor | None = None  # (T, S) bool, True where query t may see key s: replaces the causal mask


NO_HOOKS = Hooks()
HookInputs = Sequence[Tensor | None]
# (query rows, key columns, hook inputs) of a block → that block's hooks. A hook reads every tensor that needs a
# gradient from the hook inputs (the PyTorch kernels' ``hook_inputs``), never from a closure: a block recomputed in the
# backward pass (``chunked_attention``) is differentiated with respect to its inputs only.
BlockHooks = Callable[[slice, slice, HookInputs], Hooks]


def no_hooks(rows: slice, cols: slice, inputs: HookInputs) -> Hooks:
    return NO_HOOKS


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """(B, H_kv, S, d) → (B, H_kv·n_rep, S, d): query head h reads kv head h // n_rep, as in HF LLaMA."""
    if n_rep == 1:
        return x
    b, h_kv, s, d = x.shape
    return x[:, :, None].expand(b, h_kv, n_rep, s, d).reshape(b, h_kv * n_rep, s, d)


def eager_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ctx: AttentionContext,
    *,
    scale: float | None = None,
    dropout_p: float = 0.0,
    bias_repeat: int = 1,
    query_scale: Tensor | None = None,
    hooks: Hooks = NO_HOOKS,
    window: int | None = None,
    positions: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """Reference attention with explicit fp32 logits and softmax (float64 for float64 inputs: see
    :func:`attnzoo.precision.compute_dtype`). Returns (output, probabilities).

    q: (B, H, T, d); k: (B, H_kv, S, d); v: (B, H_kv, S, d_v). In order: logits q·kᵀ·scale → × ``query_scale``
    (B, H, T) per row → + positional bias → ``hooks.scores`` → mask → softmax → ``hooks.probs`` → dropout → ·V.
    The mask is causal, within the last ``window`` keys if given, unless ``hooks.mask`` replaces it.
    ``positions`` are the (query, key) absolute positions when they are not this call's queries against keys
    0 .. S−1 (a block of a chunked call, a ring cache). ``bias_repeat`` adjacent query heads share one
    positional-bias head (sub-heads of one differential head).
    """
    batch, n_heads, query_len, head_dim = q.shape
    n_kv_heads, key_len = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    # GQA without copying k and v: the n_rep query heads of a kv head are stacked along the query axis.
    if q.dtype == compute_dtype(q.dtype):
        # fp32/fp64: scaling the (T, d) queries instead of the (T, S) logits is one rounding either way, S/d
        # times less work, and one pass over the scores fewer forward and backward.
        logits = (q * scale).reshape(batch, n_kv_heads, -1, head_dim) @ k.transpose(-2, -1)
    else:
        logits = (q.reshape(batch, n_kv_heads, -1, head_dim) @ k.transpose(-2, -1)).to(compute_dtype(q.dtype)) * scale
    logits = logits.view(batch, n_heads, query_len, key_len)
    if query_scale is not None:
        logits = logits * query_scale[..., None]
    if positions is None:
        bias = ctx.score_bias(n_heads, key_len, bias_repeat)
    else:
        bias = ctx.position_bias(n_heads, *positions, bias_repeat)
    if bias is not None:
        logits = logits + bias
    if hooks.scores is not None:
        logits = hooks.scores(logits)
    if hooks.mask is not None:
        allowed = hooks.mask
    else:
        allowed = ctx.allowed(key_len, window) if positions is None else visible(*positions, window, ctx.causal)
    blind = None
    if ctx.key_padding is not None:
        allowed = ctx.padded(allowed, ctx.key_positions(key_len) if positions is None else positions[1])
        # A query that sees only padding (a left-padded row) takes the softmax over every key and then 0: no NaN
        # reaches the output or, through the softmax's backward, the gradients.
        blind = ~allowed.any(dim=-1, keepdim=True)
    ctx.record_logits(logits, allowed)
    probs = torch.softmax(logits.masked_fill(~(allowed if blind is None else allowed | blind), float("-inf")), dim=-1)
    if blind is not None:
        probs = probs.masked_fill(blind, 0)
    if hooks.probs is not None:
        probs = hooks.probs(probs)
    dropped = F.dropout(probs, p=dropout_p) if dropout_p > 0 else probs
    out = dropped.to(v.dtype).reshape(batch, n_kv_heads, -1, key_len) @ v
    return out.view(batch, n_heads, query_len, -1), probs


def eager_call(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ctx: AttentionContext,
    *,
    hooks: BlockHooks | None = None,
    hook_inputs: HookInputs = (),
    window: int | None = None,
    key_positions: Tensor | None = None,
    chunk: int | None = None,
    record: bool = True,
    **kernel: Any,
) -> tuple[Tensor, Tensor | None]:
    """:func:`eager_attention` over all queries and keys, as a PyTorch kernel (:data:`PyTorchKernel`): returns the
    output and, when the context records maps, the probabilities after ``hooks.probs``, which are recorded as this
    layer's map unless ``record`` is false (a mechanism whose map combines several calls records the combination).
    ``chunk`` is the chunked kernel's, which the reference ignores."""
    block_hooks = (hooks or no_hooks)(slice(None), slice(None), hook_inputs)
    positions = None if key_positions is None else (ctx.positions, key_positions)
    out, probs = eager_attention(q, k, v, ctx, hooks=block_hooks, window=window, positions=positions, **kernel)
    if ctx.attention_maps is None:
        return out, None
    if record:
        ctx.record(probs)
    return out, probs


def run_eager(layer: Attention, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, **inputs: Any) -> Tensor:
    return layer.pytorch_attention(eager_call, q, k, v, ctx, **inputs)


EAGER = register_kernel(
    Kernel(
        name="eager",
        display_name="the eager reference",
        run=run_eager,
        masks_padding=True,
    )
)
