"""Dynamically composable multi-head attention (DCMHA), the attention of DCFormer (Xiao et al., ICML 2024).

Parameter names, shapes and slot order follow the official code (Caiyun-AI/DCFormer), so its checkpoints
convert by renaming: ``dyn_w_proj.dw1`` (D, G, 4, K), ``dyn_w_proj.qkw`` (G, 4, K, 2R, N/G) and
``dyn_w_proj.dd`` (D, G, 4N/G), slots [pre_q, pre_k, post_q, post_k]. Heads are numbered group-major
(head = g·N/G + m), as the official ``'B (G M) T S'`` layout.

One computation through the shared kernels (``kernels.attend``), whose score and probability hooks are
the pre- and post-composition with merged per-token matrices QW[t] + KW[s], tested three ways against each
other (and against :func:`compose_low_rank`, the rank-R form of the official ``_cross_head_proj``; on CPU it is
slower than the merged form, see ``_block_hooks``):

* the eager reference: the full (B, N, T, S) scores composed with explicit per-token N×N matrices;
* the training path: the kernel's chunked form, queries in blocks each against its key range or window,
  composed with the block's rows of QW and keys of KW, so memory grows with T·chunk;
* cached decoding: merged key-side matrices KW[s] are cached per key position, and each step forms the
  query-side matrix once.

On the CPU the fused C++ kernels (``kernels/dcmha_fused.py``: ``dcmha-fused`` and ``dcmha-decode``) replace the
second and third: a fresh sequence (a prefill into an empty cache too) runs ``dcmha_fused_forward``, a cached step of
one token ``dcmha_decode_forward``, with that token's composition matrices from one ``dcmha_step_weights`` call.
"""

from __future__ import annotations

import math
from collections.abc import Set
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnzoo.attention.base import ATTENTION, AttentionContext, CacheBuffer
from attnzoo.attention.kernels import (
    BlockHooks,
    Call,
    HookInputs,
    Hooks,
    ScoreHook,
    attend,
    choose,
    dcmha_fused,
    stage_chain,
)
from attnzoo.attention.kernels.dcmha_compiled import compiled_compose, runs_compiled
from attnzoo.attention.mha import MultiHeadAttention
from attnzoo.cache import LayerCache, WindowCache
from attnzoo.precision import compute_dtype
from attnzoo.validation import require, require_count

if TYPE_CHECKING:
    from attnzoo.attention.kernels.eager import PyTorchKernel
    from attnzoo.config import ModelConfig

PRE_Q, PRE_K, POST_Q, POST_K = range(4)  # the official slot order of the dynamic-weight parameters


@dataclass(frozen=True)
class DCMHAOptions:
    pre_compose: bool = True  # compose the logits, before the softmax
    post_compose: bool = True  # compose the probabilities, after the softmax
    query_wise: bool = False  # query-wise composition only (no key-wise terms), as the official `query_wise`
    static_proj: bool = False  # add the static talking-heads matrix W_b; the official default is off
    # W_b alone, no dynamic weights: the paper's static composition (its Table 9's branch 1), Talking-Heads Attention
    # (Shazeer et al., 2020) with DCFormer's identity residual, A' = (I + W_b)ᵀ·A; static_proj stays false.
    static_only: bool = False
    num_groups: int = 1  # G: heads compose only within their group (tensor parallelism)
    rank: int = 2  # R: rank of the dynamic low-rank projections
    dynamic_w_hidden_dim: int | None = None  # K; None → 2·R·N/G (= 4N), as the official code
    qk_norm: bool = False  # RMSNorm (learnable scale) over head_dim on queries and keys, before RoPE
    window_size: int = 256  # keys a local layer's query sees, itself included
    window_type: str = "LG"  # layer i is local if window_type[i % len] is "L", global if "G"
    q_chunk_size: int = 128  # queries per block on the training path
    # torch.compile the composition on the training path (fused loops: 1.5–2.7× faster training steps on CPU,
    # ``kernels/dcmha_compiled.py``); the first forward pass compiles it, which takes tens of seconds. A PyTorch-path
    # option, not a kernel, read in one place (``dcmha_compiled.runs_compiled``): the chunked and eager kernels run it
    # through ``_block_hooks``, and the fused C++ kernels, which compose in their own loops, refuse the config (their
    # static reasons, ``dcmha_compiled.static_reasons``).
    compile_composition: bool = False

    def __post_init__(self) -> None:
        flags = ("pre_compose", "post_compose", "query_wise", "static_proj", "static_only", "qk_norm")
        for name in (*flags, "compile_composition"):
            require(isinstance(getattr(self, name), bool), name, getattr(self, name), "must be true or false")
        for name in ("num_groups", "rank", "window_size", "q_chunk_size"):
            require_count(name, getattr(self, name))
        if self.dynamic_w_hidden_dim is not None:  # null: derived from the model's size
            require_count("dynamic_w_hidden_dim", self.dynamic_w_hidden_dim)
        if self.static_only:
            self._check_static_only()
        require(
            isinstance(self.window_type, str) and len(self.window_type) > 0 and set(self.window_type) <= {"L", "G"},
            "window_type",
            self.window_type,
            'must be a non-empty string of "L" (local) and "G" (global), one per layer, repeated over depth',
        )

    def _check_static_only(self) -> None:
        """Refuse every option that contradicts static-only composition, which has no dynamic weights."""
        no_dynamic = "static_only has no dynamic weights"
        require(
            not self.query_wise,
            "query_wise",
            self.query_wise,
            f"must be false with static_only: it drops the dynamic key-side weights, and {no_dynamic}",
        )
        require(
            not self.static_proj,
            "static_proj",
            self.static_proj,
            "must be false with static_only, which composes with W_b alone (static_proj adds W_b beside the "
            "dynamic weights)",
        )
        require(
            self.rank == 2,
            "rank",
            self.rank,
            f"must stay 2 (the default) with static_only: it sizes the dynamic weights, and {no_dynamic}",
        )
        require(
            self.dynamic_w_hidden_dim is None,
            "dynamic_w_hidden_dim",
            self.dynamic_w_hidden_dim,
            f"must be null with static_only: it sizes the dynamic weights, and {no_dynamic}",
        )
        require(
            self.pre_compose or self.post_compose,
            "pre_compose, post_compose",
            (self.pre_compose, self.post_compose),
            "one must be true with static_only, which would otherwise compose nothing",
        )

    @property
    def has_static_w(self) -> bool:
        """Whether the layer has the static matrix W_b: beside the dynamic weights (static_proj) or alone."""
        return self.static_proj or self.static_only

    @property
    def key_wise(self) -> bool:
        """Whether the composition has key-side matrices KW[s], which the cache keeps: dynamic and not query-wise."""
        return not (self.query_wise or self.static_only)

    def window(self, layer_idx: int) -> int | None:
        """How many keys a query of layer ``layer_idx`` sees: ``window_size`` if local, None (all) if global."""
        return self.window_size if self.window_type[layer_idx % len(self.window_type)] == "L" else None


class Mixing(NamedTuple):
    """Dynamic head-mixing weights of one composition (pre or post), tokens on axis 2.

    w1, w2: (B, G, L, R, M); dd: (B, G, L, M), with M = N/G heads per group. The key-side fields are None
    for query-wise composition.
    """

    qw1: Tensor
    qw2: Tensor
    qdd: Tensor
    kw1: Tensor | None
    kw2: Tensor | None
    kdd: Tensor | None


def query_matrices(mixing: Mixing, static_w: Tensor | None) -> Tensor:
    """(B, G, T, M, M) QW[t] = I + W_b + qw1[t]ᵀ·qw2[t] + diag(qdd[t]), indexed [input head, output head].

    The identity residual and the static matrix ride on the query side, so the cached key-side matrices are
    exactly kw1ᵀ·kw2 + diag(kdd), and query-wise composition needs no special case.
    """
    matrices = mixing.qw1.mT @ mixing.qw2 + torch.diag_embed(1 + mixing.qdd)
    return matrices if static_w is None else matrices + static_w[:, None]


def key_matrices(mixing: Mixing) -> Tensor:
    """(B, G, M, M, S) KW[s] = kw1[s]ᵀ·kw2[s] + diag(kdd[s]), indexed [input head, output head, key].

    Key positions come last, the layout of the cache, so a decoding step reads each entry contiguously.
    """
    return (mixing.kw1.mT @ mixing.kw2 + torch.diag_embed(mixing.kdd)).permute(0, 1, 3, 4, 2)


def compose_merged(scores: Tensor, query_w: Tensor, key_w: Tensor | None) -> Tensor:
    """A'[:, t, s] = (QW[t] + KW[s])ᵀ · A[:, t, s] within each head group: the explicit matrix form.

    scores: (B, N, T, S); query_w: (B, G, T, M, M); key_w: (B, G, M, M, S) or None.
    """
    batch, _, query_len, key_len = scores.shape
    groups, heads_per_group = query_w.shape[1], query_w.shape[-1]
    grouped = scores.view(batch, groups, heads_per_group, query_len, key_len)
    if key_w is not None and query_len == 1:
        # One decoding step, as the official decoder: W[s] = QW + KW[s] for every cached key, applied as one
        # broadcast multiply-sum (an einsum would run S tiny M×M matmuls).
        weights = key_w + query_w[:, :, 0, :, :, None]
        return (grouped.unsqueeze(3) * weights.unsqueeze(4)).sum(2).reshape(scores.shape)
    out = torch.einsum("bgnts,bgtnm->bgmts", grouped, query_w)
    if key_w is not None:
        out = out + torch.einsum("bgnts,bgnms->bgmts", grouped, key_w)
    return out.reshape(scores.shape)


def compose_low_rank(scores: Tensor, mixing: Mixing, static_w: Tensor | None) -> Tensor:
    """The rank-R form of the official ``_cross_head_proj``, kept as a reference for the tests and
    ``benchmarks/bench_composition.py`` (the model uses the merged N×N form, faster on CPU at N = 8):

    A'[m,t,s] = A[m,t,s]·(1 + qdd[t,m] + kdd[s,m]) + Σ_r qw2[t,r,m]·Σ_n qw1[t,r,n]·A[n,t,s]
              + Σ_r kw2[s,r,m]·Σ_n kw1[s,r,n]·A[n,t,s]  (+ Σ_n W_b[n,m]·A[n,t,s]).

    Each side is two batched matmuls over a view of A with its own token axis as the batch axis, so the
    cost is O(R·N) per score instead of O(N²), and no per-token N×N matrix is formed. Fewer flops, but more
    memory-bound passes over the scores than :func:`compose_merged`, which the training path uses instead.
    """
    batch, _, query_len, key_len = scores.shape
    groups, heads_per_group = mixing.qdd.shape[1], mixing.qdd.shape[-1]
    grouped = scores.view(batch, groups, heads_per_group, query_len, key_len)
    out = grouped * (1 + mixing.qdd.mT[..., None])
    by_query = grouped.transpose(2, 3)  # (B, G, T, M, S)
    out = out + (mixing.qw2.mT @ (mixing.qw1 @ by_query)).transpose(2, 3)
    if mixing.kw1 is not None:
        out = torch.addcmul(out, grouped, mixing.kdd.mT[..., None, :])
        by_key = grouped.permute(0, 1, 4, 2, 3)  # (B, G, S, M, T)
        out = out + (mixing.kw2.mT @ (mixing.kw1 @ by_key)).permute(0, 1, 3, 4, 2)
    if static_w is not None:
        out = out + torch.einsum("bgnts,gnm->bgmts", grouped, static_w)
    return out.reshape(scores.shape)


class DynamicWeightProjection(nn.Module):
    """x → the dynamic composition weights of the four slots (DCFormer, Eq. 6–7).

    h = GELU(x·dw1); [w1 | w2] = h·qkw; w1 ← RMSNorm over heads (no scale, eps 1e-6); dd = tanh(x·dd).
    GELU is exact, as in the official PyTorch code (the JAX training code uses the tanh approximation).
    """

    def __init__(self, dim: int, n_heads: int, num_groups: int, rank: int, hidden_dim: int) -> None:
        super().__init__()
        self.rank = rank
        heads_per_group = n_heads // num_groups
        # Zeros make every dynamic weight zero (plain MHA) until reset_parameters draws the training init.
        self.dw1 = nn.Parameter(torch.zeros(dim, num_groups, 4, hidden_dim))
        self.qkw = nn.Parameter(torch.zeros(num_groups, 4, hidden_dim, 2 * rank, heads_per_group))
        self.dd = nn.Parameter(torch.zeros(dim, num_groups, 4 * heads_per_group))

    def reset_parameters(self) -> None:
        """The official JAX training init (``dc_attentions.py``)."""
        dim, hidden = self.dw1.shape[0], self.dw1.shape[-1]
        heads_per_group = self.qkw.shape[-1]
        nn.init.normal_(self.dw1, std=math.sqrt(2 / (dim + hidden)))
        nn.init.normal_(self.qkw, std=math.sqrt(1 / hidden) * 2 / (heads_per_group + self.rank) * 0.01)
        nn.init.normal_(self.dd, std=math.sqrt(2 / (dim + heads_per_group)) * 0.005)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(B, T, D) → w1, w2: (B, G, T, 4, R, M) and dd: (B, G, T, 4, M)."""
        batch, seq_len, dim = x.shape
        groups, slots, hidden = self.dw1.shape[1:]
        heads_per_group = self.qkw.shape[-1]
        h = F.gelu(x @ self.dw1.view(dim, -1)).view(batch, seq_len, groups, slots, hidden)
        w1, w2 = torch.einsum("btgck,gckim->bgtcim", h, self.qkw).split(self.rank, dim=-2)
        w1 = F.rms_norm(w1, (heads_per_group,), eps=1e-6)
        dd = torch.tanh(x @ self.dd.view(dim, -1)).view(batch, seq_len, groups, slots, heads_per_group)
        return w1, w2, dd.transpose(1, 2)


# What a kernel of the composition weights returns: the (pre, post) mixings (None where off, or not formed), and
# {composition: QW (B, G, T, M, M)} and {composition: KW (B, G, M, M, T)} of the call's tokens.
CompositionWeights = tuple[tuple[Mixing | None, Mixing | None], dict[int, Tensor], dict[int, Tensor]]


class Composed(NamedTuple):
    """What DCMHA's kernels read of a call beside q, k and v: the composition weights and matrices, and the call's own
    keys and values where the layer attends over a cache's."""

    mixings: tuple[Mixing | None, Mixing | None]  # pre, post (None: off, static-only, or formed by one fused call)
    query_w: dict[int, Tensor]  # {composition: QW (B, G, T, M, M)}
    new_kw: dict[int, Tensor]  # {composition: KW (B, G, M, M, T)} of this call's tokens
    key_w: dict[int, Tensor]  # {composition: KW (B, G, M, M, S)} of every key the queries see
    fresh_k: Tensor  # this call's own keys and values, before the cache's
    fresh_v: Tensor
    key_positions: Tensor | None  # the keys' positions, in cache slot order; None without a cache


@ATTENTION.register("dcmha")
class DynamicallyComposableAttention(MultiHeadAttention[DCMHAOptions]):
    """DCMHA (Xiao et al., 2024, "Improving Transformers with Dynamically Composable Multi-Head Attention").

    Logits A = QKᵀ/√d + B (B the positional bias) are composed across heads before the softmax and the
    probabilities again after it, with weights computed from the layer input x (Eq. 5–7):

        A'[m,t,s] = A[m,t,s] + Σ_n A[n,t,s]·(QW[t] + KW[s])[n,m],
        QW[t] = qw1[t]ᵀ·qw2[t] + diag(qdd[t]),  KW[s] = kw1[s]ᵀ·kw2[s] + diag(kdd[s]).

    Order, as the official code: logits (+ bias) → pre-compose → mask → fp32 softmax → post-compose → @V.
    Masked probabilities are exactly 0 after the softmax and composition mixes heads at the same (t, s),
    whose mask is shared, so they stay 0: the JAX code's re-zeroing after post-compose would be a no-op.
    Local layers (``window_type``) see ``window_size`` keys including the query itself, the JAX training
    semantics. Projections are MHA's (q/k/v/o_proj, grouped kv heads), inherited.

    ``static_only`` keeps the static matrix W_b alone, the paper's branch 1 (Talking-Heads Attention, Shazeer et
    al., 2020, with the identity residual): A'[m,t,s] = A[m,t,s] + Σ_n A[n,t,s]·W_b[n,m], the same matrix for every
    (t, s). QW[t] = I + W_b, there is no KW (nothing extra is cached) and no ``dyn_w_proj``; W_b keeps
    ``static_proj``'s name and shape, so every kernel computes it as a query-side-only composition.
    """

    map_note = "the post-composition map that actually mixes the values; composing heads can make it signed"

    Options = DCMHAOptions
    extends = ("mha",)
    needs_scores = True
    # The fused kernels where one serves the call (Triton on CUDA, C++ on the CPU), else the composition as score
    # hooks of the chunked eager kernel. The composition weights have their own kernels, chosen the same way before
    # the call attends (``weight_kernels``: ``dcmha_fused.WEIGHT_KERNELS``): a decoding step's token in one fused
    # C++ call, else the PyTorch projection (:meth:`composition_weights`).
    kernels = ("dcmha-triton", "dcmha-fused", "dcmha-decode", "chunked")

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        opts = self.options
        self.num_groups = opts.num_groups
        self.window = self.key_window(cfg, layer_idx)
        self.weight_kernels = stage_chain(cfg, dcmha_fused.WEIGHT_KERNELS)
        if opts.qk_norm:
            self.q_norm = nn.RMSNorm(cfg.head_dim, eps=1e-6)
            self.k_norm = nn.RMSNorm(cfg.head_dim, eps=1e-6)
        self.dyn_w_proj: DynamicWeightProjection | None = None  # static-only composition has no dynamic weights
        if not opts.static_only:
            hidden = opts.dynamic_w_hidden_dim or 2 * opts.rank * cfg.n_heads // opts.num_groups
            self.dyn_w_proj = DynamicWeightProjection(cfg.dim, cfg.n_heads, opts.num_groups, opts.rank, hidden)
        # W_b of the pre and post composition, (2, G, M, M) indexed [input head, output head].
        heads_per_group = cfg.n_heads // opts.num_groups
        self.static_w = (
            nn.Parameter(torch.zeros(2, opts.num_groups, heads_per_group, heads_per_group))
            if opts.has_static_w
            else None
        )

    @classmethod
    def validate_config(cls, cfg: ModelConfig) -> None:
        groups = cfg.attention_opts.num_groups
        require(
            cfg.n_heads % groups == 0,
            "attention_options.num_groups",
            groups,
            f"must divide n_heads={cfg.n_heads}: heads are composed within equal groups",
        )

    @classmethod
    def key_window(cls, cfg: ModelConfig, layer_idx: int) -> int | None:
        return cfg.attention_opts.window(layer_idx)

    def reset_mechanism_parameters(self) -> None:
        if self.dyn_w_proj is not None:
            self.dyn_w_proj.reset_parameters()
        if self.static_w is not None:
            heads_per_group = self.static_w.shape[-1]
            nn.init.normal_(self.static_w, std=math.sqrt(2 / (2 * heads_per_group)) * 0.1)

    def init_added_parameters_as_identity(self, added: Set[str], source: ModelConfig) -> list[str]:
        """Zero qkw, dd and W_b: every dynamic weight is then 0 (w1 = RMSNorm(0) = 0, dd = tanh(0)) and both
        compositions are the identity, A' = A, whatever dw1 is. dw1 keeps its random init, so that qkw gets a
        gradient (with dw1 = 0 too, h = GELU(0) = 0 would leave both stuck). Static-only, W_b = 0 alone makes
        QW = I + W_b = I."""
        for name in ("dyn_w_proj.qkw", "dyn_w_proj.dd", "static_w"):
            if name in added:
                nn.init.zeros_(self.get_parameter(name))
        reasons: list[str] = []
        if "dyn_w_proj.dw1" in added and "dyn_w_proj.qkw" not in added:
            reasons.append("dw1 is new but qkw was loaded, so the dynamic weights GELU(x·dw1)·qkw are not 0")
        if {"q_norm.weight", "k_norm.weight"} & added:
            reasons.append("qk_norm normalises queries and keys whatever its scale, which the source did not")
        source_window = source.attention_opts.window(self.layer_idx) if source.attention == self.registry_name else None
        if self.window != source_window:
            seen = [("all" if window is None else f"the last {window}") for window in (self.window, source_window)]
            shortest = min(window for window in (self.window, source_window) if window is not None)
            reasons.append(
                f"a query sees {seen[0]} keys where the source's saw {seen[1]} (window_type, window_size): "
                f"outputs agree on sequences of at most {shortest} tokens"
            )
        return reasons

    def forward(self, x: Tensor, ctx: AttentionContext, cache: LayerCache | None = None) -> Tensor:
        batch, seq_len, _ = x.shape
        q, k, v = self._project(x)
        if self.options.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = ctx.rotate(q), ctx.rotate(k)
        call = Call.of(self, q, k, ctx, cached=cache is not None)
        mixings, query_w, new_kw = choose(self, call, self.weight_kernels).run(self, x)
        key_positions, key_w = None, new_kw  # key_w: KW of every key the queries see
        fresh_k, fresh_v = k, v
        if cache is not None:
            key_positions, k, v, key_w = self._extend_cache(cache, ctx, k, v, new_kw)
        composed = Composed(mixings, query_w, new_kw, key_w, fresh_k, fresh_v, key_positions)
        out = attend(self, q, k, v, ctx, cached=cache is not None, composed=composed)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq_len, -1))

    def pytorch_attention(
        self, kernel: PyTorchKernel, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, *, composed: Composed
    ) -> Tensor:
        """The composition as the kernel's score and probability hooks, over the keys of ``k`` (the cache's at
        ``composed.key_positions`` on a cached call), local layers within their window."""
        cached = composed.key_positions is not None
        hooks, hook_inputs = self._block_hooks(composed.query_w, composed.key_w, cached=cached)
        out, _ = kernel(
            q,
            k,
            v,
            ctx,
            dropout_p=self.attn_dropout,
            hooks=hooks,
            hook_inputs=hook_inputs,
            window=self.window,
            key_positions=composed.key_positions,
            chunk=self.options.q_chunk_size,
        )
        return out

    def composition_weights(self, x: Tensor) -> CompositionWeights:
        """The PyTorch path of the composition weights of ``x``'s tokens (the reference of ``weight_kernels``): the
        (pre, post) mixings, {composition: QW (B, G, T, M, M)} and {composition: KW (B, G, M, M, T)}; static-only,
        I + W_b and no mixings."""
        if self.options.static_only:
            return (None, None), self._static_query_matrices(x.shape[0], x.shape[1]), {}
        pre, post = self._mixings(x)
        return (pre, post), self._query_matrices(pre, post), self._key_matrices(pre, post)

    def _mixings(self, x: Tensor) -> tuple[Mixing | None, Mixing | None]:
        """The pre and post composition weights (None where switched off), in the scores' dtype (fp32, or float64)."""
        opts = self.options
        if not (opts.pre_compose or opts.post_compose):
            return None, None
        w1, w2, dd = (w.to(compute_dtype(w.dtype)) for w in self.dyn_w_proj(x))

        def mixing(query_slot: int, key_slot: int) -> Mixing:
            query_side = (w1[:, :, :, query_slot], w2[:, :, :, query_slot], dd[:, :, :, query_slot])
            key_side = (w1[:, :, :, key_slot], w2[:, :, :, key_slot], dd[:, :, :, key_slot])
            return Mixing(*query_side, *((None,) * 3 if opts.query_wise else key_side))

        return (
            mixing(PRE_Q, PRE_K) if opts.pre_compose else None,
            mixing(POST_Q, POST_K) if opts.post_compose else None,
        )

    def _block_hooks(
        self, query_w: dict[int, Tensor], key_w: dict[int, Tensor], *, cached: bool
    ) -> tuple[BlockHooks, list[Tensor | None]]:
        """The kernel hooks of a block of queries ``rows`` × keys ``cols`` (pre-compose the scores, post-compose
        the probabilities: ``compose_merged``, or ``compiled_compose`` with ``compile_composition``), and the
        tensors they read: QW and KW of the pre and of the post composition, None where one is off.

        Each block is composed with the merged matrices QW[t] (B, G, rows, M, M) and KW[s] (B, G, M, M, cols), the
        form of Eq. 5–7 with W = QW + KW, on the chunks of the training path as on the eager reference's full
        scores. Both are memory-bound passes over the scores, and at N = 8 the N×N form takes fewer of them (and
        fewer layout copies) than the rank-R factors: fwd+bwd of one (8, 8, 128, 256) block took 61 ms against
        105 ms for the rank-R form (CPU, 1 thread), and the 4-layer training step 1.3–1.6× less time. Compiled,
        the two forms ran equally fast, so the merged one serves both. QW and KW are formed once for all tokens and
        sliced per block, so neither is recomputed for each block; ``key_w`` holds KW of every key the queries see,
        the cache's on a ``cached`` call (empty when query-wise).
        """
        compose = compiled_compose if runs_compiled(self.options, cached=cached) else compose_merged
        inputs = self.composition_matrices(query_w, key_w)

        def hooks(rows: slice, cols: slice, inputs: HookInputs) -> Hooks:
            def block(which: int) -> ScoreHook | None:
                query_w, key_w = inputs[2 * which], inputs[2 * which + 1]
                if query_w is None:
                    return None
                key_w = None if key_w is None else key_w[..., cols]
                return partial(compose, query_w=query_w[:, :, rows], key_w=key_w)

            return Hooks(scores=block(0), probs=block(1))

        return hooks, inputs

    @staticmethod
    def composition_matrices(query_w: dict[int, Tensor], key_w: dict[int, Tensor]) -> list[Tensor | None]:
        """[QW, KW] of the pre- and of the post-composition, None where one is off (KW also where query-wise), from
        {composition: QW (B, G, T, M, M)} and {composition: KW (B, G, M, M, S)}."""
        return [matrix for which in (0, 1) for matrix in (query_w.get(which), key_w.get(which))]

    def _query_matrices(self, pre: Mixing | None, post: Mixing | None) -> dict[int, Tensor]:
        """{composition: QW (B, G, T, M, M)}, the identity and W_b included."""
        matrices = {}
        for which, mixing in enumerate((pre, post)):
            if mixing is not None:
                static_w = self.static_w
                static_w = None if static_w is None else static_w[which].to(compute_dtype(static_w.dtype))
                matrices[which] = query_matrices(mixing, static_w)
        return matrices

    def _static_query_matrices(self, batch: int, seq_len: int) -> dict[int, Tensor]:
        """{composition: QW (B, G, T, M, M)} of static-only composition: I + W_b at every token, a broadcast view
        (autograd sums its gradient over batch and tokens into W_b)."""
        static_w = self.static_w.to(compute_dtype(self.static_w.dtype))
        eye = torch.eye(static_w.shape[-1], dtype=static_w.dtype, device=static_w.device)
        composed = (which for which, on in enumerate((self.options.pre_compose, self.options.post_compose)) if on)
        return {which: (eye + static_w[which])[None, :, None].expand(batch, -1, seq_len, -1, -1) for which in composed}

    @staticmethod
    def _key_matrices(pre: Mixing | None, post: Mixing | None) -> dict[int, Tensor]:
        """{composition: KW (B, G, M, M, T)} of this call's tokens, formed once for the attention and the cache;
        empty where query-wise."""
        mixings = enumerate((pre, post))
        return {which: key_matrices(m) for which, m in mixings if m is not None and m.kw1 is not None}

    def _extend_cache(
        self, cache: WindowCache, ctx: AttentionContext, k: Tensor, v: Tensor, new_kw: dict[int, Tensor]
    ) -> tuple[Tensor, Tensor, Tensor, dict[int, Tensor]]:
        """Store keys, values and each key's merged KW; return the key positions, keys, values and
        {composition: KW (B, G, M, M, S)} the new queries may see."""
        new = {"k": k, "v": v}
        if new_kw:
            # One buffer for both compositions: (B, C, G, M, M, T) → (B, C·G·M·M, T), key positions last.
            new["kw"] = torch.stack(list(new_kw.values()), dim=1).flatten(1, -2)
        key_positions, k, v, *kw = cache.extend(ctx, **new)
        if not kw:
            return key_positions, k, v, {}
        heads_per_group = self.n_heads // self.num_groups
        shape = (len(new_kw), self.num_groups, heads_per_group, heads_per_group)
        merged = kw[0].to(compute_dtype(kw[0].dtype)).unflatten(1, shape).unbind(1)
        return key_positions, k, v, dict(zip(new_kw, merged, strict=True))

    @classmethod
    def cache_layout(cls, cfg: ModelConfig) -> list[CacheBuffer]:
        """MHA's keys and values, plus unless query-wise or static-only the merged key-side matrices KW[s] of each of
        the C compositions, G blocks of (N/G)², i.e. C·N²/G numbers per token."""
        layout = super().cache_layout(cfg)
        opts = cfg.attention_opts
        composed = int(opts.pre_compose) + int(opts.post_compose)
        if composed and opts.key_wise:
            n, g = cfg.n_heads, opts.num_groups
            layout.append(CacheBuffer("kw", composed * n * n // g, f"C·N²/G = {composed}·{n}²/{g}"))
        return layout

    def new_layer_cache(
        self, batch_size: int, max_len: int, *, device: torch.device, dtype: torch.dtype
    ) -> WindowCache:
        """Keys, values and, unless query-wise or static-only, the merged KW of each composition: (B, C·G·M·M, L),
        keys last."""
        capacity = max_len if self.window is None else min(self.window, max_len)
        shapes = {"k": (self.n_kv_heads, self.head_dim), "v": (self.n_kv_heads, self.head_dim)}
        n_composed = int(self.options.pre_compose) + int(self.options.post_compose)
        if n_composed and self.options.key_wise:
            shapes["kw"] = (n_composed * self.n_heads * self.n_heads // self.num_groups,)
        buffers = LayerCache.allocate(batch_size, capacity, device=device, dtype=dtype, **shapes).buffers
        return WindowCache(self.window, **buffers)
