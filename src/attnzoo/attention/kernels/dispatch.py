"""The one place a kernel is chosen: a layer's kernels are fixed once from its config (:func:`kernel_chain`), and each
call runs the first of them that serves it (:func:`choose`, :func:`attend`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor

from attnzoo.attention.base import ATTENTION
from attnzoo.attention.kernels.eager import EAGER
from attnzoo.attention.kernels.kernel import KERNELS, Call, Kernel

if TYPE_CHECKING:
    from attnzoo.attention.base import Attention, AttentionContext
    from attnzoo.config import ModelConfig

# The attn_backend that runs, for each call, the first of its mechanism's kernels that serves it
AUTO = "auto"


def backend_refusal(cfg: ModelConfig) -> str | None:
    """Why ``cfg.attn_backend``, a kernel's name, cannot serve ``cfg``'s layers, or None; "auto" and "eager" serve
    every mechanism."""
    if cfg.attn_backend in (AUTO, EAGER.name):
        return None
    reason = KERNELS.get(cfg.attn_backend).static_refusal(cfg)
    if reason is None:
        return None
    return f"the kernel cannot run {cfg.attention} here: {reason}; use 'auto' or 'eager'"


def kernel_chain(cfg: ModelConfig) -> tuple[Kernel, ...]:
    """The kernels a layer of ``cfg`` may run, in order, the eager reference last: with "auto" those its mechanism
    names (``Attention.kernels``) less those whose static reasons refuse ``cfg``; with a kernel's name that kernel;
    with "eager" the reference alone. The static reasons are asked here, once per layer."""
    if cfg.attn_backend == EAGER.name:
        return (EAGER,)
    names = ATTENTION.get(cfg.attention).kernels if cfg.attn_backend == AUTO else (cfg.attn_backend,)
    kernels = (KERNELS.get(name) for name in names)
    return (*(kernel for kernel in kernels if kernel.static_refusal(cfg) is None), EAGER)


def choose(layer: Attention, call: Call) -> Kernel:
    """The first of the layer's kernels that serves ``call``; the eager reference serves every call."""
    return next(kernel for kernel in layer.kernel_chain if kernel.call_refusal(layer, call) is None)


def attend(
    layer: Attention, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, *, cached: bool = False, **inputs: Any
) -> Tensor:
    """The layer's attention output (B, H, T, d_v) by the kernel :func:`choose` picks for this call: q (B, H, T, d)
    rotated, k and v (B, H_kv, S, ·) the cache's where ``cached`` (the layer was given a cache), ``inputs`` the
    mechanism's own (Diff's λ, DCMHA's composition), passed to the kernel as they are. Where ``ctx.kernels`` is a
    dict, files the kernel's name under the layer's index."""
    kernel = choose(layer, Call.of(layer, q, k, ctx, cached=cached))
    if ctx.kernels is not None:
        ctx.kernels[layer.layer_idx] = kernel.name
    return kernel.run(layer, q, k, v, ctx, **inputs)
