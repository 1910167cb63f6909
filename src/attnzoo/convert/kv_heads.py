"""Multi-head → grouped-query (GQA) or multi-query (MQA) attention by mean-pooling kv heads (Ainslie et al.,
"GQA: Training Generalized Multi-Query Transformer Models from Multi-Head Checkpoints", EMNLP 2023, §2.1).

The query heads are split into G groups of consecutive heads, the group HF LLaMA and attnzoo read a kv head
for (query head h reads kv head h // (H / G)), and the key and value projection heads of each group are
averaged into the group's one kv head, biases included. Queries, the output projection and everything else
keep their weights. RoPE rotates every head alike and is linear, and ALiBi's slopes belong to the query heads,
so neither changes. The paper then *uptrains* the converted model with α = 5% of the original pre-training
steps (``attnzoo train --init-from``), which recovers most of the quality MHA → GQA conversion loses.
"""

from __future__ import annotations

import dataclasses

from attnzoo.model import Transformer
from attnzoo.validation import is_int


def pool_kv_heads(model: Transformer, n_kv_heads: int) -> Transformer:
    """A new model with ``n_kv_heads`` kv heads whose kv projections are the group means of ``model``'s (on its
    device, in eval mode). ``n_kv_heads`` must divide the source's kv-head count: pooling merges whole groups
    and never splits a head; equal to it, the model is copied unchanged. A mechanism whose kv heads cannot be
    pooled (no ``kv_projections``) is refused with the reason."""
    cfg = model.config
    current = cfg.n_kv_heads
    if not is_int(n_kv_heads) or not 1 <= n_kv_heads <= current or current % n_kv_heads:
        source = f"n_heads={cfg.n_heads}" if current == cfg.n_heads else f"the source's n_kv_heads={current}"
        raise ValueError(
            f"kv_heads={n_kv_heads!r} is invalid: must be an integer that divides {source}, so that every new kv "
            f"head is the mean of a whole group of {current} // kv_heads heads (1 for MQA)"
        )
    pooled = dict(model.state_dict())
    for i, block in enumerate(model.layers):
        for name, tensor in block.self_attn.pooled_kv_state(n_kv_heads).items():
            pooled[f"layers.{i}.self_attn.{name}"] = tensor
    weight = model.embed_tokens.weight
    grouped = Transformer(dataclasses.replace(cfg, n_kv_heads=n_kv_heads)).to(device=weight.device, dtype=weight.dtype)
    grouped.load_state_dict(pooled)  # strict: every tensor with a kv-head axis must have been pooled
    return grouped.eval()
