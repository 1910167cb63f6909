"""Official DCFormer PyTorch checkpoints (Caiyun-AI/DCFormer, e.g. DCFormer-2.8B) → attnzoo ``dcmha``.

The official model is gpt-fast's LLaMA with DCMHA. Its ``config.json`` fields map as
dim, n_layer, n_head, vocab_size, intermediate_size, norm_eps → the usual fields; block_size → max_seq_len;
rope_base → rope_theta; use_qk_norm → qk_norm; window_size and window_type → the per-layer windows. The
state dict renames layer by layer (``tok_embeddings``, ``attention.wqkv`` / ``wo``, ``attention.q_norm.scale``,
``attention.dyn_w_proj.{dw1, qkw, dd}``, ``feed_forward.w1/w3/w2`` = gate/up/down, ``attention_norm``,
``ffn_norm``, ``norm``, ``output``); the fused ``wqkv`` holds all query rows, then all key rows, then all value
rows. attnzoo's ``dcmha`` keeps the official shapes and slot order of the dynamic-weight parameters.

Two points where the official PyTorch code is not the model's math:

* RoPE "half" mode pairs channels (x_i, x_{i+d/2}) as GPT-NeoX does, then writes the rotated pairs interleaved.
  Queries and keys get the same channel permutation, so q·k, and everything computed from it, equals
  half-split RoPE, attnzoo's default. (Its fp16 cos/sin table is a rounding of the same values.)
* A local layer here sees ``window_size`` keys including the query's own, as in the JAX training code and
  the official decoding cache. The official PyTorch prefill mask (``make_window_mask``) admits one key more.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from attnzoo.config import ModelConfig
from attnzoo.convert.common import SourceWeights, load_converted, renamer, unsupported
from attnzoo.model import Transformer

MODEL_TYPE = "dcformer"  # config.json's model_type
SOURCE = "DCFormer"
REQUIRED_FIELDS = (
    "dim",
    "n_layer",
    "n_head",
    "n_local_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "block_size",
    "rope_base",
    "norm_eps",
    "use_qk_norm",
    "use_dcmha",
    "window_size",
    "window_type",
    "query_wise",
)
# The official window_type patterns (attention layer i uses entry i mod length); their local layers see 256
# keys, whatever window_size says.
WINDOW_PATTERNS = {"LG": "LG", "LGLL": "LGLL", "LGL6": "LGLLLLLL"}
PATTERN_WINDOW = 256
# Tensors with no information of their own: copies of dw1/dd/qkw that merge_weights() rebuilds, the unused
# identity buffers of the static composition (use_sw is off in the official code), and decoding caches.
DERIVED = re.compile(r"\.(dyn_w_proj\.(dw_m|qkw_m|sw|pre_proj\.w|post_proj\.w)|kv_cache\.\w+)$")
OFFICIAL_NAME = renamer(
    layers="layers.",
    top={"embed_tokens.": "tok_embeddings.", "lm_head.": "output."},
    per_layer={
        "input_layernorm.": "attention_norm.",
        "post_attention_layernorm.": "ffn_norm.",
        "self_attn.o_proj.": "attention.wo.",
        "self_attn.q_norm.weight": "attention.q_norm.scale",
        "self_attn.k_norm.weight": "attention.k_norm.scale",
        "self_attn.dyn_w_proj.": "attention.dyn_w_proj.",
        "mlp.gate_proj.": "feed_forward.w1.",
        "mlp.up_proj.": "feed_forward.w3.",
        "mlp.down_proj.": "feed_forward.w2.",
    },
)


def window_options(window_type: str | None, window_size: int | None) -> dict[str, Any]:
    """attnzoo's ``window_type`` / ``window_size`` for the official per-layer windows."""
    if window_type is None:
        # Even layers are local with window_size, odd ones global; without a window_size all are global.
        return {"window_type": "G"} if window_size is None else {"window_type": "LG", "window_size": window_size}
    if window_type in WINDOW_PATTERNS and window_size == PATTERN_WINDOW:
        return {"window_type": WINDOW_PATTERNS[window_type], "window_size": PATTERN_WINDOW}
    raise unsupported(
        SOURCE,
        "window_type",
        window_type,
        f"with window_size={window_size!r} is not supported; the official patterns are {list(WINDOW_PATTERNS)}, "
        f"whose local layers see {PATTERN_WINDOW} keys",
    )


def from_official(config: Mapping[str, Any], state_dict: Mapping[str, Tensor]) -> Transformer:
    """An official DCFormer (``config.json`` as a dict, state dict) → attnzoo ``dcmha`` + ``rope``."""
    missing = [name for name in REQUIRED_FIELDS if name not in config]
    if missing:
        raise ValueError(f"cannot convert {SOURCE}: its config lacks {missing}")
    if config.get("mgate"):
        raise unsupported(SOURCE, "mgate", config["mgate"], "is not supported: attnzoo's SwiGLU has no extra gate")
    if not config["use_dcmha"]:
        raise unsupported(
            SOURCE, "use_dcmha", False, "is not supported: the official inference code composes heads regardless"
        )
    if config["query_wise"]:
        raise unsupported(
            SOURCE,
            "query_wise",
            True,
            "is not supported: the official code drops key-wise composition only when decoding one token, "
            "so its prefill and decoding disagree",
        )
    dim, heads = config["dim"], config["n_head"]
    if heads < 2 or dim % heads:
        raise unsupported(SOURCE, "n_head", heads, f"is not supported: the official code needs 2 <= n_head | dim={dim}")
    head_dim = dim // heads
    if config["head_dim"] != head_dim:
        raise unsupported(
            SOURCE,
            "head_dim",
            config["head_dim"],
            f"disagrees with dim // n_head = {head_dim}, which the official code uses",
        )
    if config["n_local_heads"] not in (-1, heads):
        raise unsupported(
            SOURCE,
            "n_local_heads",
            config["n_local_heads"],
            f"is not supported: the official forward multiplies queries by keys without repeating kv heads, "
            f"so only n_local_heads = n_head = {heads} runs",
        )
    # The official FFN size when none is given: 2/3 of 4·dim, rounded up to a multiple of 256.
    intermediate = config["intermediate_size"] or -(-int(8 * dim / 3) // 256) * 256
    cfg = ModelConfig(
        vocab_size=config["vocab_size"],
        dim=dim,
        n_layers=config["n_layer"],
        n_heads=heads,
        head_dim=head_dim,
        mlp="swiglu",
        mlp_hidden_dim=intermediate,
        norm="rmsnorm",
        norm_eps=config["norm_eps"],
        tie_embeddings=False,
        max_seq_len=config["block_size"],
        attention="dcmha",
        attention_options={
            "qk_norm": config["use_qk_norm"],
            # The official qkw has 2·(N // (N // 2)) rows per slot, split into w1 and w2: rank 2 for even N.
            "rank": heads // (heads // 2),
            "dynamic_w_hidden_dim": 4 * heads,
            **window_options(config["window_type"], config["window_size"]),
        },
        position="rope",
        position_options={"rope_theta": float(config["rope_base"])},
    )
    source = SourceWeights({name: t for name, t in state_dict.items() if not DERIVED.search(name)}, SOURCE)
    qkv = {}
    for i in range(cfg.n_layers):
        prefix = f"layers.{i}.attention."
        if f"{prefix}wqkv.weight" in source:
            parts = source.take(f"{prefix}wqkv.weight").chunk(3)
        else:  # separate projections, which the official load hook also accepts
            parts = tuple(source.take(f"{prefix}{name}.weight") for name in ("wq", "wk", "wv"))
        for proj, part in zip(("q_proj", "k_proj", "v_proj"), parts, strict=True):
            qkv[f"layers.{i}.self_attn.{proj}.weight"] = part
    return load_converted(cfg, source, OFFICIAL_NAME, qkv)
