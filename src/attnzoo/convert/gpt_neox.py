"""GPT-NeoX (Pythia) → attnzoo: partial rotary, parallel residual, LayerNorm, biases, a per-head fused qkv."""

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
    hf_rope_parameters,
    load_converted,
    multi_head_mismatches,
    per_head_qkv,
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
    from transformers import GPTNeoXForCausalLM

SOURCE = "gpt_neox"
HF_CLASS = "GPTNeoXForCausalLM"
# HF activation names → attnzoo mlp; the tanh forms differ only in rounding.
GELU_KINDS = {
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_python_tanh": "gelu_tanh",
}
# attnzoo mlp → the first HF name that reads as it: "gelu", and "gelu_new" (GPT-NeoX's and GPT-2's tanh form).
HF_ACTIVATIONS = {mlp: name for name, mlp in reversed(GELU_KINDS.items())}
FUSED_QKV = "gpt_neox.layers.{i}.attention.query_key_value"
HF_NAME = renamer(
    layers="gpt_neox.layers.",
    top={"embed_tokens.": "gpt_neox.embed_in.", "norm.": "gpt_neox.final_layer_norm."},
    per_layer={
        "self_attn.o_proj.": "attention.dense.",
        "mlp.up_proj.": "mlp.dense_h_to_4h.",
        "mlp.down_proj.": "mlp.dense_4h_to_h.",
    },
)


def from_hf(config: Mapping[str, Any], state_dict: Mapping[str, Tensor]) -> Transformer:
    """``GPTNeoXForCausalLM`` (config dict, state dict) → attnzoo ``mha`` + partial ``rope``.

    ``use_parallel_residual=False`` is GPT-NeoX's sequential block, x + attn(ln1(x)) then + mlp(ln2(·)),
    which is attnzoo's default block.
    """
    if not config["attention_bias"]:
        raise unsupported(
            SOURCE,
            "attention_bias",
            False,
            "is not supported: GPT-NeoX keeps its MLP and LayerNorm biases, and attnzoo's bias flag covers all",
        )
    mlp = GELU_KINDS.get(config["hidden_act"])
    if mlp is None:
        raise unsupported(SOURCE, "hidden_act", config["hidden_act"], f"is not supported; one of {list(GELU_KINDS)}")
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    cfg = ModelConfig(
        vocab_size=config["vocab_size"],
        dim=hidden,
        n_layers=config["num_hidden_layers"],
        n_heads=heads,
        mlp=mlp,
        mlp_hidden_dim=config["intermediate_size"],
        norm="layernorm",
        norm_eps=config["layer_norm_eps"],
        bias=True,
        tie_embeddings=config["tie_word_embeddings"],
        parallel_residual=config["use_parallel_residual"],
        max_seq_len=config["max_position_embeddings"],
        attention="mha",
        position="rope",
        position_options=rope_options(config, SOURCE, partial_rotary=True),
    )
    source = SourceWeights(state_dict, SOURCE)
    qkv = per_head_qkv(source, FUSED_QKV, cfg.n_layers, heads)
    return load_converted(cfg, source, HF_NAME, qkv)


def hf_mismatches(cfg: ModelConfig) -> list[Mismatch]:
    """What of ``cfg`` ``GPTNeoXForCausalLM`` cannot hold (none: it holds the model): the layout :func:`from_hf`
    reads, ``mha`` with half-split, possibly partial, RoPE, LayerNorm, biases everywhere and a GELU MLP."""
    mlp = [] if cfg.mlp in HF_ACTIVATIONS else [Mismatch("mlp", cfg.mlp, f"one of {list(HF_ACTIVATIONS)}")]
    return [
        *differences(("attention", cfg.attention, "mha")),
        *rope_mismatches(cfg, partial_rotary=True),
        *differences(("causal", cfg.causal, True), ("norm", cfg.norm, "layernorm"), ("bias", cfg.bias, True)),
        *mlp,
        *multi_head_mismatches(cfg),
        *differences(("embedding_norm", cfg.embedding_norm, False), ("scale_embeddings", cfg.scale_embeddings, False)),
    ]


def to_hf(model: Transformer) -> GPTNeoXForCausalLM:
    """An attnzoo model → ``GPTNeoXForCausalLM`` with the same logits, the inverse of :func:`from_hf`; refused,
    naming the fields, if GPT-NeoX cannot hold it (:func:`hf_mismatches`)."""
    cfg = model.config
    refuse_mismatches(HF_CLASS, hf_mismatches(cfg))
    transformers = require_transformers()
    rope = cfg.position_opts
    rope_parameters, max_position_embeddings = hf_rope_parameters(rope, cfg.max_seq_len)
    hf_config = transformers.GPTNeoXConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.dim,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        intermediate_size=cfg.mlp_hidden_dim,
        hidden_act=HF_ACTIVATIONS[cfg.mlp],
        max_position_embeddings=max_position_embeddings,
        layer_norm_eps=cfg.norm_eps,
        tie_word_embeddings=cfg.tie_embeddings,
        use_parallel_residual=cfg.parallel_residual,
        attention_bias=True,
        rope_parameters={**rope_parameters, "partial_rotary_factor": rope.partial_rotary_factor},
        initializer_range=cfg.init_std,
        **NO_SPECIAL_TOKENS,
    )
    weights = dict(model.state_dict())
    qkv = fuse_per_head_qkv(weights, FUSED_QKV, cfg.n_layers, cfg.n_heads)
    hf_model = transformers.GPTNeoXForCausalLM(hf_config)
    hf_model.load_state_dict({**renamed(weights, HF_NAME), **qkv})
    return hf_model
