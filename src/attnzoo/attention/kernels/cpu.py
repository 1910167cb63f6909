"""What every fused C++ kernel shares: its record's per-call reasons open with the device and the tracer and close with
the extension's build (``build.py``), ``attnzoo info`` names it with the build state, and its operands reach the C++
code as contiguous fp32."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attnzoo.attention.kernels import build
from attnzoo.attention.kernels.kernel import Call, Kernel, register_kernel

if TYPE_CHECKING:
    from attnzoo.attention.base import Attention
    from attnzoo.config import ModelConfig
    from attnzoo.positions import PositionalEncoding

# Input dtypes the kernels serve; they compute in fp32 (bf16 operands are upcast, each tile's sums stay fp32).
# float64 keeps the PyTorch path, float64 throughout.
DTYPES = (torch.float32, torch.bfloat16)
# Rows of queries and keys per tile of the flash kernels (ALiBi's, Diff's). Forward + backward of (4096/T, 8, T, 32)
# ALiBi attention, 1 thread, contended (load 4.6), took 1.51 / 1.64 / 2.04 / 1.12× plain causal SDPA at T = 256 /
# 1024 / 2048 / 4096 in 64-row tiles, 1.07 / 1.21 / 1.30 / 0.96× in 128-row tiles and 1.10 / 1.02 / 1.15 / 0.99× in
# 256-row tiles: at d = 32 a short tile leaves each matmul too little work to amortise its dispatch. A 256 × 256 fp32
# tile is 256 KiB; the backward pass's two stay in L2.
Q_TILE = 256
K_TILE = 256


def fp32_operands(*tensors: Tensor) -> tuple[Tensor, ...]:
    """Contiguous fp32 operands, detached: bf16 is upcast here (O(T·d) per operand) so every tile sum is taken in
    fp32. Detached because the kernels' tile matmuls run on OpenMP workers, whose thread-local grad mode is on even
    inside an autograd Function, and an out= matmul refuses an operand that requires grad there."""
    return tuple(x.detach().float().contiguous() for x in tensors)


def fp32_rows(*tensors: Tensor) -> tuple[Tensor, ...]:
    """fp32 operands, detached as :func:`fp32_operands`'s, for a kernel that reads any strides whose rows are
    contiguous (``dcmha_fused``): a head-major view of a token-major projection is passed as it lies, not copied."""
    return tuple(_with_contiguous_rows(x.detach().float()) for x in tensors)


def _with_contiguous_rows(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


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
    built = build.available() if call.build else not build.status().startswith("unavailable")
    if not built:
        yield f"the fused CPU kernels are {build.status()}"


def register_cpu_kernel(
    *,
    name: str,
    display_name: str,
    run: Callable[..., Tensor],
    static_reasons: Callable[[ModelConfig], Iterator[str]],
    call_reasons: Callable[[Attention, Call], Iterator[str]],
    ops: tuple[str, ...],
    serves: tuple[str, ...] | None = None,
    specialises: str | None = None,
) -> Kernel:
    """Registers a fused C++ kernel (the :class:`Kernel` fields by name). ``call_reasons`` are the kernel's own, asked
    between :func:`cpu_reasons` and :func:`extension_reasons`, so no kernel can ask for the extension before it knows
    the call is on the CPU; ``ops``: the ``torch.ops.attnzoo`` operators its forward runs."""

    def reasons(layer: Attention, call: Call) -> Iterator[str]:
        yield from cpu_reasons(call)
        yield from call_reasons(layer, call)
        yield from extension_reasons(call)

    def describe(cfg: ModelConfig, position: PositionalEncoding) -> str:
        return f"{display_name}, {build.status()}"

    return register_kernel(
        Kernel(
            name=name,
            display_name=display_name,
            run=run,
            serves=serves,
            static_reasons=static_reasons,
            call_reasons=reasons,
            describe=describe,
            specialises=specialises,
            ops=ops,
        )
    )
