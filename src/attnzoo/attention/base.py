"""The attention interface every mechanism implements: :class:`Attention`, its per-call
:class:`AttentionContext`, and the registry of mechanisms. The kernels are records in ``kernels/``.

A mechanism is one :class:`Attention` subclass in one file, registered under a name::

    @ATTENTION.register("mha")
    class MultiHeadAttention(Attention): ...

The model calls ``attention(x, ctx, cache)`` with ``x`` the block's normalised input and never looks
inside. A mechanism gets its layer index and its kernels at construction, positions through the
per-forward :class:`AttentionContext`, and owns its :class:`~attnzoo.cache.LayerCache` layout, so it can
cache whatever per-token state it needs. It computes attention with one call,
:func:`~attnzoo.attention.kernels.attend`, which picks the kernel: a mechanism names its kernels in order of
preference and never picks one itself.
"""

from __future__ import annotations

from collections.abc import Callable, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

import torch
from torch import Tensor, nn

from attnzoo.cache import LayerCache
from attnzoo.registry import NoOptions, Registry

if TYPE_CHECKING:
    from attnzoo.attention.kernels import Kernel
    from attnzoo.attention.kernels.eager import PyTorchKernel
    from attnzoo.config import ModelConfig
    from attnzoo.positions import PositionalEncoding

OptionsT = TypeVar("OptionsT")

ATTENTION: Registry[type[Attention]] = Registry("attention mechanism", "attention", "attnzoo.attention")


def visible(q_positions: Tensor, k_positions: Tensor, window: int | None = None, causal: bool = True) -> Tensor:
    """(T, S) bool: query t sees key s iff s <= t and, with a window, t − s < window (itself included).

    Not causal, every key is visible, and a window is symmetric: |t − s| < window, 2·window − 1 keys."""
    distance = q_positions[:, None] - k_positions[None, :]
    if not causal:
        return torch.ones_like(distance, dtype=torch.bool) if window is None else distance.abs() < window
    return distance >= 0 if window is None else (distance >= 0) & (distance < window)


@dataclass
class AttentionContext:
    """What every layer needs to know about the current forward call, computed once per call."""

    positions: Tensor  # (T,) absolute positions of the tokens in this call
    start: int | None  # positions already in the cache; 0 without one; None on a static step (only a tensor knows)
    position: PositionalEncoding
    position_state: Any  # from position.prepare(): e.g. RoPE's cos/sin for these positions
    attention_maps: list[Tensor] | None = None  # when a list, each layer appends its effective map
    # When a dict, each layer files under its index the name of the kernel its attention ran (``kernels.attend``).
    kernels: dict[int, str] | None = None
    # When a dict, the eager kernel records what enters the softmax (``record_logits``): the probes' top logit.
    attention_logits: dict[int, list[Tensor]] | None = None
    causal: bool = True  # False: queries see later keys too (the config's ``causal``)
    dtype: torch.dtype = torch.float32  # of positional biases and tables: the model's compute_dtype
    # A static decoding step (``attnzoo.cache``): one query attends over a cache's whole buffers, the keys at
    # ``key_positions``, and only the mask built here from ``positions`` excludes the slots it may not see.
    static: bool = False
    # (B, S) bool, True at the real tokens of each sequence among the S = ``end`` positions so far (HF's
    # ``attention_mask``), or None: every key is a token. Only the eager reference masks keys per sequence
    # (``Kernel.masks_padding``); a query that sees no real key gets a zero output rather than a NaN.
    key_padding: Tensor | None = None
    # Biases and masks depend only on the call, not the layer: built by the first layer, reused by the rest.
    _memo: dict[tuple, Tensor | None] = field(default_factory=dict, repr=False)

    @property
    def end(self) -> int:
        return self.start + self.positions.shape[0]

    def rotate(self, x: Tensor) -> Tensor:
        """Apply the positional rotation (RoPE) to (B, heads, T, d) queries or keys; identity otherwise."""
        return self.position.rotate(x, self.position_state)

    def key_positions(self, key_len: int) -> Tensor:
        """(key_len,) absolute positions of the keys: 0 .. key_len−1, or on a static step those of a cache buffer
        of key_len slots, where slot s holds the latest position ≡ s (mod key_len) up to the query, and a slot not
        yet written the future position s, which the causal mask excludes (a buffer of max_len slots: 0 .. max_len−1
        again; a ring of the window: the window's positions)."""
        slots = torch.arange(key_len, device=self.positions.device)
        if not self.static:
            return slots

        def ring_positions() -> Tensor:
            last = self.positions[-1]
            latest = last - (last - slots) % key_len
            return torch.where(latest < 0, latest + key_len, latest)

        return self._memoized(("key_positions", key_len), ring_positions)

    def _memoized(self, key: tuple, build: Callable[[], Tensor | None]) -> Tensor | None:
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    def position_bias(
        self, n_heads: int, q_positions: Tensor, k_positions: Tensor, bias_repeat: int = 1
    ) -> Tensor | None:
        """The (n_heads, T, S) bias on scaled logits (ALiBi) between these positions, or None, in ``self.dtype``.
        Each run of ``bias_repeat`` adjacent heads shares one bias head (the sub-heads of one differential head)."""
        bias = self.position.bias(
            n_heads // bias_repeat, q_positions, k_positions, causal=self.causal, dtype=self.dtype
        )
        return bias if bias is None or bias_repeat == 1 else bias.repeat_interleave(bias_repeat, dim=0)

    def score_bias(self, n_heads: int, key_len: int, bias_repeat: int = 1) -> Tensor | None:
        """:meth:`position_bias` of this call's queries against keys 0 .. key_len−1."""
        return self._memoized(
            ("bias", n_heads, key_len, bias_repeat),
            lambda: self.position_bias(n_heads, self.positions, self.key_positions(key_len), bias_repeat),
        )

    def bias_slopes(self, n_heads: int, bias_repeat: int = 1) -> Tensor | None:
        """(n_heads,) fp32 slopes of a causal linear bias m_h·(j − i) (:meth:`PositionalEncoding.bias_slopes`), each
        shared by ``bias_repeat`` adjacent heads, or None when the scheme's bias is not one."""

        def build() -> Tensor | None:
            slopes = self.position.bias_slopes(n_heads // bias_repeat)
            if slopes is None:
                return None
            return torch.tensor(slopes, dtype=torch.float32, device=self.positions.device).repeat_interleave(
                bias_repeat
            )

        return self._memoized(("slopes", n_heads, bias_repeat), build)

    def allowed(self, key_len: int, window: int | None = None) -> Tensor:
        """(T, key_len) bool mask of this call's queries, causal unless the context is not, within ``window``
        keys if given (:func:`visible`)."""
        return self._memoized(
            ("allowed", key_len, window),
            lambda: visible(self.positions, self.key_positions(key_len), window, self.causal),
        )

    def sdpa_mask(self, n_heads: int, key_len: int, bias_repeat: int, dtype: torch.dtype) -> Tensor:
        """The ``attn_mask`` for SDPA: the causal mask (T, S), or with a bias one additive (1, H, T, S) mask, −inf
        where masked. Four axes, not the bias's three: SDPA on the CPU sends a 3-D mask to its math path, which
        left an ALiBi decoding step far behind MHA's (benchmarks/results/source-comments.md); 2-D and 4-D masks run
        its flash kernel."""

        def build() -> Tensor:
            bias = self.score_bias(n_heads, key_len, bias_repeat)
            allowed = self.allowed(key_len)
            return allowed if bias is None else bias.masked_fill(~allowed, float("-inf"))[None].to(dtype)

        return self._memoized(("sdpa_mask", n_heads, key_len, bias_repeat, dtype), build)

    def sdpa_bias(self, n_heads: int, key_len: int, bias_repeat: int, dtype: torch.dtype) -> Tensor:
        """The positional bias alone as a (1, H, T, S) ``attn_mask`` in ``dtype``, for a kernel that applies the
        causal mask itself (:func:`~attnzoo.attention.kernels.sdpa_attention` on CPU)."""
        return self._memoized(
            ("sdpa_bias", n_heads, key_len, bias_repeat, dtype),
            lambda: self.score_bias(n_heads, key_len, bias_repeat)[None].to(dtype),
        )

    def padded(self, allowed: Tensor, key_positions: Tensor) -> Tensor:
        """``allowed`` (T, S) narrowed to each sequence's real keys, (B, 1, T, S), the keys at ``key_positions``
        (S,); ``allowed`` itself without a padding mask. A slot past the last position written (a static step's
        buffer) is read at that position: the causal mask excludes it anyway."""
        if self.key_padding is None:
            return allowed
        last = self.key_padding.shape[1] - 1
        return allowed & self.key_padding[:, None, None, key_positions.clamp(max=last)]

    def record(self, attention_map: Tensor) -> None:
        if self.attention_maps is not None:
            self.attention_maps.append(attention_map.detach())

    @property
    def records_scores(self) -> bool:
        """Whether a kernel must return the probabilities or logits: maps or logits are being recorded."""
        return self.attention_maps is not None or self.attention_logits is not None

    def record_logits(self, logits: Tensor, allowed: Tensor) -> None:
        """Record fp32 ``logits`` (B, H, T, S) as they enter the softmax (scaled, biased, after a score hook),
        0 where ``allowed`` (T, S) masks them.

        Logits are filed under the layer whose map comes next, ``len(attention_maps)``: every layer records
        exactly one map, after its kernel calls (Diff makes two: both maps' logits are filed together).
        """
        if self.attention_logits is None:
            return
        layer = len(self.attention_maps) if self.attention_maps is not None else 0
        self.attention_logits.setdefault(layer, []).append(logits.detach().masked_fill(~allowed, 0))


def mean_pool_heads(tensor: Tensor, n_heads: int, n_groups: int) -> Tensor:
    """Mean of each run of ``n_heads / n_groups`` consecutive heads along dim 0, which holds ``n_heads`` equal
    blocks of rows: (n_heads·rows, …) → (n_groups·rows, …). Ainslie et al.'s (2023, §2.1) conversion of a
    multi-head checkpoint to grouped queries, applied to a key or value projection's weight or bias."""
    if n_heads % n_groups or tensor.shape[0] % n_heads:
        raise ValueError(f"cannot pool {n_heads} heads of a {tuple(tensor.shape)} tensor into {n_groups} groups")
    grouped = tensor.reshape(n_groups, n_heads // n_groups, tensor.shape[0] // n_heads, *tensor.shape[1:])
    return grouped.mean(dim=1).reshape(-1, *tensor.shape[1:])


class CacheBuffer(NamedTuple):
    """One buffer of a layer's cache: its name in the :class:`LayerCache`, the numbers it holds per cached token,
    and how that count is made, e.g. ``n_kv_heads·head_dim = 2·32``."""

    name: str
    numbers: int
    formula: str


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
    Attention itself goes through :func:`~attnzoo.attention.kernels.attend`, which runs the first of the
    mechanism's ``kernels`` that serves the call; the PyTorch kernels (eager, SDPA, chunked) run the mechanism's
    ``pytorch_attention``, which records the effective (B, heads, T, S) attention map when ``ctx.attention_maps``
    is a list.
    """

    Options: type = NoOptions
    registry_name: str
    # How the effective map that ``ctx.record`` receives is read off this mechanism (shown beside its plots).
    map_note: str = "the softmax probabilities"
    # Mechanisms whose parameters this one holds under the same names, with the same shapes and meaning, and
    # adds its own to (selective and dcmha extend mha): their checkpoints initialise this mechanism.
    extends: tuple[str, ...] = ()
    # Projections whose output rows come in n_kv_heads blocks, one per kv head: what MHA → GQA pooling averages.
    kv_projections: tuple[str, ...] = ()
    # True for a mechanism that acts on the scores or probabilities (kernel hooks), which SDPA cannot run.
    needs_scores: bool = False
    # The kernels (``attention.kernels.KERNELS`` names) that compute this mechanism, in order of preference; the
    # eager reference follows them. attn_backend="auto" runs the first that serves each call.
    kernels: tuple[str, ...] = ("sdpa",)

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.options: OptionsT = cfg.attention_opts
        self.dropout = cfg.dropout
        self.kernel_chain: tuple[Kernel, ...] = cfg.kernel_chain

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

    @classmethod
    def key_window(cls, cfg: ModelConfig, layer_idx: int) -> int | None:
        """How many keys a query of layer ``layer_idx`` sees, itself included (on each side when not causal);
        None: no window."""
        return None

    @classmethod
    def cache_layout(cls, cfg: ModelConfig) -> list[CacheBuffer]:
        """The buffers ``new_layer_cache`` allocates, with the numbers each holds per cached token: the one
        definition ``attnzoo info`` prints and the tests compare with the allocation."""
        raise NotImplementedError

    @classmethod
    def cache_bytes_per_token(cls, cfg: ModelConfig, dtype: torch.dtype) -> int:
        """Bytes one layer caches per token at ``dtype``."""
        return sum(buffer.numbers for buffer in cls.cache_layout(cfg)) * dtype.itemsize

    @classmethod
    def cache_bytes(cls, cfg: ModelConfig, layer_idx: int, batch_size: int, max_len: int, dtype: torch.dtype) -> int:
        """Bytes of layer ``layer_idx``'s cache for ``batch_size`` sequences of up to ``max_len`` positions: every
        position, or a ring capped at the layer's window (``key_window``)."""
        window = cls.key_window(cfg, layer_idx)
        positions = max_len if window is None else min(window, max_len)
        return batch_size * positions * cls.cache_bytes_per_token(cfg, dtype)

    def forward(self, x: Tensor, ctx: AttentionContext, cache: LayerCache | None = None) -> Tensor:
        raise NotImplementedError

    def pytorch_attention(
        self, kernel: PyTorchKernel, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, **inputs: Any
    ) -> Tensor:
        """This mechanism's attention on one of the PyTorch kernels (eager, SDPA, chunked), from what its ``forward``
        passed to ``attend``: the default is one call over q, k, v with the layer's dropout, ``inputs`` (such as a
        ``query_scale``) passed on. A mechanism whose attention is several calls or needs hooks overrides it."""
        out, _ = kernel(q, k, v, ctx, dropout_p=self.attn_dropout, **inputs)
        return out

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

    def pooled_kv_state(self, n_kv_heads: int) -> dict[str, Tensor]:
        """This layer's tensors that have a kv-head axis, with each group of kv heads mean-pooled into one of
        ``n_kv_heads`` (:func:`mean_pool_heads`), keyed as in ``state_dict``: what loads into this mechanism at
        ``n_kv_heads``. The default pools the weights and biases of ``kv_projections``; a mechanism without them
        refuses, and one with other per-kv-head parameters adds them."""
        if not self.kv_projections:
            raise ValueError(
                f"{self.registry_name} defines no kv-head pooling: it names no key/value projections grouped by "
                "kv head (Attention.kv_projections)"
            )
        current = self.n_kv_heads
        return {
            name: mean_pool_heads(tensor, current, n_kv_heads)
            for name, tensor in self.state_dict().items()
            if name.split(".")[0] in self.kv_projections
        }

    @property
    def attn_dropout(self) -> float:
        return self.dropout if self.training else 0.0


def residual_linear(in_features: int, out_features: int, bias: bool) -> nn.Linear:
    """A projection that writes into the residual stream; the model scales its init by 1/√(2·n_layers)."""
    layer = nn.Linear(in_features, out_features, bias=bias)
    layer.is_residual_projection = True
    return layer
