"""One attention layer outside the Transformer: the model of the selective-attention tasks that train their own
attention-only models (``graph`` reads the layer's map, ``denoising`` its output at a query token).
"""

from __future__ import annotations

import torch

from attnzoo.attention import ATTENTION, Attention, AttentionContext
from attnzoo.config import ModelConfig
from attnzoo.positions import POSITIONS, PositionalEncoding
from attnzoo.precision import compute_dtype


def attention_layer(model_config: ModelConfig) -> tuple[Attention, PositionalEncoding]:
    """One attention layer of the variant's mechanism, and its positional encoding."""
    attention = ATTENTION.get(model_config.attention)
    position = POSITIONS.get(model_config.position)(model_config, attention.qk_head_dim(model_config))
    return attention(model_config, 0), position


def attention_context(
    position_encoding: PositionalEncoding, seq_len: int, device: torch.device, causal: bool
) -> AttentionContext:
    """The context one attention layer needs for a fresh sequence of ``seq_len`` inputs."""
    positions = torch.arange(seq_len, device=device)
    dtype = compute_dtype(torch.get_default_dtype())
    return AttentionContext(
        positions=positions,
        start=0,
        position=position_encoding,
        position_state=position_encoding.prepare(positions, seq_len, dtype=dtype),
        causal=causal,
        dtype=dtype,
    )
