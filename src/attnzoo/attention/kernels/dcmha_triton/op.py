"""DCMHA's fused Triton attention as an operator: composed scores never reach memory.

For a block of queries and one composition group of M heads, the kernel computes the logits of all M heads
tile by tile, pre-composes them with the low-rank per-token weights (query side loaded once per query block,
key side once per key tile), masks (causal, or the last ``window`` keys), takes the softmax, post-composes
the probabilities and multiplies by V. Memory is linear in T: per head it keeps only the log-sum-exp.

Post-composition mixes the *normalised* probabilities of different heads, each with its own normaliser, so
the forward pass runs two passes over the keys: the first finds every head's log-sum-exp of the composed
logits, the second recomputes each tile, normalises it exactly, post-composes and accumulates P'·V. Without
post-composition one online-softmax pass suffices, as in flash attention.

The backward pass recomputes the tiles from q, k, v, the weights and the log-sum-exp (flash attention's
scheme). The softmax's row term D_n[t] = Σ_s P_n·dP_n needs the gradient *after* the post-mix is undone, so
with post-composition it takes one more pass over the keys (in the dq kernel) instead of rowsum(dO∘O). A
query-block kernel then gives dq and the query-side weight gradients (sums over keys); a key-block kernel
gives dk, dv and the key-side weight gradients (sums over queries). Nothing uses atomics: dk and dv are
accumulated per query head and summed over the heads that share a kv head (GQA) afterwards.

Notation per (t, s) and head n, with w1 = qw1/kw1, w2 = qw2/kw2, dd = qdd/kdd of one composition:

    out_m = x_m·(1 + qdd_m[t] + kdd_m[s]) + Σ_r qw2[t,r,m]·X_r + Σ_r kw2[s,r,m]·Y_r,
    X_r = Σ_n qw1[t,r,n]·x_n,  Y_r = Σ_n kw1[s,r,n]·x_n,

the rank-R form of ``compose_merged`` (x = logits before the softmax, probabilities after it).

Here the operator, its autograd and its launches; the Triton programs are in ``jit.py``, how they are tiled and
autotuned in ``tuning.py``.

:func:`dcmha_attention` is what the ``dcmha-triton`` kernel record (this package's ``__init__``) runs; the record
refuses, and the layer runs its next kernel, for anything the kernel does not do: cached decoding, a positional bias
(ALiBi), the static projection, attention dropout, recorded maps, a bidirectional model, float64, or sizes past the
kernel's register budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from attnzoo.attention.kernels.dcmha_triton.jit import dot_options, triton
from attnzoo.attention.kernels.dcmha_triton.tuning import FEATURES_PER_STEP, launch
from attnzoo.validation import is_int, require

if TYPE_CHECKING:
    from attnzoo.attention.dcmha import Mixing

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
DEFAULT_HEADS_PER_PROGRAM = 4  # untuned; the largest of tuning.HEADS_PER_PROGRAM


def runs_on(device_type: str) -> bool:
    """Whether the kernel can run on a device of this type at all: CUDA, with Triton installed."""
    return triton is not None and device_type == "cuda"


def dcmha_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    pre: Mixing | None,
    post: Mixing | None,
    *,
    num_groups: int,
    window: int | None,
    scale: float | None = None,
    block: int | None = None,
    heads_per_program: int | None = None,
) -> Tensor:
    """Causal DCMHA attention of q (B, H, T, d) over k, v (B, H_kv, T, d) by the fused kernel, differentiable in
    q, k, v and every mixing weight. ``pre``/``post``: the compositions' weights (None: off); key-side fields
    None for query-wise composition. Query head h reads kv head h // (H / H_kv). ``block``: queries and keys
    per tile, a power of 2 >= 16 (None: chosen from M and R). ``heads_per_program``: the heads of a group whose
    output (and gradients) one program accumulates, a power of 2 (None: chosen from M; see
    :meth:`KernelSpec.constants`)."""
    require_triton()
    require(
        block is None or (is_int(block) and block >= 16 and block & (block - 1) == 0),
        "block",
        block,
        "must be a power of 2 >= 16 (tl.dot's smallest tile), or None",
    )
    require(q.dtype in KERNEL_DTYPES, "q.dtype", q.dtype, "must be float32, bfloat16 or float16")
    n_heads, seq_len, head_dim = q.shape[1:]
    n_kv_heads = k.shape[1]
    require(
        k.shape == v.shape == (q.shape[0], n_kv_heads, seq_len, head_dim) and k.dtype == v.dtype == q.dtype,
        "k, v shapes",
        (tuple(k.shape), tuple(v.shape)),
        f"must both be (B, H_kv, T, d) = (·, ·, {seq_len}, {head_dim}) in {q.dtype}, as q {tuple(q.shape)}",
    )
    require(n_heads % n_kv_heads == 0, "n_kv_heads", n_kv_heads, f"must divide n_heads={n_heads}")
    require(is_int(num_groups) and num_groups >= 1 and n_heads % num_groups == 0, "num_groups", num_groups,
            f"must divide n_heads={n_heads}")  # fmt: skip
    heads_per_group = n_heads // num_groups
    require(
        heads_per_program is None
        or (is_int(heads_per_program) and heads_per_program >= 1 and heads_per_program & (heads_per_program - 1) == 0),
        "heads_per_program",
        heads_per_program,
        "must be a power of 2, or None",
    )
    mixings = [m for m in (pre, post) if m is not None]
    key_wise = bool(mixings) and mixings[0].kw1 is not None
    rank = mixings[0].qw1.shape[-2] if mixings else 1
    spec = KernelSpec(
        num_groups=num_groups,
        heads_per_group=heads_per_group,
        rank=rank,
        pre=pre is not None,
        post=post is not None,
        key_wise=key_wise,
        window=window,
        scale=1.0 / math.sqrt(head_dim) if scale is None else scale,
        block=block,
        heads_per_program=heads_per_program,
    )
    query_w = pack_weights([(m.qw1, m.qw2, m.qdd) for m in mixings], q)
    key_w = pack_weights([(m.kw1, m.kw2, m.kdd) for m in mixings] if key_wise else [], q)
    out, _ = dcmha_forward(*map(unit_stride_last, (q, k, v)), query_w, key_w, *spec.as_args())
    return out


def require_triton() -> None:
    if triton is None:
        raise RuntimeError('the fused DCMHA kernel needs Triton (Linux): pip install -e ".[triton]" in the clone')


@dataclass(frozen=True)
class KernelSpec:
    num_groups: int
    heads_per_group: int
    rank: int
    pre: bool
    post: bool
    key_wise: bool
    window: int | None
    scale: float
    block: int | None = None
    heads_per_program: int | None = None

    def as_args(self) -> tuple[int | bool | float, ...]:
        """The fields as the custom ops take them: plain numbers, 0 for no window and for the default tiles."""
        return (self.num_groups, self.heads_per_group, self.rank, self.pre, self.post, self.key_wise,
                self.window or 0, self.scale, self.block or 0, self.heads_per_program or 0)  # fmt: skip

    @classmethod
    def from_args(cls, *args: int | bool | float) -> KernelSpec:
        *fields, window, scale, block, heads_per_program = args
        return cls(*fields, window=window or None, scale=scale, block=block or None,
                   heads_per_program=heads_per_program or None)  # fmt: skip

    def constants(self, head_dim: int) -> dict[str, Any]:
        """The kernels' compile-time arguments and launch options. Tiles shrink and warps grow with M, since a
        tile holds R·M·BT·BS mixing products: the tiles the interpreter runs and a block named runs; on a GPU the
        autotuner times them among others (:data:`TUNING`)."""
        heads_p2 = triton.next_power_of_2(self.heads_per_group)
        head_p2 = max(16, triton.next_power_of_2(head_dim))  # tl.dot needs every dimension >= 16
        tile = self.block or (32 if heads_p2 * triton.next_power_of_2(self.rank) <= 8 else 16)
        return dict(
            num_warps=4 if heads_p2 <= 4 else 8,
            M=self.heads_per_group,
            MP=heads_p2,
            MC=min(heads_p2, self.heads_per_program or DEFAULT_HEADS_PER_PROGRAM),
            R=self.rank,
            RP=triton.next_power_of_2(self.rank),
            D=head_dim,
            DP=head_p2,
            DF=min(head_p2, FEATURES_PER_STEP),
            BT=tile,
            BS=tile,
            PRE=self.pre,
            POST=self.post,
            KEY_WISE=self.key_wise,
            LOCAL=self.window is not None,
        )


def unit_stride_last(x: Tensor) -> Tensor:
    """The kernels take any batch, head and token strides, but consecutive features."""
    return x if x.stride(-1) == 1 else x.contiguous()


def pack_weights(sides: list[tuple[Tensor, Tensor, Tensor]], q: Tensor) -> Tensor:
    """One side's weights of every composition as one fp32 tensor (B, G, L, C, 2R+1, M): rows w1 (R), w2 (R), dd.

    A differentiable copy, so autograd hands the packed gradient back to each weight. Without weights a
    one-element placeholder, which the kernels never read."""
    if not sides:
        return q.new_zeros(1, dtype=torch.float32)
    slots = [torch.cat([w1, w2, dd.unsqueeze(-2)], dim=-2) for w1, w2, dd in sides]
    return torch.stack(slots, dim=3).float().contiguous()


def launch_forward(
    q: Tensor, k: Tensor, v: Tensor, query_w: Tensor, key_w: Tensor, spec: KernelSpec
) -> tuple[Tensor, Tensor]:
    """The output (B, H, T, d) and the per-head log-sum-exp (B, H, T) of the composed logits, fp32."""
    batch, n_heads, seq_len, head_dim = q.shape
    out = torch.empty(batch, n_heads, seq_len, head_dim, device=q.device, dtype=v.dtype)
    lse = torch.empty(batch, n_heads, seq_len, device=q.device, dtype=torch.float32)
    launch(
        "forward", spec, head_dim, seq_len, batch * spec.num_groups,
        q, k, v, query_w, key_w, out, lse,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
        n_heads, seq_len, spec.num_groups, n_heads // k.shape[1], spec.window or 0, spec.scale,
        **dot_options(q),
    )  # fmt: skip
    return out, lse


def launch_backward(
    grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, query_w: Tensor, key_w: Tensor, out: Tensor, lse: Tensor,
    spec: KernelSpec,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """dq, dk, dv and the gradients of the packed query-side and key-side weights."""
    grad_out = unit_stride_last(grad_out)  # e.g. the all-zero-stride gradient of a sum
    batch, n_heads, seq_len, head_dim = q.shape
    n_kv_heads = k.shape[1]
    # D = Σ_s P·dP per row: with post-composition the dq kernel's first pass fills it; without, dP = dO·vᵀ
    # and D = dO·O, flash attention's shortcut.
    delta = torch.empty_like(lse) if spec.post else (grad_out.float() * out.float()).sum(-1)
    grad_q = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    # dk, dv per query head (fp32), summed over the heads that share a kv head below: no atomics.
    grad_k = torch.empty(batch, n_heads, seq_len, head_dim, device=q.device, dtype=torch.float32)
    grad_v = torch.empty_like(grad_k)
    grad_query_w = torch.zeros_like(query_w)
    grad_key_w = torch.zeros_like(key_w)
    common = (
        n_heads, seq_len, spec.num_groups, n_heads // n_kv_heads, spec.window or 0, spec.scale,
    )  # fmt: skip
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *grad_out.stride()[:3])
    options = dot_options(q)
    bg = batch * spec.num_groups
    launch(
        "backward_query", spec, head_dim, seq_len, bg,
        q, k, v, grad_out, query_w, key_w, lse, delta, grad_q, grad_query_w, *strides, *common, **options,
    )  # fmt: skip
    launch(
        "backward_key", spec, head_dim, seq_len, bg,
        q, k, v, grad_out, query_w, key_w, lse, delta, grad_k, grad_v, grad_key_w, *strides, *common, **options,
    )  # fmt: skip
    n_rep = n_heads // n_kv_heads
    grad_k = grad_k.view(batch, n_kv_heads, n_rep, seq_len, head_dim).sum(2).to(k.dtype)
    grad_v = grad_v.view(batch, n_kv_heads, n_rep, seq_len, head_dim).sum(2).to(v.dtype)
    return grad_q, grad_k, grad_v, grad_query_w, grad_key_w


# The kernels as custom operators: torch.compile keeps a model that calls them in one graph (an opaque node with the
# shapes its fake implementation gives), where a Python autograd.Function launching Triton broke the graph at every
# layer. The spec travels as plain numbers (KernelSpec.as_args), which an operator's schema can hold.


@torch.library.custom_op("attnzoo::dcmha_triton_forward", mutates_args=())
def dcmha_forward(
    q: Tensor, k: Tensor, v: Tensor, query_w: Tensor, key_w: Tensor, num_groups: int, heads_per_group: int,
    rank: int, pre: bool, post: bool, key_wise: bool, window: int, scale: float, block: int, heads_per_program: int,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """:func:`launch_forward` as an operator: (output, log-sum-exp)."""
    spec = KernelSpec.from_args(
        num_groups, heads_per_group, rank, pre, post, key_wise, window, scale, block, heads_per_program
    )
    return launch_forward(q, k, v, query_w, key_w, spec)


@dcmha_forward.register_fake
def _(
    q: Tensor, k: Tensor, v: Tensor, query_w: Tensor, key_w: Tensor, *spec: int | bool | float
) -> tuple[Tensor, Tensor]:
    return q.new_empty(q.shape, dtype=v.dtype), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("attnzoo::dcmha_triton_backward", mutates_args=())
def dcmha_backward(
    grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, query_w: Tensor, key_w: Tensor, out: Tensor, lse: Tensor,
    num_groups: int, heads_per_group: int, rank: int, pre: bool, post: bool, key_wise: bool, window: int,
    scale: float, block: int, heads_per_program: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """:func:`launch_backward` as an operator."""
    spec = KernelSpec.from_args(
        num_groups, heads_per_group, rank, pre, post, key_wise, window, scale, block, heads_per_program
    )
    return launch_backward(grad_out, q, k, v, query_w, key_w, out, lse, spec)


@dcmha_backward.register_fake
def _(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, query_w: Tensor, key_w: Tensor, out: Tensor, lse: Tensor,
      *spec: int | bool | float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    return (
        torch.empty_like(q),
        torch.empty_like(k),
        torch.empty_like(v),
        torch.empty_like(query_w),
        torch.empty_like(key_w),
    )


def _save_for_backward(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    ctx.save_for_backward(*inputs[:5], *output)
    ctx.spec = inputs[5:]


def _backward(ctx: Any, grad_out: Tensor, grad_lse: Tensor | None) -> tuple[Tensor | None, ...]:
    """The log-sum-exp is an output no caller differentiates (``dcmha_attention`` drops it): its gradient is ignored."""
    q, k, v, query_w, key_w, out, lse = ctx.saved_tensors
    grad_q, grad_k, grad_v, grad_query_w, grad_key_w = dcmha_backward(
        grad_out, q, k, v, query_w, key_w, out, lse, *ctx.spec
    )
    key_wise = KernelSpec.from_args(*ctx.spec).key_wise
    return grad_q, grad_k, grad_v, grad_query_w, grad_key_w if key_wise else None, *([None] * len(ctx.spec))


dcmha_forward.register_autograd(_backward, setup_context=_save_for_backward)
