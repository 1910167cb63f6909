"""The one place a kernel is chosen: a layer's kernels are fixed once from its config (:func:`kernel_chain`), and each
call runs the first of them that serves it (:func:`choose`, :func:`attend`). The kernels come from the mechanism
(``Attention.kernels``) and from the positional scheme (``PositionalEncoding.kernels``), whose kernels "auto" tries
just before the kernel each specialises (ALiBi's ``alibi-flash`` before ``sdpa``). On CUDA, a route a GPU lease
decided (``routes.py``: ``cuda_routes.json``) is tried first for the calls it was timed on.

A kernel the user named (``attn_backend``) is never swapped silently for the eager reference: a run it cannot serve
is refused before it starts (:func:`planned_backend_refusal`), and where only a call can tell, the fallback is said
once per layer, kernel and reason.
"""

from __future__ import annotations

import dataclasses
import warnings
import weakref
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from torch import Tensor

from attnzoo.attention.base import ATTENTION
from attnzoo.attention.kernels.eager import EAGER
from attnzoo.attention.kernels.kernel import KERNELS, Call, Kernel
from attnzoo.attention.kernels.routes import CANDIDATES, MODES, ROUTES_FILE, cuda_routes

if TYPE_CHECKING:
    from attnzoo.attention.base import Attention, AttentionContext
    from attnzoo.config import ModelConfig

# The attn_backend that runs, for each call, the first of its mechanism's kernels that serves it
AUTO = "auto"


def backend_refusal(cfg: ModelConfig, position_kernels: tuple[str, ...] = ()) -> str | None:
    """Why ``cfg.attn_backend``, a kernel's name, cannot serve ``cfg``'s layers, or None; "auto" and "eager" serve
    every mechanism. A kernel that specialises another (a positional scheme's) serves a model whose scheme brings it
    (``position_kernels``, the scheme's ``kernels``) and whose mechanism the kernel it specialises serves."""
    if cfg.attn_backend in (AUTO, EAGER.name):
        return None
    kernel = KERNELS.get(cfg.attn_backend)
    reason = kernel.static_refusal(cfg)
    if reason is None and kernel.specialises is not None:
        reason = brought_refusal(kernel, cfg, position_kernels)
    if reason is None:
        return None
    return f"the kernel cannot run {cfg.attention} here: {reason}; use 'auto' or 'eager'"


def brought_refusal(kernel: Kernel, cfg: ModelConfig, position_kernels: tuple[str, ...]) -> str | None:
    """Why ``kernel``, which specialises another, cannot serve ``cfg`` beyond its own static reasons: the positional
    scheme does not bring it, or the kernel it specialises cannot serve the mechanism."""
    if kernel.name not in position_kernels:
        return f"it computes a positional scheme's bias, and position={cfg.position!r} does not bring it"
    reason = KERNELS.get(kernel.specialises).static_refusal(cfg)
    return None if reason is None else f"it runs the calls of {kernel.specialises!r}, which cannot: {reason}"


def kernel_chain(cfg: ModelConfig, position_kernels: tuple[str, ...] = ()) -> tuple[Kernel, ...]:
    """The kernels a layer of ``cfg`` may run, in order: with "auto" those its mechanism names
    (``Attention.kernels``) less those whose static reasons refuse ``cfg``, each of ``position_kernels`` (the
    positional scheme's) that serves ``cfg`` just before the kernel it specialises, and the eager reference last; a
    CUDA route the lease decided against the mechanism's own order (:func:`routed_kernels`) goes first. With "eager"
    the reference alone; with a kernel's name that kernel alone (a scheme's kernel included: "sdpa" runs SDPA
    without ALiBi's), the reference running (and :func:`attend` telling) a call it cannot serve. The static
    reasons are asked here, once per layer."""
    if cfg.attn_backend == EAGER.name:
        return (EAGER,)
    if cfg.attn_backend != AUTO:
        return (KERNELS.get(cfg.attn_backend),)
    brought = [kernel for kernel in map(KERNELS.get, position_kernels) if kernel.static_refusal(cfg) is None]

    def with_brought(kernels: Iterable[Kernel]) -> Iterator[Kernel]:
        for kernel in kernels:
            yield from (extra for extra in brought if extra.specialises == kernel.name)
            yield kernel

    kernels = (*routed_kernels(cfg), *(KERNELS.get(name) for name in ATTENTION.get(cfg.attention).kernels))
    return (*with_brought(kernel for kernel in kernels if kernel.static_refusal(cfg) is None), EAGER)


def routed_kernels(cfg: ModelConfig) -> list[Kernel]:
    """The kernels ``cuda_routes.json`` routes first for ``cfg``'s mechanism where they differ from its own order's
    CUDA kernel, each one refusing every call but those it was timed on (:func:`routed_first`)."""
    routes = cuda_routes()
    default = CANDIDATES[cfg.attention].default if cfg.attention in CANDIDATES else None
    modes: dict[str, tuple[str, ...]] = {}
    for mode in MODES:
        kernel = routes.get((cfg.attention, mode))
        if kernel is not None and kernel != default:
            modes[kernel] = (*modes.get(kernel, ()), mode)
    return [routed_first(KERNELS.get(kernel), kernel_modes) for kernel, kernel_modes in modes.items()]


def routed_first(kernel: Kernel, modes: tuple[str, ...]) -> Kernel:
    """``kernel`` as the first of a chain for what the lease timed, CUDA calls over a fresh sequence in ``modes``
    (eager, compiled): for every other call it refuses, and the kernel's place in the rest of the chain, if any,
    is where it runs."""
    told = f"routed first for CUDA calls over a fresh sequence, {' and '.join(modes)} ({ROUTES_FILE.name})"

    def call_reasons(layer: Attention, call: Call) -> Iterator[str]:
        if call.device_type != "cuda" or call.cached or MODES[call.compiling] not in modes:
            yield told
        yield from kernel.call_reasons(layer, call)

    return dataclasses.replace(kernel, call_reasons=call_reasons)


def stage_chain(cfg: ModelConfig, kernels: tuple[Kernel, ...]) -> tuple[Kernel, ...]:
    """The kernels of a stage of a layer other than its attention (DCMHA's composition weights) that may serve
    ``cfg``, in order: those whose static reasons do not refuse it, and the last, the stage's reference, which serves
    every call. The static reasons are asked here, once per layer."""
    return (*(kernel for kernel in kernels[:-1] if kernel.static_refusal(cfg) is None), kernels[-1])


def choose(layer: Attention, call: Call, chain: tuple[Kernel, ...] | None = None) -> Kernel:
    """The first of the layer's kernels (or of a stage's ``chain``, :func:`stage_chain`) that serves ``call``; the
    eager reference, which serves every call, where none does (a stage's chain ends in its own reference)."""
    kernels = layer.kernel_chain if chain is None else chain
    return next((kernel for kernel in kernels if kernel.call_refusal(layer, call) is None), EAGER)


def named_kernel_refusal(layer: Attention, call: Call) -> str | None:
    """Why the kernel named as the layer's ``attn_backend`` (its chain's one kernel) cannot serve ``call``, which the
    eager reference would then run; None where it serves, or where no kernel was named ("auto" and "eager" end in the
    reference)."""
    if choose(layer, call) in layer.kernel_chain:
        return None
    return layer.kernel_chain[-1].call_refusal(layer, call)


def planned_backend_refusal(layers: Iterable[Attention], call: Call, planned: str) -> str | None:
    """Why the kernel named as ``attn_backend`` cannot serve the ``planned`` calls (a run's training steps, as
    :meth:`Call.planned <attnzoo.attention.kernels.Call.planned>` describes them) of one of ``layers``, the first
    such layer's reason; None where it serves them all, or where no kernel was named."""
    for layer in layers:
        reason = named_kernel_refusal(layer, call)
        if reason is not None:
            return (
                f"the kernel cannot serve {planned}: {reason}; use 'auto' (the first kernel that serves each call) "
                "or 'eager'"
            )
    return None


# The (kernel, reason) fallbacks already said, per layer: a model's layers come and go, the record with them.
_FALLBACKS_TOLD: weakref.WeakKeyDictionary[Attention, set[tuple[str, str]]] = weakref.WeakKeyDictionary()


def _tell_fallback(layer: Attention, call: Call) -> None:
    """Warn, once per layer, kernel and reason, that the kernel named as ``attn_backend`` could not serve ``call``
    and the eager reference ran it. Not while torch.compile traces: a warning would break the graph."""
    if call.compiling:
        return
    kernel, reason = layer.kernel_chain[-1], named_kernel_refusal(layer, call)
    told = _FALLBACKS_TOLD.setdefault(layer, set())
    if reason is None or (kernel.name, reason) in told:
        return
    told.add((kernel.name, reason))
    warnings.warn(
        f"attn_backend={kernel.name!r} cannot serve a call of layer {layer.layer_idx} ({reason}); the eager "
        "reference runs it",
        RuntimeWarning,
        stacklevel=3,
    )


def attend(
    layer: Attention, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, *, cached: bool = False, **inputs: Any
) -> Tensor:
    """The layer's attention output (B, H, T, d_v) by the kernel :func:`choose` picks for this call: q (B, H, T, d)
    rotated, k and v (B, H_kv, S, ·) the cache's where ``cached`` (the layer was given a cache), ``inputs`` the
    mechanism's own (Diff's λ, DCMHA's composition), passed to the kernel as they are. Where ``ctx.kernels`` is a
    dict, files the kernel's name under the layer's index."""
    call = Call.of(layer, q, k, ctx, cached=cached)
    kernel = choose(layer, call)
    if kernel not in layer.kernel_chain:
        _tell_fallback(layer, call)
    if ctx.kernels is not None:
        ctx.kernels[layer.layer_idx] = kernel.name
    return kernel.run(layer, q, k, v, ctx, **inputs)
