"""The attention interface every mechanism implements: :class:`Attention`, its per-call
:class:`AttentionContext`, and the registry of mechanisms. The kernels they share are in ``kernels.py``.

A mechanism is one :class:`Attention` subclass in one file, registered under a name::

    @ATTENTION.register("mha")
    class MultiHeadAttention(Attention): ...

The model calls ``attention(x, ctx, cache)`` with ``x`` the block's normalised input and never looks
inside. A mechanism gets its layer index at construction, positions and the backend through the
per-forward :class:`AttentionContext`, and owns its :class:`~attnzoo.cache.LayerCache` layout, so it can
cache whatever per-token state it needs. It computes attention with one call,
:func:`~attnzoo.attention.kernels.attend`, which picks the kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import torch
from torch import Tensor, nn

from attnzoo.cache import LayerCache
from attnzoo.registry import NoOptions, Registry

if TYPE_CHECKING:
    from attnzoo.config import ModelConfig
    from attnzoo.positions import PositionalEncoding

OptionsT = TypeVar("OptionsT")

ATTENTION: Registry[type[Attention]] = Registry("attention mechanism", "attention", "attnzoo.attention")


def visible(q_positions: Tensor, k_positions: Tensor, window: int | None = None) -> Tensor:
    """(T, S) bool: query t sees key s iff s <= t and, with a window, t − s < window (itself included)."""
    distance = q_positions[:, None] - k_positions[None, :]
    return distance >= 0 if window is None else (distance >= 0) & (distance < window)


@dataclass
class AttentionContext:
    """What every layer needs to know about the current forward call, computed once per call."""

    positions: Tensor  # (T,) absolute positions of the tokens in this call
    start: int  # positions already in the cache; 0 without one
    position: PositionalEncoding
    position_state: Any  # from position.prepare(): e.g. RoPE's cos/sin for these positions
    backend: str  # the config's attn_backend, "auto", "eager" or "sdpa": kernels.attend interprets it
    attention_maps: list[Tensor] | None = None  # when a list, each layer appends its effective map
    dtype: torch.dtype = torch.float32  # of positional biases and tables: the model's compute_dtype
    # Biases and masks depend only on the call, not the layer: built by the first layer, reused by the rest.
    _memo: dict[tuple, Tensor | None] = field(default_factory=dict, repr=False)

    @property
    def end(self) -> int:
        return self.start + self.positions.shape[0]

    def rotate(self, x: Tensor) -> Tensor:
        """Apply the positional rotation (RoPE) to (B, heads, T, d) queries or keys; identity otherwise."""
        return self.position.rotate(x, self.position_state)

    def key_positions(self, key_len: int) -> Tensor:
        return torch.arange(key_len, device=self.positions.device)

    def _memoized(self, key: tuple, build: Callable[[], Tensor | None]) -> Tensor | None:
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    def position_bias(
        self, n_heads: int, q_positions: Tensor, k_positions: Tensor, bias_repeat: int = 1
    ) -> Tensor | None:
        """The (n_heads, T, S) bias on scaled logits (ALiBi) between these positions, or None, in ``self.dtype``.
        Each run of ``bias_repeat`` adjacent heads shares one bias head (the sub-heads of one differential head)."""
        bias = self.position.bias(n_heads // bias_repeat, q_positions, k_positions, dtype=self.dtype)
        return bias if bias is None or bias_repeat == 1 else bias.repeat_interleave(bias_repeat, dim=0)

    def score_bias(self, n_heads: int, key_len: int, bias_repeat: int = 1) -> Tensor | None:
        """:meth:`position_bias` of this call's queries against keys 0 .. key_len−1."""
        return self._memoized(
            ("bias", n_heads, key_len, bias_repeat),
            lambda: self.position_bias(n_heads, self.positions, self.key_positions(key_len), bias_repeat),
        )

    def allowed(self, key_len: int, window: int | None = None) -> Tensor:
        """(T, key_len) bool causal mask of this call's queries, within ``window`` keys if given (:func:`visible`)."""
        return self._memoized(
            ("allowed", key_len, window), lambda: visible(self.positions, self.key_positions(key_len), window)
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


class Attention(nn.Module, Generic[OptionsT]):
    """Base class of attention mechanisms, generic in their ``Options`` dataclass.

    Subclasses implement ``forward(x, ctx, cache) -> (B, T, dim)`` and ``new_layer_cache``, may declare
    an ``Options`` dataclass (their ``attention_options``), refuse unsupported configurations in
    ``validate_config``, report the head size that positions rotate in ``qk_head_dim``, say how they pair
    with an MHA baseline in ``paired_overrides``, and initialise
    their own parameters in ``reset_mechanism_parameters`` (called after the model's generic init).
    A mechanism that adds parameters to another names it in ``extends`` and starts them where the layer still
    computes what the other did in ``init_added_parameters_as_identity``, so it can be swapped into a
    pretrained model (``attnzoo train --init-from``).
    Attention itself goes through :func:`~attnzoo.attention.kernels.attend`, which picks the kernel and
    records the effective (B, heads, T, S) attention map when ``ctx.attention_maps`` is a list.
    """

    Options: type = NoOptions
    registry_name: str
    # How the effective map that ``ctx.record`` receives is read off this mechanism (shown beside its plots).
    map_note: str = "the softmax probabilities"
    # Mechanisms whose parameters this one holds under the same names, with the same shapes and meaning, and
    # adds its own to (selective and dcmha extend mha): their checkpoints initialise this mechanism.
    extends: tuple[str, ...] = ()
    # True for a mechanism that acts on the scores or probabilities (kernel hooks), which SDPA cannot run:
    # attn_backend="sdpa" refuses it and "auto" runs it on the chunked eager kernel.
    needs_scores: bool = False

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.options: OptionsT = cfg.attention_opts
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

    def new_layer_cache(self, batch_size: int, max_len: int, *, device: torch.device, dtype: torch.dtype) -> LayerCache:
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
