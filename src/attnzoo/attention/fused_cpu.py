"""Fused CPU attention kernels: a C++ extension (``csrc/``) built on first use and cached.

The library holds three kernels: ALiBi's, here; DCMHA's (``csrc/dcmha_fused.cpp``, whose autograd wrapper is
:mod:`attnzoo.attention.kernels.dcmha_fused`); and differential attention's (``csrc/diff_flash.cpp``, wrapped by
:mod:`attnzoo.attention.kernels.diff_flash`).

:func:`alibi_flash_attention` is causal ALiBi attention, softmax(q·kᵀ/√d + m_h·(j − i))·V with the official
slopes m_h (Press et al., 2022), by a flash-style kernel that adds the bias as it computes each score tile, so
neither the forward nor the backward pass holds a (H, T, T) tensor: the forward pass keeps each query tile's
online-softmax statistics and saves only the output and the row log-sum-exp; the backward pass recomputes the
probabilities from them (FlashAttention-2). ``csrc/alibi_flash.cpp`` derives it.

Why a C++ extension: SDPA's CPU flash kernel takes a bias only as a tensor; FlexAttention has no CPU backward
pass; inductor gave no gain on CPU (``../shared/notes/cpu_perf.md``); Triton has no CPU backend in the wheels.
``torch.utils.cpp_extension.load`` compiles the one source with the compiler and ninja present, caches the library
in the torch extensions directory (``TORCH_EXTENSIONS_DIR``, else ``~/.cache/torch_extensions``) and rebuilds only
when the source or flags change, so it needs nothing the install does not already bring. Where it cannot build
(no compiler, no ninja, a compile error) attnzoo warns once, naming the reason, and each mechanism runs on its
PyTorch path: ALiBi on SDPA's flash kernel with the (1, H, T, T) bias
(:func:`~attnzoo.attention.kernels.sdpa_attention`), DCMHA on its chunked composition
(:func:`~attnzoo.attention.kernels.chunked_attention`), Diff on two SDPA calls.

The library is built for the CPU's vector extension (``torch.backends.cpu.get_cpu_capability``) and named after it,
so a cache shared by different machines never hands one a build for instructions it lacks.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import threading
import warnings
from pathlib import Path

import torch
from torch import Tensor

SOURCES = tuple(
    Path(__file__).with_name("csrc") / name
    for name in ("alibi_flash.cpp", "dcmha_fused.cpp", "diff_flash.cpp", "fused_common.cpp")
)
# Rows of queries and keys per tile. Forward + backward of (4096/T, 8, T, 32), 1 thread, contended (load 4.6), took
# 1.51 / 1.64 / 2.04 / 1.12× plain causal SDPA at T = 256 / 1024 / 2048 / 4096 in 64-row tiles, 1.07 / 1.21 / 1.30 /
# 0.96× in 128-row tiles and 1.10 / 1.02 / 1.15 / 0.99× in 256-row tiles: at d = 32 a short tile leaves each matmul
# too little work to amortise its dispatch. A 256 × 256 fp32 tile is 256 KiB; the backward pass's two stay in L2.
Q_TILE = 256
K_TILE = 256
# Input dtypes the kernel serves; it computes in fp32 (bf16 operands are upcast, each tile's sums stay fp32).
# float64 keeps the path it had, float64 throughout.
DTYPES = (torch.float32, torch.bfloat16)
KERNEL_NAME = "alibi-flash (fused C++, CPU)"

# Compiler flags per CPU capability: ATen's vector type takes its width from CPU_CAPABILITY, as in ATen's own
# per-capability kernels.
_CAPABILITY_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-DCPU_CAPABILITY_AVX512"],
    "AVX2": ["-mavx2", "-mfma", "-DCPU_CAPABILITY_AVX2"],
}

_lock = threading.Lock()
_loaded: bool | None = None  # None: not tried in this process; then whether the ops are registered
_failure: str | None = None  # why the build failed, once it has


def _build() -> None:
    """Compile (or find cached) and load the library, which registers ``torch.ops.attnzoo.alibi_flash_*``,
    ``torch.ops.attnzoo.dcmha_fused_*`` and ``torch.ops.attnzoo.diff_flash_*``."""
    # Imported here: it pulls in setuptools, which only a build needs.
    from torch.utils.cpp_extension import get_cxx_compiler, is_ninja_available, load

    # Checked first so that the reason is one plain line (a failed build's message is the whole command line),
    # and so that a cache built elsewhere is never loaded where nothing could rebuild it.
    compiler = get_cxx_compiler()
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C++ compiler: {compiler!r} (the CXX variable, else c++) is not on PATH")
    if not is_ninja_available():
        raise RuntimeError("ninja, which torch.utils.cpp_extension builds with, is not on PATH")
    capability = torch.backends.cpu.get_cpu_capability()
    flags = ["-O3", *openmp_flags()]
    if capability in _CAPABILITY_FLAGS:
        flags += [*_CAPABILITY_FLAGS[capability], f"-DCPU_CAPABILITY={capability}"]
    # One cache entry per checkout (the build file names the sources' paths, so two installs sharing one name would
    # rebuild each other's library on every first use) and per content of csrc/: load() rebuilds when a source
    # changes but does not follow includes, so an edit of the shared header must change the name.
    content = hashlib.sha256(str(SOURCES[0].parent.resolve()).encode())
    for path in sorted(SOURCES[0].parent.iterdir()):
        content.update(path.read_bytes())
    checkout = content.hexdigest()[:10]
    load(
        name=f"attnzoo_cpu_kernels_{capability.lower()}_{checkout}",
        sources=[str(source) for source in SOURCES],
        extra_cflags=flags,
        extra_ldflags=openmp_flags(),
        is_python_module=False,
        verbose=False,
    )


def openmp_flags() -> list[str]:
    """``-fopenmp`` where PyTorch parallelises with OpenMP on Linux, else nothing. ATen's ``parallel_for`` is inline
    OpenMP code: compiled without the flag it runs every task on the calling thread (the kernels took the same time
    at 2 threads as at 1). The link finds ``libgomp.so.1`` in torch's own lib directory first, so the extension
    shares the OpenMP runtime PyTorch loaded rather than bringing a second one."""
    uses_openmp = "parallel backend: OpenMP" in torch.__config__.parallel_info()
    return ["-fopenmp"] if sys.platform.startswith("linux") and uses_openmp else []


def _reason(err: BaseException) -> str:
    """One line naming why a build failed: the compiler's first error where there is one (a failed build's message
    starts with the command line), else the exception's first line."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line]
    line = (errors or lines or ["no message"])[0]
    return f"{type(err).__name__}: {line[:300]}"


def available() -> bool:
    """Whether the fused kernels can run: builds them the first time (2 min 15 s on 2 cores; scripts/install.sh
    builds them at install), then answers from memory. A failed build warns once, with its reason, and is not
    retried in this process."""
    global _loaded, _failure
    if _loaded is None:
        with _lock:
            if _loaded is None:
                try:
                    _build()
                    _loaded = True
                except Exception as err:  # any failure to build means the PyTorch path, never a crash
                    _loaded, _failure = False, _reason(err)
                    warnings.warn(
                        f"attnzoo: the fused CPU kernels could not be built ({_failure}); ALiBi attention runs on "
                        "SDPA with a (1, H, T, T) bias, DCMHA on its chunked PyTorch path and Diff on two SDPA calls "
                        "instead",
                        RuntimeWarning,
                        stacklevel=3,
                    )
    return _loaded


def status() -> str:
    """The fused kernels' state in this process, without building them: what ``attnzoo info`` prints."""
    if _loaded:
        return "built"
    if _loaded is False:
        return f"unavailable ({_failure})"
    compiler = os.environ.get("CXX", "c++")
    return f"not built yet in this process: builds on first use with {compiler}, then cached"


def ensure_built() -> None:
    """Builds the kernels the first time; raises, naming why, where they cannot be built (a kernel's record asks
    :func:`available` first, so this raises only for a direct call)."""
    if not available():
        raise RuntimeError(f"the fused CPU kernels are {status()}")


def use_blas(enabled: bool) -> bool:
    """Whether the kernels' tile products call BLAS directly (``csrc/fused_common.h``: without ATen's per-call
    dispatch, which a tile's product at head size 32 does not amortise) or ATen's matmul; returns whether they now
    call BLAS, False where the BLAS PyTorch links exports no ``sgemm_``. Both give the same numbers to fp32
    rounding; the tests run each kernel both ways. Builds the library if needed."""
    if not isinstance(enabled, bool):
        raise ValueError(f"enabled={enabled!r} is invalid: must be true or false")
    ensure_built()
    return bool(torch.ops.attnzoo.fused_use_blas(enabled))


def runs_alibi(q: Tensor, k: Tensor, v: Tensor, dropout_p: float) -> bool:
    """Whether :func:`alibi_flash_attention` serves these operands: on CPU, fp32 or bf16, without dropout (which it
    does not draw), outside ``torch.compile`` (the op has no fake kernel to trace, so a compiled graph keeps SDPA's
    path whole rather than breaking around it), once the extension is built (building it the first time)."""
    return (
        q.device.type == "cpu"
        and not torch.compiler.is_compiling()
        and dropout_p == 0
        and q.dtype in DTYPES
        and q.dtype == k.dtype == v.dtype
        and available()
    )


class AlibiFlash(torch.autograd.Function):
    """softmax(scale·q·kᵀ + m_h·(j − i), causal)·V through ``torch.ops.attnzoo.alibi_flash_forward``; the backward
    pass recomputes the probabilities from the saved log-sum-exp (``alibi_flash_backward``)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, slopes: Tensor, scale: float) -> Tensor:
        out, lse = torch.ops.attnzoo.alibi_flash_forward(*fp32_operands(q, k, v, slopes), scale, Q_TILE, K_TILE)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, slopes, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, slopes, out, lse = ctx.saved_tensors
        q32, k32, v32, slopes32 = fp32_operands(q, k, v, slopes)
        grads = torch.ops.attnzoo.alibi_flash_backward(
            grad_out.float().contiguous(), q32, k32, v32, out, lse, slopes32, ctx.scale, Q_TILE, K_TILE
        )
        return *(grad.to(x.dtype) for grad, x in zip(grads, (q, k, v), strict=True)), None, None


def fp32_operands(*tensors: Tensor) -> tuple[Tensor, ...]:
    """Contiguous fp32 operands, detached: bf16 is upcast here (O(T·d) per operand) so every tile sum is taken in
    fp32. Detached because the kernels' tile matmuls run on OpenMP workers, whose thread-local grad mode is on even
    inside an autograd Function, and an out= matmul refuses an operand that requires grad there."""
    return tuple(x.detach().float().contiguous() for x in tensors)


def alibi_flash_attention(q: Tensor, k: Tensor, v: Tensor, slopes: Tensor, scale: float) -> Tensor:
    """Causal ALiBi attention of q (B, H, T, d) over k (B, H_kv, T, d) and v (B, H_kv, T, d_v), H a multiple of H_kv
    (query head h reads kv head h // (H / H_kv)): softmax(scale·q·kᵀ + m_h·(j − i))·V over keys j ≤ i, with
    ``slopes`` (H,) the m_h. Call only where :func:`runs_alibi` holds. Returns (B, H, T, d_v) in q's dtype."""
    return AlibiFlash.apply(q, k, v, slopes, scale)
