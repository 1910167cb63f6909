"""A fused Triton kernel for DCMHA's attention: composed scores never reach memory.

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

:func:`dcmha_attention` is what the ``dcmha-triton`` kernel record (``kernels/dcmha_triton.py``) runs; the record
refuses, and the layer runs its next kernel, for anything the kernel does not do: cached decoding, a positional bias
(ALiBi), the static projection, attention dropout, recorded maps, a bidirectional model, float64, or sizes past the
kernel's register budget.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from attnzoo.validation import is_int, require

if TYPE_CHECKING:
    from attnzoo.attention.dcmha import Mixing

try:
    import triton
    import triton.language as tl
except ImportError:  # the optional extra is absent: the PyTorch path serves every device
    triton = None

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


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
) -> Tensor:
    """Causal DCMHA attention of q (B, H, T, d) over k, v (B, H_kv, T, d) by the fused kernel, differentiable in
    q, k, v and every mixing weight. ``pre``/``post``: the compositions' weights (None: off); key-side fields
    None for query-wise composition. Query head h reads kv head h // (H / H_kv). ``block``: queries and keys
    per tile, a power of 2 >= 16 (None: chosen from M and R)."""
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

    def as_args(self) -> tuple[int | bool | float, ...]:
        """The fields as the custom ops take them: plain numbers, 0 for no window and for the default tile."""
        return (self.num_groups, self.heads_per_group, self.rank, self.pre, self.post, self.key_wise,
                self.window or 0, self.scale, self.block or 0)  # fmt: skip

    @classmethod
    def from_args(cls, *args: int | bool | float) -> KernelSpec:
        *fields, window, scale, block = args
        return cls(*fields, window=window or None, scale=scale, block=block or None)

    def constants(self, head_dim: int) -> dict[str, Any]:
        """The kernels' compile-time arguments and launch options. Tiles shrink and warps grow with M, since a
        tile holds R·M·BT·BS mixing products: the tiles the interpreter runs and a block named runs; on a GPU the
        autotuner times them among others (:data:`TUNING`)."""
        heads_p2 = triton.next_power_of_2(self.heads_per_group)
        tile = self.block or (32 if heads_p2 * triton.next_power_of_2(self.rank) <= 8 else 16)
        return dict(
            num_warps=4 if heads_p2 <= 4 else 8,
            M=self.heads_per_group,
            MP=heads_p2,
            R=self.rank,
            RP=triton.next_power_of_2(self.rank),
            D=head_dim,
            DP=max(16, triton.next_power_of_2(head_dim)),  # tl.dot needs every dimension >= 16
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
    rank: int, pre: bool, post: bool, key_wise: bool, window: int, scale: float, block: int,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """:func:`launch_forward` as an operator: (output, log-sum-exp)."""
    spec = KernelSpec.from_args(num_groups, heads_per_group, rank, pre, post, key_wise, window, scale, block)
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
    scale: float, block: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """:func:`launch_backward` as an operator."""
    spec = KernelSpec.from_args(num_groups, heads_per_group, rank, pre, post, key_wise, window, scale, block)
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


# How each kernel is launched: (the tile axis its grid walks, the most pipelining stages it may use; None: Triton's
# default, 3). The key kernel holds every head's K, V, dK and dV tiles for its whole loop; Triton's default pipelining
# adds copies of each query tile it loads, and that overflowed an H100's shared memory at 6 heads of 64
# (benchmarks/results/gpu-2026-11-25). One stage keeps it inside.
KERNEL_GRID = {"forward": ("BT", None), "backward_query": ("BT", None), "backward_key": ("BS", 1)}
# What the autotuner times on a GPU at the first call of each shape (TUNING_KEY): square tiles of BT = BS queries and
# keys, warps, and pipelining stages (1, or Triton's default 3) up to the kernel's limit, each at its register cap
# (register_cap). KernelSpec.constants' own choice is among them, so tuning keeps it or finds a faster one. Tiles
# whose rank-R mixing products (RP·MP·BT·BS) exceed MAX_MIX_PRODUCTS are not timed: they cannot stay in registers.
TUNING = tuple((tile, warps, stages) for tile in (16, 32) for warps in (4, 8) for stages in (1, 3))
TUNING_KEY = ["T", "M", "R", "D", "PRE", "POST", "KEY_WISE", "LOCAL"]
MAX_MIX_PRODUCTS = 16384
UNTUNABLE: set[str] = set()  # the kernels whose tuning raised in this process: they run untuned (see launch)


REGISTER_FILE = 65536  # 32-bit registers per streaming multiprocessor, every CUDA GPU from Volta to Hopper


def register_cap(num_warps: int) -> int:
    """Registers a thread may use: its share of the register file when one program has an SM to itself, at most 255
    (PTX's limit). Left to choose, ptxas keeps as few as 32 a thread where a kernel's working set cannot fit anyway,
    for occupancy, and spills the rest to local memory: compiled for sm_90a, 10.9 KB a thread in the untuned forward
    kernel at 16 heads per group (benchmarks/results/dcmha-triton-sm90-uncapped.md), 2.5 KB at this cap
    (dcmha-triton-sm90.md). That occupancy is not there to buy: wherever ptxas chose 32, the program's 64-160 KiB of
    shared memory leaves room for at most three on an H100's 228 KiB. Where it chose 255 anyway, the cap changes its
    spills by -2% to +13%."""
    return min(255, REGISTER_FILE // (32 * num_warps))


def tuning_configs(max_stages: int | None) -> list[Any]:
    return [
        triton.Config({"BT": tile, "BS": tile}, num_warps=warps, num_stages=stages, maxnreg=register_cap(warps))
        for tile, warps, stages in TUNING
        if max_stages is None or stages <= max_stages
    ]


def prune_tiles(configs: list[Any], named_args: dict[str, Any], **constants: Any) -> list[Any]:
    """The configs whose tiles' mixing products fit :data:`MAX_MIX_PRODUCTS`; the smallest tiles if none do."""
    mixes = constants["MP"] * constants["RP"]
    kept = [c for c in configs if mixes * c.kwargs["BT"] * c.kwargs["BS"] <= MAX_MIX_PRODUCTS]
    smallest = min(c.kwargs["BT"] for c in configs)
    return kept or [c for c in configs if c.kwargs["BT"] == smallest]


def launch(
    kernel: str, spec: KernelSpec, head_dim: int, seq_len: int, programs: int, *args: Any, **options: Any
) -> None:
    """Runs one kernel over ``programs`` (batch × group) × tiles of the sequence: compiled on a GPU, through its
    autotuner (:data:`TUNED`), unless the spec names a block; interpreted, or with a block named, with the spec's own
    tiles (:meth:`KernelSpec.constants`) and the kernel's stage limit (:data:`KERNEL_GRID`).

    Tuning never fails a call the untuned tiles can run: the autotuner skips a candidate that runs out of registers
    or shared memory, and where tuning raises anything else (a candidate Triton cannot compile), the kernel warns
    once, names the error, and runs its untuned tiles from then on in this process (:data:`UNTUNABLE`). Every launch
    stores all of its outputs, so what a failed tuning wrote is overwritten."""
    tile = KERNEL_GRID[kernel][0]
    const, untuned = untuned_launch(kernel, spec, head_dim)
    if spec.block is None and not INTERPRETED and kernel not in UNTUNABLE:
        fixed = {name: value for name, value in const.items() if name not in ("BT", "BS")}
        try:
            TUNED[kernel][lambda meta: (triton.cdiv(seq_len, meta[tile]), programs)](*args, **options, **fixed)
            return
        except Exception as err:
            UNTUNABLE.add(kernel)
            warnings.warn(
                f"autotuning DCMHA's {kernel} kernel failed ({type(err).__name__}: {err}); it runs its untuned "
                f"tiles (BT = BS = {const['BT']}, {untuned['num_warps']} warps) from now on in this process",
                RuntimeWarning,
                stacklevel=2,
            )
    KERNELS_BY_NAME[kernel][(triton.cdiv(seq_len, const[tile]), programs)](*args, **options, **const, **untuned)


def untuned_launch(kernel: str, spec: KernelSpec, head_dim: int) -> tuple[dict[str, Any], dict[str, int]]:
    """A kernel's compile-time constants, and the launch options it runs with untuned: the spec's warps, the kernel's
    most stages (Triton's default 3 where unlimited) and the register cap."""
    const = spec.constants(head_dim)
    warps = const.pop("num_warps")
    stages = KERNEL_GRID[kernel][1] or 3
    return const, {"num_warps": warps, "num_stages": stages, "maxnreg": register_cap(warps)}


def dot_options(q: Tensor) -> dict[str, Any]:
    """How the kernels multiply: fp32 inputs in full fp32 ("ieee"), as the PyTorch path does (TF32 would lose
    about three digits); bf16 under the interpreter widened to fp32 first (see ``_dot``)."""
    return dict(PREC="ieee" if q.dtype == torch.float32 else "tf32", WIDEN=INTERPRETED and q.dtype == torch.bfloat16)


if triton is not None:

    @triton.jit
    def _dot(a, b, PREC: tl.constexpr, WIDEN: tl.constexpr):
        """a @ b batched over heads, fp32 accumulation. WIDEN (the interpreter on bf16): multiply the operands as
        fp32, which is exact for bf16 values; Triton 3.9's interpreter multiplies bf16 bit patterns as integers."""
        if WIDEN:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        return tl.dot(a, b, input_precision=PREC)

    @triton.jit
    def _load_weights(ptr, bg, first, length, slot, R: tl.constexpr, RP: tl.constexpr, M: tl.constexpr,
                      MP: tl.constexpr, BL: tl.constexpr, SLOTS: tl.constexpr):  # fmt: skip
        """Positions first..first+BL of one side and composition: w1, w2 (RP, MP, BL) and dd (MP, BL), 0 past
        the ends (padded ranks and heads then add nothing)."""
        r = tl.arange(0, RP)[:, None, None]
        m = tl.arange(0, MP)[None, :, None]
        pos = first + tl.arange(0, BL)[None, None, :]
        row = ptr + ((bg * length + pos) * SLOTS + slot) * (2 * R + 1) * M
        ok = (r < R) & (m < M) & (pos < length)
        w1 = tl.load(row + r * M + m, mask=ok, other=0.0)
        w2 = tl.load(row + (R + r) * M + m, mask=ok, other=0.0)
        m2 = tl.arange(0, MP)[:, None]
        pos2 = first + tl.arange(0, BL)[None, :]
        dd_row = ptr + ((bg * length + pos2) * SLOTS + slot) * (2 * R + 1) * M + 2 * R * M
        dd = tl.load(dd_row + m2, mask=(m2 < M) & (pos2 < length), other=0.0)
        return w1, w2, dd

    @triton.jit
    def _store_weights(ptr, bg, first, length, slot, g_w1, g_w2, g_dd, R: tl.constexpr, RP: tl.constexpr,
                       M: tl.constexpr, MP: tl.constexpr, BL: tl.constexpr, SLOTS: tl.constexpr):  # fmt: skip
        """The inverse of :func:`_load_weights`, for their gradients."""
        r = tl.arange(0, RP)[:, None, None]
        m = tl.arange(0, MP)[None, :, None]
        pos = first + tl.arange(0, BL)[None, None, :]
        row = ptr + ((bg * length + pos) * SLOTS + slot) * (2 * R + 1) * M
        ok = (r < R) & (m < M) & (pos < length)
        tl.store(row + r * M + m, g_w1, mask=ok)
        tl.store(row + (R + r) * M + m, g_w2, mask=ok)
        m2 = tl.arange(0, MP)[:, None]
        pos2 = first + tl.arange(0, BL)[None, :]
        dd_row = ptr + ((bg * length + pos2) * SLOTS + slot) * (2 * R + 1) * M + 2 * R * M
        tl.store(dd_row + m2, g_dd, mask=(m2 < M) & (pos2 < length))

    @triton.jit
    def _compose(x, qw1, qw2, qdd, kw1, kw2, kdd, KEY_WISE: tl.constexpr):
        """x (M, BT, BS) composed across heads; also X_r, Y_r (R, BT, BS), the rank-R mixes the backward needs.

        Query-side weights come as (R, M, BT, 1) and (M, BT, 1), key-side as (R, M, 1, BS) and (M, 1, BS)."""
        mix_q = tl.sum(qw1 * x[None, :, :, :], axis=1)
        out = x * (1.0 + qdd) + tl.sum(qw2 * mix_q[:, None, :, :], axis=0)
        mix_k = mix_q
        if KEY_WISE:
            mix_k = tl.sum(kw1 * x[None, :, :, :], axis=1)
            out += x * kdd + tl.sum(kw2 * mix_k[:, None, :, :], axis=0)
        return out, mix_q, mix_k

    @triton.jit
    def _compose_backward(grad, x, mix_q, mix_k, qw1, qw2, qdd, kw1, kw2, kdd, KEY_WISE: tl.constexpr,
                          QUERY_SIDE: tl.constexpr):  # fmt: skip
        """The gradient of :func:`_compose` with respect to x, and the tile's share of the gradients of one
        side's weights: summed over keys (QUERY_SIDE, shapes (R, M, BT) and (M, BT)) or over queries."""
        grad_mix_q = tl.sum(qw2 * grad[None, :, :, :], axis=1)
        grad_x = grad * (1.0 + qdd) + tl.sum(qw1 * grad_mix_q[:, None, :, :], axis=0)
        grad_mix_k = grad_mix_q
        if KEY_WISE:
            grad_mix_k = tl.sum(kw2 * grad[None, :, :, :], axis=1)
            grad_x += grad * kdd + tl.sum(kw1 * grad_mix_k[:, None, :, :], axis=0)
        if QUERY_SIDE:
            g_w1 = tl.sum(grad_mix_q[:, None, :, :] * x[None, :, :, :], axis=3)
            g_w2 = tl.sum(grad[None, :, :, :] * mix_q[:, None, :, :], axis=3)
            g_dd = tl.sum(grad * x, axis=2)
        else:
            g_w1 = tl.sum(grad_mix_k[:, None, :, :] * x[None, :, :, :], axis=2)
            g_w2 = tl.sum(grad[None, :, :, :] * mix_k[:, None, :, :], axis=2)
            g_dd = tl.sum(grad * x, axis=1)
        return grad_x, g_w1, g_w2, g_dd

    @triton.jit
    def _allowed(t, s, head_ok, T, window, LOCAL: tl.constexpr):
        """(MP, BT, BS): query t sees key s (causal, within the window if local), both in range, real head."""
        distance = t[:, None] - s[None, :]
        ok = (distance >= 0) & (t[:, None] < T) & (s[None, :] < T)
        if LOCAL:
            ok = ok & (distance < window)
        return head_ok[:, None, None] & ok[None, :, :]

    @triton.jit
    def _query_rows(ptr, b, heads, head_ok, t, stride_b, stride_h, stride_t, T, D: tl.constexpr,
                    DP: tl.constexpr):  # fmt: skip
        """(MP, BT, DP) rows t of the heads' q (or dO), 0 outside."""
        d = tl.arange(0, DP)
        offsets = b * stride_b + heads[:, None, None] * stride_h + t[None, :, None] * stride_t + d[None, None, :]
        ok = head_ok[:, None, None] & (t[None, :, None] < T) & (d[None, None, :] < D)
        return tl.load(ptr + offsets, mask=ok, other=0.0)

    @triton.jit
    def _key_columns(ptr, b, kv_heads, head_ok, s, stride_b, stride_h, stride_t, T, D: tl.constexpr,
                     DP: tl.constexpr):  # fmt: skip
        """(MP, DP, BS) columns s of each head's k (or v), transposed, 0 outside."""
        d = tl.arange(0, DP)
        offsets = b * stride_b + kv_heads[:, None, None] * stride_h + d[None, :, None] + s[None, None, :] * stride_t
        ok = head_ok[:, None, None] & (d[None, :, None] < D) & (s[None, None, :] < T)
        return tl.load(ptr + offsets, mask=ok, other=0.0)

    @triton.jit
    def _probabilities(
        q3, kt3, lse, allowed, scale,
        pre_qw1, pre_qw2, pre_qdd, pre_kw1, pre_kw2, pre_kdd,
        post_qw1, post_qw2, post_qdd, post_kw1, post_kw2, post_kdd,
        PRE: tl.constexpr, POST: tl.constexpr, KEY_WISE: tl.constexpr, PREC: tl.constexpr,
        WIDEN: tl.constexpr,
    ):  # fmt: skip
        """A tile recomputed from the saved log-sum-exp: the logits and their pre-mixes, the probabilities P, and
        the post-composed P' with its mixes."""
        logits = _dot(q3, kt3, PREC, WIDEN) * scale
        composed = logits
        pre_mix_q = logits
        pre_mix_k = logits
        if PRE:
            composed, pre_mix_q, pre_mix_k = _compose(
                logits, pre_qw1, pre_qw2, pre_qdd, pre_kw1, pre_kw2, pre_kdd, KEY_WISE
            )
        probs = tl.where(allowed, tl.exp(composed - lse[:, :, None]), 0.0)
        mixed = probs
        post_mix_q = probs
        post_mix_k = probs
        if POST:
            mixed, post_mix_q, post_mix_k = _compose(
                probs, post_qw1, post_qw2, post_qdd, post_kw1, post_kw2, post_kdd, KEY_WISE
            )
        return logits, pre_mix_q, pre_mix_k, probs, mixed, post_mix_q, post_mix_k

    @triton.jit
    def _query_weights(ptr, bg, t0, T, slot, R: tl.constexpr, RP: tl.constexpr, M: tl.constexpr,
                       MP: tl.constexpr, BT: tl.constexpr, SLOTS: tl.constexpr):  # fmt: skip
        """One composition's query-side weights of a query block, shaped to broadcast over keys."""
        w1, w2, dd = _load_weights(ptr, bg, t0, T, slot, R, RP, M, MP, BT, SLOTS)
        return w1[:, :, :, None], w2[:, :, :, None], dd[:, :, None]

    @triton.jit
    def _key_weights(ptr, bg, s0, T, slot, R: tl.constexpr, RP: tl.constexpr, M: tl.constexpr,
                     MP: tl.constexpr, BS: tl.constexpr, SLOTS: tl.constexpr):  # fmt: skip
        """One composition's key-side weights of a key block, shaped to broadcast over queries."""
        w1, w2, dd = _load_weights(ptr, bg, s0, T, slot, R, RP, M, MP, BS, SLOTS)
        return w1[:, :, None, :], w2[:, :, None, :], dd[:, None, :]

    @triton.jit
    def _forward_kernel(
        Q, K, V, WQ, WK, OUT, LSE,
        stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
        H, T, G, n_rep, window, scale,
        M: tl.constexpr, MP: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
        BT: tl.constexpr, BS: tl.constexpr, PRE: tl.constexpr, POST: tl.constexpr, KEY_WISE: tl.constexpr,
        LOCAL: tl.constexpr, PREC: tl.constexpr, WIDEN: tl.constexpr,
    ):  # fmt: skip
        """The output and per-head log-sum-exp of one query block of one (batch, group)."""
        SLOTS: tl.constexpr = PRE + POST
        bg = tl.program_id(1)
        b = bg // G
        t0 = tl.program_id(0) * BT
        heads = tl.arange(0, MP)
        head_ok = heads < M
        q_heads = (bg % G) * M + heads
        kv_heads = tl.where(head_ok, q_heads // n_rep, 0)
        t = t0 + tl.arange(0, BT)
        q3 = _query_rows(Q, b, q_heads, head_ok, t, stride_qb, stride_qh, stride_qt, T, D, DP)
        # Weights of a switched-off composition or side are never read: placeholders.
        pre_qw1, pre_qw2, pre_qdd, post_qw1, post_qw2, post_qdd = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
        if PRE:
            pre_qw1, pre_qw2, pre_qdd = _query_weights(WQ, bg, t0, T, 0, R, RP, M, MP, BT, SLOTS)
        if POST:
            post_qw1, post_qw2, post_qdd = _query_weights(WQ, bg, t0, T, SLOTS - 1, R, RP, M, MP, BT, SLOTS)
        lo = 0
        if LOCAL:
            lo = tl.maximum(t0 - window + 1, 0) // BS * BS
        hi = tl.minimum(t0 + BT, T)

        # Pass 1: each head's running max and sum of the composed logits (and without post-composition the
        # output itself, by online softmax).
        row_max = tl.full((MP, BT), float("-inf"), tl.float32)
        row_sum = tl.zeros((MP, BT), tl.float32)
        acc = tl.zeros((MP, BT, DP), tl.float32)
        for s0 in range(lo, hi, BS):
            s = s0 + tl.arange(0, BS)
            kt3 = _key_columns(K, b, kv_heads, head_ok, s, stride_kb, stride_kh, stride_kt, T, D, DP)
            logits = _dot(q3, kt3, PREC, WIDEN) * scale
            if PRE:
                pre_kw1, pre_kw2, pre_kdd = 0.0, 0.0, 0.0
                if KEY_WISE:
                    pre_kw1, pre_kw2, pre_kdd = _key_weights(WK, bg, s0, T, 0, R, RP, M, MP, BS, SLOTS)
                logits, _, _ = _compose(logits, pre_qw1, pre_qw2, pre_qdd, pre_kw1, pre_kw2, pre_kdd, KEY_WISE)
            logits = tl.where(_allowed(t, s, head_ok, T, window, LOCAL), logits, float("-inf"))
            new_max = tl.maximum(row_max, tl.max(logits, axis=2))
            # Rows that have seen no key yet keep max -inf: shift them by 0 so that exp gives 0, not NaN.
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)
            p = tl.exp(logits - shift[:, :, None])
            rescale = tl.exp(row_max - shift)
            row_sum = row_sum * rescale + tl.sum(p, axis=2)
            row_max = new_max
            if not POST:
                vt3 = _key_columns(V, b, kv_heads, head_ok, s, stride_vb, stride_vh, stride_vt, T, D, DP)
                pv = _dot(p.to(V.dtype.element_ty), tl.permute(vt3, (0, 2, 1)), PREC, WIDEN)
                acc = acc * rescale[:, :, None] + pv
        # Rows past the end (and padded heads) saw no key: lse 0, never used.
        seen = row_sum > 0
        lse = tl.where(seen, row_max + tl.log(tl.where(seen, row_sum, 1.0)), 0.0)

        if POST:
            # Pass 2: exact probabilities from the log-sum-exp, post-composed, times V.
            for s0 in range(lo, hi, BS):
                s = s0 + tl.arange(0, BS)
                pre_kw1, pre_kw2, pre_kdd, post_kw1, post_kw2, post_kdd = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
                if KEY_WISE:
                    if PRE:
                        pre_kw1, pre_kw2, pre_kdd = _key_weights(WK, bg, s0, T, 0, R, RP, M, MP, BS, SLOTS)
                    post_kw1, post_kw2, post_kdd = _key_weights(WK, bg, s0, T, SLOTS - 1, R, RP, M, MP, BS, SLOTS)
                kt3 = _key_columns(K, b, kv_heads, head_ok, s, stride_kb, stride_kh, stride_kt, T, D, DP)
                allowed = _allowed(t, s, head_ok, T, window, LOCAL)
                _, _, _, _, mixed, _, _ = _probabilities(
                    q3, kt3, lse, allowed, scale,
                    pre_qw1, pre_qw2, pre_qdd, pre_kw1, pre_kw2, pre_kdd,
                    post_qw1, post_qw2, post_qdd, post_kw1, post_kw2, post_kdd,
                    PRE, POST, KEY_WISE, PREC, WIDEN,
                )  # fmt: skip
                vt3 = _key_columns(V, b, kv_heads, head_ok, s, stride_vb, stride_vh, stride_vt, T, D, DP)
                acc += _dot(mixed.to(V.dtype.element_ty), tl.permute(vt3, (0, 2, 1)), PREC, WIDEN)
        else:
            acc = acc / tl.where(seen, row_sum, 1.0)[:, :, None]

        d = tl.arange(0, DP)
        rows = (b * H + q_heads[:, None]) * T + t[None, :]
        row_ok = head_ok[:, None] & (t[None, :] < T)
        tl.store(LSE + rows, lse, mask=row_ok)
        out_ok = row_ok[:, :, None] & (d[None, None, :] < D)
        tl.store(OUT + rows[:, :, None] * D + d[None, None, :], acc.to(OUT.dtype.element_ty), mask=out_ok)

    @triton.jit
    def _backward_query_kernel(
        Q, K, V, DO, WQ, WK, LSE, DELTA, DQ, DWQ,
        stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
        stride_ob, stride_oh, stride_ot,
        H, T, G, n_rep, window, scale,
        M: tl.constexpr, MP: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
        BT: tl.constexpr, BS: tl.constexpr, PRE: tl.constexpr, POST: tl.constexpr, KEY_WISE: tl.constexpr,
        LOCAL: tl.constexpr, PREC: tl.constexpr, WIDEN: tl.constexpr,
    ):  # fmt: skip
        """dq and the query-side weight gradients of one query block (with post-composition, D first)."""
        SLOTS: tl.constexpr = PRE + POST
        bg = tl.program_id(1)
        b = bg // G
        t0 = tl.program_id(0) * BT
        heads = tl.arange(0, MP)
        head_ok = heads < M
        q_heads = (bg % G) * M + heads
        kv_heads = tl.where(head_ok, q_heads // n_rep, 0)
        t = t0 + tl.arange(0, BT)
        q3 = _query_rows(Q, b, q_heads, head_ok, t, stride_qb, stride_qh, stride_qt, T, D, DP)
        do3 = _query_rows(DO, b, q_heads, head_ok, t, stride_ob, stride_oh, stride_ot, T, D, DP)
        rows = (b * H + q_heads[:, None]) * T + t[None, :]
        row_ok = head_ok[:, None] & (t[None, :] < T)
        lse = tl.load(LSE + rows, mask=row_ok, other=0.0)
        pre_qw1, pre_qw2, pre_qdd, post_qw1, post_qw2, post_qdd = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
        if PRE:
            pre_qw1, pre_qw2, pre_qdd = _query_weights(WQ, bg, t0, T, 0, R, RP, M, MP, BT, SLOTS)
        if POST:
            post_qw1, post_qw2, post_qdd = _query_weights(WQ, bg, t0, T, SLOTS - 1, R, RP, M, MP, BT, SLOTS)
        lo = 0
        if LOCAL:
            lo = tl.maximum(t0 - window + 1, 0) // BS * BS
        hi = tl.minimum(t0 + BT, T)

        if POST:
            # D_n[t] = Σ_s P_n·dP_n, with dP the gradient of P once the post-mix is undone: one more pass.
            delta = tl.zeros((MP, BT), tl.float32)
            for s0 in range(lo, hi, BS):
                s = s0 + tl.arange(0, BS)
                pre_kw1, pre_kw2, pre_kdd, post_kw1, post_kw2, post_kdd = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
                if KEY_WISE:
                    if PRE:
                        pre_kw1, pre_kw2, pre_kdd = _key_weights(WK, bg, s0, T, 0, R, RP, M, MP, BS, SLOTS)
                    post_kw1, post_kw2, post_kdd = _key_weights(WK, bg, s0, T, SLOTS - 1, R, RP, M, MP, BS, SLOTS)
                kt3 = _key_columns(K, b, kv_heads, head_ok, s, stride_kb, stride_kh, stride_kt, T, D, DP)
                vt3 = _key_columns(V, b, kv_heads, head_ok, s, stride_vb, stride_vh, stride_vt, T, D, DP)
                allowed = _allowed(t, s, head_ok, T, window, LOCAL)
                _, _, _, probs, _, post_mix_q, post_mix_k = _probabilities(
                    q3, kt3, lse, allowed, scale,
                    pre_qw1, pre_qw2, pre_qdd, pre_kw1, pre_kw2, pre_kdd,
                    post_qw1, post_qw2, post_qdd, post_kw1, post_kw2, post_kdd,
                    PRE, POST, KEY_WISE, PREC, WIDEN,
                )  # fmt: skip
                grad_mixed = _dot(do3, vt3, PREC, WIDEN)
                grad_probs, _, _, _ = _compose_backward(
                    grad_mixed, probs, post_mix_q, post_mix_k,
                    post_qw1, post_qw2, post_qdd, post_kw1, post_kw2, post_kdd, KEY_WISE, True,
                )  # fmt: skip
                delta += tl.sum(probs * grad_probs, axis=2)
            tl.store(DELTA + rows, delta, mask=row_ok)
        else:
            delta = tl.load(DELTA + rows, mask=row_ok, other=0.0)

        grad_q = tl.zeros((MP, BT, DP), tl.float32)
        pre_gw1 = tl.zeros((RP, MP, BT), tl.float32)
        pre_gw2 = tl.zeros((RP, MP, BT), tl.float32)
        pre_gdd = tl.zeros((MP, BT), tl.float32)
        post_gw1 = tl.zeros((RP, MP, BT), tl.float32)
        post_gw2 = tl.zeros((RP, MP, BT), tl.float32)
        post_gdd = tl.zeros((MP, BT), tl.float32)
        for s0 in range(lo, hi, BS):
            s = s0 + tl.arange(0, BS)
            pre_kw1, pre_kw2, pre_kdd, post_kw1, post_kw2, post_kdd = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
            if KEY_WISE:
                if PRE:
                    pre_kw1, pre_kw2, pre_kdd = _key_weights(WK, bg, s0, T, 0, R, RP, M, MP, BS, SLOTS)
                if POST:
                    post_kw1, post_kw2, post_kdd = _key_weights(WK, bg, s0, T, SLOTS - 1, R, RP, M, MP, BS, SLOTS)
            kt3 = _key_columns(K, b, kv_heads, head_ok, s, stride_kb, stride_kh, stride_kt, T, D, DP)
            vt3 = _key_columns(V, b, kv_heads, head_ok, s, stride_vb, stride_vh, stride_vt, T, D, DP)
            allowed = _allowed(t, s, head_ok, T, window, LOCAL)
            logits, pre_mix_q, pre_mix_k, probs, _, post_mix_q, post_mix_k = _probabilities(
                q3, kt3, lse, allowed, scale,
                pre_qw1, pre_qw2, pre_qdd, pre_kw1, pre_kw2, pre_kdd,
                post_qw1, post_qw2, post_qdd, post_kw1, post_kw2, post_kdd,
                PRE, POST, KEY_WISE, PREC, WIDEN,
            )  # fmt: skip
            grad_probs = _dot(do3, vt3, PREC, WIDEN)
            if POST:
                grad_probs, g_w1, g_w2, g_dd = _compose_backward(
                    grad_probs, probs, post_mix_q, post_mix_k,
                    post_qw1, post_qw2, post_qdd, post_kw1, post_kw2, post_kdd, KEY_WISE, True,
                )  # fmt: skip
                post_gw1 += g_w1
                post_gw2 += g_w2
                post_gdd += g_dd
            grad_logits = probs * (grad_probs - delta[:, :, None])
            if PRE:
                grad_logits, g_w1, g_w2, g_dd = _compose_backward(
                    grad_logits, logits, pre_mix_q, pre_mix_k,
                    pre_qw1, pre_qw2, pre_qdd, pre_kw1, pre_kw2, pre_kdd, KEY_WISE, True,
                )  # fmt: skip
                pre_gw1 += g_w1
                pre_gw2 += g_w2
                pre_gdd += g_dd
            grad_q += _dot(grad_logits.to(Q.dtype.element_ty), tl.permute(kt3, (0, 2, 1)), PREC, WIDEN)

        d = tl.arange(0, DP)
        out_ok = row_ok[:, :, None] & (d[None, None, :] < D)
        tl.store(DQ + rows[:, :, None] * D + d[None, None, :], (grad_q * scale).to(DQ.dtype.element_ty), mask=out_ok)
        if PRE:
            _store_weights(DWQ, bg, t0, T, 0, pre_gw1, pre_gw2, pre_gdd, R, RP, M, MP, BT, SLOTS)
        if POST:
            _store_weights(DWQ, bg, t0, T, SLOTS - 1, post_gw1, post_gw2, post_gdd, R, RP, M, MP, BT, SLOTS)

    @triton.jit
    def _backward_key_kernel(
        Q, K, V, DO, WQ, WK, LSE, DELTA, DK, DV, DWK,
        stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
        stride_ob, stride_oh, stride_ot,
        H, T, G, n_rep, window, scale,
        M: tl.constexpr, MP: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
        BT: tl.constexpr, BS: tl.constexpr, PRE: tl.constexpr, POST: tl.constexpr, KEY_WISE: tl.constexpr,
        LOCAL: tl.constexpr, PREC: tl.constexpr, WIDEN: tl.constexpr,
    ):  # fmt: skip
        """dk, dv (per query head) and the key-side weight gradients of one key block, over the queries that see it."""
        SLOTS: tl.constexpr = PRE + POST
        bg = tl.program_id(1)
        b = bg // G
        s0 = tl.program_id(0) * BS
        heads = tl.arange(0, MP)
        head_ok = heads < M
        q_heads = (bg % G) * M + heads
        kv_heads = tl.where(head_ok, q_heads // n_rep, 0)
        s = s0 + tl.arange(0, BS)
        kt3 = _key_columns(K, b, kv_heads, head_ok, s, stride_kb, stride_kh, stride_kt, T, D, DP)
        vt3 = _key_columns(V, b, kv_heads, head_ok, s, stride_vb, stride_vh, stride_vt, T, D, DP)
        pre_kw1, pre_kw2, pre_kdd, post_kw1, post_kw2, post_kdd = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
        if KEY_WISE:
            if PRE:
                pre_kw1, pre_kw2, pre_kdd = _key_weights(WK, bg, s0, T, 0, R, RP, M, MP, BS, SLOTS)
            if POST:
                post_kw1, post_kw2, post_kdd = _key_weights(WK, bg, s0, T, SLOTS - 1, R, RP, M, MP, BS, SLOTS)
        lo = s0 // BT * BT
        hi = T
        if LOCAL:
            hi = tl.minimum(s0 + BS - 1 + window, T)

        grad_k = tl.zeros((MP, BS, DP), tl.float32)
        grad_v = tl.zeros((MP, BS, DP), tl.float32)
        pre_gw1 = tl.zeros((RP, MP, BS), tl.float32)
        pre_gw2 = tl.zeros((RP, MP, BS), tl.float32)
        pre_gdd = tl.zeros((MP, BS), tl.float32)
        post_gw1 = tl.zeros((RP, MP, BS), tl.float32)
        post_gw2 = tl.zeros((RP, MP, BS), tl.float32)
        post_gdd = tl.zeros((MP, BS), tl.float32)
        for t0 in range(lo, hi, BT):
            t = t0 + tl.arange(0, BT)
            q3 = _query_rows(Q, b, q_heads, head_ok, t, stride_qb, stride_qh, stride_qt, T, D, DP)
            do3 = _query_rows(DO, b, q_heads, head_ok, t, stride_ob, stride_oh, stride_ot, T, D, DP)
            rows = (b * H + q_heads[:, None]) * T + t[None, :]
            row_ok = head_ok[:, None] & (t[None, :] < T)
            lse = tl.load(LSE + rows, mask=row_ok, other=0.0)
            delta = tl.load(DELTA + rows, mask=row_ok, other=0.0)
            pre_qw1, pre_qw2, pre_qdd, post_qw1, post_qw2, post_qdd = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
            if PRE:
                pre_qw1, pre_qw2, pre_qdd = _query_weights(WQ, bg, t0, T, 0, R, RP, M, MP, BT, SLOTS)
            if POST:
                post_qw1, post_qw2, post_qdd = _query_weights(WQ, bg, t0, T, SLOTS - 1, R, RP, M, MP, BT, SLOTS)
            allowed = _allowed(t, s, head_ok, T, window, LOCAL)
            logits, pre_mix_q, pre_mix_k, probs, mixed, post_mix_q, post_mix_k = _probabilities(
                q3, kt3, lse, allowed, scale,
                pre_qw1, pre_qw2, pre_qdd, pre_kw1, pre_kw2, pre_kdd,
                post_qw1, post_qw2, post_qdd, post_kw1, post_kw2, post_kdd,
                PRE, POST, KEY_WISE, PREC, WIDEN,
            )  # fmt: skip
            grad_v += _dot(tl.permute(mixed, (0, 2, 1)).to(DO.dtype.element_ty), do3, PREC, WIDEN)
            grad_probs = _dot(do3, vt3, PREC, WIDEN)
            if POST:
                grad_probs, g_w1, g_w2, g_dd = _compose_backward(
                    grad_probs, probs, post_mix_q, post_mix_k,
                    post_qw1, post_qw2, post_qdd, post_kw1, post_kw2, post_kdd, KEY_WISE, False,
                )  # fmt: skip
                post_gw1 += g_w1
                post_gw2 += g_w2
                post_gdd += g_dd
            grad_logits = probs * (grad_probs - delta[:, :, None])
            if PRE:
                grad_logits, g_w1, g_w2, g_dd = _compose_backward(
                    grad_logits, logits, pre_mix_q, pre_mix_k,
                    pre_qw1, pre_qw2, pre_qdd, pre_kw1, pre_kw2, pre_kdd, KEY_WISE, False,
                )  # fmt: skip
                pre_gw1 += g_w1
                pre_gw2 += g_w2
                pre_gdd += g_dd
            grad_k += _dot(tl.permute(grad_logits, (0, 2, 1)).to(Q.dtype.element_ty), q3, PREC, WIDEN)

        d = tl.arange(0, DP)
        cols = (b * H + q_heads[:, None]) * T + s[None, :]
        col_ok = (head_ok[:, None] & (s[None, :] < T))[:, :, None] & (d[None, None, :] < D)
        tl.store(DK + cols[:, :, None] * D + d[None, None, :], grad_k * scale, mask=col_ok)
        tl.store(DV + cols[:, :, None] * D + d[None, None, :], grad_v, mask=col_ok)
        if KEY_WISE:
            if PRE:
                _store_weights(DWK, bg, s0, T, 0, pre_gw1, pre_gw2, pre_gdd, R, RP, M, MP, BS, SLOTS)
            if POST:
                _store_weights(DWK, bg, s0, T, SLOTS - 1, post_gw1, post_gw2, post_gdd, R, RP, M, MP, BS, SLOTS)

    INTERPRETED = not isinstance(_forward_kernel, triton.runtime.JITFunction)  # TRITON_INTERPRET=1: CPU tensors
    KERNELS_BY_NAME = {
        "forward": _forward_kernel,
        "backward_query": _backward_query_kernel,
        "backward_key": _backward_key_kernel,
    }
    TUNED = {
        name: triton.autotune(
            configs=tuning_configs(KERNEL_GRID[name][1]),
            key=TUNING_KEY,
            prune_configs_by={"early_config_prune": prune_tiles},
        )(function)
        for name, function in KERNELS_BY_NAME.items()
    }
