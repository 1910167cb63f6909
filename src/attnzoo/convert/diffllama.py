"""DiffLlama → attnzoo ``diff``: the same differential attention, with HF's head pairs restriped.

HF DiffLlama has H heads of size d. Its differential head i (i < H/2) subtracts the map of head H/2 + i
from that of head i, reads keys from kv heads j and H_kv/2 + j (j = i // n_rep) and values from both,
concatenated to 2d, then applies a weightless RMSNorm over 2d and (1 − λ_init) with
λ_init = 0.8 − 0.6·exp(−0.3·layer_idx), layer_idx from 0, the schedule attnzoo's ``diff`` uses by default.
attnzoo's ``diff`` (the official layout) keeps each pair adjacent instead, as sub-heads 2i and 2i + 1, so the
q, k and v rows are restriped; everything else carries over.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from attnzoo.config import ModelConfig
from attnzoo.convert.common import SourceWeights, check_swiglu_gate, load_converted, renamer, rope_options, unsupported
from attnzoo.model import Transformer

SOURCE = "diffllama"
HF_NAME = renamer(
    layers="model.layers.",
    top={"embed_tokens.": "model.embed_tokens.", "norm.": "model.norm."},
    per_layer={"self_attn.out_proj.": "self_attn.o_proj."},
)


def halves_to_stripes(rows: Tensor, n_heads: int) -> Tensor:
    """Rows of n_heads blocks ordered [0, 1, ..., n/2 − 1 | n/2, ..., n − 1] → [0, n/2, 1, n/2 + 1, ...]."""
    return rows.unflatten(0, (2, n_heads // 2, -1)).transpose(0, 1).flatten(0, 2)


def from_hf(config: Mapping[str, Any], state_dict: Mapping[str, Tensor]) -> Transformer:
    """``DiffLlamaForCausalLM`` (config dict, state dict) → attnzoo ``diff`` with ``subln_affine=False``."""
    if config["attention_bias"]:
        raise unsupported(SOURCE, "attention_bias", True, "is not supported: attnzoo's diff has no biases")
    check_swiglu_gate(config, SOURCE)
    heads, kv_heads, head_dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    cfg = ModelConfig(
        vocab_size=config["vocab_size"],
        dim=config["hidden_size"],
        n_layers=config["num_hidden_layers"],
        n_heads=heads // 2,
        n_kv_heads=kv_heads // 2,
        head_dim=2 * head_dim,
        mlp="swiglu",
        mlp_hidden_dim=config["intermediate_size"],
        norm="rmsnorm",
        norm_eps=config["rms_norm_eps"],
        tie_embeddings=config["tie_word_embeddings"],
        max_seq_len=config["max_position_embeddings"],
        attention="diff",
        # HF normalises each head's output with the model's rms_norm_eps too.
        attention_options={"subln_affine": False, "subln_eps": config["rms_norm_eps"]},
        position="rope",
        position_options=rope_options(config, SOURCE),
    )
    source = SourceWeights(state_dict, SOURCE)
    restriped = {
        f"layers.{i}.self_attn.{proj}.weight": halves_to_stripes(
            source.take(f"model.layers.{i}.self_attn.{proj}.weight"), n
        )
        for i in range(cfg.n_layers)
        for proj, n in (("q_proj", heads), ("k_proj", kv_heads), ("v_proj", kv_heads))
    }
    return load_converted(cfg, source, HF_NAME, restriped)
