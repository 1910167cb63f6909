"""The attention interface every mechanism implements, and the attention kernels they share.

A mechanism is one :class:`Attention` subclass in one file, registered under a name::

    @ATTENTION.register("mha")
    class MultiHeadAttention(Attention): ...

The model calls ``attention(x, ctx, cache)`` with ``x`` the block's normalised input and never looks
inside. A mechanism gets its layer index at construction, positions and the backend through the
per-forward :class:`AttentionContext`, and owns its :class:`~attnzoo.cache.LayerCache` layout, so it can
cache whatever per-token state it needs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnzoo.cache import LayerCache
from attnzoo.registry import NoOptions, Registry

if TYPE_CHECKING:
    from attnzoo.config import ModelConfig
    from attnzoo.positions import PositionalEncoding

ATTENTION: Registry[type[Attention]] = Registry("attention mechanism", "attention")


@dataclass
class AttentionContext:
    """What every layer needs to know about the current forward call, computed once per call."""

    positions: Tensor  # (T,) absolute positions of the tokens in this call
    start: int  # positions already in the cache; 0 without one
    position: PositionalEncoding
    position_state: Any  # from position.prepare(): e.g. RoPE's cos/sin for these positions
    backend: str  # "eager" or "sdpa"
    attention_maps: list[Tensor] | None = None  # when a list, each layer appends its effective map
    # Biases and masks depend only on the call, not the layer: built by the first layer, reused by the rest.
    _memo: dict[tuple, Tensor | None] = field(default_factory=dict, repr=False)

    @property
    def end(self) -> int:
        return self.start + self.positions.shape[0]

    @property
    def use_eager(self) -> bool:
        return self.backend == "eager" or self.attention_maps is not None

    def rotate(self, x: Tensor) -> Tensor:
        """Apply the positional rotation (RoPE) to (B, heads, T, d) queries or keys; identity otherwise."""
        return self.position.rotate(x, self.position_state)

    def key_positions(self, key_len: int) -> Tensor:
        return torch.arange(key_len, device=self.positions.device)

    def _memoized(self, key: tuple, build: Callable[[], Tensor | None]) -> Tensor | None:
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    def score_bias(self, n_heads: int, key_len: int, bias_repeat: int = 1) -> Tensor | None:
        """The (n_heads, T, key_len) fp32 bias on scaled logits (ALiBi), or None. Each run of ``bias_repeat``
        adjacent heads shares one bias head (the sub-heads of one differential head)."""

        def build() -> Tensor | None:
            bias = self.position.bias(n_heads // bias_repeat, self.positions, self.key_positions(key_len))
            return bias if bias is None or bias_repeat == 1 else bias.repeat_interleave(bias_repeat, dim=0)

        return self._memoized(("bias", n_heads, key_len, bias_repeat), build)

    def allowed(self, key_len: int) -> Tensor:
        """(T, key_len) bool causal mask: query t may see key s iff s <= t."""
        return self._memoized(
            ("allowed", key_len), lambda: self.key_positions(key_len)[None, :] <= self.positions[:, None]
        )

    def sdpa_mask(self, n_heads: int, key_len: int, bias_repeat: int, dtype: torch.dtype) -> Tensor:
        """The ``attn_mask`` for SDPA: the causal mask, or with a bias one additive mask (−inf where masked)."""

        def build() -> Tensor:
            bias = self.score_bias(n_heads, key_len, bias_repeat)
            allowed = self.allowed(key_len)
            return allowed if bias is None else bias.masked_fill(~allowed, float("-inf")).to(dtype)

        return self._memoized(("sdpa_mask", n_heads, key_len, bias_repeat, dtype), build)

    def record(self, attention_map: Tensor) -> None:
        if self.attention_maps is not None:
            self.attention_maps.append(attention_map.detach())


class Attention(nn.Module):
    """Base class of attention mechanisms.

    Subclasses implement ``forward(x, ctx, cache) -> (B, T, dim)`` and ``new_layer_cache``, may declare
    an ``Options`` dataclass (their ``attention_options``), refuse unsupported configurations in
    ``validate_config``, report the head size that positions rotate in ``qk_head_dim``, say how they pair
    with an MHA baseline in ``paired_overrides``, and initialise
    their own parameters in ``reset_mechanism_parameters`` (called after the model's generic init).
    A mechanism that adds parameters to another names it in ``extends`` and starts them where the layer still
    computes what the other did in ``init_added_parameters_as_identity``, so it can be swapped into a
    pretrained model (``attnzoo train --init-from``).
    When ``ctx.attention_maps`` is a list, a layer takes its eager path and records its effective
    (B, heads, T, S) attention map with ``ctx.record``.
    """

    Options: type = NoOptions
    registry_name: str
    # How the effective map that ``ctx.record`` receives is read off this mechanism (shown beside its plots).
    map_note: str = "the softmax probabilities"
    # Mechanisms whose parameters this one holds under the same names, with the same shapes and meaning, and
    # adds its own to (selective and dcmha extend mha): their checkpoints initialise this mechanism.
    extends: tuple[str, ...] = ()

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.options = cfg.attention_opts
        self.dropout = cfg.dropout

    @classmethod
    def validate_config(cls, cfg: ModelConfig) -> None:
        """Raise ``ValueError`` for configurations the mechanism's math does not allow."""

    @classmethod
    def paired_overrides(cls, baseline: ModelConfig) -> dict[str, Any]:
        """Config fields to change when this mechanism replaces MHA in ``baseline``, as its paper pairs them
        (Diff halves the head count and doubles the head size); the default keeps the heads."""
        return {}

    @classmethod
    def qk_head_dim(cls, cfg: ModelConfig) -> int:
        """The per-head query/key size, which is what RoPE rotates."""
        return cfg.head_dim

    def forward(self, x: Tensor, ctx: AttentionContext, cache: LayerCache | None = None) -> Tensor:
        raise NotImplementedError

    def new_layer_cache(self, batch_size: int, max_len: int, *, device, dtype) -> LayerCache:
        raise NotImplementedError

    def reset_mechanism_parameters(self) -> None:
        """Initialise parameters the generic (normal, std=init_std) init must not touch."""

    def init_added_parameters_as_identity(self, added: Set[str], source: ModelConfig) -> list[str]:
        """Start the ``added`` parameters where this layer computes exactly what the ``source`` model's did.

        Called after the weights of a ``source`` model (a mechanism this one ``extends``, or this one with
        other options) were loaded into this layer, ``added`` naming (relative to the layer) the parameters
        they lacked, which hold their training init. Set those that can to values under which the layer's
        output equals the source layer's for any input, and return one line per reason it does not (a part
        whose math has no identity value, a structural difference such as a window); an empty list means
        the layer starts as the source's. The default sets nothing and says so.
        """
        if not added:
            return []
        return [f"{self.registry_name} defines no identity start for {sorted(added)}: they keep their training init"]

    @property
    def attn_dropout(self) -> float:
        return self.dropout if self.training else 0.0


def residual_linear(in_features: int, out_features: int, bias: bool) -> nn.Linear:
    """A projection that writes into the residual stream; the model scales its init by 1/√(2·n_layers)."""
    layer = nn.Linear(in_features, out_features, bias=bias)
    layer.is_residual_projection = True
    return layer


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
) -> tuple[Tensor, Tensor]:
    """Reference attention with explicit fp32 logits and softmax. Returns (output, probabilities).

    q: (B, H, T, d); k: (B, H_kv, S, d); v: (B, H_kv, S, d_v). ``bias_repeat`` lets adjacent query heads
    share one positional-bias head (sub-heads of one differential head).
    """
    n_heads, key_len = q.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    k, v = repeat_kv(k, n_heads // k.shape[1]), repeat_kv(v, n_heads // v.shape[1])
    logits = torch.matmul(q, k.transpose(-2, -1)).float() * scale
    bias = ctx.score_bias(n_heads, key_len, bias_repeat)
    if bias is not None:
        logits = logits + bias
    logits = logits.masked_fill(~ctx.allowed(key_len), float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    dropped = F.dropout(probs, p=dropout_p) if dropout_p > 0 else probs
    return torch.matmul(dropped.to(v.dtype), v), probs


def sdpa_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ctx: AttentionContext,
    *,
    scale: float | None = None,
    dropout_p: float = 0.0,
    bias_repeat: int = 1,
) -> Tensor:
    """``F.scaled_dot_product_attention`` with the same semantics as :func:`eager_attention`.

    Plain causal attention over a fresh sequence uses ``is_causal`` (block skipping, no T×S mask). A
    positional bias or a non-empty cache needs an explicit mask; the bias enters as one additive mask,
    since SDPA refuses ``attn_mask`` together with ``is_causal``.
    """
    n_heads, query_len, key_len = q.shape[1], q.shape[2], k.shape[2]
    k, v = repeat_kv(k, n_heads // k.shape[1]), repeat_kv(v, n_heads // v.shape[1])
    if ctx.score_bias(n_heads, key_len, bias_repeat) is None and query_len in (1, key_len):
        # A fresh sequence is plain causal; a single new token sees every cached key.
        is_causal = query_len > 1
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=is_causal, scale=scale)
    mask = ctx.sdpa_mask(n_heads, key_len, bias_repeat, q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ctx: AttentionContext,
    *,
    scale: float | None = None,
    dropout_p: float = 0.0,
    bias_repeat: int = 1,
) -> Tensor:
    """Causal attention through the context's backend; records the map when the context asks for maps."""
    kwargs = dict(scale=scale, dropout_p=dropout_p, bias_repeat=bias_repeat)
    if not ctx.use_eager:
        return sdpa_attention(q, k, v, ctx, **kwargs)
    out, probs = eager_attention(q, k, v, ctx, **kwargs)
    ctx.record(probs)
    return out
