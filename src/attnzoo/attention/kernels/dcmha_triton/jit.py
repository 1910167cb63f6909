"""The Triton programs of DCMHA's fused kernel: the forward pass, and the backward pass's query-block and key-block
kernels, with the helpers they inline. ``op.py`` states what they compute (its docstring's notation is theirs);
``tuning.py`` launches them."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # the optional extra is absent: the PyTorch path serves every device
    triton = None


def dot_options(q: Tensor) -> dict[str, Any]:
    """How the kernels multiply: fp32 inputs in full fp32 ("ieee"), as the PyTorch path does (TF32 would lose
    about three digits); bf16 under the interpreter widened to fp32 first (see ``_dot``)."""
    return dict(PREC="ieee" if q.dtype == torch.float32 else "tf32", WIDEN=INTERPRETED and q.dtype == torch.bfloat16)


if triton is not None:

    @triton.jit
    def _dot(a, b, PREC: tl.constexpr, WIDEN: tl.constexpr):
        """a @ b batched over heads, fp32 accumulation. WIDEN (the interpreter on bf16): multiply the operands as
        fp32, which is exact for bf16 values; Triton 3.9's interpreter multiplies bf16 bit patterns as integers."""
        if WIDEN:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        return tl.dot(a, b, input_precision=PREC)

    @triton.jit
    def _load_weights(ptr, bg, first, length, slot, R: tl.constexpr, RP: tl.constexpr, M: tl.constexpr, h, ok,
                      BL: tl.constexpr, SLOTS: tl.constexpr):  # fmt: skip
        """Positions first..first+BL of one side and composition, heads h of the group (where ``ok``): w1, w2
        (RP, len(h), BL) and dd (len(h), BL), 0 past the ends (padded ranks and heads then add nothing)."""
        r = tl.arange(0, RP)[:, None, None]
        m = h[None, :, None]
        pos = first + tl.arange(0, BL)[None, None, :]
        row = ptr + ((bg * length + pos) * SLOTS + slot) * (2 * R + 1) * M
        mask = (r < R) & ok[None, :, None] & (pos < length)
        w1 = tl.load(row + r * M + m, mask=mask, other=0.0)
        w2 = tl.load(row + (R + r) * M + m, mask=mask, other=0.0)
        pos2 = first + tl.arange(0, BL)[None, :]
        dd_row = ptr + ((bg * length + pos2) * SLOTS + slot) * (2 * R + 1) * M + 2 * R * M
        dd = tl.load(dd_row + h[:, None], mask=ok[:, None] & (pos2 < length), other=0.0)
        return w1, w2, dd

    @triton.jit
    def _store_weights(ptr, bg, first, length, slot, grads, h, ok, R: tl.constexpr, RP: tl.constexpr,
                       M: tl.constexpr, BL: tl.constexpr, SLOTS: tl.constexpr):  # fmt: skip
        """The inverse of :func:`_load_weights`, for their gradients ``grads`` (g_w1, g_w2, g_dd)."""
        r = tl.arange(0, RP)[:, None, None]
        m = h[None, :, None]
        pos = first + tl.arange(0, BL)[None, None, :]
        row = ptr + ((bg * length + pos) * SLOTS + slot) * (2 * R + 1) * M
        mask = (r < R) & ok[None, :, None] & (pos < length)
        tl.store(row + r * M + m, grads[0], mask=mask)
        tl.store(row + (R + r) * M + m, grads[1], mask=mask)
        pos2 = first + tl.arange(0, BL)[None, :]
        dd_row = ptr + ((bg * length + pos2) * SLOTS + slot) * (2 * R + 1) * M + 2 * R * M
        tl.store(dd_row + h[:, None], grads[2], mask=ok[:, None] & (pos2 < length))

    @triton.jit
    def _weight_rank(w, r):
        """Rank r of one side's weights (RP, M, ·, ·), as (M, ·, ·)."""
        return tl.sum(tl.where(tl.arange(0, w.shape[0])[:, None, None, None] == r, w, 0.0), axis=0)

    @triton.jit
    def _with_rank(stack, r, x):
        """``stack`` (RP, A, B) with its rank r replaced by x (A, B)."""
        return tl.where(tl.arange(0, stack.shape[0])[:, None, None] == r, x[None, :, :], stack)

    @triton.jit
    def _compose(x, qw1, qw2, qdd, kw1, kw2, kdd, KEY_WISE: tl.constexpr):
        """x (M, BT, BS) composed across heads; also X_r, Y_r (R, BT, BS), the rank-R mixes the backward needs.

        Query-side weights come as (R, M, BT, 1) and (M, BT, 1), key-side as (R, M, 1, BS) and (M, 1, BS). One rank
        at a time: the products of all ranks at once, (R, M, BT, BS), were more than a program's registers hold."""
        RP: tl.constexpr = qw1.shape[0]
        out = x * (1.0 + qdd)
        if KEY_WISE:
            out += x * kdd
        mix_q = tl.zeros((RP, x.shape[1], x.shape[2]), tl.float32)
        mix_k = mix_q
        for r in tl.static_range(RP):
            mix = tl.sum(_weight_rank(qw1, r) * x, axis=0)
            out += _weight_rank(qw2, r) * mix[None, :, :]
            mix_q = _with_rank(mix_q, r, mix)
            if KEY_WISE:
                mix = tl.sum(_weight_rank(kw1, r) * x, axis=0)
                out += _weight_rank(kw2, r) * mix[None, :, :]
                mix_k = _with_rank(mix_k, r, mix)
        if not KEY_WISE:
            mix_k = mix_q
        return out, mix_q, mix_k

    @triton.jit
    def _chunk(x, c, MC: tl.constexpr):
        """Heads c·MC .. c·MC + MC - 1 of x (MP, A, B): a program's own heads out of a tile that holds all of them."""
        NC: tl.constexpr = x.shape[0] // MC
        if NC == 1:
            return x
        parts = tl.reshape(x, (NC, MC, x.shape[1], x.shape[2]))
        return tl.sum(tl.where(tl.arange(0, NC)[:, None, None, None] == c, parts, 0.0), axis=0)

    @triton.jit
    def _allowed(t, s, head_ok, T, window, LOCAL: tl.constexpr):
        """(MP, BT, BS): query t sees key s (causal, within the window if local), both in range, real head."""
        distance = t[:, None] - s[None, :]
        ok = (distance >= 0) & (t[:, None] < T) & (s[None, :] < T)
        if LOCAL:
            ok = ok & (distance < window)
        return head_ok[:, None, None] & ok[None, :, :]

    @triton.jit
    def _query_rows(ptr, b, heads, head_ok, t, stride_b, stride_h, stride_t, T, D: tl.constexpr, d0,
                    DW: tl.constexpr):  # fmt: skip
        """(heads, BT, DW) rows t of the heads' q (or dO), features d0..d0+DW, 0 outside."""
        d = d0 + tl.arange(0, DW)
        offsets = b * stride_b + heads[:, None, None] * stride_h + t[None, :, None] * stride_t + d[None, None, :]
        ok = head_ok[:, None, None] & (t[None, :, None] < T) & (d[None, None, :] < D)
        return tl.load(ptr + offsets, mask=ok, other=0.0)

    @triton.jit
    def _key_columns(ptr, b, kv_heads, head_ok, s, stride_b, stride_h, stride_t, T, D: tl.constexpr, d0,
                     DW: tl.constexpr):  # fmt: skip
        """(heads, DW, BS) columns s of each head's k (or v), transposed, features d0..d0+DW, 0 outside."""
        d = d0 + tl.arange(0, DW)
        offsets = b * stride_b + kv_heads[:, None, None] * stride_h + d[None, :, None] + s[None, None, :] * stride_t
        ok = head_ok[:, None, None] & (d[None, :, None] < D) & (s[None, None, :] < T)
        return tl.load(ptr + offsets, mask=ok, other=0.0)

    @triton.jit
    def _head_products(A, B, b, heads, kv_heads, head_ok, t, s, stride_ab, stride_ah, stride_at, stride_bb, stride_bh,
                       stride_bt, T, D: tl.constexpr, DP: tl.constexpr, DF: tl.constexpr, PREC: tl.constexpr,
                       WIDEN: tl.constexpr):  # fmt: skip
        """(MP, BT, BS) = Σ_d A[head, t, d]·B[kv head, s, d] for every head of the group (q·kᵀ, dO·vᵀ), DF features at
        a time: every head's full rows at once are more than a program's registers hold."""
        products = tl.zeros((heads.shape[0], t.shape[0], s.shape[0]), tl.float32)
        for d0 in tl.static_range(0, DP, DF):
            rows = _query_rows(A, b, heads, head_ok, t, stride_ab, stride_ah, stride_at, T, D, d0, DF)
            columns = _key_columns(B, b, kv_heads, head_ok, s, stride_bb, stride_bh, stride_bt, T, D, d0, DF)
            products += _dot(rows, columns, PREC, WIDEN)
        return products

    @triton.jit
    def _probabilities(
        logits, lse, allowed,
        pre_qw1, pre_qw2, pre_qdd, pre_kw1, pre_kw2, pre_kdd,
        post_qw1, post_qw2, post_qdd, post_kw1, post_kw2, post_kdd,
        PRE: tl.constexpr, POST: tl.constexpr, KEY_WISE: tl.constexpr,
    ):  # fmt: skip
        """A tile recomputed from its logits and the saved log-sum-exp: the pre-mixes, the probabilities P, and the
        post-composed P' with its mixes."""
        composed = logits
        pre_mix_q = logits
        pre_mix_k = logits
        if PRE:
            composed, pre_mix_q, pre_mix_k = _compose(
                logits, pre_qw1, pre_qw2, pre_qdd, pre_kw1, pre_kw2, pre_kdd, KEY_WISE
            )
        probs = tl.where(allowed, tl.exp(composed - lse[:, :, None]), 0.0)
        mixed = probs
        post_mix_q = probs
        post_mix_k = probs
        if POST:
            mixed, post_mix_q, post_mix_k = _compose(
                probs, post_qw1, post_qw2, post_qdd, post_kw1, post_kw2, post_kdd, KEY_WISE
            )
        return pre_mix_q, pre_mix_k, probs, mixed, post_mix_q, post_mix_k

    @triton.jit
    def _query_weights(ptr, bg, t0, T, slot, R: tl.constexpr, RP: tl.constexpr, M: tl.constexpr, h, ok,
                       BT: tl.constexpr, SLOTS: tl.constexpr):  # fmt: skip
        """One composition's query-side weights of a query block, heads h, shaped to broadcast over keys."""
        w1, w2, dd = _load_weights(ptr, bg, t0, T, slot, R, RP, M, h, ok, BT, SLOTS)
        return w1[:, :, :, None], w2[:, :, :, None], dd[:, :, None]

    @triton.jit
    def _key_weights(ptr, bg, s0, T, slot, R: tl.constexpr, RP: tl.constexpr, M: tl.constexpr, h, ok,
                     BS: tl.constexpr, SLOTS: tl.constexpr):  # fmt: skip
        """One composition's key-side weights of a key block, heads h, shaped to broadcast over queries."""
        w1, w2, dd = _load_weights(ptr, bg, s0, T, slot, R, RP, M, h, ok, BS, SLOTS)
        return w1[:, :, None, :], w2[:, :, None, :], dd[:, None, :]

    @triton.jit
    def _group_rows(ptr, b, H, g0, t, T, M: tl.constexpr, MP: tl.constexpr, MC: tl.constexpr):
        """(MP / MC, MC, BT): a per-row statistic (D) of each head of the group at rows t, chunk by chunk."""
        h = tl.arange(0, MP)
        rows = (b * H + g0 + h[:, None]) * T + t[None, :]
        x = tl.load(ptr + rows, mask=(h[:, None] < M) & (t[None, :] < T), other=0.0)
        return tl.reshape(x, (MP // MC, MC, t.shape[0]))

    @triton.jit
    def _of_chunk(x, c):
        """Chunk c of x (chunks, ...)."""
        return tl.sum(tl.where(tl.arange(0, x.shape[0])[:, None, None] == c, x, 0.0), axis=0)

    @triton.jit
    def _forward_kernel(
        Q, K, V, WQ, WK, OUT, LSE,
        stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
        H, T, G, n_rep, window, scale,
        M: tl.constexpr, MP: tl.constexpr, MC: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, D: tl.constexpr,
        DP: tl.constexpr, DF: tl.constexpr, BT: tl.constexpr, BS: tl.constexpr, PRE: tl.constexpr, POST: tl.constexpr,
        KEY_WISE: tl.constexpr, LOCAL: tl.constexpr, PREC: tl.constexpr, WIDEN: tl.constexpr,
    ):  # fmt: skip
        """The output of MC heads (chunk c of the group) for one query block, and the log-sum-exp of those heads."""
        SLOTS: tl.constexpr = PRE + POST
        NC: tl.constexpr = MP // MC
        bg = tl.program_id(1) // NC
        c = tl.program_id(1) % NC
        b = bg // G
        t0 = tl.program_id(0) * BT
        heads = tl.arange(0, MP)
        head_ok = heads < M
        q_heads = (bg % G) * M + heads
        kv_heads = tl.where(head_ok, q_heads // n_rep, 0)
        own = c * MC + tl.arange(0, MC)
        own_ok = own < M
        own_q_heads = (bg % G) * M + own
        own_kv_heads = tl.where(own_ok, own_q_heads // n_rep, 0)
        t = t0 + tl.arange(0, BT)
        lo = 0
        if LOCAL:
            lo = tl.maximum(t0 - window + 1, 0) // BS * BS
        hi = tl.minimum(t0 + BT, T)

        # Pass 1: the running max and sum of the composed logits of every head where post-composition mixes them
        # all, else of the program's own heads only (and then the output itself, by online softmax).
        if POST:
            stat_heads = q_heads
            stat_ok = head_ok
            stored = head_ok & (heads // MC == c)  # every chunk finds every head's statistics; each stores its own
            row_max = tl.full((MP, BT), float("-inf"), tl.float32)
            row_sum = tl.zeros((MP, BT), tl.float32)
        else:
            stat_heads = own_q_heads
            stat_ok = own_ok
            stored = own_ok
            row_max = tl.full((MC, BT), float("-inf"), tl.float32)
            row_sum = tl.zeros((MC, BT), tl.float32)
        acc = tl.zeros((MC, BT, DP), tl.float32)
        for s0 in range(lo, hi, BS):
            s = s0 + tl.arange(0, BS)
            # Every head's query block is read again per key tile (from cache): held across the loop, it spilled.
            logits = scale * _head_products(
                Q, K, b, q_heads, kv_heads, head_ok, t, s, stride_qb, stride_qh, stride_qt,
                stride_kb, stride_kh, stride_kt, T, D, DP, DF, PREC, WIDEN,
            )  # fmt: skip
            if PRE:
                pre_qw1, pre_qw2, pre_qdd = _query_weights(WQ, bg, t0, T, 0, R, RP, M, heads, head_ok, BT, SLOTS)
                pre_kw1, pre_kw2, pre_kdd = 0.0, 0.0, 0.0
                if KEY_WISE:
                    pre_kw1, pre_kw2, pre_kdd = _key_weights(WK, bg, s0, T, 0, R, RP, M, heads, head_ok, BS, SLOTS)
                logits, _, _ = _compose(logits, pre_qw1, pre_qw2, pre_qdd, pre_kw1, pre_kw2, pre_kdd, KEY_WISE)
            if not POST:
                logits = _chunk(logits, c, MC)
            logits = tl.where(_allowed(t, s, stat_ok, T, window, LOCAL), logits, float("-inf"))
            new_max = tl.maximum(row_max, tl.max(logits, axis=2))
            # Rows that have seen no key yet keep max -inf: shift them by 0 so that exp gives 0, not NaN.
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)
            p = tl.exp(logits - shift[:, :, None])
            rescale = tl.exp(row_max - shift)
            row_sum = row_sum * rescale + tl.sum(p, axis=2)
            row_max = new_max
            if not POST:
                vt3 = _key_columns(V, b, own_kv_heads, own_ok, s, stride_vb, stride_vh, stride_vt, T, D, 0, DP)
                pv = _dot(p.to(V.dtype.element_ty), tl.permute(vt3, (0, 2, 1)), PREC, WIDEN)
                acc = acc * rescale[:, :, None] + pv
        # Rows past the end (and padded heads) saw no key: lse 0, never used.
        seen = row_sum > 0
        lse = tl.where(seen, row_max + tl.log(tl.where(seen, row_sum, 1.0)), 0.0)

        if POST:
            # Pass 2: exact probabilities of every head from the log-sum-exp, post-composed; the own heads' times V.
            for s0 in range(lo, hi, BS):
                s = s0 + tl.arange(0, BS)
                # Weights of a switched-off composition or side are never read: placeholders. The query side's are
                # read again per tile (from cache): held across the loop, broadcast over keys, they spilled.
                pre_qw1, pre_qw2, pre_qdd, post_qw1, post_qw2, post_qdd = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
                pre_kw1, pre_kw2, pre_kdd, post_kw1, post_kw2, post_kdd = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
                if PRE:
                    pre_qw1, pre_qw2, pre_qdd = _query_weights(WQ, bg, t0, T, 0, R, RP, M, heads, head_ok, BT, SLOTS)
                post_qw1, post_qw2, post_qdd = _query_weights(
                    WQ, bg, t0, T, SLOTS - 1, R, RP, M, heads, head_ok, BT, SLOTS
                )
                if KEY_WISE:
                    if PRE:
                        pre_kw1, pre_kw2, pre_kdd = _key_weights(WK, bg, s0, T, 0, R, RP, M, heads, head_ok, BS, SLOTS)
                    post_kw1, post_kw2, post_kdd = _key_weights(
                        WK, bg, s0, T, SLOTS - 1, R, RP, M, heads, head_ok, BS, SLOTS
                    )
                logits = scale * _head_products(
                    Q, K, b, q_heads, kv_heads, head_ok, t, s, stride_qb, stride_qh, stride_qt,
                    stride_kb, stride_kh, stride_kt, T, D, DP, DF, PREC, WIDEN,
                )  # fmt: skip
                allowed = _allowed(t, s, head_ok, T, window, LOCAL)
                _, _, _, mixed, _, _ = _probabilities(
                    logits, lse, allowed,
                    pre_qw1, pre_qw2, pre_qdd, pre_kw1, pre_kw2, pre_kdd,
                    post_qw1, post_qw2, post_qdd, post_kw1, post_kw2, post_kdd,
                    PRE, POST, KEY_WISE,
                )  # fmt: skip
                vt3 = _key_columns(V, b, own_kv_heads, own_ok, s, stride_vb, stride_vh, stride_vt, T, D, 0, DP)
                own_mixed = _chunk(mixed, c, MC).to(V.dtype.element_ty)
                acc += _dot(own_mixed, tl.permute(vt3, (0, 2, 1)), PREC, WIDEN)
        else:
            acc = acc / tl.where(seen, row_sum, 1.0)[:, :, None]

        d = tl.arange(0, DP)
        stat_rows = (b * H + stat_heads[:, None]) * T + t[None, :]
        tl.store(LSE + stat_rows, lse, mask=stored[:, None] & (t[None, :] < T))
        rows = (b * H + own_q_heads[:, None]) * T + t[None, :]
        out_ok = (own_ok[:, None] & (t[None, :] < T))[:, :, None] & (d[None, None, :] < D)
        tl.store(OUT + rows[:, :, None] * D + d[None, None, :], acc.to(OUT.dtype.element_ty), mask=out_ok)

    @triton.jit
    def _rank(stack, r):
        """Rank r of a stack of mixes (RP, A, B), as (A, B)."""
        return tl.sum(tl.where(tl.arange(0, stack.shape[0])[:, None, None] == r, stack, 0.0), axis=0)

    @triton.jit
    def _mix(w, x):
        """Σ_n w[r, n]·x_n over a chunk of heads n, per rank r: (RP, BT, BS) from w (RP, MC, ·, ·), x (MC, BT, BS)."""
        mixes = tl.zeros((w.shape[0], x.shape[1], x.shape[2]), tl.float32)
        for r in tl.static_range(w.shape[0]):
            mixes = _with_rank(mixes, r, tl.sum(_weight_rank(w, r) * x, axis=0))
        return mixes

    @triton.jit
    def _unmix(w, mixes):
        """Σ_r w[r, m]·mixes_r: each head m of a chunk's share of the group's mixes, (MC, BT, BS)."""
        out = _weight_rank(w, 0) * _rank(mixes, 0)[None, :, :]
        for r in tl.static_range(1, w.shape[0]):
            out += _weight_rank(w, r) * _rank(mixes, r)[None, :, :]
        return out

    @triton.jit
    def _composed(x, weights, mixes, KEY_WISE: tl.constexpr):
        """A chunk's x_m·(1 + qdd_m + kdd_m) + Σ_r qw2[r,m]·X_r + Σ_r kw2[r,m]·Y_r, the group's mixes X, Y complete.
        ``weights``: ((qw1, qw2, qdd), (kw1, kw2, kdd)) of the chunk's heads (:func:`_chunk_weights`)."""
        out = x * (1.0 + weights[0][2]) + _unmix(weights[0][1], mixes[0])
        if KEY_WISE:
            out += x * weights[1][2] + _unmix(weights[1][1], mixes[1])
        return out

    @triton.jit
    def _composed_grad(grad, weights, grad_mixes, KEY_WISE: tl.constexpr):
        """The gradient of :func:`_composed` with respect to a chunk's x, from its own gradient and the group's
        gradient mixes Σ_m qw2[r,m]·grad_m (and kw2's), complete."""
        out = grad * (1.0 + weights[0][2]) + _unmix(weights[0][0], grad_mixes[0])
        if KEY_WISE:
            out += grad * weights[1][2] + _unmix(weights[1][0], grad_mixes[1])
        return out

    @triton.jit
    def _weight_grads(x, grad, mixes, grad_mixes, AXIS: tl.constexpr):
        """One side's weight gradients of a chunk's heads at a tile, summed over AXIS (2: keys, for the query side;
        1: queries, for the key side): w1[r, n] gets Σ grad_mix_r·x_n, w2[r, m] Σ grad_m·mix_r, dd[m] Σ grad_m·x_m."""
        RP: tl.constexpr = mixes.shape[0]
        g_w1 = tl.zeros((RP, x.shape[0], x.shape[3 - AXIS]), tl.float32)
        g_w2 = g_w1
        for r in tl.static_range(RP):
            g_w1 = _with_rank(g_w1, r, tl.sum(_rank(grad_mixes, r)[None, :, :] * x, axis=AXIS))
            g_w2 = _with_rank(g_w2, r, tl.sum(grad * _rank(mixes, r)[None, :, :], axis=AXIS))
        return g_w1, g_w2, tl.sum(grad * x, axis=AXIS)

    @triton.jit
    def _chunk_weights(WQ, WK, bg, t0, s0, T, slot, h, ok, R: tl.constexpr, RP: tl.constexpr, M: tl.constexpr,
                       BT: tl.constexpr, BS: tl.constexpr, SLOTS: tl.constexpr, KEY_WISE: tl.constexpr):  # fmt: skip
        """One composition's weights of the heads h at a tile: query side ((RP, MC, BT, 1) twice, (MC, BT, 1)) and key
        side ((RP, MC, 1, BS) twice, (MC, 1, BS); 0s when query-wise)."""
        query_side = _query_weights(WQ, bg, t0, T, slot, R, RP, M, h, ok, BT, SLOTS)
        key_side = (0.0, 0.0, 0.0)
        if KEY_WISE:
            key_side = _key_weights(WK, bg, s0, T, slot, R, RP, M, h, ok, BS, SLOTS)
        return query_side, key_side

    @triton.jit
    def _chunk_tile(
        Q, K, V, DO, WQ, WK, LSE, b, bg, g0, h, t, s, t0, s0,
        stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
        stride_ob, stride_oh, stride_ot,
        H, T, n_rep, window, scale, pre_mixes, post_grad_mixes, delta,
        M: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, DF: tl.constexpr,
        BT: tl.constexpr, BS: tl.constexpr, PRE: tl.constexpr, POST: tl.constexpr, KEY_WISE: tl.constexpr,
        LOCAL: tl.constexpr, PREC: tl.constexpr, WIDEN: tl.constexpr, UPTO: tl.constexpr,
    ):  # fmt: skip
        """The heads h (MC,) of group g0.. at the tile (t, s), recomputed from q, k, v, dO, the weights, the saved
        statistics and the group's mixes known so far, as far as UPTO: 1 the logits x; 2 the probabilities P (the
        pre-mixes complete) and dP' = dO·vᵀ, the gradient of the post-composed P'; 3 dP, the gradient of P (the
        post-mixes of dP' complete; dP' itself without post-composition); 4 dZ = P∘(dP − D), the gradient of the
        pre-composed logits. Also the chunk's pre- and post-composition weights (placeholders where off).

        Every stage of the backward passes runs this over the group's heads a chunk at a time: all of a group's
        heads' tiles at once (M, BT, BS), several of them live, spilled at 16 heads (benchmarks/results)."""
        SLOTS: tl.constexpr = PRE + POST
        ok = h < M
        q_heads = g0 + h
        kv_heads = tl.where(ok, q_heads // n_rep, 0)
        pre = (0.0, 0.0, 0.0), (0.0, 0.0, 0.0)
        post = (0.0, 0.0, 0.0), (0.0, 0.0, 0.0)
        if PRE:
            pre = _chunk_weights(WQ, WK, bg, t0, s0, T, 0, h, ok, R, RP, M, BT, BS, SLOTS, KEY_WISE)
        if POST:
            post = _chunk_weights(WQ, WK, bg, t0, s0, T, SLOTS - 1, h, ok, R, RP, M, BT, BS, SLOTS, KEY_WISE)
        x = scale * _head_products(
            Q, K, b, q_heads, kv_heads, ok, t, s, stride_qb, stride_qh, stride_qt,
            stride_kb, stride_kh, stride_kt, T, D, DP, DF, PREC, WIDEN,
        )  # fmt: skip
        probs = x
        grad_mixed = x
        grad_probs = x
        grad_logits = x
        if UPTO >= 2:
            composed = x
            if PRE:
                composed = _composed(x, pre, pre_mixes, KEY_WISE)
            rows = (b * H + q_heads[:, None]) * T + t[None, :]
            row_ok = ok[:, None] & (t[None, :] < T)
            lse = tl.load(LSE + rows, mask=row_ok, other=0.0)
            probs = tl.where(_allowed(t, s, ok, T, window, LOCAL), tl.exp(composed - lse[:, :, None]), 0.0)
            grad_mixed = _head_products(
                DO, V, b, q_heads, kv_heads, ok, t, s, stride_ob, stride_oh, stride_ot,
                stride_vb, stride_vh, stride_vt, T, D, DP, DF, PREC, WIDEN,
            )  # fmt: skip
            if UPTO >= 3:
                grad_probs = grad_mixed
                if POST:
                    grad_probs = _composed_grad(grad_mixed, post, post_grad_mixes, KEY_WISE)
                if UPTO >= 4:
                    grad_logits = probs * (grad_probs - delta[:, :, None])
        return pre, post, x, probs, grad_mixed, grad_probs, grad_logits

    @triton.jit
    def _group_mixes(
        Q, K, V, DO, WQ, WK, LSE, b, bg, g0, t, s, t0, s0,
        stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
        stride_ob, stride_oh, stride_ot,
        H, T, n_rep, window, scale, pre_mixes, post_grad_mixes, deltas,
        M: tl.constexpr, MP: tl.constexpr, MC: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, D: tl.constexpr,
        DP: tl.constexpr, DF: tl.constexpr, BT: tl.constexpr, BS: tl.constexpr, PRE: tl.constexpr,
        POST: tl.constexpr, KEY_WISE: tl.constexpr, LOCAL: tl.constexpr, PREC: tl.constexpr, WIDEN: tl.constexpr,
        STAGE: tl.constexpr,
    ):  # fmt: skip
        """A tile's sums over the group's heads, a chunk of MC heads at a time (each (RP, BT, BS), query side then key
        side): STAGE 1 the pre-mixes of the logits (Σ_n qw1·x_n, Σ_n kw1·x_n); 2 the post-mixes of P (Σ_n qw1'·P_n,
        Σ_n kw1'·P_n) and of dP' (Σ_m qw2'·dP'_m, Σ_m kw2'·dP'_m); 4 the pre-mixes of dZ (Σ_m qw2·dZ_m, ...)."""
        zero = tl.zeros((RP, BT, BS), tl.float32)
        first, second, third, fourth = zero, zero, zero, zero
        for c in range(0, MP // MC):
            h = c * MC + tl.arange(0, MC)
            delta = 0.0
            if STAGE == 4:
                delta = _of_chunk(deltas, c)
            pre, post, x, probs, grad_mixed, _, grad_logits = _chunk_tile(
                Q, K, V, DO, WQ, WK, LSE, b, bg, g0, h, t, s, t0, s0,
                stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
                stride_ob, stride_oh, stride_ot, H, T, n_rep, window, scale, pre_mixes, post_grad_mixes,
                delta, M, R, RP, D, DP, DF, BT, BS, PRE, POST, KEY_WISE, LOCAL, PREC, WIDEN, STAGE,
            )  # fmt: skip
            if STAGE == 1:
                first += _mix(pre[0][0], x)
                if KEY_WISE:
                    second += _mix(pre[1][0], x)
            if STAGE == 2:
                first += _mix(post[0][0], probs)
                third += _mix(post[0][1], grad_mixed)
                if KEY_WISE:
                    second += _mix(post[1][0], probs)
                    fourth += _mix(post[1][1], grad_mixed)
            if STAGE == 4:
                first += _mix(pre[0][1], grad_logits)
                if KEY_WISE:
                    second += _mix(pre[1][1], grad_logits)
        return (first, second), (third, fourth)

    @triton.jit
    def _backward_tile(
        Q, K, V, DO, WQ, WK, LSE, b, bg, g0, own, c, t, s, t0, s0,
        stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
        stride_ob, stride_oh, stride_ot,
        H, T, n_rep, window, scale, deltas,
        M: tl.constexpr, MP: tl.constexpr, MC: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, D: tl.constexpr,
        DP: tl.constexpr, DF: tl.constexpr, BT: tl.constexpr, BS: tl.constexpr, PRE: tl.constexpr,
        POST: tl.constexpr, KEY_WISE: tl.constexpr, LOCAL: tl.constexpr, PREC: tl.constexpr, WIDEN: tl.constexpr,
    ):  # fmt: skip
        """Both backward kernels' work at one tile (t, s): the group's mixes, each stage once the one before it is
        complete (the pre-mixes of the logits, the post-mixes of P and dP', the pre-mixes of dZ; zeros where off),
        then the own chunk c's tile as far as dZ. Returns the four mixes, then the tile (:func:`_chunk_tile`)."""
        zero = tl.zeros((RP, BT, BS), tl.float32)
        no_mixes = (zero, zero)
        pre_mixes = no_mixes
        post_mixes = no_mixes
        post_grad_mixes = no_mixes
        pre_grad_mixes = no_mixes
        if PRE:
            pre_mixes = _group_mixes(
                Q, K, V, DO, WQ, WK, LSE, b, bg, g0, t, s, t0, s0,
                stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh,
                stride_vt, stride_ob, stride_oh, stride_ot, H, T, n_rep, window, scale, no_mixes, no_mixes, 0.0,
                M, MP, MC, R, RP, D, DP, DF, BT, BS, PRE, POST, KEY_WISE, LOCAL, PREC, WIDEN, 1,
            )[0]  # fmt: skip
        if POST:
            post_mixes, post_grad_mixes = _group_mixes(
                Q, K, V, DO, WQ, WK, LSE, b, bg, g0, t, s, t0, s0,
                stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh,
                stride_vt, stride_ob, stride_oh, stride_ot, H, T, n_rep, window, scale, pre_mixes, no_mixes, 0.0,
                M, MP, MC, R, RP, D, DP, DF, BT, BS, PRE, POST, KEY_WISE, LOCAL, PREC, WIDEN, 2,
            )  # fmt: skip
        if PRE:
            pre_grad_mixes = _group_mixes(
                Q, K, V, DO, WQ, WK, LSE, b, bg, g0, t, s, t0, s0,
                stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh,
                stride_vt, stride_ob, stride_oh, stride_ot, H, T, n_rep, window, scale, pre_mixes,
                post_grad_mixes, deltas, M, MP, MC, R, RP, D, DP, DF, BT, BS, PRE, POST, KEY_WISE, LOCAL, PREC,
                WIDEN, 4,
            )[0]  # fmt: skip
        tile = _chunk_tile(
            Q, K, V, DO, WQ, WK, LSE, b, bg, g0, own, t, s, t0, s0,
            stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
            stride_ob, stride_oh, stride_ot, H, T, n_rep, window, scale, pre_mixes, post_grad_mixes,
            _of_chunk(deltas, c), M, R, RP, D, DP, DF, BT, BS, PRE, POST, KEY_WISE, LOCAL, PREC, WIDEN, 4,
        )  # fmt: skip
        return pre_mixes, post_mixes, post_grad_mixes, pre_grad_mixes, tile

    @triton.jit
    def _backward_query_kernel(
        Q, K, V, DO, WQ, WK, LSE, DELTA, DQ, DWQ,
        stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
        stride_ob, stride_oh, stride_ot,
        H, T, G, n_rep, window, scale,
        M: tl.constexpr, MP: tl.constexpr, MC: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, D: tl.constexpr,
        DP: tl.constexpr, DF: tl.constexpr, BT: tl.constexpr, BS: tl.constexpr, PRE: tl.constexpr, POST: tl.constexpr,
        KEY_WISE: tl.constexpr, LOCAL: tl.constexpr, PREC: tl.constexpr, WIDEN: tl.constexpr,
    ):  # fmt: skip
        """dq of MC heads (chunk c) for one query block, and those heads' query-side weight gradients; with
        post-composition, first D of every head (every chunk's program finds it; each stores its own heads')."""
        SLOTS: tl.constexpr = PRE + POST
        NC: tl.constexpr = MP // MC
        bg = tl.program_id(1) // NC
        c = tl.program_id(1) % NC
        b = bg // G
        g0 = (bg % G) * M
        t0 = tl.program_id(0) * BT
        t = t0 + tl.arange(0, BT)
        own = c * MC + tl.arange(0, MC)
        own_ok = own < M
        own_kv_heads = tl.where(own_ok, (g0 + own) // n_rep, 0)
        lo = 0
        if LOCAL:
            lo = tl.maximum(t0 - window + 1, 0) // BS * BS
        hi = tl.minimum(t0 + BT, T)
        zero = tl.zeros((RP, BT, BS), tl.float32)
        no_mixes = (zero, zero)
        rows = (b * H + g0 + own[:, None]) * T + t[None, :]

        if POST:
            # D_n[t] = Σ_s P_n·dP_n, with dP the gradient of P once the post-mix is undone: one more pass. Each
            # program needs every head's D below, so each finds all of them, a chunk at a time, and stores its own
            # (for the key kernel).
            deltas = tl.zeros((NC, MC, BT), tl.float32)
            for s0 in range(lo, hi, BS):
                s = s0 + tl.arange(0, BS)
                pre_mixes = no_mixes
                if PRE:
                    pre_mixes = _group_mixes(
                        Q, K, V, DO, WQ, WK, LSE, b, bg, g0, t, s, t0, s0,
                        stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh,
                        stride_vt, stride_ob, stride_oh, stride_ot, H, T, n_rep, window, scale, no_mixes, no_mixes, 0.0,
                        M, MP, MC, R, RP, D, DP, DF, BT, BS, PRE, POST, KEY_WISE, LOCAL, PREC, WIDEN, 1,
                    )[0]  # fmt: skip
                post_grad_mixes = _group_mixes(
                    Q, K, V, DO, WQ, WK, LSE, b, bg, g0, t, s, t0, s0,
                    stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh,
                    stride_vt, stride_ob, stride_oh, stride_ot, H, T, n_rep, window, scale, pre_mixes, no_mixes, 0.0,
                    M, MP, MC, R, RP, D, DP, DF, BT, BS, PRE, POST, KEY_WISE, LOCAL, PREC, WIDEN, 2,
                )[1]  # fmt: skip
                for chunk in range(0, NC):
                    h = chunk * MC + tl.arange(0, MC)
                    tile = _chunk_tile(
                        Q, K, V, DO, WQ, WK, LSE, b, bg, g0, h, t, s, t0, s0,
                        stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh,
                        stride_vt, stride_ob, stride_oh, stride_ot, H, T, n_rep, window, scale, pre_mixes,
                        post_grad_mixes, 0.0, M, R, RP, D, DP, DF, BT, BS, PRE, POST, KEY_WISE, LOCAL, PREC, WIDEN, 3,
                    )  # fmt: skip
                    probs, grad_probs = tile[3], tile[5]
                    part = tl.sum(probs * grad_probs, axis=2)
                    deltas = tl.where(tl.arange(0, NC)[:, None, None] == chunk, deltas + part[None, :, :], deltas)
            tl.store(DELTA + rows, _of_chunk(deltas, c), mask=own_ok[:, None] & (t[None, :] < T))
        else:
            deltas = _group_rows(DELTA, b, H, g0, t, T, M, MP, MC)

        grad_q = tl.zeros((MC, BT, DP), tl.float32)
        pre_grads = (tl.zeros((RP, MC, BT), tl.float32), tl.zeros((RP, MC, BT), tl.float32),
                     tl.zeros((MC, BT), tl.float32))  # fmt: skip
        post_grads = pre_grads
        for s0 in range(lo, hi, BS):
            s = s0 + tl.arange(0, BS)
            pre_mixes, post_mixes, post_grad_mixes, pre_grad_mixes, tile = _backward_tile(
                Q, K, V, DO, WQ, WK, LSE, b, bg, g0, own, c, t, s, t0, s0,
                stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
                stride_ob, stride_oh, stride_ot, H, T, n_rep, window, scale, deltas,
                M, MP, MC, R, RP, D, DP, DF, BT, BS, PRE, POST, KEY_WISE, LOCAL, PREC, WIDEN,
            )  # fmt: skip
            pre, _, logits, probs, grad_mixed, _, grad_logits = tile
            if POST:
                g_w1, g_w2, g_dd = _weight_grads(probs, grad_mixed, post_mixes[0], post_grad_mixes[0], 2)
                post_grads = (post_grads[0] + g_w1, post_grads[1] + g_w2, post_grads[2] + g_dd)
            if PRE:
                g_w1, g_w2, g_dd = _weight_grads(logits, grad_logits, pre_mixes[0], pre_grad_mixes[0], 2)
                pre_grads = (pre_grads[0] + g_w1, pre_grads[1] + g_w2, pre_grads[2] + g_dd)
                grad_logits = _composed_grad(grad_logits, pre, pre_grad_mixes, KEY_WISE)
            own_kt3 = _key_columns(K, b, own_kv_heads, own_ok, s, stride_kb, stride_kh, stride_kt, T, D, 0, DP)
            grad_q += _dot(grad_logits.to(Q.dtype.element_ty), tl.permute(own_kt3, (0, 2, 1)), PREC, WIDEN)

        d = tl.arange(0, DP)
        out_ok = (own_ok[:, None] & (t[None, :] < T))[:, :, None] & (d[None, None, :] < D)
        grad_q = (grad_q * scale).to(DQ.dtype.element_ty)
        tl.store(DQ + rows[:, :, None] * D + d[None, None, :], grad_q, mask=out_ok)
        if PRE:
            _store_weights(DWQ, bg, t0, T, 0, pre_grads, own, own_ok, R, RP, M, BT, SLOTS)
        if POST:
            _store_weights(DWQ, bg, t0, T, SLOTS - 1, post_grads, own, own_ok, R, RP, M, BT, SLOTS)

    @triton.jit
    def _backward_key_kernel(
        Q, K, V, DO, WQ, WK, LSE, DELTA, DK, DV, DWK,
        stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
        stride_ob, stride_oh, stride_ot,
        H, T, G, n_rep, window, scale,
        M: tl.constexpr, MP: tl.constexpr, MC: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, D: tl.constexpr,
        DP: tl.constexpr, DF: tl.constexpr, BT: tl.constexpr, BS: tl.constexpr, PRE: tl.constexpr, POST: tl.constexpr,
        KEY_WISE: tl.constexpr, LOCAL: tl.constexpr, PREC: tl.constexpr, WIDEN: tl.constexpr,
    ):  # fmt: skip
        """dk, dv of MC query heads (chunk c) for one key block, over the queries that see it, and those heads'
        key-side weight gradients."""
        SLOTS: tl.constexpr = PRE + POST
        NC: tl.constexpr = MP // MC
        bg = tl.program_id(1) // NC
        c = tl.program_id(1) % NC
        b = bg // G
        g0 = (bg % G) * M
        s0 = tl.program_id(0) * BS
        s = s0 + tl.arange(0, BS)
        own = c * MC + tl.arange(0, MC)
        own_ok = own < M
        own_q_heads = g0 + own
        lo = s0 // BT * BT
        hi = T
        if LOCAL:
            hi = tl.minimum(s0 + BS - 1 + window, T)

        grad_k = tl.zeros((MC, BS, DP), tl.float32)
        grad_v = tl.zeros((MC, BS, DP), tl.float32)
        pre_grads = (tl.zeros((RP, MC, BS), tl.float32), tl.zeros((RP, MC, BS), tl.float32),
                     tl.zeros((MC, BS), tl.float32))  # fmt: skip
        post_grads = pre_grads
        for t0 in range(lo, hi, BT):
            t = t0 + tl.arange(0, BT)
            deltas = _group_rows(DELTA, b, H, g0, t, T, M, MP, MC)
            pre_mixes, post_mixes, post_grad_mixes, pre_grad_mixes, tile = _backward_tile(
                Q, K, V, DO, WQ, WK, LSE, b, bg, g0, own, c, t, s, t0, s0,
                stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
                stride_ob, stride_oh, stride_ot, H, T, n_rep, window, scale, deltas,
                M, MP, MC, R, RP, D, DP, DF, BT, BS, PRE, POST, KEY_WISE, LOCAL, PREC, WIDEN,
            )  # fmt: skip
            pre, post, logits, probs, grad_mixed, _, grad_logits = tile
            mixed = probs
            if POST:
                mixed = _composed(probs, post, post_mixes, KEY_WISE)
                if KEY_WISE:
                    g_w1, g_w2, g_dd = _weight_grads(probs, grad_mixed, post_mixes[1], post_grad_mixes[1], 1)
                    post_grads = (post_grads[0] + g_w1, post_grads[1] + g_w2, post_grads[2] + g_dd)
            if PRE:
                if KEY_WISE:
                    g_w1, g_w2, g_dd = _weight_grads(logits, grad_logits, pre_mixes[1], pre_grad_mixes[1], 1)
                    pre_grads = (pre_grads[0] + g_w1, pre_grads[1] + g_w2, pre_grads[2] + g_dd)
                grad_logits = _composed_grad(grad_logits, pre, pre_grad_mixes, KEY_WISE)
            own_do3 = _query_rows(DO, b, own_q_heads, own_ok, t, stride_ob, stride_oh, stride_ot, T, D, 0, DP)
            grad_v += _dot(tl.permute(mixed, (0, 2, 1)).to(DO.dtype.element_ty), own_do3, PREC, WIDEN)
            own_q3 = _query_rows(Q, b, own_q_heads, own_ok, t, stride_qb, stride_qh, stride_qt, T, D, 0, DP)
            grad_k += _dot(tl.permute(grad_logits, (0, 2, 1)).to(Q.dtype.element_ty), own_q3, PREC, WIDEN)

        d = tl.arange(0, DP)
        cols = (b * H + own_q_heads[:, None]) * T + s[None, :]
        col_ok = (own_ok[:, None] & (s[None, :] < T))[:, :, None] & (d[None, None, :] < D)
        tl.store(DK + cols[:, :, None] * D + d[None, None, :], grad_k * scale, mask=col_ok)
        tl.store(DV + cols[:, :, None] * D + d[None, None, :], grad_v, mask=col_ok)
        if KEY_WISE:
            if PRE:
                _store_weights(DWK, bg, s0, T, 0, pre_grads, own, own_ok, R, RP, M, BS, SLOTS)
            if POST:
                _store_weights(DWK, bg, s0, T, SLOTS - 1, post_grads, own, own_ok, R, RP, M, BS, SLOTS)

    INTERPRETED = not isinstance(_forward_kernel, triton.runtime.JITFunction)  # TRITON_INTERPRET=1: CPU tensors
    KERNELS_BY_NAME = {
        "forward": _forward_kernel,
        "backward_query": _backward_query_kernel,
        "backward_key": _backward_key_kernel,
    }
