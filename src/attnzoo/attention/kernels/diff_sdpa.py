"""``diff-halves`` and ``diff-stacked``: differential attention's two maps in one SDPA call, two head layouts for the
GPU (issue 36), chosen by name (``attn_backend``) until a GPU has timed them against the default two calls.

Diff's maps share their values, which are 2d wide while queries and keys are d wide (d = head_dim / 2). The default
PyTorch path (``sdpa``) makes one SDPA call per map; on CUDA unequal widths leave flash attention out, so each call
runs the memory-efficient kernel. The two layouts here make one call of all of a layer's maps instead:

* ``diff-halves``, the official ``multihead_flashdiff_1`` layout in one call: each map against each half of V, 4H
  heads all d wide, so flash attention (or cuDNN) takes it; QKᵀ is computed twice per map, as there.
* ``diff-stacked``: the 2H maps as heads of one call with V (2d wide) shared by both maps of a differential head;
  QKᵀ once per map, on the kernels that take wider values (memory-efficient; CPU pads q and k, ``sdpa_pads_queries``).

Both keep the striped sub-head order (map m of differential head i is query head 2i + m), so ALiBi's slope of head i
reaches its copies through ``bias_repeat``, and they expand k and v to one copy per query head in that order, which
SDPA's own GQA grouping (head h reads kv head h // n_rep) would not give. The result is A1·V − λ·A2·V, as in
:meth:`~attnzoo.attention.diff.DifferentialAttention.pytorch_attention`, the reference the tests hold both to.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from torch import Tensor

from attnzoo.attention.kernels.kernel import Call, Kernel, register_kernel
from attnzoo.attention.kernels.sdpa import records_scores, sdpa_attention

if TYPE_CHECKING:
    from attnzoo.attention.base import AttentionContext
    from attnzoo.attention.diff import DifferentialAttention


def per_query_head(x: Tensor, n_heads: int, per_head: tuple[int, ...]) -> Tensor:
    """x (B, H_kv, *e, S, w), each e 1 or per_head's, → (B, n_heads·prod(per_head), S, w): kv head j's entries for
    each of the n_rep differential heads that read it (heads j·n_rep …), in the order (head, *per_head)."""
    batch, n_kv_heads, *_, length, width = x.shape
    expanded = x[:, :, None].expand(batch, n_kv_heads, n_heads // n_kv_heads, *per_head, length, width)
    return expanded.reshape(batch, -1, length, width)


def run_halves(
    layer: DifferentialAttention, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, *, lam: Tensor
) -> Tensor:
    """Query head 4i + 2m + c is map m of differential head i against half c of its values."""
    batch, _, query_len, d = q.shape
    n_heads, key_len = layer.n_heads, k.shape[2]
    queries = q.view(batch, n_heads, 2, 1, query_len, d).expand(-1, -1, -1, 2, -1, -1).reshape(batch, -1, query_len, d)
    keys = per_query_head(k.view(batch, -1, 2, 1, key_len, d), n_heads, (2, 2))
    halves = v.view(batch, -1, key_len, 2, d).transpose(2, 3)  # (B, H_kv, half, S, d)
    values = per_query_head(halves[:, :, None], n_heads, (2, 2))
    out = sdpa_attention(queries, keys, values, ctx, bias_repeat=4)
    # (B, head, map, half, T, d) → (B, head, map, T, 2d): each map's output over both halves of V.
    maps = (
        out.view(batch, n_heads, 2, 2, query_len, d).permute(0, 1, 2, 4, 3, 5).reshape(batch, n_heads, 2, query_len, -1)
    )
    return maps[:, :, 0] - lam.to(maps.dtype) * maps[:, :, 1]


def run_stacked(
    layer: DifferentialAttention, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, *, lam: Tensor
) -> Tensor:
    """Query head 2i + m is map m of differential head i, against the values of head i, shared by both maps."""
    batch, _, query_len, d = q.shape
    n_heads, key_len = layer.n_heads, k.shape[2]
    keys = per_query_head(k.view(batch, -1, 2, key_len, d), n_heads, (2,))
    values = per_query_head(v[:, :, None], n_heads, (2,))
    out = sdpa_attention(q, keys, values, ctx, dropout_p=layer.attn_dropout, bias_repeat=2)
    maps = out.view(batch, n_heads, 2, query_len, -1)
    return maps[:, :, 0] - lam.to(maps.dtype) * maps[:, :, 1]


def halves_reasons(layer: DifferentialAttention, call: Call) -> Iterator[str]:
    yield from records_scores(layer, call)
    if call.dropout > 0:
        yield "attention dropout is on: it would drop each half of a map's values with its own mask"


DIFF_HALVES = register_kernel(
    Kernel(
        name="diff-halves",
        display_name="diff-halves (one SDPA call, value halves)",
        run=run_halves,
        serves=("diff",),
        call_reasons=halves_reasons,
    )
)
DIFF_STACKED = register_kernel(
    Kernel(
        name="diff-stacked",
        display_name="diff-stacked (one SDPA call, shared values)",
        run=run_stacked,
        serves=("diff",),
        call_reasons=records_scores,
    )
)
