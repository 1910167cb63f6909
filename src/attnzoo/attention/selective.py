"""Selective self-attention: per-token, per-head inverse temperatures on queries and values.

Zhang, Chang, Li, Roy-Chowdhury, Chen & Oymak, "Selective Attention: Enhancing Transformer through
Principled Context Control", NeurIPS 2024 (arXiv 2411.12892). Not Leviathan et al.'s "Selective Attention
Improves Transformer", which is a different method.
"""

from __future__ import annotations

import math
from collections.abc import Set
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnzoo.attention.base import ATTENTION, AttentionContext, mean_pool_heads
from attnzoo.attention.kernels import attend
from attnzoo.attention.mha import MultiHeadAttention
from attnzoo.cache import LayerCache
from attnzoo.precision import compute_dtype
from attnzoo.validation import require

if TYPE_CHECKING:
    from attnzoo.config import ModelConfig

TEMPERATURE_FNS = ("shared", "mlp")
POSITION_COEFFICIENTS = ("sigmoid", "pts", "linear")
# The official code initialises β = 1.5, a position coefficient exp(−exp(1.5)) ≈ 0.0113: scaling starts
# close to vanilla attention. The paper's σ(α) starts at the same value. The linear form, c itself (as the
# official fine-tuning code, which starts it at 1e-5), starts at c = 0: exactly vanilla attention, which the
# other two never reach.
OFFICIAL_BETA_INIT = 1.5


@dataclass(frozen=True)
class SelectiveOptions:
    query_temperature: bool = True  # scale queries by τ_q
    value_temperature: bool = True  # scale values by τ_v
    token_temperature: bool = True  # the token part tanh(f(x)) of each τ
    position_temperature: bool = True  # the position part c·log n of each τ
    temperature_fn: str = "shared"  # f: "shared" reuses the q/v projections (a); "mlp" is W2·GELU(W1·x) (b)
    temperature_hidden_dim: int | None = None  # "mlp" only; None → dim // 4 (about 5% more parameters)
    position_coefficient: str = "sigmoid"  # c = σ(α) (paper), "pts": exp(−exp(β)) (official), "linear": c itself
    per_head_coefficient: bool = False  # one α (β, c) per head instead of one per layer

    def __post_init__(self) -> None:
        for name in (
            "query_temperature",
            "value_temperature",
            "token_temperature",
            "position_temperature",
            "per_head_coefficient",
        ):
            require(isinstance(getattr(self, name), bool), name, getattr(self, name), "must be true or false")
        require(
            self.temperature_fn in TEMPERATURE_FNS,
            "temperature_fn",
            self.temperature_fn,
            f"choose one of {list(TEMPERATURE_FNS)}",
        )
        require(
            self.position_coefficient in POSITION_COEFFICIENTS,
            "position_coefficient",
            self.position_coefficient,
            f"choose one of {list(POSITION_COEFFICIENTS)}",
        )
        # Settings without effect are refused rather than ignored, so an ablation cannot silently be a no-op.
        if self.temperature_hidden_dim is not None:
            require(
                isinstance(self.temperature_hidden_dim, int)
                and not isinstance(self.temperature_hidden_dim, bool)
                and self.temperature_hidden_dim >= 1,
                "temperature_hidden_dim",
                self.temperature_hidden_dim,
                "must be an integer >= 1, or null for dim // 4",
            )
            require(
                self.temperature_fn == "mlp",
                "temperature_hidden_dim",
                self.temperature_hidden_dim,
                f"only applies to temperature_fn='mlp' (got temperature_fn={self.temperature_fn!r}); leave it null",
            )
        if not self.token_temperature:
            require(
                self.temperature_fn == "shared",
                "temperature_fn",
                self.temperature_fn,
                "has no effect with token_temperature=false; leave it at 'shared'",
            )
        if not self.position_temperature:
            require(
                self.position_coefficient == "sigmoid",
                "position_coefficient",
                self.position_coefficient,
                "has no effect with position_temperature=false; leave it at 'sigmoid'",
            )
            require(
                not self.per_head_coefficient,
                "per_head_coefficient",
                self.per_head_coefficient,
                "has no effect with position_temperature=false; leave it false",
            )


class Temperature(nn.Module):
    """The inverse temperature of one side (queries or values): τ = 1 + tanh(f(x)) + c·log n, (B, heads, T).

    n is the token's absolute 1-based position and c = σ(α), exp(−exp(β)) or c itself (``linear``). f is per
    head: with weight sharing f_h = w_hᵀ·GELU(p_h), p_h the head's slice of the existing q (or v) projection;
    otherwise a separate MLP W2·GELU(W1·x) with one output per head.
    """

    def __init__(self, options: SelectiveOptions, dim: int, n_heads: int, head_dim: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.token = options.token_temperature
        self.position = options.position_temperature
        self.shared = options.temperature_fn == "shared"
        self.coefficient_form = options.position_coefficient
        if self.token and self.shared:
            self.weight = nn.Parameter(torch.empty(n_heads, head_dim))
        elif self.token:
            hidden = options.temperature_hidden_dim or max(1, dim // 4)
            self.w1 = nn.Linear(dim, hidden, bias=False)
            self.w2 = nn.Linear(hidden, n_heads, bias=False)
        if self.position:
            # Per layer one value, as the official code's `beta`, but shaped (1,) rather than 0-dim: FSDP2
            # cannot shard 0-dim parameters. Each form names its parameter apart, so a checkpoint of one form
            # never loads into another as a different c.
            shape = (n_heads,) if options.per_head_coefficient else (1,)
            name = {"sigmoid": "alpha", "pts": "beta", "linear": "c"}[self.coefficient_form]
            self.register_parameter(name, nn.Parameter(torch.empty(shape)))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # f's last layer starts at zero, so tanh(f(x)) = 0 and only the small position part is active.
        if self.token and self.shared:
            nn.init.zeros_(self.weight)
        elif self.token:
            nn.init.zeros_(self.w2.weight)
        if not self.position:
            return
        if self.coefficient_form == "pts":
            nn.init.constant_(self.beta, OFFICIAL_BETA_INIT)
        elif self.coefficient_form == "sigmoid":
            c = math.exp(-math.exp(OFFICIAL_BETA_INIT))
            nn.init.constant_(self.alpha, math.log(c / (1 - c)))
        else:
            nn.init.zeros_(self.c)

    def coefficient(self) -> Tensor:
        """The position coefficient c, () or (heads,)."""
        if self.coefficient_form == "pts":
            return torch.exp(-torch.exp(self.beta))
        return torch.sigmoid(self.alpha) if self.coefficient_form == "sigmoid" else self.c

    def init_as_identity(self, added: Set[str]) -> list[str]:
        """Make τ ≡ 1 through the ``added`` parameters (names relative to this module); say why it cannot.

        Zero weights make tanh(f(x)) = 0 and the linear c = 0 exactly. σ(α) and exp(−exp(β)) are positive
        for every finite parameter, so those forms leave the position part on.
        """
        reasons = []
        for name in sorted(added):
            if name in ("weight", "w2.weight", "c"):
                nn.init.zeros_(self.get_parameter(name))
            elif name in ("alpha", "beta"):
                form = "σ(α)" if name == "alpha" else "exp(−exp(β))"
                reasons.append(
                    f"the position part c·log n cannot start at 0 with c = {form} > 0 (c starts at "
                    f"{self.coefficient().max().item():.3g}); position_coefficient='linear' starts at c = 0"
                )
        # A new w1 keeps its random init: under a zero w2, f = 0 whatever w1 is, and a random w1 gives w2 a
        # gradient (a zero w1 would leave both stuck at 0). Under a loaded w2 it would change f.
        if "w1.weight" in added and "w2.weight" not in added:
            reasons.append("w1 is new but w2 was loaded, so the token part tanh(w2·GELU(w1·x)) is not 0")
        return reasons

    def forward(self, x: Tensor, heads: Tensor, positions: Tensor) -> Tensor:
        """τ from the layer input ``x`` (B, T, dim), its projection ``heads`` (B, H, T, d), ``positions`` (T,); in
        fp32, or float64 for a float64 ``x``."""
        batch, seq_len, _ = x.shape
        tau = torch.ones(batch, self.n_heads, seq_len, device=x.device, dtype=compute_dtype(x.dtype))
        if self.token:
            if self.shared:
                # f = Σ_d GELU(heads)·weight as a matmul: its backward hands GELU a dense gradient, where the
                # einsum's was a broadcast one, with which GELU's backward ran 4× slower (CPU, T = 4096).
                f = (F.gelu(heads) @ self.weight[..., None]).squeeze(-1)
            else:
                f = self.w2(F.gelu(self.w1(x))).transpose(1, 2)
            tau = tau + torch.tanh(f.to(tau.dtype))
        if self.position:
            log_n = torch.log1p(positions.to(tau.dtype))  # n = position + 1, absolute, so correct under a cache
            tau = tau + self.coefficient().to(tau.dtype)[..., None] * log_n
        return tau


@ATTENTION.register("selective")
class SelectiveAttention(MultiHeadAttention[SelectiveOptions]):
    """Selective self-attention (SSA; Zhang et al., NeurIPS 2024, §3):

        out = softmax((τ_q ⊙ Q)Kᵀ/√d + B) · (τ_v ⊙ V),    τ(x, n) = tanh(f(x)) + 1 + σ(α)·log n,

    with one τ per token and head (τ_q per query head, τ_v per kv head), n the absolute 1-based position,
    B the positional bias if any (ALiBi, not temperature-scaled) and keys never scaled. The official
    code's position-only form ("PTS") is τ_q = 1 + exp(−exp(β))·log n: logits × τ_q, a per-row scalar.

    Projections are MHA's (q/k/v/o_proj, GQA via n_kv_heads), so an MHA checkpoint loads with only the
    temperature parameters missing; with the token and position parts off, τ ≡ 1 and this is exactly MHA.
    Added to a pretrained MHA model, τ ≡ 1 at the start when f's last layer is zero (its init) and the
    position coefficient is linear with c = 0 (``init_added_parameters_as_identity``).
    The token part reads the pre-RoPE projections, so f depends on the token alone. τ_q is the kernel's
    ``query_scale``: SDPA folds it into the rotated queries (a per-row scalar commutes with the rotation), the
    eager reference scales logit rows. The cache stores rotated keys and τ_v-scaled values.
    """

    map_note = "the softmax probabilities after the query-temperature scaling"

    Options = SelectiveOptions
    extends = ("mha",)

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        options = self.options
        has_temperature = options.token_temperature or options.position_temperature
        self.q_temperature = (
            Temperature(options, cfg.dim, cfg.n_heads, cfg.head_dim)
            if options.query_temperature and has_temperature
            else None
        )
        self.v_temperature = (
            Temperature(options, cfg.dim, cfg.n_kv_heads, cfg.head_dim)
            if options.value_temperature and has_temperature
            else None
        )

    def reset_mechanism_parameters(self) -> None:
        for temperature in (self.q_temperature, self.v_temperature):
            if temperature is not None:
                temperature.reset_parameters()

    def init_added_parameters_as_identity(self, added: Set[str], source: ModelConfig) -> list[str]:
        reasons: list[str] = []
        for side in ("q_temperature", "v_temperature"):
            names = {name.removeprefix(side + ".") for name in added if name.startswith(side + ".")}
            if names:
                reasons += self.get_submodule(side).init_as_identity(names)
        return reasons

    def pooled_kv_state(self, n_kv_heads: int) -> dict[str, Tensor]:
        """MHA's pooled projections plus τ_v's per-kv-head parameters (its token weights, and its position
        coefficient when per head), pooled alike. τ_v is not linear in them, so the pooled τ_v is the same kind of
        starting point as the pooled projections: an average that uptraining adapts."""
        state = super().pooled_kv_state(n_kv_heads)
        if self.v_temperature is not None:
            per_head = ["weight", "w2.weight"]
            if self.options.per_head_coefficient:
                per_head += ["alpha", "beta", "c"]
            for name, tensor in self.v_temperature.state_dict().items():
                if name in per_head:
                    state[f"v_temperature.{name}"] = mean_pool_heads(tensor, self.n_kv_heads, n_kv_heads)
        return state

    def _temperatures(self, x: Tensor, q: Tensor, v: Tensor, positions: Tensor) -> tuple[Tensor | None, ...]:
        tau_q = self.q_temperature(x, q, positions) if self.q_temperature is not None else None
        tau_v = self.v_temperature(x, v, positions) if self.v_temperature is not None else None
        return tau_q, tau_v

    def temperatures(self, x: Tensor, positions: Tensor) -> dict[str, Tensor]:
        """The fp32 inverse temperatures for layer input ``x`` (B, T, dim) at absolute 0-based ``positions`` (T,).

        ``"query"``: (B, n_heads, T); ``"value"``: (B, n_kv_heads, T); each present when that side is on.
        """
        q, _, v = self._project(x)
        tau_q, tau_v = self._temperatures(x, q, v, positions)
        return {name: tau for name, tau in (("query", tau_q), ("value", tau_v)) if tau is not None}

    def forward(self, x: Tensor, ctx: AttentionContext, cache: LayerCache | None = None) -> Tensor:
        batch, seq_len, _ = x.shape
        q, k, v = self._project(x)
        tau_q, tau_v = self._temperatures(x, q, v, ctx.positions)
        if tau_v is not None:
            v = v * tau_v[..., None].to(v.dtype)
        q, k = ctx.rotate(q), ctx.rotate(k)
        if cache is not None:
            k, v = cache.update(ctx, k=k, v=v)
        out = attend(self, q, k, v, ctx, cached=cache is not None, query_scale=tau_q)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq_len, -1))
