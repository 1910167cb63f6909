"""The attention kernels mechanisms share, and :func:`attend`, the one entry point that picks between them.

* :func:`eager_attention`, the reference: explicit fp32 scores and softmax (float64 in a float64 model). Hooks on
  the scores, the probabilities and the mask let a mechanism that acts on them (DCMHA's composition) reuse it.
* :func:`sdpa_attention`: ``F.scaled_dot_product_attention`` with the same semantics, for everything SDPA can
  express: GQA, a positional bias, a per-row logit scale (selective's τ_q), values wider than queries (Diff).
* :func:`chunked_attention`: the eager kernel over blocks of queries, each against only the keys it can see,
  for hooks SDPA cannot run: O(T·chunk) scores instead of O(T·S).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnzoo.attention import fused_cpu
from attnzoo.attention.base import AttentionContext, visible
from attnzoo.precision import compute_dtype

ScoreHook = Callable[[Tensor], Tensor]


class Hooks(NamedTuple):
    """A mechanism's changes inside the eager kernel, for one block of queries × keys; (B, H, T, S) in the compute
    dtype (fp32, or float64 for a float64 model)."""

    scores: ScoreHook | None = None  # on the scaled logits plus bias, before the mask
    probs: ScoreHook | None = None  # on the softmax probabilities: the map that weighs V and is recorded
    mask: Tensor | None = None  # (T, S) bool, True where query t may see key s: replaces the causal mask


NO_HOOKS = Hooks()
HookInputs = Sequence[Tensor | None]
# (query rows, key columns, hook inputs) of a block → that block's hooks. A hook reads every tensor that needs a
# gradient from the hook inputs (``attend``'s ``hook_inputs``), never from a closure: a block recomputed in the
# backward pass (``chunked_attention``) is differentiated with respect to its inputs only.
BlockHooks = Callable[[slice, slice, HookInputs], Hooks]


def no_hooks(rows: slice, cols: slice, inputs: HookInputs) -> Hooks:
    return NO_HOOKS


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """(B, H_kv, S, d) → (B, H_kv·n_rep, S, d): query head h reads kv head h // n_rep, as in HF LLaMA."""
    if n_rep == 1:
        return x
    b, h_kv, s, d = x.shape
    return x[:, :, None].expand(b, h_kv, n_rep, s, d).reshape(b, h_kv * n_rep, s, d)


def sdpa_pads_queries(device: torch.device) -> bool:
    """Whether SDPA on ``device`` needs queries and keys zero-padded to the width of wider values.

    CUDA's memory-efficient kernel takes a value head size different from the query/key size, so Diff's 2d
    values need no change there (the official ``flashdiff_1``). On CPU, unequal sizes silently fall back to
    SDPA's math path, which materialises the T×S map. Padding q and k with zeros leaves every logit
    unchanged and lets the fused kernel run: for Diff on CPU it beat the official four calls on value halves
    (``flashdiff_2``) by about 20% (fwd+bwd, T=1024, 2 threads), since both do twice MHA's QKᵀ work but
    padding launches half the calls.
    """
    return device.type != "cuda"


def sdpa_takes_bias_with_causal(q: Tensor, k: Tensor, v: Tensor, dropout_p: float) -> bool:
    """Whether SDPA's causal kernel can also add a positional bias for these inputs.

    The CPU flash kernel (``aten._scaled_dot_product_flash_attention_for_cpu``) takes an ``attn_mask`` together
    with ``is_causal`` and keeps its causal block skipping; its public entry point refuses the pair, which PyTorch
    documents as exclusive, so the kernel is called directly, on CPU only, without dropout (which it does not
    run), for equal dtypes (the entry point would cast them under autocast) and equal head sizes (unless
    ``sdpa_pads_queries``, Diff's wider values). Elsewhere the bias and the causal
    mask become one additive mask, which loses the block skipping: fwd+bwd of (4, 8, 1024, 32) ALiBi attention
    took 267 ms with the bias and the causal flag, 753 ms with one additive mask and 109 ms for plain causal
    attention (CPU, 1 thread, contended), and the 4-layer training step at T = 1024 1.7× plain causal against
    3.4×. What is left is the kernel's backward pass with a mask, 3× its causal one (forward 1.6×). Folding ALiBi
    into q·k (an extra head dimension holding m·j, softmax dropping the row's m·i) would run the plain kernel but
    round the logits of nearby keys to the precision of m·T, so it is not done.
    """
    return (
        q.device.type == "cpu"
        and dropout_p == 0
        and q.dtype == k.dtype == v.dtype
        and q.shape[-1] == v.shape[-1]
        and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")
    )


def sdpa_with_causal_bias(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: float | None) -> Tensor:
    """Causal attention of q over k, v (B, H, T, d) with the additive ``bias`` (1, H, T, T) on the scaled logits,
    by the CPU flash kernel (:func:`sdpa_takes_bias_with_causal` says when it applies)."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, attn_mask=bias, scale=scale)[
        0
    ]


def linear_bias_kernel(device: torch.device, dtype: torch.dtype, dropout_p: float = 0.0) -> str:
    """The kernel that runs a fresh causal sequence with a linear bias (ALiBi) on ``device`` at ``dtype``, as
    :func:`sdpa_attention` decides it, without building the fused kernel: what ``attnzoo info`` and the benchmarks
    print. (A recording context, ``ctx.records_scores``, or the "eager" backend runs the eager reference instead.)"""
    on_cpu = device.type == "cpu"
    if on_cpu and dropout_p == 0 and dtype in fused_cpu.DTYPES:
        status = fused_cpu.status()
        if not status.startswith("unavailable"):
            return f"{fused_cpu.KERNEL_NAME}, {status}"
        return f"SDPA flash (CPU) with a (1, H, T, T) bias: the fused kernel is {status}"
    if on_cpu:
        return "SDPA flash (CPU) with a (1, H, T, T) bias"
    return "SDPA with a (1, H, T, T) additive mask"


# Query rows per block of sdpa_biased_in_blocks. One layer's forward at T = 8192 (8 heads, d = 32, 1 thread) took
# 2.8 / 2.2 / 3.1 s in blocks of 256 / 512 / 1024 rows, biases included, and 1.8 s as one call with the whole bias
# (its build shared by 4 layers).
BIAS_BLOCK_ROWS = 512


def sdpa_biased_in_blocks(
    q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, *, scale: float | None, dropout_p: float, bias_repeat: int
) -> Tensor:
    """Causal attention with a positional bias over a fresh sequence, without a (1, H, T, T) tensor: the queries in
    blocks of :data:`BIAS_BLOCK_ROWS`, each against the keys up to its last row with its own bias and causal mask, so
    masks take O(H·T·rows) memory. The whole bias is 2 GB at T = 8192 and 8 heads, and grows with T²: this is the
    path of inference (evaluating ALiBi's extrapolation, prefilling a long prompt), which keeps no mask for a
    backward pass. Each row sees the same keys and bias as in one call, so the output is the same (measured bit
    for bit on CPU); a block pays for its diagonal tile's masked half and its own bias.

    q, k, v: (B, H, T, ·) with k and v already repeated to H heads.
    """
    n_heads, query_len = q.shape[1], q.shape[2]
    key_positions = ctx.key_positions(query_len)
    outs = []
    for first in range(0, query_len, BIAS_BLOCK_ROWS):
        rows = slice(first, min(query_len, first + BIAS_BLOCK_ROWS))
        q_positions, k_positions = ctx.positions[rows], key_positions[: rows.stop]
        bias = ctx.position_bias(n_heads, q_positions, k_positions, bias_repeat)
        mask = bias.masked_fill(~visible(q_positions, k_positions), float("-inf"))[None].to(q.dtype)
        keys, values = k[:, :, : rows.stop], v[:, :, : rows.stop]
        outs.append(
            F.scaled_dot_product_attention(
                q[:, :, rows], keys, values, attn_mask=mask, dropout_p=dropout_p, scale=scale
            )
        )
    return torch.cat(outs, dim=2)


def eager_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ctx: AttentionContext,
    *,
    scale: float | None = None,
    dropout_p: float = 0.0,
    bias_repeat: int = 1,
    query_scale: Tensor | None = None,
    hooks: Hooks = NO_HOOKS,
    window: int | None = None,
    positions: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """Reference attention with explicit fp32 logits and softmax (float64 for float64 inputs: see
    :func:`attnzoo.precision.compute_dtype`). Returns (output, probabilities).

    q: (B, H, T, d); k: (B, H_kv, S, d); v: (B, H_kv, S, d_v). In order: logits q·kᵀ·scale → × ``query_scale``
    (B, H, T) per row → + positional bias → ``hooks.scores`` → mask → softmax → ``hooks.probs`` → dropout → ·V.
    The mask is causal, within the last ``window`` keys if given, unless ``hooks.mask`` replaces it.
    ``positions`` are the (query, key) absolute positions when they are not this call's queries against keys
    0 .. S−1 (a block of a chunked call, a ring cache). ``bias_repeat`` adjacent query heads share one
    positional-bias head (sub-heads of one differential head).
    """
    batch, n_heads, query_len, head_dim = q.shape
    n_kv_heads, key_len = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    # GQA without copying k and v: the n_rep query heads of a kv head are stacked along the query axis.
    if q.dtype == compute_dtype(q.dtype):
        # fp32/fp64: scaling the (T, d) queries instead of the (T, S) logits is one rounding either way, S/d
        # times less work, and one pass over the scores fewer forward and backward.
        logits = (q * scale).reshape(batch, n_kv_heads, -1, head_dim) @ k.transpose(-2, -1)
    else:
        logits = (q.reshape(batch, n_kv_heads, -1, head_dim) @ k.transpose(-2, -1)).to(compute_dtype(q.dtype)) * scale
    logits = logits.view(batch, n_heads, query_len, key_len)
    if query_scale is not None:
        logits = logits * query_scale[..., None]
    if positions is None:
        bias = ctx.score_bias(n_heads, key_len, bias_repeat)
    else:
        bias = ctx.position_bias(n_heads, *positions, bias_repeat)
    if bias is not None:
        logits = logits + bias
    if hooks.scores is not None:
        logits = hooks.scores(logits)
    if hooks.mask is not None:
        allowed = hooks.mask
    else:
        allowed = ctx.allowed(key_len, window) if positions is None else visible(*positions, window, ctx.causal)
    ctx.record_logits(logits, allowed)
    probs = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
    if hooks.probs is not None:
        probs = hooks.probs(probs)
    dropped = F.dropout(probs, p=dropout_p) if dropout_p > 0 else probs
    out = dropped.to(v.dtype).reshape(batch, n_kv_heads, -1, key_len) @ v
    return out.view(batch, n_heads, query_len, -1), probs


def sdpa_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ctx: AttentionContext,
    *,
    scale: float | None = None,
    dropout_p: float = 0.0,
    bias_repeat: int = 1,
    query_scale: Tensor | None = None,
) -> Tensor:
    """``F.scaled_dot_product_attention`` with the semantics of :func:`eager_attention` without hooks.

    Plain causal attention over a fresh sequence uses ``is_causal`` (block skipping, no T×S mask), and
    bidirectional attention (``ctx.causal`` false) no mask at all. A fresh causal sequence with a linear bias
    (ALiBi) runs on the CPU on the fused kernel that adds the bias inside its tiles
    (:func:`~attnzoo.attention.fused_cpu.alibi_flash_attention`, where :func:`linear_bias_kernel` names it), in
    training and inference. Otherwise, with a positional bias, a fresh causal sequence passes the bias with the
    causal flag where the kernel takes both (:func:`sdpa_takes_bias_with_causal`: CPU); otherwise, and on a
    non-empty cache, bias and mask enter as one additive mask. Without autograd recording, a fresh biased sequence
    longer than :data:`BIAS_BLOCK_ROWS` runs in query blocks (:func:`sdpa_biased_in_blocks`), so inference never
    builds the T×T bias.
    """
    if query_scale is not None:
        # Scaling query row t scales logit row t before the bias is added: the eager kernel's row scale.
        q = q * query_scale[..., None].to(q.dtype)
    has_bias = ctx.position.adds_bias
    fresh_biased = has_bias and ctx.causal and q.shape[2] == k.shape[2] > 1
    slopes = ctx.bias_slopes(q.shape[1], bias_repeat) if fresh_biased else None
    if slopes is not None and fused_cpu.runs_alibi(q, k, v, dropout_p):
        # Before the padding and the kv repeat below: the kernel takes wider values and reads shared kv heads.
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        return fused_cpu.alibi_flash_attention(q, k, v, slopes, scale)
    if v.shape[-1] > q.shape[-1] and sdpa_pads_queries(q.device):
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale  # the scale of the true width
        width = v.shape[-1] - q.shape[-1]
        q, k = F.pad(q, (0, width)), F.pad(k, (0, width))  # zeros add nothing to q·k
    n_heads, query_len, key_len = q.shape[1], q.shape[2], k.shape[2]
    k, v = repeat_kv(k, n_heads // k.shape[1]), repeat_kv(v, n_heads // v.shape[1])
    if not ctx.static and not has_bias and query_len in (1, key_len):
        # A fresh sequence is plain causal (or bidirectional); a single new token sees every cached key (on a
        # growing cache: a static step's keys include slots only its mask excludes).
        is_causal = query_len > 1 and ctx.causal
        return sdpa_step(q, k, v, dropout_p=dropout_p, is_causal=is_causal, scale=scale)
    records = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
    if fresh_biased and query_len > BIAS_BLOCK_ROWS and not records:  # inference: no (1, H, T, T) bias
        return sdpa_biased_in_blocks(q, k, v, ctx, scale=scale, dropout_p=dropout_p, bias_repeat=bias_repeat)
    if fresh_biased and sdpa_takes_bias_with_causal(q, k, v, dropout_p):
        # A fresh causal sequence with a bias (ALiBi): the causal kernel adds the bias itself.
        return sdpa_with_causal_bias(q, k, v, ctx.sdpa_bias(n_heads, key_len, bias_repeat, q.dtype), scale)
    mask = ctx.sdpa_mask(n_heads, key_len, bias_repeat, q.dtype)
    return sdpa_step(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)


# A decode step on CUDA leaves cuDNN out: cuDNN's attention builds an execution graph for each new key length, and
# a growing cache brings one at every step (9 ms a call on an H100 against a whole 4 ms step of a 6-layer model,
# eager, 2026-11-26: benchmarks/results/gpu-2026-11-26). Flash and memory-efficient attention take any length.
DECODE_BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)


def sdpa_step(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
    """``F.scaled_dot_product_attention``, restricted to :data:`DECODE_BACKENDS` for one query row on CUDA in
    eager mode (a compiled step has static shapes, so cuDNN builds its graph once)."""
    if q.shape[2] == 1 and q.is_cuda and not torch.compiler.is_compiling():
        with sdpa_kernel(list(DECODE_BACKENDS)):
            return F.scaled_dot_product_attention(q, k, v, **kwargs)
    return F.scaled_dot_product_attention(q, k, v, **kwargs)


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
    score-sized temporaries fit in memory its larger predecessor freed.
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
        random = kernel.get("dropout_p", 0.0) > 0
        outs.append(RecomputedBlock.apply(block, random, *args) if records else block(*args))
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


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ctx: AttentionContext,
    *,
    scale: float | None = None,
    dropout_p: float = 0.0,
    bias_repeat: int = 1,
    query_scale: Tensor | None = None,
    hooks: BlockHooks | None = None,
    hook_inputs: HookInputs = (),
    window: int | None = None,
    key_positions: Tensor | None = None,
    chunk: int | None = None,
    record: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """Attention of q (B, H, T, d) over k, v (B, H_kv, S, ·), causal unless ``ctx.causal`` is false: the one
    place the kernel is chosen.

    * ``eager_attention`` over all queries and keys when ``ctx.backend`` is "eager" or the context records
      attention maps, which need the probabilities;
    * ``sdpa_attention`` when nothing needs the scores: ``query_scale`` (B, H, T), a per-row logit scale
      before the bias, and values wider than queries are expressed inside SDPA;
    * otherwise ``chunked_attention`` over blocks of ``chunk`` queries, since hooks, a window or keys at
      explicit positions cannot run inside SDPA; the "sdpa" backend refuses that.

    ``hooks(rows, cols, hook_inputs)`` gives the :class:`Hooks` of the block of queries ``rows`` × keys ``cols``,
    reading the tensors that need gradients from ``hook_inputs`` (:data:`BlockHooks`); with
    ``window`` a query sees its last ``window`` keys, itself included; ``key_positions`` (S,) are the keys'
    absolute positions when they are not 0 .. S−1. Returns the output (B, H, T, d_v) and, when the context
    records maps, the probabilities after ``hooks.probs``, which are recorded as this layer's map unless
    ``record`` is false (a mechanism whose map combines several calls records the combination).
    """
    kernel = dict(scale=scale, dropout_p=dropout_p, bias_repeat=bias_repeat, query_scale=query_scale)
    if ctx.backend == "eager" or ctx.records_scores:
        block_hooks = (hooks or no_hooks)(slice(None), slice(None), hook_inputs)
        positions = None if key_positions is None else (ctx.positions, key_positions)
        out, probs = eager_attention(q, k, v, ctx, hooks=block_hooks, window=window, positions=positions, **kernel)
        if ctx.attention_maps is None:
            return out, None
        if record:
            ctx.record(probs)
        return out, probs
    if hooks is None and window is None and key_positions is None:
        return sdpa_attention(q, k, v, ctx, **kernel), None
    if ctx.backend == "sdpa":
        raise ValueError("attn_backend='sdpa' cannot run score hooks or windows; use 'auto' or 'eager'")
    chunk = chunk or q.shape[2]
    out = chunked_attention(
        q,
        k,
        v,
        ctx,
        hooks=hooks or no_hooks,
        chunk=chunk,
        hook_inputs=hook_inputs,
        window=window,
        key_positions=key_positions,
        **kernel,
    )
    return out, None
