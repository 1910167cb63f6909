"""Multi-head attention with grouped kv heads: MHA, GQA and MQA through ``n_kv_heads``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from attnzoo.attention.base import ATTENTION, Attention, AttentionContext, CacheBuffer, OptionsT, residual_linear
from attnzoo.attention.kernels import attend
from attnzoo.cache import LayerCache

if TYPE_CHECKING:
    from attnzoo.config import ModelConfig


@ATTENTION.register("mha")
class MultiHeadAttention(Attention[OptionsT]):
    """softmax(QKᵀ/√d + B)·V per head (Vaswani et al., 2017, Eq. 1), with B the positional bias if any.

    Query head h reads kv head h // (n_heads / n_kv_heads) (GQA, Ainslie et al., 2023; MQA when
    n_kv_heads = 1), as in HF LLaMA, whose projection names (q/k/v/o_proj) are used here. MHA itself takes no
    options; it stays generic in them for the mechanisms that extend it (selective, dcmha).
    """

    kv_projections = ("k_proj", "v_proj")

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=cfg.bias)
        self.k_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=cfg.bias)
        self.v_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=cfg.bias)
        self.o_proj = residual_linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=cfg.bias)

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(B, T, dim) → q (B, H, T, d), k and v (B, H_kv, T, d), before any rotation."""
        batch, seq_len, _ = x.shape
        q = self.q_proj(x).view(batch, seq_len, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq_len, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq_len, self.n_kv_heads, self.head_dim).transpose(1, 2)
        return q, k, v

    def forward(self, x: Tensor, ctx: AttentionContext, cache: LayerCache | None = None) -> Tensor:
        batch, seq_len, _ = x.shape
        q, k, v = self._project(x)
        q, k = ctx.rotate(q), ctx.rotate(k)
        if cache is not None:
            k, v = cache.update(ctx, k=k, v=v)
        out = attend(self, q, k, v, ctx, cached=cache is not None)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq_len, -1))

    @classmethod
    def cache_layout(cls, cfg: ModelConfig) -> list[CacheBuffer]:
        numbers, formula = cfg.n_kv_heads * cfg.head_dim, f"n_kv_heads·head_dim = {cfg.n_kv_heads}·{cfg.head_dim}"
        return [CacheBuffer("k", numbers, formula), CacheBuffer("v", numbers, formula)]

    def new_layer_cache(self, batch_size: int, max_len: int, *, device: torch.device, dtype: torch.dtype) -> LayerCache:
        shape = (self.n_kv_heads, self.head_dim)
        return LayerCache.allocate(batch_size, max_len, device=device, dtype=dtype, k=shape, v=shape)
