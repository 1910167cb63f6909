"""BLOOM → attnzoo: ALiBi, a LayerNorm on the embeddings, a per-head fused qkv and tanh-GELU."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torch import Tensor

from attnzoo.config import ModelConfig
from attnzoo.convert.common import (
    NO_SPECIAL_TOKENS,
    Mismatch,
    SourceWeights,
    differences,
    fuse_per_head_qkv,
    load_converted,
    multi_head_mismatches,
    per_head_qkv,
    refuse_mismatches,
    renamed,
    renamer,
    require_transformers,
    unsupported,
)
from attnzoo.model import Transformer

if TYPE_CHECKING:
    from transformers import BloomForCausalLM

SOURCE = "bloom"
HF_CLASS = "BloomForCausalLM"
FUSED_QKV = "transformer.h.{i}.self_attention.query_key_value"
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
    qkv = per_head_qkv(source, FUSED_QKV, cfg.n_layers, heads)
    return load_converted(cfg, source, HF_NAME, qkv)


def hf_mismatches(cfg: ModelConfig) -> list[Mismatch]:
    """What of ``cfg`` ``BloomForCausalLM`` cannot hold (none: it holds the model): the layout :func:`from_hf`
    reads, ``mha`` with ALiBi, LayerNorm (the embeddings' too), biases everywhere and a 4·dim tanh-GELU MLP.
    BLOOM has no length limit, so ``max_seq_len`` is not carried over."""
    found = [
        *differences(("attention", cfg.attention, "mha"), ("position", cfg.position, "alibi")),
        *differences(
            ("causal", cfg.causal, True),
            ("norm", cfg.norm, "layernorm"),
            ("bias", cfg.bias, True),
            ("mlp", cfg.mlp, "gelu_tanh"),
            ("embedding_norm", cfg.embedding_norm, True),
            ("parallel_residual", cfg.parallel_residual, False),
            ("scale_embeddings", cfg.scale_embeddings, False),
        ),
        *multi_head_mismatches(cfg),
    ]
    if cfg.mlp_hidden_dim != 4 * cfg.dim:
        found.append(Mismatch("mlp_hidden_dim", cfg.mlp_hidden_dim, f"4·dim = {4 * cfg.dim}"))
    return found


def to_hf(model: Transformer) -> BloomForCausalLM:
    """An attnzoo model → ``BloomForCausalLM`` with the same logits, the inverse of :func:`from_hf`; refused,
    naming the fields, if BLOOM cannot hold it (:func:`hf_mismatches`)."""
    cfg = model.config
    refuse_mismatches(HF_CLASS, hf_mismatches(cfg))
    transformers = require_transformers()
    hf_config = transformers.BloomConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.dim,
        n_layer=cfg.n_layers,
        n_head=cfg.n_heads,
        layer_norm_epsilon=cfg.norm_eps,
        tie_word_embeddings=cfg.tie_embeddings,
        initializer_range=cfg.init_std,
        **NO_SPECIAL_TOKENS,
    )
    weights = dict(model.state_dict())
    qkv = fuse_per_head_qkv(weights, FUSED_QKV, cfg.n_layers, cfg.n_heads)
    hf_model = transformers.BloomForCausalLM(hf_config)
    hf_model.load_state_dict({**renamed(weights, HF_NAME), **qkv})
    return hf_model
