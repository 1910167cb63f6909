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
    from transformers import DiffLlamaForCausalLM

SOURCE = "diffllama"
HF_CLASS = "DiffLlamaForCausalLM"
HF_NAME = renamer(
    layers="model.layers.",
    top={"embed_tokens.": "model.embed_tokens.", "norm.": "model.norm."},
    per_layer={"self_attn.out_proj.": "self_attn.o_proj."},
)


def restriped_weights(n_layers: int, heads: int, kv_heads: int) -> list[tuple[str, int]]:
    """The attnzoo names of the weights whose rows are restriped, with their HF head counts."""
    counts = {"q_proj": heads, "k_proj": kv_heads, "v_proj": kv_heads}
    return [(f"layers.{i}.self_attn.{proj}.weight", n) for i in range(n_layers) for proj, n in counts.items()]


def halves_to_stripes(rows: Tensor, n_heads: int) -> Tensor:
    """Rows of n_heads blocks ordered [0, 1, ..., n/2 − 1 | n/2, ..., n − 1] → [0, n/2, 1, n/2 + 1, ...]."""
    return rows.unflatten(0, (2, n_heads // 2, -1)).transpose(0, 1).flatten(0, 2)


def stripes_to_halves(rows: Tensor, n_heads: int) -> Tensor:
    """The inverse of :func:`halves_to_stripes`: rows of n_heads blocks [0, n/2, 1, n/2 + 1, ...] → [0, 1, ...]."""
    return rows.unflatten(0, (n_heads // 2, 2, -1)).transpose(0, 1).flatten(0, 2)


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
        name: halves_to_stripes(source.take(HF_NAME(name)), n)
        for name, n in restriped_weights(cfg.n_layers, heads, kv_heads)
    }
    return load_converted(cfg, source, HF_NAME, restriped)


def hf_mismatches(cfg: ModelConfig) -> list[Mismatch]:
    """What of ``cfg`` ``DiffLlamaForCausalLM`` cannot hold (none: it holds the model): the layout
    :func:`from_hf` reads, whose head norm has no weight and LLaMA's eps, and whose λ_init follows the depth
    schedule."""
    found = differences(("attention", cfg.attention, "diff"))
    if not found:
        options = cfg.attention_opts
        found = differences(
            ("attention_options.lambda_init", options.lambda_init, None),
            ("attention_options.subln_affine", options.subln_affine, False),
        )
        if options.subln_eps != cfg.norm_eps:
            found.append(Mismatch("attention_options.subln_eps", options.subln_eps, f"norm_eps={cfg.norm_eps!r}"))
    return [
        *found,
        *rope_mismatches(cfg),
        *differences(
            ("causal", cfg.causal, True),
            ("norm", cfg.norm, "rmsnorm"),
            ("mlp", cfg.mlp, "swiglu"),
            ("bias", cfg.bias, False),
            ("parallel_residual", cfg.parallel_residual, False),
            ("embedding_norm", cfg.embedding_norm, False),
            ("scale_embeddings", cfg.scale_embeddings, False),
        ),
    ]


def to_hf(model: Transformer) -> DiffLlamaForCausalLM:
    """An attnzoo ``diff`` model → ``DiffLlamaForCausalLM`` with the same logits, the inverse of :func:`from_hf`;
    refused, naming the fields, if DiffLlama cannot hold it (:func:`hf_mismatches`)."""
    cfg = model.config
    refuse_mismatches(HF_CLASS, hf_mismatches(cfg))
    transformers = require_transformers()
    heads, kv_heads = 2 * cfg.n_heads, 2 * cfg.n_kv_heads
    rope_parameters, max_position_embeddings = hf_rope_parameters(cfg.position_opts, cfg.max_seq_len)
    hf_config = transformers.DiffLlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.dim,
        intermediate_size=cfg.mlp_hidden_dim,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=cfg.head_dim // 2,
        hidden_act=SWIGLU_ACTIVATIONS[0],
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=cfg.norm_eps,
        tie_word_embeddings=cfg.tie_embeddings,
        rope_parameters=rope_parameters,
        attention_bias=False,
        initializer_range=cfg.init_std,
        **NO_SPECIAL_TOKENS,
    )
    weights = dict(model.state_dict())
    for name, n in restriped_weights(cfg.n_layers, heads, kv_heads):
        weights[name] = stripes_to_halves(weights[name], n)
    hf_model = transformers.DiffLlamaForCausalLM(hf_config)
    hf_model.load_state_dict(renamed(weights, HF_NAME))
    return hf_model
