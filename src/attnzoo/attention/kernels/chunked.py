"""The eager reference over blocks of queries, each against only the keys it can see, for hooks SDPA cannot run
(DCMHA's composition): O(T·chunk) scores instead of O(T·S), each block recomputed in the backward pass."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from attnzoo.attention.base import AttentionContext
from attnzoo.attention.kernels.eager import BlockHooks, HookInputs, eager_attention, no_hooks
from attnzoo.attention.kernels.kernel import Kernel, register_kernel
from attnzoo.attention.kernels.sdpa import records_scores

if TYPE_CHECKING:
    from attnzoo.attention.base import Attention


def chunked_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ctx: AttentionContext,
    *,
    hooks: BlockHooks,
    chunk: int,
    hook_inputs: HookInputs = (),
    window: int | None = None,
    key_positions: Tensor | None = None,
    query_scale: Tensor | None = None,
    **kernel: Any,
) -> Tensor:
    """:func:`eager_attention` over blocks of ``chunk`` queries, each against the keys it can see.

    Keys at positions 0 .. S−1 are cut to each block's causal range, or its window (on both sides of the block
    when the context is not causal: all keys, or a symmetric window); keys at explicit
    ``key_positions`` (a ring cache, in slot order) are all kept and masked by position. ``kernel``: the
    remaining arguments of :func:`eager_attention` (scale, dropout_p, bias_repeat).

    When autograd records, each block is one :class:`RecomputedBlock`: autograd keeps the block's inputs (views of
    q, k, v and the hook inputs) and the backward pass recomputes its scores, one block at a time, so training
    memory grows with T, not T·S. That costs one more forward pass of each block: 1.16× the eager DCMHA training
    step at T = 1024 (CPU, contended). Blocks run from the last (the most keys) to the first, so each block's
    score-sized temporaries fit in memory its larger predecessor freed. Under ``torch.compile`` each block is a
    ``torch.utils.checkpoint`` instead, which the compiled graph recomputes the same way without a break.
    """
    query_len = q.shape[2]
    k_positions = ctx.key_positions(k.shape[2]) if key_positions is None else key_positions
    if query_len > chunk:  # projections come head-transposed: copied once here, rather than by each block's matmuls
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    outs = []
    for first in reversed(range(0, query_len, chunk)):
        rows = slice(first, min(query_len, first + chunk))
        cols = slice(None)
        if key_positions is None:
            lowest = 0 if window is None else max(0, ctx.start + first - window + 1)
            if ctx.causal:
                cols = slice(lowest, ctx.start + rows.stop)
            else:
                cols = slice(lowest, None if window is None else ctx.start + rows.stop - 1 + window)
        block = _Block(ctx, hooks, rows, cols, (ctx.positions[rows], k_positions[cols]), window, kernel)
        args = (q[:, :, rows], k[:, :, cols], v[:, :, cols], None if query_scale is None else query_scale[:, :, rows])
        args += tuple(hook_inputs)
        records = torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in args)
        if not records:
            outs.append(block(*args))
        elif torch.compiler.is_compiling():
            # Traced, checkpoint is one node the compiled backward recomputes; RecomputedBlock's backward calls
            # autograd.grad, which dynamo does not trace, and broke the graph at every block.
            outs.append(checkpoint(block, *args, use_reentrant=False))
        else:
            outs.append(RecomputedBlock.apply(block, kernel.get("dropout_p", 0.0) > 0, *args))
    return torch.cat(outs[::-1], dim=2)


class _Block(NamedTuple):
    """One block of :func:`chunked_attention` as a function of its tensors: q, k, v, query_scale, hook inputs."""

    ctx: AttentionContext
    hooks: BlockHooks
    rows: slice
    cols: slice
    positions: tuple[Tensor, Tensor]
    window: int | None
    kernel: dict[str, Any]

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, query_scale: Tensor | None, *inputs: Tensor | None) -> Tensor:
        hooks = self.hooks(self.rows, self.cols, inputs)
        out, _ = eager_attention(
            q,
            k,
            v,
            self.ctx,
            query_scale=query_scale,
            hooks=hooks,
            window=self.window,
            positions=self.positions,
            **self.kernel,
        )
        return out


class RecomputedBlock(torch.autograd.Function):
    """``run(*inputs)`` with only its inputs kept for the backward pass, which runs it again to differentiate it.

    The forward pass records nothing, so no score-sized tensor and no graph node per operation stays alive
    between the passes. (``torch.utils.checkpoint``'s non-reentrant form keeps the graph: its nodes, allocated
    among the blocks' temporaries, pinned glibc's heap and doubled the resident peak of DCMHA training at
    T = 2048.) The recomputation draws the same dropout masks, under the same autocast, as the forward pass.
    Gradients reach ``run``'s tensor inputs only; one that needs none gets None.
    """

    @staticmethod
    def forward(ctx, run: Callable[..., Tensor], random: bool, *inputs: Tensor | None) -> Tensor:
        """``random``: whether ``run`` draws random numbers (dropout), whose generator states are then kept."""
        ctx.run = run
        ctx.save_for_backward(*inputs)
        device = next(x.device for x in inputs if x is not None)
        ctx.cuda_devices = [device] if random and device.type == "cuda" else []
        ctx.rng_states = (torch.get_rng_state(), *map(torch.cuda.get_rng_state, ctx.cuda_devices)) if random else ()
        ctx.autocast = (device.type, torch.get_autocast_dtype(device.type), torch.is_autocast_enabled(device.type))
        return run(*inputs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        needs = ctx.needs_input_grad[2:]
        leaves = [
            None if x is None else x.detach().requires_grad_(need)
            for x, need in zip(ctx.saved_tensors, needs, strict=True)
        ]
        device_type, dtype, enabled = ctx.autocast
        replay = torch.random.fork_rng(devices=ctx.cuda_devices) if ctx.rng_states else contextlib.nullcontext()
        with replay, torch.enable_grad(), torch.autocast(device_type, dtype=dtype, enabled=enabled):
            if ctx.rng_states:
                torch.set_rng_state(ctx.rng_states[0])
                for device, state in zip(ctx.cuda_devices, ctx.rng_states[1:], strict=True):
                    torch.cuda.set_rng_state(state, device)
            out = ctx.run(*leaves)
        wanted = [leaf for leaf in leaves if leaf is not None and leaf.requires_grad]
        grads = iter(torch.autograd.grad(out, wanted, grad, allow_unused=True))
        return None, None, *(next(grads) if leaf is not None and leaf.requires_grad else None for leaf in leaves)


def chunked_call(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ctx: AttentionContext,
    *,
    hooks: BlockHooks | None = None,
    chunk: int | None = None,
    record: bool = True,
    **kernel: Any,
) -> tuple[Tensor, Tensor | None]:
    """:func:`chunked_attention` as a PyTorch kernel (:data:`~attnzoo.attention.kernels.eager.PyTorchKernel`), in
    blocks of ``chunk`` queries (all of them by default); it records no map."""
    return chunked_attention(q, k, v, ctx, hooks=hooks or no_hooks, chunk=chunk or q.shape[2], **kernel), None


def run_chunked(layer: Attention, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, **inputs: Any) -> Tensor:
    return layer.pytorch_attention(chunked_call, q, k, v, ctx, **inputs)


CHUNKED = register_kernel(
    Kernel(
        name="chunked",
        display_name="the chunked eager kernel",
        run=run_chunked,
        call_reasons=records_scores,
    )
)
