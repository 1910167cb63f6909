"""Attention kernels as records (:class:`Kernel`, registered in :data:`KERNELS`), and :func:`attend`, the one entry
point that picks between them.

* ``eager``: the reference, explicit fp32 scores and softmax (:func:`eager_attention`); hooks on the scores, the
  probabilities and the mask let a mechanism that acts on them (DCMHA's composition) reuse it;
* ``sdpa``: ``F.scaled_dot_product_attention`` with the same semantics (:func:`sdpa_attention`);
* ``chunked``: the eager kernel over blocks of queries (:func:`chunked_attention`), for hooks SDPA cannot run;
* the fused kernels of one mechanism each: ``diff-flash``, ``dcmha-fused``, ``dcmha-decode`` (C++, CPU) and
  ``dcmha-triton`` (CUDA);
* the kernels a positional scheme brings: ``alibi-flash`` (C++, CPU), SDPA's calls with ALiBi's bias in the tiles;
* Diff's two maps in one SDPA call, two head layouts for the GPU: ``diff-halves`` and ``diff-stacked``.

Each module registers its kernel as the package imports it, every module here: a kernel is one file and one name, in
the mechanism's or the positional scheme's ``kernels`` (``docs/jobs/plugins.md``, "Adding a kernel"). Another
package's kernel is checked as it loads (:mod:`~attnzoo.attention.kernels.plugins`).
"""

import importlib
import pkgutil

from attnzoo.attention.kernels.chunked import chunked_attention
from attnzoo.attention.kernels.dispatch import (
    attend,
    backend_refusal,
    choose,
    kernel_chain,
    named_kernel_refusal,
    planned_backend_refusal,
    stage_chain,
)
from attnzoo.attention.kernels.eager import BlockHooks, HookInputs, Hooks, ScoreHook, eager_attention, repeat_kv
from attnzoo.attention.kernels.kernel import KERNELS, Call, Kernel, backend_names, kernel_ops
from attnzoo.attention.kernels.sdpa import sdpa_attention

for _module in pkgutil.iter_modules(__path__):  # registers every kernel, and checks the plugins' (plugins.py)
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "KERNELS",
    "BlockHooks",
    "Call",
    "HookInputs",
    "Hooks",
    "Kernel",
    "ScoreHook",
    "attend",
    "backend_names",
    "backend_refusal",
    "choose",
    "chunked_attention",
    "eager_attention",
    "kernel_chain",
    "kernel_ops",
    "named_kernel_refusal",
    "planned_backend_refusal",
    "repeat_kv",
    "sdpa_attention",
    "stage_chain",
]
