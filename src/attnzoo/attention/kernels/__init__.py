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

Each module registers its kernel: one file and one name per kernel (``docs/jobs/plugins.md``, "Adding a kernel").
Another package's kernel is checked as it loads (:mod:`~attnzoo.attention.kernels.plugins`).
"""

from attnzoo.attention.kernels import alibi_flash, dcmha_fused, dcmha_triton, diff_flash, diff_sdpa, plugins  # noqa: F401  (registers the kernels, checks the plugins')
from attnzoo.attention.kernels.chunked import chunked_attention
from attnzoo.attention.kernels.dispatch import (
    attend,
    backend_refusal,
    choose,
    kernel_chain,
    named_kernel_refusal,
    planned_backend_refusal,
)
from attnzoo.attention.kernels.eager import BlockHooks, HookInputs, Hooks, ScoreHook, eager_attention, repeat_kv
from attnzoo.attention.kernels.kernel import KERNELS, Call, Kernel, backend_names, kernel_ops
from attnzoo.attention.kernels.sdpa import sdpa_attention

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
]
