"""LLaMA ⇄ attnzoo; Mistral without a sliding window is the same model.

attnzoo's parameter names are HF LLaMA's under ``model.``, and both rotate half-split pairs, so weights move
as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torch import Tensor

from attnzoo.config import ModelConfig
from attnzoo.convert.common import (
    NO_SPECIAL_TOKENS,
    SWIGLU_ACTIVATIONS,
    Mismatch,
    SourceWeights,
    check_swiglu_gate,
    differences,
    hf_rope_parameters,
    load_converted,
    refuse_mismatches,
    renamed,
    renamer,
    require_transformers,
    rope_mismatches,
    rope_options,
    unsupported,
)
from attnzoo.model import Transformer

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM

HF_CLASS = "LlamaForCausalLM"
HF_NAME = renamer(layers="model.layers.", top={"embed_tokens.": "model.embed_tokens.", "norm.": "model.norm."})


def from_hf(config: Mapping[str, Any], state_dict: Mapping[str, Tensor]) -> Transformer:
    """``LlamaForCausalLM`` or ``MistralForCausalLM`` (config dict, state dict) → attnzoo ``mha`` + ``rope``."""
    source = config["model_type"]
    if config.get("sliding_window") is not None:
        raise unsupported(source, "sliding_window", config["sliding_window"], "is not supported: mha sees every key")
    check_swiglu_gate(config, source)
    attention_bias, mlp_bias = config.get("attention_bias", False), config.get("mlp_bias", False)
    if attention_bias != mlp_bias:
        raise unsupported(
            source,
            "attention_bias",
            attention_bias,
            f"with mlp_bias={mlp_bias} is not supported: attnzoo's bias flag covers attention and MLP together",
        )
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    cfg = ModelConfig(
        vocab_size=config["vocab_size"],
        dim=hidden,
        n_layers=config["num_hidden_layers"],
        n_heads=heads,
        n_kv_heads=config["num_key_value_heads"],
        head_dim=config.get("head_dim") or hidden // heads,
        mlp="swiglu",
        mlp_hidden_dim=config["intermediate_size"],
        norm="rmsnorm",
        norm_eps=config["rms_norm_eps"],
        bias=attention_bias,
        tie_embeddings=config["tie_word_embeddings"],
        max_seq_len=config["max_position_embeddings"],
        attention="mha",
        position="rope",
        position_options=rope_options(config, source),
    )
    return load_converted(cfg, SourceWeights(state_dict, source), HF_NAME)


def hf_mismatches(cfg: ModelConfig) -> list[Mismatch]:
    """What of ``cfg`` ``LlamaForCausalLM`` cannot hold (none: it holds the model).

    LLaMA is ``mha`` with half-split RoPE over whole heads, RMSNorm, SwiGLU and sequential residuals without an
    embedding norm; biases on all projections are ``attention_bias = mlp_bias = True``.
    """
    return [
        *differences(("attention", cfg.attention, "mha")),
        *rope_mismatches(cfg),
        *differences(
            ("causal", cfg.causal, True),
            ("norm", cfg.norm, "rmsnorm"),
            ("mlp", cfg.mlp, "swiglu"),
            ("parallel_residual", cfg.parallel_residual, False),
            ("embedding_norm", cfg.embedding_norm, False),
            ("scale_embeddings", cfg.scale_embeddings, False),
        ),
    ]


def to_hf(model: Transformer) -> LlamaForCausalLM:
    """An attnzoo model → ``LlamaForCausalLM`` with the same logits, the inverse of :func:`from_hf`; refused,
    naming the fields, if LLaMA cannot hold it (:func:`hf_mismatches`). Dropout is not carried over: HF LLaMA
    has attention dropout only."""
    cfg = model.config
    refuse_mismatches(HF_CLASS, hf_mismatches(cfg))
    transformers = require_transformers()
    rope_parameters, max_position_embeddings = hf_rope_parameters(cfg.position_opts, cfg.max_seq_len)
    hf_config = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.dim,
        intermediate_size=cfg.mlp_hidden_dim,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim,
        hidden_act=SWIGLU_ACTIVATIONS[0],
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=cfg.norm_eps,
        tie_word_embeddings=cfg.tie_embeddings,
        rope_parameters=rope_parameters,
        attention_bias=cfg.bias,
        mlp_bias=cfg.bias,
        initializer_range=cfg.init_std,
        **NO_SPECIAL_TOKENS,
    )
    hf_model = transformers.LlamaForCausalLM(hf_config)
    hf_model.load_state_dict(renamed(model.state_dict(), HF_NAME))
    return hf_model
