"""DIFF V2: differential attention over one attention call (Diff Transformer V2, Microsoft, 2026)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from attnzoo.attention.base import ATTENTION, Attention, AttentionContext, CacheBuffer, residual_linear
from attnzoo.attention.kernels import attend
from attnzoo.cache import LayerCache
from attnzoo.registry import NoOptions

if TYPE_CHECKING:
    from attnzoo.attention.kernels.eager import PyTorchKernel
    from attnzoo.config import ModelConfig


@ATTENTION.register("diff_v2")
class DiffV2Attention(Attention[NoOptions]):
    """DIFF V2: one causal attention over 2h query heads, whose adjacent heads are subtracted.

    With a_m = softmax(Q_m K_mᵀ/√d + B)·V_m the output of query head m (m = 0 .. 2h−1, size d) and
    λ_i(t) = sigmoid(x_t W_λ)_i one weight per token and differential head, the formula of the official
    ``Diff-Transformer-V2/multihead_flashdiffv2.py`` (and its blog post of 2026-01-20) is::

        head_i(t) = a_2i(t) − λ_i(t)·a_2i+1(t),     O = o_proj(concat_i head_i)

    V1's per-head norm, (1 − λ_init) factor and exp-reparameterised λ are gone, and V and the head size
    stay at the baseline's. ``n_heads`` = h, ``head_dim`` = d, ``n_kv_heads`` = h_kv; parameter names
    (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``, ``lambda_proj``) are the official ones, and, as there,
    no projection has a bias, whatever ``cfg.bias`` says. Query head m reads kv head m // (2h / h_kv), so
    heads 2i and 2i+1 share their keys and values (the config's rule that h_kv divides h guarantees it); with
    ALiBi they share differential head i's slope.
    """

    map_note = "the differential map of each head pair, A1 − λ·A2 with a per-token λ, signed"

    kv_projections = ("k_proj", "v_proj")
    # Diff's fused CPU kernel on a fresh sequence (each head pair as Diff's two maps with shared keys), else one SDPA
    # call over the 2h query heads.
    kernels = ("diff-v2-flash", "sdpa")

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.dim, 2 * cfg.n_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = residual_linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)
        self.lambda_proj = nn.Linear(cfg.dim, cfg.n_heads, bias=False)

    def forward(self, x: Tensor, ctx: AttentionContext, cache: LayerCache | None = None) -> Tensor:
        batch, seq_len, _ = x.shape
        q = self.q_proj(x).view(batch, seq_len, 2 * self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq_len, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq_len, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = ctx.rotate(q), ctx.rotate(k)
        if cache is not None:
            k, v = cache.update(ctx, k=k, v=v)
        lam = torch.sigmoid(self.lambda_proj(x)).transpose(1, 2)[..., None]  # (B, h, T, 1)
        attn = attend(self, q, k, v, ctx, cached=cache is not None, lam=lam)
        return self.o_proj(attn.transpose(1, 2).reshape(batch, seq_len, -1))

    def pytorch_attention(
        self, kernel: PyTorchKernel, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, *, lam: Tensor
    ) -> Tensor:
        """One call over the 2h query heads, adjacent pairs sharing a positional-bias head, then head 2i minus λ
        times head 2i + 1, for the outputs and for the recorded map."""
        attn, probs = kernel(q, k, v, ctx, dropout_p=self.attn_dropout, bias_repeat=2, record=False)
        if probs is not None:
            ctx.record(probs[:, 0::2] - lam * probs[:, 1::2])
        return attn[:, 0::2] - lam * attn[:, 1::2]

    @classmethod
    def cache_layout(cls, cfg: ModelConfig) -> list[CacheBuffer]:
        # The 2h query heads share h_kv kv heads of the baseline's size: MHA's cache at n_kv_heads.
        numbers, formula = cfg.n_kv_heads * cfg.head_dim, f"n_kv_heads·head_dim = {cfg.n_kv_heads}·{cfg.head_dim}"
        return [CacheBuffer("k", numbers, formula), CacheBuffer("v", numbers, formula)]

    def new_layer_cache(self, batch_size: int, max_len: int, *, device: torch.device, dtype: torch.dtype) -> LayerCache:
        shape = (self.n_kv_heads, self.head_dim)
        return LayerCache.allocate(batch_size, max_len, device=device, dtype=dtype, k=shape, v=shape)
