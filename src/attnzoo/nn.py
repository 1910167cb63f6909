"""attnzoo's attention layers for any PyTorch model: three lines, no attnzoo ``Transformer`` needed.

    from attnzoo.nn import SelfAttention
    self.attn = SelfAttention("diff", dim=256, n_heads=8, position="rope", max_seq_len=1024)
    y = self.attn(x)  # (B, T, dim) → (B, T, dim), causal, positions 0 .. T−1

:class:`SelfAttention` is one registered mechanism (plugins included) plus what attnzoo's ``Transformer`` otherwise
gives it on each call: the positions, RoPE's tables or ALiBi's biases, the causal mask, a KV cache. Its arguments are
:class:`~attnzoo.config.ModelConfig`'s fields and are validated by it, with the same messages; it runs on the same
kernels through the same dispatcher (``attn_backend``), and ``layer.mechanism`` is the module a ``Transformer`` holds at
``layers[i].self_attn``, with the same parameter names and shapes, so weights move between the two with
``load_state_dict`` (:meth:`SelfAttention.from_transformer`).
:class:`Block` is the pre-norm block attnzoo's model stacks: norm → attention → residual, norm → MLP → residual.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch
from torch import Tensor, nn

from attnzoo.attention import ATTENTION, Attention, AttentionContext
from attnzoo.cache import KVCache
from attnzoo.config import ModelConfig
from attnzoo.model import MLP, Transformer, init_linear, make_norm
from attnzoo.positions import POSITIONS, PositionalEncoding
from attnzoo.precision import compute_dtype

__all__ = ["Block", "SelfAttention"]

# Schemes that add a (T, dim) table to the token embeddings: they act before the first layer, not inside attention.
EMBEDDED_POSITIONS = ("learned", "sinusoidal")


def layer_config(
    attention: str,
    dim: int,
    n_heads: int,
    *,
    n_kv_heads: int | None = None,
    head_dim: int | None = None,
    position: str = "rope",
    position_options: dict[str, Any] | None = None,
    max_seq_len: int = 2048,
    causal: bool = True,
    bias: bool = False,
    dropout: float = 0.0,
    attn_backend: str = "auto",
    init_std: float = 0.02,
    **options: Any,
) -> ModelConfig:
    """The :class:`ModelConfig` of one layer: validated there, so a layer refuses what a model refuses, in the same
    words. ``options`` are the mechanism's own (``attention_options``)."""
    if position in EMBEDDED_POSITIONS:
        raise ValueError(
            f"position={position!r} is invalid for a layer: {position} positions are a table added to the token "
            "embeddings, before any attention layer; give the layer position='none' and add the table in your model "
            "(attnzoo's Transformer does this with position='learned' or 'sinusoidal')"
        )
    return ModelConfig(
        vocab_size=1,  # a layer has no vocabulary
        dim=dim,
        n_layers=1,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        bias=bias,
        dropout=dropout,
        max_seq_len=max_seq_len,
        attention=attention,
        attention_options=options,
        position=position,
        position_options=position_options or {},
        attn_backend=attn_backend,
        init_std=init_std,
        causal=causal,
    )


class SelfAttention(nn.Module):
    """A self-attention layer of any registered mechanism: ``layer(x)`` maps (B, T, dim) to (B, T, dim).

    Arguments are :class:`~attnzoo.config.ModelConfig`'s fields of the same names, ``options`` the mechanism's
    (e.g. ``SelfAttention("dcmha", 256, 8, window_type="LG", window_size=128)``); ``layer_idx`` is the layer's
    depth in your model, which some mechanisms read (Diff's λ_init, DCMHA's local/global pattern). Parameters start
    as in attnzoo's model: N(0, ``init_std``), the output projection scaled by 1/√(2·``n_layers``), then the
    mechanism's own init.

    A call takes, besides ``x``:

    * ``positions``: (T,) integer positions that the rotary scheme rotates by, as HF's ``position_ids``; the causal
      order is the tokens' order whatever they say. Default: the next T positions (after a cache's).
    * ``cache``: from :meth:`new_cache`; the call appends its tokens and attends over every cached one.
    * ``padding_mask``: (B, S) bool, True at real tokens, S counting the cached tokens and this call's (HF's
      ``attention_mask``). It runs the eager reference (the only kernel that masks keys per sequence), and a query
      that sees no real token gets a zero output.
    """

    def __init__(self, attention: str, dim: int, n_heads: int, *, layer_idx: int = 0, n_layers: int = 1,
                 **fields: Any) -> None:  # fmt: skip
        super().__init__()
        self.config = layer_config(attention, dim, n_heads, **fields)
        mechanism = ATTENTION.get(attention)
        self.position: PositionalEncoding = POSITIONS.get(self.config.position)(
            self.config, mechanism.qk_head_dim(self.config)
        )
        self.mechanism: Attention = mechanism(self.config, layer_idx)
        self.reset_parameters(n_layers)

    def reset_parameters(self, n_layers: int = 1) -> None:
        """attnzoo's init (``Transformer.reset_parameters``) of this layer in a stack of ``n_layers``."""
        for module in self.mechanism.modules():
            if isinstance(module, nn.Linear):
                init_linear(module, self.config.init_std, n_layers)
        self.mechanism.reset_mechanism_parameters()

    @classmethod
    def from_transformer(cls, model: Transformer, layer_idx: int) -> SelfAttention:
        """Layer ``layer_idx`` of an attnzoo ``model`` as a standalone layer, its weights copied: it computes what the
        model's layer computes on the same (normalised) input. ``model.layers[i].self_attn.load_state_dict(
        layer.mechanism.state_dict())`` takes them back."""
        cfg = model.config
        layer = cls(
            cfg.attention,
            cfg.dim,
            cfg.n_heads,
            layer_idx=layer_idx,
            n_layers=cfg.n_layers,
            **_layer_fields(cfg),
            **cfg.attention_options,
        )
        weights = model.layers[layer_idx].self_attn.state_dict()
        layer.mechanism.load_state_dict(weights)
        return layer.to(device=weights_device(weights), dtype=model.embed_tokens.weight.dtype)

    def new_cache(self, batch_size: int, max_len: int, *, dtype: torch.dtype | None = None) -> KVCache:
        """A preallocated cache of this layer for ``batch_size`` sequences of up to ``max_len`` positions, in the
        layer's dtype unless ``dtype`` is given."""
        if not self.config.causal:
            raise ValueError("a KV cache needs causal=True: a bidirectional layer's outputs change as tokens arrive")
        if batch_size < 1 or max_len < 1:
            raise ValueError(f"batch_size={batch_size} and max_len={max_len} must both be >= 1")
        self.position.check_length(max_len)
        weight = next(self.mechanism.parameters())
        layer = self.mechanism.new_layer_cache(batch_size, max_len, device=weight.device, dtype=dtype or weight.dtype)
        return KVCache([layer], batch_size, max_len)

    def forward(
        self,
        x: Tensor,
        *,
        positions: Tensor | None = None,
        cache: KVCache | None = None,
        padding_mask: Tensor | None = None,
    ) -> Tensor:
        batch, seq_len = self._check_input(x)
        start = 0
        if cache is not None:
            self._check_cache(cache, x)
            cache.check_fits(batch, seq_len)
            start = cache.length
        end = start + seq_len
        self.position.check_length(end)
        if positions is not None:
            self._check_positions(positions, seq_len)
        if padding_mask is not None:
            self._check_padding(padding_mask, batch, end, x.device)
        tokens = torch.arange(start, end, device=x.device)
        dtype = compute_dtype(x.dtype)
        # HF's position_ids: what the rotation reads, the length so far (dynamic RoPE) one past the last of them.
        rotated, length = (tokens, end) if positions is None else (positions, positions.max() + 1)
        ctx = AttentionContext(
            positions=tokens,
            start=start,
            position=self.position,
            position_state=self.position.prepare(rotated, length, dtype=dtype),
            causal=self.config.causal,
            dtype=dtype,
            key_padding=padding_mask,
        )
        out = self.mechanism(x, ctx, cache.layers[0] if cache is not None else None)
        if cache is not None:
            cache.length = end
        return out

    def _check_input(self, x: Tensor) -> tuple[int, int]:
        if x.dim() != 3 or x.shape[-1] != self.config.dim or 0 in x.shape[:2]:
            raise ValueError(
                f"x must have shape (batch >= 1, seq_len >= 1, dim={self.config.dim}); got {tuple(x.shape)}"
            )
        if not x.dtype.is_floating_point:
            raise ValueError(f"x must be a floating-point tensor; got dtype {x.dtype}")
        return x.shape[0], x.shape[1]

    @functools.cached_property
    def _cache_layout(self) -> dict[str, tuple[int, ...]]:
        """This layer's cache buffers laid out (:func:`_layout`), from a meta cache made once: every cached call
        checks its cache against it."""
        buffers = self.mechanism.new_layer_cache(1, 1, device=torch.device("meta"), dtype=torch.float32).buffers
        return {name: _layout(buffer) for name, buffer in buffers.items()}

    def _check_cache(self, cache: KVCache, x: Tensor) -> None:
        """A cache from :meth:`new_cache` of a layer laid out as this one, in x's dtype unless autocast chooses."""
        if not isinstance(cache, KVCache) or len(cache.layers) != 1:
            raise ValueError(f"cache must come from this layer's new_cache(); got {type(cache).__name__}")
        theirs = cache.layers[0].buffers
        layout = {name: _layout(buffer) for name, buffer in theirs.items()}
        if layout != self._cache_layout:
            raise ValueError(
                f"the cache holds {sorted(layout)} laid out as {layout}, not this {self.config.attention} layer's: "
                "make it with this layer's new_cache()"
            )
        cache_dtype = next(iter(theirs.values())).dtype
        if cache_dtype != x.dtype and not torch.is_autocast_enabled(x.device.type):
            raise ValueError(
                f"the cache holds {cache_dtype} and x is {x.dtype}: make the cache with new_cache(..., dtype={x.dtype})"
            )

    def _check_positions(self, positions: Tensor, seq_len: int) -> None:
        if not self.position.rotates:
            raise ValueError(
                f"positions are what a rotary scheme rotates by, and position={self.config.position!r} rotates "
                "nothing: its bias and the causal mask follow the tokens' order; leave positions out"
            )
        if positions.shape != (seq_len,) or positions.dtype.is_floating_point or positions.dtype == torch.bool:
            raise ValueError(
                f"positions must be a ({seq_len},) integer tensor, one per token of x; got {tuple(positions.shape)} "
                f"{positions.dtype}"
            )
        if not torch.compiler.is_compiling():
            low, high = torch.stack(torch.aminmax(positions)).tolist()
            if low < 0 or high >= self.config.max_seq_len:
                bad = low if low < 0 else high
                raise ValueError(f"position {bad} is outside [0, max_seq_len={self.config.max_seq_len})")

    def _check_padding(self, mask: Tensor, batch: int, end: int, device: torch.device) -> None:
        if mask.shape != (batch, end) or mask.dtype != torch.bool or mask.device != device:
            raise ValueError(
                f"padding_mask must be a ({batch}, {end}) bool tensor on {device}, True at the real tokens among the "
                f"cached ones and this call's; got {tuple(mask.shape)} {mask.dtype} on {mask.device}"
            )


class Block(nn.Module):
    """attnzoo's pre-norm block for your own model: x + attn(norm(x)), then + mlp(norm(·)) (``parallel_residual``:
    both from x, as GPT-J). ``attention`` and ``fields`` are :class:`SelfAttention`'s; ``mlp`` ("swiglu", "gelu",
    "gelu_tanh"), ``mlp_hidden_dim`` and ``norm`` ("rmsnorm", "layernorm") as in ``ModelConfig``."""

    def __init__(
        self,
        attention: str,
        dim: int,
        n_heads: int,
        *,
        mlp: str = "swiglu",
        mlp_hidden_dim: int | None = None,
        norm: str = "rmsnorm",
        norm_eps: float = 1e-5,
        parallel_residual: bool = False,
        layer_idx: int = 0,
        n_layers: int = 1,
        **fields: Any,
    ) -> None:
        super().__init__()
        self.self_attn = SelfAttention(attention, dim, n_heads, layer_idx=layer_idx, n_layers=n_layers, **fields)
        self.config = dataclasses.replace(
            self.self_attn.config, mlp=mlp, mlp_hidden_dim=mlp_hidden_dim, norm=norm, norm_eps=norm_eps,
            parallel_residual=parallel_residual,
        )  # fmt: skip
        self.input_layernorm = make_norm(self.config)
        self.post_attention_layernorm = make_norm(self.config)
        self.mlp = MLP(self.config)
        self.dropout = nn.Dropout(self.config.dropout)
        for module in self.mlp.modules():
            if isinstance(module, nn.Linear):
                init_linear(module, self.config.init_std, n_layers)

    @classmethod
    def from_transformer(cls, model: Transformer, layer_idx: int) -> Block:
        """Block ``layer_idx`` of an attnzoo ``model``, its weights copied (norms, attention, MLP)."""
        cfg = model.config
        block = cls(
            cfg.attention, cfg.dim, cfg.n_heads, mlp=cfg.mlp, mlp_hidden_dim=cfg.mlp_hidden_dim, norm=cfg.norm,
            norm_eps=cfg.norm_eps, parallel_residual=cfg.parallel_residual, layer_idx=layer_idx,
            n_layers=cfg.n_layers, **_layer_fields(cfg), **cfg.attention_options,
        )  # fmt: skip
        source = model.layers[layer_idx]
        block.self_attn.mechanism.load_state_dict(source.self_attn.state_dict())
        for name in ("input_layernorm", "post_attention_layernorm", "mlp"):
            getattr(block, name).load_state_dict(getattr(source, name).state_dict())
        weights = source.state_dict()
        return block.to(device=weights_device(weights), dtype=model.embed_tokens.weight.dtype)

    def new_cache(self, batch_size: int, max_len: int, **kwargs: Any) -> KVCache:
        """The attention's cache (:meth:`SelfAttention.new_cache`)."""
        return self.self_attn.new_cache(batch_size, max_len, **kwargs)

    def forward(self, x: Tensor, **attention_inputs: Any) -> Tensor:
        """``attention_inputs``: :meth:`SelfAttention.forward`'s ``positions``, ``cache`` and ``padding_mask``."""
        attention_out = self.dropout(self.self_attn(self.input_layernorm(x), **attention_inputs))
        if self.config.parallel_residual:
            return x + attention_out + self.dropout(self.mlp(self.post_attention_layernorm(x)))
        x = x + attention_out
        return x + self.dropout(self.mlp(self.post_attention_layernorm(x)))


def _layer_fields(cfg: ModelConfig) -> dict[str, Any]:
    """The fields of a model's config that shape one attention layer, as :class:`SelfAttention` takes them; a model's
    embedded positions (learned, sinusoidal) are none of its layers' business."""
    position = "none" if cfg.position in EMBEDDED_POSITIONS else cfg.position
    return {
        "n_kv_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "position": position,
        "position_options": cfg.position_options if position == cfg.position else {},
        "max_seq_len": cfg.max_seq_len,
        "causal": cfg.causal,
        "bias": cfg.bias,
        "dropout": cfg.dropout,
        "attn_backend": cfg.attn_backend,
        "init_std": cfg.init_std,
    }


def weights_device(weights: dict[str, Tensor]) -> torch.device:
    return next(iter(weights.values())).device


def _layout(buffer: Tensor) -> tuple[int, ...]:
    """A cache buffer's shape but its batch and its length (dimensions 0 and 2): what the layer fixes."""
    return tuple(buffer.shape[1:2] + buffer.shape[3:])
