"""The kernel record, what its reasons read of a call, and the registry of kernels.

A kernel is a way to compute a layer's attention. Its record says which mechanisms it serves, why it cannot serve a
configuration (static reasons, asked once when the config is built) and why it cannot compute one call exactly
(per-call reasons, asked lazily and in order, so a reason that builds the C++ extension is asked last and only where
every cheaper one passed), and runs it. Each mechanism names its kernels in order of preference
(``Attention.kernels``), and a positional scheme the kernels it brings (``PositionalEncoding.kernels``, ALiBi's
``alibi-flash``); :func:`~attnzoo.attention.kernels.dispatch.attend` runs the first that serves the call, the eager
reference last.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attnzoo.registry import Registry

if TYPE_CHECKING:
    from attnzoo.attention.base import Attention, AttentionContext
    from attnzoo.config import ModelConfig
    from attnzoo.positions import PositionalEncoding


@dataclass(frozen=True)
class Call:
    """One attention call as the kernels' per-call reasons read it: built from the tensors (:meth:`of`), or planned
    from a config without any (``attnzoo info``)."""

    device_type: str
    dtype: torch.dtype  # the queries'
    key_dtype: torch.dtype
    queries: int
    keys: int  # the keys the queries attend over: the cache's on a cached call
    start: int | None  # positions already cached; None on a static step
    cached: bool  # the layer was given a cache (a prefill into an empty one included)
    static: bool  # a static decoding step (``attnzoo.cache``)
    records_scores: bool  # maps or logits are recorded: only the eager reference returns them
    dropout: float  # the layer's attention dropout in this call (0 outside training)
    compiling: bool  # torch.compile is tracing
    position: PositionalEncoding  # the model's positional scheme
    padded: bool = False  # a padding mask hides some keys of some sequences (``AttentionContext.key_padding``)
    autograd: bool = False  # autograd records the call: grad mode is on and the queries require grad
    # Whether a reason may build the C++ extension to answer; False where the call is only described.
    build: bool = True

    @classmethod
    def of(cls, layer: Attention, q: Tensor, k: Tensor, ctx: AttentionContext, *, cached: bool) -> Call:
        return cls(
            device_type=q.device.type,
            dtype=q.dtype,
            key_dtype=k.dtype,
            queries=q.shape[2],
            keys=k.shape[2],
            start=ctx.start,
            cached=cached,
            static=ctx.static,
            records_scores=ctx.records_scores,
            dropout=layer.attn_dropout,
            compiling=torch.compiler.is_compiling(),
            position=ctx.position,
            padded=ctx.key_padding is not None,
            autograd=torch.is_grad_enabled() and q.requires_grad,
        )

    @classmethod
    def planned(
        cls,
        cfg: ModelConfig,
        position: PositionalEncoding,
        *,
        device_type: str = "cpu",
        dtype: torch.dtype = torch.float32,
        length: int = 2,
        compiling: bool = False,
        build: bool = False,
    ) -> Call:
        """A fresh training sequence of ``length`` tokens on ``device_type`` at ``dtype`` (autocast's, where it is
        on), planned from the config without any tensor: the call a run records and ``attnzoo info`` describes.
        ``build``: whether a reason may build the C++ extension to answer, as a run's first step would anyway;
        ``info`` only reads whether a build failed."""
        return cls(
            device_type=device_type,
            dtype=dtype,
            key_dtype=dtype,
            queries=length,
            keys=length,
            start=0,
            cached=False,
            static=False,
            records_scores=False,
            dropout=cfg.dropout,
            compiling=compiling,
            position=position,
            build=build,
        )


def no_reasons(*args: object) -> Iterator[str]:
    return iter(())


@dataclass(frozen=True)
class Kernel:
    """A registered way to compute a layer's attention.

    ``run(layer, q, k, v, ctx, **inputs)`` returns the (B, H, T, d_v) output from the layer's rotated queries, its
    keys and values (the cache's on a cached call) and the mechanism's own inputs (Diff's λ, DCMHA's composition
    matrices). ``static_reasons(cfg)`` and ``call_reasons(layer, call)`` yield why the kernel cannot serve the
    configuration, or this :class:`Call`, in order: the first is the one told. ``describe(cfg, position)`` says what
    runs, with a build state where there is one (``attnzoo info``).

    A kernel a positional scheme brings names the kernel it ``specialises``: it computes what that one computes, for
    the scheme's calls it serves, and "auto" tries it just before that kernel. Named as ``attn_backend`` it runs
    alone, as any kernel named does, for a model whose scheme brings it and whose mechanism the kernel it specialises
    serves (``dispatch.backend_refusal``); naming the kernel it specialises runs that one without it.
    """

    name: str
    display_name: str
    run: Callable[..., Tensor]
    serves: tuple[str, ...] | None = None  # the mechanisms it serves; None: any that names it
    static_reasons: Callable[[ModelConfig], Iterator[str]] = no_reasons
    call_reasons: Callable[[Attention, Call], Iterator[str]] = no_reasons
    describe: Callable[[ModelConfig, PositionalEncoding], str] | None = None
    masks_padding: bool = False  # whether it reads a padding mask; a call with one goes to a kernel that does
    specialises: str | None = None  # a positional scheme's kernel: the kernel it is tried ahead of
    ops: tuple[str, ...] = ()  # the torch.ops.attnzoo operators its forward runs: how a trace tells that it ran

    def static_refusal(self, cfg: ModelConfig) -> str | None:
        """Why this kernel can never serve ``cfg``'s layers, or None."""
        if self.serves is not None and cfg.attention not in self.serves:
            return f"it serves {', '.join(self.serves)} only"
        return next(self.static_reasons(cfg), None)

    def call_refusal(self, layer: Attention, call: Call) -> str | None:
        """Why this kernel cannot compute ``call`` exactly, or None: the reasons are asked in order, up to the first
        that applies."""
        if call.padded and not self.masks_padding:
            return "a padding mask hides keys per sequence, which only the eager reference reads"
        return next(self.call_reasons(layer, call), None)

    def description(self, cfg: ModelConfig, position: PositionalEncoding) -> str:
        return self.display_name if self.describe is None else self.describe(cfg, position)


KERNELS: Registry[Kernel] = Registry("attention kernel", "attn_backend", "attnzoo.kernels")


def register_kernel(kernel: Kernel) -> Kernel:
    return KERNELS.register(kernel.name)(kernel)


def backend_names() -> list[str]:
    """The kernels ``attn_backend`` may name: every registered one, a positional scheme's included. Plugins not yet
    loaded are listed, and loaded only when named."""
    return KERNELS.names()


def kernel_ops() -> dict[str, str]:
    """{operator: the display name of the kernel whose run dispatches it}, over the kernels registered so far: what a
    trace of the dispatched operators (``bench.sdpa_kernels``) names."""
    return {op: kernel.display_name for kernel in KERNELS.registered().values() for op in kernel.ops}
