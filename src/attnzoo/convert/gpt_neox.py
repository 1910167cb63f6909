"""GPT-NeoX (Pythia) → attnzoo: partial rotary, parallel residual, LayerNorm, biases, a per-head fused qkv."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from attnzoo.config import ModelConfig
from attnzoo.convert.common import (
    SourceWeights,
    load_converted,
    per_head_qkv,
    renamer,
    rope_options,
    unsupported,
)
from attnzoo.model import Transformer

SOURCE = "gpt_neox"
# HF activation names → attnzoo mlp; the tanh forms differ only in rounding.
GELU_KINDS = {
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_python_tanh": "gelu_tanh",
}
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
    qkv = per_head_qkv(source, "gpt_neox.layers.{i}.attention.query_key_value", cfg.n_layers, heads)
    return load_converted(cfg, source, HF_NAME, qkv)
