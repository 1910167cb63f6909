"""Differential attention (Ye et al., "Differential Transformer", ICLR 2025, arXiv 2410.05258)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnzoo.attention.base import ATTENTION, Attention, AttentionContext, CacheBuffer, residual_linear
from attnzoo.attention.kernels import attend
from attnzoo.cache import LayerCache
from attnzoo.precision import compute_dtype
from attnzoo.validation import is_number, require

if TYPE_CHECKING:
    from attnzoo.attention.kernels.eager import PyTorchKernel
    from attnzoo.config import ModelConfig


def lambda_init_fn(depth: int) -> float:
    """λ_init = 0.8 − 0.6·exp(−0.3·depth), with depth the 0-based layer index (the paper's l − 1)."""
    return 0.8 - 0.6 * math.exp(-0.3 * depth)


@dataclass(frozen=True)
class DiffOptions:
    lambda_init: float | None = None  # None → 0.8 − 0.6·exp(−0.3·depth)
    subln_affine: bool = True  # False reproduces the first release (and flashdiff.py, HF diffllama)
    subln_eps: float = 1e-5  # the official value; HF diffllama uses its rms_norm_eps

    def __post_init__(self) -> None:
        if self.lambda_init is not None:
            require(
                isinstance(self.lambda_init, (int, float))
                and not isinstance(self.lambda_init, bool)
                and 0 <= self.lambda_init < 1,
                "lambda_init",
                self.lambda_init,
                "must be null (the depth schedule) or a number in [0, 1): the output is scaled by 1 − lambda_init",
            )
        require(isinstance(self.subln_affine, bool), "subln_affine", self.subln_affine, "must be true or false")
        require(
            is_number(self.subln_eps) and self.subln_eps > 0, "subln_eps", self.subln_eps, "must be a finite number > 0"
        )


@ATTENTION.register("diff")
class DifferentialAttention(Attention[DiffOptions]):
    """Differential attention: the difference of two softmax maps cancels common-mode attention noise.

    For differential head i, with query/key sub-heads of size d and a value head of size 2d (Eq. 1–3)::

        A_i  = softmax(Q1_i K1_iᵀ/√d + B) − λ·softmax(Q2_i K2_iᵀ/√d + B)      (Eq. 1, both softmaxes in fp32)
        λ    = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init                       (Eq. 2, fp32, one per layer)
        O    = out_proj(concat_i (1 − λ_init)·subln(A_i V_i))                  (Eq. 3)

    with B the positional bias (ALiBi), shared by both maps, and subln an RMSNorm over 2d (eps 1e-5 by default).

    Layout and names follow the official microsoft/unilm ``Diff-Transformer`` code, so its state dicts load
    as they are: ``n_heads`` = H differential heads, d = head_dim / 2, the query/key sub-heads are striped
    (head i uses sub-heads 2i and 2i+1), and with GQA differential head i reads kv head i // (H / H_kv),
    whose keys are sub-heads 2j and 2j+1 (the *flash* semantics the authors recommend; their naive file
    differs when H_kv < H). Projections have no bias, as in the official code, whatever ``cfg.bias`` says.
    The projections have the parameters of MHA with 2H heads of size d; λ adds 4d and subln 2d per layer.
    """

    map_note = "the differential map softmax(A1) − λ·softmax(A2), signed (rows sum to 1 − λ)"

    Options = DiffOptions
    # The fused CPU kernel on a fresh sequence, the one-row kernel on a CPU decoding step, else A1·V − λ·A2·V by two
    # SDPA calls.
    kernels = ("diff-flash", "diff-decode", "sdpa")
    # Kv head j owns rows [j·2d, (j+1)·2d) of both: key sub-heads 2j and 2j+1 (striped), and one value head of
    # width 2d. Pooling whole kv heads keeps every A1 key with A1's and every A2 key with A2's, so the grouped
    # model keeps the flash semantics (differential head i reads kv head i // (H / H_kv)).
    kv_projections = ("k_proj", "v_proj")

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.n_heads, self.n_kv_heads = cfg.n_heads, cfg.n_kv_heads
        self.head_dim = cfg.head_dim // 2  # d: the official code's name for the sub-head size
        self.lambda_init = lambda_init_fn(layer_idx) if self.options.lambda_init is None else self.options.lambda_init
        self.q_proj = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.out_proj = residual_linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)
        self.lambda_q1 = nn.Parameter(torch.zeros(self.head_dim))
        self.lambda_k1 = nn.Parameter(torch.zeros(self.head_dim))
        self.lambda_q2 = nn.Parameter(torch.zeros(self.head_dim))
        self.lambda_k2 = nn.Parameter(torch.zeros(self.head_dim))
        self.subln = nn.RMSNorm(
            2 * self.head_dim, eps=self.options.subln_eps, elementwise_affine=self.options.subln_affine
        )
        self.reset_mechanism_parameters()

    @classmethod
    def validate_config(cls, cfg: ModelConfig) -> None:
        require(
            cfg.head_dim % 2 == 0,
            "head_dim",
            cfg.head_dim,
            "must be even for diff attention: each differential head splits into two query/key sub-heads of "
            "size head_dim / 2 (head_dim defaults to dim / n_heads)",
        )

    @classmethod
    def paired_overrides(cls, baseline: ModelConfig) -> dict[str, Any]:
        # The paper's pairing: half the heads, each of twice the size, so the sub-heads keep the baseline's
        # head size and the projections keep its parameter count.
        return {
            "n_heads": max(1, baseline.n_heads // 2),
            "n_kv_heads": max(1, baseline.n_kv_heads // 2),
            "head_dim": 2 * baseline.head_dim,
        }

    @classmethod
    def qk_head_dim(cls, cfg: ModelConfig) -> int:
        return cfg.head_dim // 2

    def reset_mechanism_parameters(self) -> None:
        for vector in (self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2):
            nn.init.normal_(vector, mean=0.0, std=0.1)

    def lambda_full(self) -> Tensor:
        """λ of Eq. 2, a scalar in fp32 (float64 in a float64 model)."""
        dtype = compute_dtype(self.lambda_q1.dtype)
        lambda_1 = torch.exp(torch.dot(self.lambda_q1.to(dtype), self.lambda_k1.to(dtype)))
        lambda_2 = torch.exp(torch.dot(self.lambda_q2.to(dtype), self.lambda_k2.to(dtype)))
        return lambda_1 - lambda_2 + self.lambda_init

    def forward(self, x: Tensor, ctx: AttentionContext, cache: LayerCache | None = None) -> Tensor:
        batch, seq_len, _ = x.shape
        d = self.head_dim
        q = self.q_proj(x).view(batch, seq_len, 2 * self.n_heads, d).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq_len, 2 * self.n_kv_heads, d).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq_len, self.n_kv_heads, 2 * d).transpose(1, 2)
        q, k = ctx.rotate(q), ctx.rotate(k)
        if cache is not None:
            k, v = cache.update(ctx, k=k, v=v)
        attn = attend(self, q, k, v, ctx, cached=cache is not None, lam=self.lambda_full())
        attn = self.head_norm(attn) * (1 - self.lambda_init)
        return self.out_proj(attn.transpose(1, 2).reshape(batch, seq_len, -1))

    def pytorch_attention(
        self, kernel: PyTorchKernel, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, *, lam: Tensor
    ) -> Tensor:
        """(A1 − λ·A2)·V as A1·V − λ·A2·V, one kernel call per map: the PyTorch path, and the reference of the fused
        CPU kernel (``diff-flash``)."""
        q1, q2, k1, k2 = q[:, 0::2], q[:, 1::2], k[:, 0::2], k[:, 1::2]
        # Wider values than queries: the SDPA kernel pads q and k where it must (sdpa_pads_queries).
        attn1, probs1 = kernel(q1, k1, v, ctx, dropout_p=self.attn_dropout, record=False)
        attn2, probs2 = kernel(q2, k2, v, ctx, dropout_p=self.attn_dropout, record=False)
        if probs1 is not None and probs2 is not None:
            ctx.record(probs1 - lam * probs2)
        # (A1 − λ·A2)·V = A1·V − λ·A2·V, so the fast path never forms the difference map.
        return attn1 - lam.to(attn1.dtype) * attn2

    def head_norm(self, attn: Tensor) -> Tensor:
        """subln as the official ``rms_norm.py``: normalise in fp32 (float64 in a float64 model), cast back, then
        scale by the weight, so it behaves the same under autocast and in a bf16 model."""
        weight = self.subln.weight
        if attn.dtype == compute_dtype(attn.dtype) and (weight is None or weight.dtype == attn.dtype):
            # Nothing to cast: one fused call, the weight included, rather than a norm and then a product.
            return F.rms_norm(attn, self.subln.normalized_shape, weight, eps=self.subln.eps)
        upcast = attn.to(compute_dtype(attn.dtype))
        normed = F.rms_norm(upcast, self.subln.normalized_shape, eps=self.subln.eps).type_as(attn)
        return normed if weight is None else normed * weight

    @classmethod
    def cache_layout(cls, cfg: ModelConfig) -> list[CacheBuffer]:
        """Keys: two sub-heads of size d = head_dim/2 per kv head; values: one head of width 2d per kv head."""
        kv, d = cfg.n_kv_heads, cfg.head_dim // 2
        return [
            CacheBuffer("k", 2 * kv * d, f"2·n_kv_heads·d = 2·{kv}·{d}: two key sub-heads, d = head_dim/2"),
            CacheBuffer("v", kv * 2 * d, f"n_kv_heads·2d = {kv}·{2 * d}: values are 2d wide"),
        ]

    def new_layer_cache(self, batch_size: int, max_len: int, *, device: torch.device, dtype: torch.dtype) -> LayerCache:
        d = self.head_dim
        return LayerCache.allocate(
            batch_size, max_len, device=device, dtype=dtype, k=(2 * self.n_kv_heads, d), v=(self.n_kv_heads, 2 * d)
        )
