"""The C++ extension of the fused CPU kernels: every source in ``csrc/`` compiled into one library on first use and
cached, with a clean fallback where it cannot be built.

Each kernel's record (``alibi_flash.py``, ``diff_flash.py``, ``dcmha_fused.py``) registers through
:func:`~attnzoo.attention.kernels.cpu.register_cpu_kernel`, whose per-call reasons ask :func:`available` last, so
only a call the kernel would run builds the library; its ``run`` calls :func:`ensure_built` and then its
``torch.ops.attnzoo.*`` operators, which the source registers with ``TORCH_LIBRARY_FRAGMENT(attnzoo, m)``.

Why a C++ extension: SDPA's CPU flash kernel takes a bias only as a tensor; FlexAttention has no CPU backward
pass; inductor gave no gain on CPU (``../shared/notes/cpu_perf.md``); Triton has no CPU backend in the wheels.
``torch.utils.cpp_extension.load`` compiles the sources with the compiler and ninja present, caches the library
in the torch extensions directory (``TORCH_EXTENSIONS_DIR``, else ``~/.cache/torch_extensions``) and rebuilds only
when a source or the flags change, so it needs nothing the install does not already bring. Where it cannot build
(no compiler, no ninja, a compile error) attnzoo warns once, naming the reason, and every call runs on the kernel
after the C++ one in its chain: ALiBi on SDPA's flash kernel with the (1, H, T, T) bias, DCMHA on its chunked
composition, Diff on two SDPA calls.

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

# Every kernel's source and the shared helpers; a new kernel's .cpp here is compiled into the same library.
CSRC = Path(__file__).with_name("csrc")
SOURCES = tuple(sorted(CSRC.glob("*.cpp")))
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
    """Compile (or find cached) and load the library, which registers every source's ``torch.ops.attnzoo.*``."""
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
    content = hashlib.sha256(str(CSRC.resolve()).encode())
    for path in sorted(CSRC.iterdir()):
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
