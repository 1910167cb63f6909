"""DCMHA's composition compiled for the training path (``attention_options.compile_composition``).

The eager composition (:func:`attnzoo.attention.dcmha.compose_merged`) runs einsums, which copy a block's
(B, N, rows, keys) scores into token-major layouts for batched M×M matmuls, forward and backward. Here an autograd
Function runs small graphs compiled by inductor, each one fused loop over the scores in their own layout:

* the composition A'[m] = Σ_n A[n]·(QW[t][n, m] + KW[s][n, m]), summed over the input head n as M broadcast
  products (:func:`compose_sum`), so each score is read once for all M output heads. The gradient to the scores is
  the same map with transposed matrices, so the backward pass reuses the graph;
* the gradients to QW and KW (:func:`composition_weight_grads`), products of scores and gradients reduced over the
  keys and over the queries.

The graphs are compiled without autograd: the Function's backward is written out, so AOTAutograd never
differentiates the fused loops (its own backward of the same forward materialised score-sized temporaries and ran
5× slower than the forward). Numerics: sums in another order than the einsums, so results agree with the eager
composition to fp32 rounding, not bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import cache
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from attnzoo.attention.dcmha import DCMHAOptions
    from attnzoo.config import ModelConfig


def runs_compiled(options: DCMHAOptions, *, cached: bool) -> bool:
    """Whether a call's composition runs compiled: where ``compile_composition`` asks for it (the one place the option
    is read), on fresh sequences only, since a cached call's blocks are single tokens or short prompts."""
    return options.compile_composition and not cached


def static_reasons(cfg: ModelConfig) -> Iterator[str]:
    """Why a kernel that composes in its own loops (the fused C++ kernels) cannot serve ``cfg``: it asks for this
    PyTorch composition."""
    if runs_compiled(cfg.attention_opts, cached=False):
        yield "compile_composition asks for the compiled PyTorch composition"


def compose_sum(scores: Tensor, query_w: Tensor, key_w: Tensor | None) -> Tensor:
    """The map of ``compose_merged`` as M broadcast products summed over the input head, for inductor to fuse.

    scores: (B, N, T, S); query_w: (B, G, T, M, M) and key_w: (B, G, M, M, S) or None, indexed [input, output].
    Run eagerly it would make M score-sized temporaries: it is only ever run compiled.
    """
    batch, _, query_len, key_len = scores.shape
    groups, heads_per_group = query_w.shape[1], query_w.shape[-1]
    grouped = scores.view(batch, groups, heads_per_group, 1, query_len, key_len)  # [b, g, n, 1, t, s]
    by_query = query_w.permute(0, 1, 3, 4, 2).unsqueeze(-1)  # QW as [b, g, n, m, t, 1]
    by_key = None if key_w is None else key_w.unsqueeze(-2)  # KW as [b, g, n, m, 1, s]
    out = None
    for head in range(heads_per_group):
        weights = by_query[:, :, head] if by_key is None else by_query[:, :, head] + by_key[:, :, head]
        term = grouped[:, :, head] * weights
        out = term if out is None else out + term
    # Contiguous, as the einsums' output: left to itself inductor writes (b, t, m, s), and every op after it copies.
    return out.reshape(scores.shape).contiguous()


def composition_weight_grads(scores: Tensor, grad: Tensor, groups: int) -> tuple[Tensor, Tensor]:
    """The gradients of ``compose_sum``'s output to QW (B, G, T, M, M) and KW (B, G, M, M, S), given the gradient
    ``grad`` (B, N, T, S) to that output: Σ over keys, and over queries, of scores[n]·grad[m]."""
    batch, n_heads, query_len, key_len = scores.shape
    heads_per_group = n_heads // groups
    products = scores.view(batch, groups, heads_per_group, 1, query_len, key_len) * grad.view(
        batch, groups, 1, heads_per_group, query_len, key_len
    )  # [b, g, n, m, t, s]
    return products.sum(-1).permute(0, 1, 4, 2, 3).contiguous(), products.sum(-2).contiguous()


@cache
def _compiled(function: Callable) -> Callable:
    return torch.compile(function)


def _dynamic(tensor: Tensor, *dims: int) -> Tensor:
    """``tensor`` detached and contiguous, its token axes ``dims`` marked dynamic, so blocks of every length and the
    forward and backward passes share one graph: dynamo would also specialise a view's storage offset and strides
    at 0 and 1, and tell inputs that require grad (the forward's) from those that do not (the backward's)."""
    tensor = tensor.detach().contiguous()
    if not torch.compiler.is_compiling():  # inside a compiled model (``train.compile``) its graph decides
        for dim in dims:
            torch._dynamo.maybe_mark_dynamic(tensor, dim)
    return tensor


def _compose(scores: Tensor, query_w: Tensor, key_w: Tensor | None) -> Tensor:
    key_w = None if key_w is None else _dynamic(key_w, 4)
    return _compiled(compose_sum)(_dynamic(scores, 2, 3), _dynamic(query_w, 2), key_w)


class _CompiledComposition(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores: Tensor, query_w: Tensor, key_w: Tensor | None) -> Tensor:
        ctx.save_for_backward(scores, query_w, key_w)
        return _compose(scores, query_w, key_w)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        scores, query_w, key_w = ctx.saved_tensors
        need_scores, need_query_w, need_key_w = ctx.needs_input_grad
        grad_scores = grad_query_w = grad_key_w = None
        if need_scores:  # the transposed map: dA[n] = Σ_m dA'[m]·(QW[t][n, m] + KW[s][n, m])
            grad_scores = _compose(grad, query_w.mT, None if key_w is None else key_w.transpose(2, 3))
        if need_query_w or need_key_w:
            grad_query_w, grad_key_w = _compiled(composition_weight_grads)(
                _dynamic(scores, 2, 3), _dynamic(grad, 2, 3), query_w.shape[1]
            )
        return grad_scores, grad_query_w if need_query_w else None, grad_key_w if need_key_w else None


def compiled_compose(scores: Tensor, query_w: Tensor, key_w: Tensor | None) -> Tensor:
    """``compose_merged(scores, query_w, key_w)``, forward and backward through compiled fused loops.

    Each graph is compiled once for blocks of every query and key length (they are marked dynamic), per dtype,
    batch size, head grouping and with or without KW, plus once more for a block of a single query (dynamo
    specialises axes of size 1). The head axes stay static, so the sums over heads are unrolled.
    """
    return _CompiledComposition.apply(scores, query_w, key_w)
