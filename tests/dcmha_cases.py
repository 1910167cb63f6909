"""DCMHA attention cases and their float64 eager reference, shared by the fused kernels' tests (Triton, C++)."""

from __future__ import annotations

import dataclasses
from functools import partial

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from attnzoo import ModelConfig
from attnzoo.attention import AttentionContext
from attnzoo.attention.dcmha import Mixing, compose_merged, key_matrices, query_matrices
from attnzoo.attention.kernels import Hooks, eager_attention
from attnzoo.positions import POSITIONS


@dataclasses.dataclass(frozen=True)
class Case:
    window: int | None = 8
    pre: bool = True
    post: bool = True
    key_wise: bool = True
    batch: int = 1
    n_heads: int = 4
    n_kv_heads: int = 2  # GQA: two query heads per kv head
    groups: int = 1
    rank: int = 2
    head_dim: int = 16
    length: int = 37  # with 16-row tiles: three query blocks, the last one partial
    position: str = "none"  # "alibi": the official slopes' bias on the logits, before the pre-composition


CASES = {
    "global": Case(window=None),
    "local": Case(),
    "local-pre-only": Case(post=False),
    "local-post-only": Case(pre=False),
    "global-query-wise": Case(window=None, key_wise=False),
    "local-no-composition": Case(pre=False, post=False),
    # M = 3 heads per group (padded to 4) whose kv heads straddle the groups, rank 3 (padded to 4), head_dim 12
    # (padded to 16), two sequences.
    "groups-padded": Case(batch=2, n_heads=6, n_kv_heads=3, groups=2, rank=3, head_dim=12, length=29),
}


def make_inputs(case: Case, dtype: torch.dtype, device: str = "cpu") -> list[torch.Tensor]:
    """q, k, v and every mixing weight (leaves that need gradients), with composition strong enough to matter."""
    per_group = case.n_heads // case.groups

    def weights(length: int) -> list[torch.Tensor]:
        shape = (case.batch, case.groups, length, case.rank, per_group)
        return [0.5 * torch.randn(shape), 0.5 * torch.randn(shape), 0.5 * torch.randn((*shape[:3], per_group))]

    def mixing() -> list[torch.Tensor | None]:
        key_side = weights(case.length) if case.key_wise else [None] * 3
        return weights(case.length) + key_side

    q = torch.randn(case.batch, case.n_heads, case.length, case.head_dim).to(dtype)
    k, v = (torch.randn(case.batch, case.n_kv_heads, case.length, case.head_dim).to(dtype) for _ in range(2))
    pre = mixing() if case.pre else None
    post = mixing() if case.post else None
    return [x.to(device).requires_grad_() for x in [q, k, v, *(pre or []), *(post or [])] if x is not None]


def split(leaves: list[torch.Tensor], case: Case) -> tuple[torch.Tensor, ...]:
    """(q, k, v, pre Mixing or None, post Mixing or None) from the leaves of :func:`make_inputs`."""
    q, k, v, *rest = leaves
    per_mixing = 6 if case.key_wise else 3
    mixings = []
    for on in (case.pre, case.post):
        if on:
            fields, rest = rest[:per_mixing], rest[per_mixing:]
            mixings.append(Mixing(*fields, *([None] * (6 - per_mixing))))
        else:
            mixings.append(None)
    return q, k, v, *mixings


def reference(leaves: list[torch.Tensor], case: Case) -> torch.Tensor:
    """The eager DCMHA attention in float64: full scores composed with explicit QW[t] + KW[s]."""
    q, k, v, pre, post = split([x.double().cpu() for x in leaves], case)
    cfg = ModelConfig(vocab_size=8, dim=case.n_heads * case.head_dim, n_heads=case.n_heads, n_layers=1)
    positions = torch.arange(case.length)
    position = POSITIONS.get(case.position)(cfg, case.head_dim)
    ctx = AttentionContext(positions, 0, position, None, dtype=torch.float64)

    def compose(mixing: Mixing | None):
        if mixing is None:
            return None
        key_w = None if mixing.kw1 is None else key_matrices(mixing)
        return partial(compose_merged, query_w=query_matrices(mixing, None), key_w=key_w)

    out, _ = eager_attention(q, k, v, ctx, hooks=Hooks(scores=compose(pre), probs=compose(post)), window=case.window)
    return out


class RecordShapes(TorchDispatchMode):
    """The shape of every tensor each torch op returns, in order: what the no-T×T checks read."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor):
                self.shapes.append(tuple(tensor.shape))
        return out
