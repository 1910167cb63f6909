"""BLOOM → attnzoo: ALiBi, a LayerNorm on the embeddings, a per-head fused qkv and tanh-GELU."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from attnzoo.config import ModelConfig
from attnzoo.convert.common import SourceWeights, load_converted, per_head_qkv, renamer, unsupported
from attnzoo.model import Transformer

SOURCE = "bloom"
# BLOOM was trained on 2048-token sequences. ALiBi has no length limit, so this only informs training configs.
TRAINING_LENGTH = 2048
HF_NAME = renamer(
    layers="transformer.h.",
    top={
        "embed_tokens.": "transformer.word_embeddings.",
        "embed_norm.": "transformer.word_embeddings_layernorm.",
        "norm.": "transformer.ln_f.",
    },
    per_layer={
        "self_attn.o_proj.": "self_attention.dense.",
        "mlp.up_proj.": "mlp.dense_h_to_4h.",
        "mlp.down_proj.": "mlp.dense_4h_to_h.",
    },
)


def from_hf(config: Mapping[str, Any], state_dict: Mapping[str, Tensor]) -> Transformer:
    """``BloomForCausalLM`` (config dict, state dict) → attnzoo ``mha`` + ``alibi``.

    HF BLOOM adds slope·j for key j rather than −slope·(i − j): the same softmax, since the two differ by a
    constant per query row. Its MLP is 4·hidden wide and uses Megatron's tanh-GELU constant 0.79788456,
    √(2/π) to 8 digits.
    """
    if config["apply_residual_connection_post_layernorm"]:
        raise unsupported(
            SOURCE, "apply_residual_connection_post_layernorm", True, "is not supported: attnzoo adds the block input"
        )
    hidden, heads = config["hidden_size"], config["n_head"]
    cfg = ModelConfig(
        vocab_size=config["vocab_size"],
        dim=hidden,
        n_layers=config["n_layer"],
        n_heads=heads,
        mlp="gelu_tanh",
        mlp_hidden_dim=4 * hidden,
        norm="layernorm",
        norm_eps=config["layer_norm_epsilon"],
        bias=True,
        tie_embeddings=config["tie_word_embeddings"],
        embedding_norm=True,
        max_seq_len=TRAINING_LENGTH,
        attention="mha",
        position="alibi",
    )
    source = SourceWeights(state_dict, SOURCE)
    qkv = per_head_qkv(source, "transformer.h.{i}.self_attention.query_key_value", cfg.n_layers, heads)
    return load_converted(cfg, source, HF_NAME, qkv)
