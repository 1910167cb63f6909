"""Rotary position embedding (RoFormer, Su et al., 2021) with partial rotary and context scaling.

Option names follow HF transformers' ``rope_parameters`` (``rope_type``, ``rope_theta``,
``partial_rotary_factor``, ``factor``, ...), so a Hugging Face config maps onto these options key for key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from attnzoo.positions.base import POSITIONS, PositionalEncoding
from attnzoo.precision import compute_dtype
from attnzoo.validation import is_number, require, require_count

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")
# The positions are rotated as float32, which holds every integer only up to 2**24: past it two positions get one
# angle, so a longer max_seq_len would give a model that cannot tell them apart.
MAX_ROPE_LEN = 2**24


@dataclass(frozen=True)
class RopeOptions:
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 1.0  # GPT-NeoX / Pythia rotate only this fraction of each head
    interleaved: bool = False  # False: half-split pairs (NeoX, LLaMA); True: adjacent pairs (GPT-J, RoFormer)
    rope_type: str = "default"
    factor: float = 1.0  # linear, dynamic, yarn, llama3
    original_max_position_embeddings: int | None = None  # None → the model's max_seq_len
    attention_factor: float | None = None  # yarn; None → derived from factor / mscale
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    mscale: float | None = None  # yarn
    mscale_all_dim: float | None = None  # yarn
    truncate: bool = True  # yarn: floor/ceil the correction range
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3

    def __post_init__(self):
        # Rotation counts (YaRN's betas), frequency factors (Llama 3's) and scales of cos and sin: all positive.
        for name in ("rope_theta", "partial_rotary_factor", "factor", "beta_fast", "beta_slow", "low_freq_factor",
                     "high_freq_factor"):  # fmt: skip
            value = getattr(self, name)
            require(is_number(value) and value > 0, name, value, "must be a finite number > 0")
        factor = self.attention_factor
        require(factor is None or (is_number(factor) and factor > 0), "attention_factor", factor,
                "must be null or a finite number > 0")  # fmt: skip
        for name in ("mscale", "mscale_all_dim"):  # 0 is DeepSeek's "no scaling", as HF's yarn_get_mscale reads it
            value = getattr(self, name)
            require(
                value is None or (is_number(value) and value >= 0), name, value, "must be null or a finite number >= 0"
            )
        for name in ("interleaved", "truncate"):
            require(isinstance(getattr(self, name), bool), name, getattr(self, name), "must be true or false")
        original = self.original_max_position_embeddings
        if original is not None:  # null: the model's max_seq_len
            require_count("original_max_position_embeddings", original)
        require(self.rope_theta > 1, "rope_theta", self.rope_theta, "must be > 1")
        require(
            0 < self.partial_rotary_factor <= 1,
            "partial_rotary_factor",
            self.partial_rotary_factor,
            "must be in (0, 1]",
        )
        require(self.rope_type in ROPE_TYPES, "rope_type", self.rope_type, f"choose one of {list(ROPE_TYPES)}")
        require(self.factor >= 1, "factor", self.factor, "must be >= 1 (a context-extension factor)")
        require(
            self.high_freq_factor > self.low_freq_factor,
            "high_freq_factor",
            self.high_freq_factor,
            f"must exceed low_freq_factor={self.low_freq_factor}",
        )


def rope_inv_freq(
    options: RopeOptions,
    rotary_dim: int,
    max_seq_len: int,
    seq_len: int | Tensor | None = None,
    dtype: torch.dtype = torch.float32,
):
    """Inverse frequencies over the rotated dims, computed in float64 and returned in ``dtype``, and the factor
    that scales cos and sin.

    ``seq_len`` (the length so far) matters only for ``dynamic``; a static decoding step gives it as a tensor,
    and θ is then computed on its device with no host branch. Formulas as in HF transformers'
    ``modeling_rope_utils``.
    """
    theta = options.rope_theta
    original_len = options.original_max_position_embeddings or max_seq_len
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim
    if options.rope_type == "dynamic" and isinstance(seq_len, Tensor):
        length = seq_len.to(torch.float64).reshape(())
        growth = options.factor * length / original_len - (options.factor - 1)
        theta = torch.where(length > original_len, theta * growth ** (rotary_dim / (rotary_dim - 2)), theta)
        exponents = exponents.to(length.device)
    elif options.rope_type == "dynamic" and seq_len is not None and seq_len > original_len:
        growth = options.factor * seq_len / original_len - (options.factor - 1)
        theta = theta * growth ** (rotary_dim / (rotary_dim - 2))
    inv_freq = 1.0 / theta**exponents

    if options.rope_type == "linear":
        return (inv_freq / options.factor).to(dtype), 1.0
    if options.rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, options, original_len).to(dtype), 1.0
    if options.rope_type == "yarn":
        blended, attention_factor = _yarn_inv_freq(inv_freq, options, rotary_dim, original_len)
        return blended.to(dtype), attention_factor
    return inv_freq.to(dtype), 1.0


def _llama3_inv_freq(inv_freq: Tensor, options: RopeOptions, original_len: int) -> Tensor:
    low, high, factor = options.low_freq_factor, options.high_freq_factor, options.factor
    wavelen = 2 * math.pi / inv_freq
    smooth = (original_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    scaled = torch.where(wavelen > original_len / low, inv_freq / factor, inv_freq)
    medium = (wavelen <= original_len / low) & (wavelen >= original_len / high)
    return torch.where(medium, blended, scaled)


def _yarn_inv_freq(inv_freq: Tensor, options: RopeOptions, rotary_dim: int, original_len: int):
    factor, theta = options.factor, options.rope_theta

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = options.attention_factor
    if attention_factor is None:
        if options.mscale and options.mscale_all_dim:
            attention_factor = mscale(factor, options.mscale) / mscale(factor, options.mscale_all_dim)
        else:
            attention_factor = mscale(factor)

    def correction_dim(rotations: float) -> float:
        return rotary_dim * math.log(original_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(options.beta_fast), correction_dim(options.beta_slow)
    if options.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # avoids a zero-width ramp
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation_weight = 1 - ramp
    blended = (inv_freq / factor) * ramp + inv_freq * extrapolation_weight
    return blended, float(attention_factor)


@POSITIONS.register("rope")
class RoPE(PositionalEncoding):
    """Rotates each (query, key) channel pair by angle n·θ_i at position n (RoFormer, Eq. 34).

    θ_i = rope_theta^(−2i/d_rot), over the d_rot = int(head_dim · partial_rotary_factor) rotated channels
    only; the remaining channels pass through. Tables are computed and the rotation applied in fp32 (in
    float64 for a float64 model, with θ computed afresh in float64). ``dynamic`` scaling changes θ with the
    length so far (as HF does), so past the original context a cached key keeps the rotation it was stored
    with; every other type is position-wise and exact.
    """

    Options = RopeOptions
    rotates = True

    def __init__(self, cfg, qk_head_dim):
        super().__init__(cfg, qk_head_dim)
        self.rotary_dim = int(qk_head_dim * self.options.partial_rotary_factor)
        self.max_seq_len = cfg.max_seq_len
        inv_freq, attention_factor = rope_inv_freq(self.options, self.rotary_dim, cfg.max_seq_len)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.attention_factor = attention_factor

    @classmethod
    def validate_config(cls, cfg, qk_head_dim):
        require(
            cfg.max_seq_len <= MAX_ROPE_LEN,
            "max_seq_len",
            cfg.max_seq_len,
            f"must be <= {MAX_ROPE_LEN:,} (2**24) with rope: its float32 positions are exact only up to there",
        )
        options = cfg.position_opts
        rotary_dim = int(qk_head_dim * options.partial_rotary_factor)
        require(
            rotary_dim >= 2 and rotary_dim % 2 == 0,
            "position_options.partial_rotary_factor",
            options.partial_rotary_factor,
            f"must give an even number >= 2 of rotated dims out of head dim {qk_head_dim} (got {rotary_dim})",
        )
        require(
            options.rope_type != "dynamic" or rotary_dim > 2,
            "position_options.rope_type",
            options.rope_type,
            f"needs more than 2 rotated dims (got {rotary_dim}): dynamic NTK raises θ to the power d/(d−2)",
        )

    def prepare(
        self, positions: Tensor, end: int | Tensor, dtype: torch.dtype = torch.float32
    ) -> tuple[Tensor, Tensor]:
        inv_freq = self.inv_freq
        # The fp32 buffer is exact for fp32; a float64 model (whose buffer .double() made from fp32 values) and
        # dynamic scaling (θ depends on the length) recompute it.
        if self.options.rope_type == "dynamic" or dtype != torch.float32:
            seq_len = end if self.options.rope_type == "dynamic" else None
            inv_freq, _ = rope_inv_freq(self.options, self.rotary_dim, self.max_seq_len, seq_len=seq_len, dtype=dtype)
            inv_freq = inv_freq.to(positions.device)
        with torch.autocast(device_type=positions.device.type, enabled=False):
            angles = positions.to(dtype)[:, None] * inv_freq.to(dtype)[None, :]
            if self.options.interleaved:
                angles = angles.repeat_interleave(2, dim=-1)
            else:
                angles = torch.cat((angles, angles), dim=-1)
            return angles.cos() * self.attention_factor, angles.sin() * self.attention_factor

    def rotate(self, x: Tensor, state: tuple[Tensor, Tensor]) -> Tensor:
        cos, sin = state
        rotated, passthrough = x[..., : self.rotary_dim].to(compute_dtype(x.dtype)), x[..., self.rotary_dim :]
        if self.options.interleaved:
            partner = torch.stack((-rotated[..., 1::2], rotated[..., 0::2]), dim=-1).flatten(-2)
        else:
            first, second = rotated.chunk(2, dim=-1)
            partner = torch.cat((-second, first), dim=-1)
        out = (rotated * cos + partner * sin).to(x.dtype)
        return torch.cat((out, passthrough), dim=-1) if passthrough.shape[-1] else out
