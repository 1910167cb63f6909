"""The per-call reasons every fused C++ kernel shares: the device and the tracer first, the extension's build last."""

from __future__ import annotations

from collections.abc import Iterator

from attnzoo.attention import fused_cpu
from attnzoo.attention.kernels.kernel import Call


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
