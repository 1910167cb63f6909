"""What every fused C++ kernel's record shares: its per-call reasons open with the device and the tracer and close with
the extension's build, and ``attnzoo info`` names it with the extension's build state."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from attnzoo.attention import fused_cpu
from attnzoo.attention.kernels.kernel import Call, Kernel, register_kernel

if TYPE_CHECKING:
    from torch import Tensor

    from attnzoo.attention.base import Attention
    from attnzoo.config import ModelConfig
    from attnzoo.positions import PositionalEncoding


def cpu_reasons(call: Call) -> Iterator[str]:
    """Asked before anything else, so that a call off the CPU never builds or loads the extension."""
    if call.device_type != "cpu":
        yield "the tensors are not on the CPU"
    if call.compiling:
        yield "torch.compile is tracing (the op has no fake kernel)"
    if call.records_scores:
        yield "attention maps or logits are recorded"


def extension_reasons(call: Call) -> Iterator[str]:
    """Asked last: a call builds the extension the first time (about a minute); a planned call only reads whether a
    build was tried and failed."""
    built = fused_cpu.available() if call.build else not fused_cpu.status().startswith("unavailable")
    if not built:
        yield f"the fused CPU kernels are {fused_cpu.status()}"


def register_cpu_kernel(
    *,
    name: str,
    display_name: str,
    run: Callable[..., Tensor],
    serves: tuple[str, ...],
    static_reasons: Callable[[ModelConfig], Iterator[str]],
    call_reasons: Callable[[Attention, Call], Iterator[str]],
) -> Kernel:
    """Registers a fused C++ kernel. ``call_reasons`` are the kernel's own, asked between :func:`cpu_reasons` and
    :func:`extension_reasons`, so no kernel can ask for the extension before it knows the call is on the CPU."""

    def reasons(layer: Attention, call: Call) -> Iterator[str]:
        yield from cpu_reasons(call)
        yield from call_reasons(layer, call)
        yield from extension_reasons(call)

    def describe(cfg: ModelConfig, position: PositionalEncoding) -> str:
        return f"{display_name}, {fused_cpu.status()}"

    return register_kernel(
        Kernel(
            name=name,
            display_name=display_name,
            run=run,
            serves=serves,
            static_reasons=static_reasons,
            call_reasons=reasons,
            describe=describe,
        )
    )
