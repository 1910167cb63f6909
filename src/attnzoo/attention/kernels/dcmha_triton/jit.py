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
    def _load_weights(ptr, bg, first, length, slot, R: tl.constexpr, RP: tl.constexpr, M: tl.constexpr,
                      MP: tl.constexpr, BL: tl.constexpr, SLOTS: tl.constexpr):  # fmt: skip
        """Positions first..first+BL of one side and composition: w1, w2 (RP, MP, BL) and dd (MP, BL), 0 past
        the ends (padded ranks and heads then add nothing)."""
        r = tl.arange(0, RP)[:, None, None]
        m = tl.arange(0, MP)[None, :, None]
        pos = first + tl.arange(0, BL)[None, None, :]
        row = ptr + ((bg * length + pos) * SLOTS + slot) * (2 * R + 1) * M
        ok = (r < R) & (m < M) & (pos < length)
        w1 = tl.load(row + r * M + m, mask=ok, other=0.0)
        w2 = tl.load(row + (R + r) * M + m, mask=ok, other=0.0)
        m2 = tl.arange(0, MP)[:, None]
        pos2 = first + tl.arange(0, BL)[None, :]
        dd_row = ptr + ((bg * length + pos2) * SLOTS + slot) * (2 * R + 1) * M + 2 * R * M
        dd = tl.load(dd_row + m2, mask=(m2 < M) & (pos2 < length), other=0.0)
        return w1, w2, dd

    @triton.jit
    def _store_weights(ptr, bg, first, length, slot, g_w1, g_w2, g_dd, stored, R: tl.constexpr, RP: tl.constexpr,
                       M: tl.constexpr, MP: tl.constexpr, BL: tl.constexpr, SLOTS: tl.constexpr):  # fmt: skip
        """The inverse of :func:`_load_weights`, for their gradients, of the heads where ``stored`` (MP,) holds."""
        r = tl.arange(0, RP)[:, None, None]
        m = tl.arange(0, MP)[None, :, None]
        pos = first + tl.arange(0, BL)[None, None, :]
        row = ptr + ((bg * length + pos) * SLOTS + slot) * (2 * R + 1) * M
        ok = (r < R) & stored[None, :, None] & (pos < length)
        tl.store(row + r * M + m, g_w1, mask=ok)
        tl.store(row + (R + r) * M + m, g_w2, mask=ok)
        m2 = tl.arange(0, MP)[:, None]
        pos2 = first + tl.arange(0, BL)[None, :]
        dd_row = ptr + ((bg * length + pos2) * SLOTS + slot) * (2 * R + 1) * M + 2 * R * M
        tl.store(dd_row + m2, g_dd, mask=stored[:, None] & (pos2 < length))

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
    def _compose_backward(grad, x, mix_q, mix_k, qw1, qw2, qdd, kw1, kw2, kdd, KEY_WISE: tl.constexpr,
                          QUERY_SIDE: tl.constexpr):  # fmt: skip
        """The gradient of :func:`_compose` with respect to x, and the tile's share of the gradients of one
        side's weights: summed over keys (QUERY_SIDE, shapes (R, M, BT) and (M, BT)) or over queries. One rank at a
        time, as :func:`_compose`."""
        RP: tl.constexpr = qw1.shape[0]
        SUMMED: tl.constexpr = 2 if QUERY_SIDE else 1  # the axis a side's weight gradients sum over
        grad_x = grad * (1.0 + qdd)
        if KEY_WISE:
            grad_x += grad * kdd
        g_w1 = tl.zeros((RP, x.shape[0], x.shape[3 - SUMMED]), tl.float32)
        g_w2 = g_w1
        for r in tl.static_range(RP):
            grad_mix = tl.sum(_weight_rank(qw2, r) * grad, axis=0)
            grad_x += _weight_rank(qw1, r) * grad_mix[None, :, :]
            mix = tl.sum(tl.where(tl.arange(0, RP)[:, None, None] == r, mix_q, 0.0), axis=0)
            if KEY_WISE:
                if not QUERY_SIDE:
                    mix = tl.sum(tl.where(tl.arange(0, RP)[:, None, None] == r, mix_k, 0.0), axis=0)
                grad_mix_k = tl.sum(_weight_rank(kw2, r) * grad, axis=0)
                grad_x += _weight_rank(kw1, r) * grad_mix_k[None, :, :]
                if not QUERY_SIDE:
                    grad_mix = grad_mix_k
            g_w1 = _with_rank(g_w1, r, tl.sum(grad_mix[None, :, :] * x, axis=SUMMED))
            g_w2 = _with_rank(g_w2, r, tl.sum(grad * mix[None, :, :], axis=SUMMED))
        g_dd = tl.sum(grad * x, axis=SUMMED)
        return grad_x, g_w1, g_w2, g_dd

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
    def _query_weights(ptr, bg, t0, T, slot, R: tl.constexpr, RP: tl.constexpr, M: tl.constexpr,
                       MP: tl.constexpr, BT: tl.constexpr, SLOTS: tl.constexpr):  # fmt: skip
        """One composition's query-side weights of a query block, shaped to broadcast over keys."""
        w1, w2, dd = _load_weights(ptr, bg, t0, T, slot, R, RP, M, MP, BT, SLOTS)
        return w1[:, :, :, None], w2[:, :, :, None], dd[:, :, None]

    @triton.jit
    def _key_weights(ptr, bg, s0, T, slot, R: tl.constexpr, RP: tl.constexpr, M: tl.constexpr,
                     MP: tl.constexpr, BS: tl.constexpr, SLOTS: tl.constexpr):  # fmt: skip
        """One composition's key-side weights of a key block, shaped to broadcast over queries."""
        w1, w2, dd = _load_weights(ptr, bg, s0, T, slot, R, RP, M, MP, BS, SLOTS)
        return w1[:, :, None, :], w2[:, :, None, :], dd[:, None, :]

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
                pre_qw1, pre_qw2, pre_qdd = _query_weights(WQ, bg, t0, T, 0, R, RP, M, MP, BT, SLOTS)
                pre_kw1, pre_kw2, pre_kdd = 0.0, 0.0, 0.0
                if KEY_WISE:
                    pre_kw1, pre_kw2, pre_kdd = _key_weights(WK, bg, s0, T, 0, R, RP, M, MP, BS, SLOTS)
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
                    pre_qw1, pre_qw2, pre_qdd = _query_weights(WQ, bg, t0, T, 0, R, RP, M, MP, BT, SLOTS)
                post_qw1, post_qw2, post_qdd = _query_weights(WQ, bg, t0, T, SLOTS - 1, R, RP, M, MP, BT, SLOTS)
                if KEY_WISE:
                    if PRE:
                        pre_kw1, pre_kw2, pre_kdd = _key_weights(WK, bg, s0, T, 0, R, RP, M, MP, BS, SLOTS)
                    post_kw1, post_kw2, post_kdd = _key_weights(WK, bg, s0, T, SLOTS - 1, R, RP, M, MP, BS, SLOTS)
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
    def _backward_query_kernel(
        Q, K, V, DO, WQ, WK, LSE, DELTA, DQ, DWQ,
        stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
        stride_ob, stride_oh, stride_ot,
        H, T, G, n_rep, window, scale,
        M: tl.constexpr, MP: tl.constexpr, MC: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, D: tl.constexpr,
        DP: tl.constexpr, DF: tl.constexpr, BT: tl.constexpr, BS: tl.constexpr, PRE: tl.constexpr, POST: tl.constexpr,
        KEY_WISE: tl.constexpr, LOCAL: tl.constexpr, PREC: tl.constexpr, WIDEN: tl.constexpr,
    ):  # fmt: skip
        """dq of MC heads (chunk c) for one query block, and those heads' query-side weight gradients (with
        post-composition, their D first)."""
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
        stored = head_ok & (heads // MC == c)
        own = c * MC + tl.arange(0, MC)
        own_ok = own < M
        own_kv_heads = tl.where(own_ok, ((bg % G) * M + own) // n_rep, 0)
        t = t0 + tl.arange(0, BT)
        rows = (b * H + q_heads[:, None]) * T + t[None, :]
        row_ok = head_ok[:, None] & (t[None, :] < T)
        lse = tl.load(LSE + rows, mask=row_ok, other=0.0)
        lo = 0
        if LOCAL:
            lo = tl.maximum(t0 - window + 1, 0) // BS * BS
        hi = tl.minimum(t0 + BT, T)

        # Every head's q and dO rows are read again per key tile (from cache): held across the loops, they spilled.
        if POST:
            # D_n[t] = Σ_s P_n·dP_n, with dP the gradient of P once the post-mix is undone: one more pass.
            delta = tl.zeros((MP, BT), tl.float32)
            for s0 in range(lo, hi, BS):
                s = s0 + tl.arange(0, BS)
                pre_kw1, pre_kw2, pre_kdd, post_kw1, post_kw2, post_kdd = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
                pre_qw1, pre_qw2, pre_qdd = 0.0, 0.0, 0.0
                if PRE:
                    pre_qw1, pre_qw2, pre_qdd = _query_weights(WQ, bg, t0, T, 0, R, RP, M, MP, BT, SLOTS)
                post_qw1, post_qw2, post_qdd = _query_weights(WQ, bg, t0, T, SLOTS - 1, R, RP, M, MP, BT, SLOTS)
                if KEY_WISE:
                    if PRE:
                        pre_kw1, pre_kw2, pre_kdd = _key_weights(WK, bg, s0, T, 0, R, RP, M, MP, BS, SLOTS)
                    post_kw1, post_kw2, post_kdd = _key_weights(WK, bg, s0, T, SLOTS - 1, R, RP, M, MP, BS, SLOTS)
                logits = scale * _head_products(
                    Q, K, b, q_heads, kv_heads, head_ok, t, s, stride_qb, stride_qh, stride_qt,
                    stride_kb, stride_kh, stride_kt, T, D, DP, DF, PREC, WIDEN,
                )  # fmt: skip
                allowed = _allowed(t, s, head_ok, T, window, LOCAL)
                _, _, probs, _, post_mix_q, post_mix_k = _probabilities(
                    logits, lse, allowed,
                    pre_qw1, pre_qw2, pre_qdd, pre_kw1, pre_kw2, pre_kdd,
                    post_qw1, post_qw2, post_qdd, post_kw1, post_kw2, post_kdd,
                    PRE, POST, KEY_WISE,
                )  # fmt: skip
                grad_mixed = _head_products(
                    DO, V, b, q_heads, kv_heads, head_ok, t, s, stride_ob, stride_oh, stride_ot,
                    stride_vb, stride_vh, stride_vt, T, D, DP, DF, PREC, WIDEN,
                )  # fmt: skip
                grad_probs, _, _, _ = _compose_backward(
                    grad_mixed, probs, post_mix_q, post_mix_k,
                    post_qw1, post_qw2, post_qdd, post_kw1, post_kw2, post_kdd, KEY_WISE, True,
                )  # fmt: skip
                delta += tl.sum(probs * grad_probs, axis=2)
            tl.store(DELTA + rows, delta, mask=row_ok & stored[:, None])
        else:
            delta = tl.load(DELTA + rows, mask=row_ok, other=0.0)

        grad_q = tl.zeros((MC, BT, DP), tl.float32)
        pre_gw1 = tl.zeros((RP, MP, BT), tl.float32)
        pre_gw2 = tl.zeros((RP, MP, BT), tl.float32)
        pre_gdd = tl.zeros((MP, BT), tl.float32)
        post_gw1 = tl.zeros((RP, MP, BT), tl.float32)
        post_gw2 = tl.zeros((RP, MP, BT), tl.float32)
        post_gdd = tl.zeros((MP, BT), tl.float32)
        for s0 in range(lo, hi, BS):
            s = s0 + tl.arange(0, BS)
            # The query side's weights are read again per tile (from cache), as every head's q and dO rows.
            pre_qw1, pre_qw2, pre_qdd, post_qw1, post_qw2, post_qdd = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
            pre_kw1, pre_kw2, pre_kdd, post_kw1, post_kw2, post_kdd = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
            if PRE:
                pre_qw1, pre_qw2, pre_qdd = _query_weights(WQ, bg, t0, T, 0, R, RP, M, MP, BT, SLOTS)
            if POST:
                post_qw1, post_qw2, post_qdd = _query_weights(WQ, bg, t0, T, SLOTS - 1, R, RP, M, MP, BT, SLOTS)
            if KEY_WISE:
                if PRE:
                    pre_kw1, pre_kw2, pre_kdd = _key_weights(WK, bg, s0, T, 0, R, RP, M, MP, BS, SLOTS)
                if POST:
                    post_kw1, post_kw2, post_kdd = _key_weights(WK, bg, s0, T, SLOTS - 1, R, RP, M, MP, BS, SLOTS)
            logits = scale * _head_products(
                Q, K, b, q_heads, kv_heads, head_ok, t, s, stride_qb, stride_qh, stride_qt,
                stride_kb, stride_kh, stride_kt, T, D, DP, DF, PREC, WIDEN,
            )  # fmt: skip
            allowed = _allowed(t, s, head_ok, T, window, LOCAL)
            pre_mix_q, pre_mix_k, probs, _, post_mix_q, post_mix_k = _probabilities(
                logits, lse, allowed,
                pre_qw1, pre_qw2, pre_qdd, pre_kw1, pre_kw2, pre_kdd,
                post_qw1, post_qw2, post_qdd, post_kw1, post_kw2, post_kdd,
                PRE, POST, KEY_WISE,
            )  # fmt: skip
            grad_probs = _head_products(
                DO, V, b, q_heads, kv_heads, head_ok, t, s, stride_ob, stride_oh, stride_ot,
                stride_vb, stride_vh, stride_vt, T, D, DP, DF, PREC, WIDEN,
            )  # fmt: skip
            if POST:
                grad_probs, g_w1, g_w2, g_dd = _compose_backward(
                    grad_probs, probs, post_mix_q, post_mix_k,
                    post_qw1, post_qw2, post_qdd, post_kw1, post_kw2, post_kdd, KEY_WISE, True,
                )  # fmt: skip
                post_gw1 += g_w1
                post_gw2 += g_w2
                post_gdd += g_dd
            grad_logits = probs * (grad_probs - delta[:, :, None])
            if PRE:
                grad_logits, g_w1, g_w2, g_dd = _compose_backward(
                    grad_logits, logits, pre_mix_q, pre_mix_k,
                    pre_qw1, pre_qw2, pre_qdd, pre_kw1, pre_kw2, pre_kdd, KEY_WISE, True,
                )  # fmt: skip
                pre_gw1 += g_w1
                pre_gw2 += g_w2
                pre_gdd += g_dd
            own_kt3 = _key_columns(K, b, own_kv_heads, own_ok, s, stride_kb, stride_kh, stride_kt, T, D, 0, DP)
            own_grad = _chunk(grad_logits, c, MC).to(Q.dtype.element_ty)
            grad_q += _dot(own_grad, tl.permute(own_kt3, (0, 2, 1)), PREC, WIDEN)

        d = tl.arange(0, DP)
        own_rows = (b * H + (bg % G) * M + own[:, None]) * T + t[None, :]
        out_ok = (own_ok[:, None] & (t[None, :] < T))[:, :, None] & (d[None, None, :] < D)
        grad_q = (grad_q * scale).to(DQ.dtype.element_ty)
        tl.store(DQ + own_rows[:, :, None] * D + d[None, None, :], grad_q, mask=out_ok)
        if PRE:
            _store_weights(DWQ, bg, t0, T, 0, pre_gw1, pre_gw2, pre_gdd, stored, R, RP, M, MP, BT, SLOTS)
        if POST:
            _store_weights(DWQ, bg, t0, T, SLOTS - 1, post_gw1, post_gw2, post_gdd, stored, R, RP, M, MP, BT, SLOTS)

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
        s0 = tl.program_id(0) * BS
        heads = tl.arange(0, MP)
        head_ok = heads < M
        q_heads = (bg % G) * M + heads
        kv_heads = tl.where(head_ok, q_heads // n_rep, 0)
        stored = head_ok & (heads // MC == c)
        own = c * MC + tl.arange(0, MC)
        own_ok = own < M
        own_q_heads = (bg % G) * M + own
        s = s0 + tl.arange(0, BS)
        pre_kw1, pre_kw2, pre_kdd, post_kw1, post_kw2, post_kdd = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
        if KEY_WISE:
            if PRE:
                pre_kw1, pre_kw2, pre_kdd = _key_weights(WK, bg, s0, T, 0, R, RP, M, MP, BS, SLOTS)
            if POST:
                post_kw1, post_kw2, post_kdd = _key_weights(WK, bg, s0, T, SLOTS - 1, R, RP, M, MP, BS, SLOTS)
        lo = s0 // BT * BT
        hi = T
        if LOCAL:
            hi = tl.minimum(s0 + BS - 1 + window, T)

        grad_k = tl.zeros((MC, BS, DP), tl.float32)
        grad_v = tl.zeros((MC, BS, DP), tl.float32)
        pre_gw1 = tl.zeros((RP, MP, BS), tl.float32)
        pre_gw2 = tl.zeros((RP, MP, BS), tl.float32)
        pre_gdd = tl.zeros((MP, BS), tl.float32)
        post_gw1 = tl.zeros((RP, MP, BS), tl.float32)
        post_gw2 = tl.zeros((RP, MP, BS), tl.float32)
        post_gdd = tl.zeros((MP, BS), tl.float32)
        for t0 in range(lo, hi, BT):
            t = t0 + tl.arange(0, BT)
            rows = (b * H + q_heads[:, None]) * T + t[None, :]
            row_ok = head_ok[:, None] & (t[None, :] < T)
            lse = tl.load(LSE + rows, mask=row_ok, other=0.0)
            delta = tl.load(DELTA + rows, mask=row_ok, other=0.0)
            pre_qw1, pre_qw2, pre_qdd, post_qw1, post_qw2, post_qdd = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
            if PRE:
                pre_qw1, pre_qw2, pre_qdd = _query_weights(WQ, bg, t0, T, 0, R, RP, M, MP, BT, SLOTS)
            if POST:
                post_qw1, post_qw2, post_qdd = _query_weights(WQ, bg, t0, T, SLOTS - 1, R, RP, M, MP, BT, SLOTS)
            # Every head's k and v columns are read again per query tile (from cache): held, they spilled.
            logits = scale * _head_products(
                Q, K, b, q_heads, kv_heads, head_ok, t, s, stride_qb, stride_qh, stride_qt,
                stride_kb, stride_kh, stride_kt, T, D, DP, DF, PREC, WIDEN,
            )  # fmt: skip
            allowed = _allowed(t, s, head_ok, T, window, LOCAL)
            pre_mix_q, pre_mix_k, probs, mixed, post_mix_q, post_mix_k = _probabilities(
                logits, lse, allowed,
                pre_qw1, pre_qw2, pre_qdd, pre_kw1, pre_kw2, pre_kdd,
                post_qw1, post_qw2, post_qdd, post_kw1, post_kw2, post_kdd,
                PRE, POST, KEY_WISE,
            )  # fmt: skip
            own_do3 = _query_rows(DO, b, own_q_heads, own_ok, t, stride_ob, stride_oh, stride_ot, T, D, 0, DP)
            own_mixed = tl.permute(_chunk(mixed, c, MC), (0, 2, 1)).to(DO.dtype.element_ty)
            grad_v += _dot(own_mixed, own_do3, PREC, WIDEN)
            grad_probs = _head_products(
                DO, V, b, q_heads, kv_heads, head_ok, t, s, stride_ob, stride_oh, stride_ot,
                stride_vb, stride_vh, stride_vt, T, D, DP, DF, PREC, WIDEN,
            )  # fmt: skip
            if POST:
                grad_probs, g_w1, g_w2, g_dd = _compose_backward(
                    grad_probs, probs, post_mix_q, post_mix_k,
                    post_qw1, post_qw2, post_qdd, post_kw1, post_kw2, post_kdd, KEY_WISE, False,
                )  # fmt: skip
                post_gw1 += g_w1
                post_gw2 += g_w2
                post_gdd += g_dd
            grad_logits = probs * (grad_probs - delta[:, :, None])
            if PRE:
                grad_logits, g_w1, g_w2, g_dd = _compose_backward(
                    grad_logits, logits, pre_mix_q, pre_mix_k,
                    pre_qw1, pre_qw2, pre_qdd, pre_kw1, pre_kw2, pre_kdd, KEY_WISE, False,
                )  # fmt: skip
                pre_gw1 += g_w1
                pre_gw2 += g_w2
                pre_gdd += g_dd
            own_q3 = _query_rows(Q, b, own_q_heads, own_ok, t, stride_qb, stride_qh, stride_qt, T, D, 0, DP)
            own_grad = tl.permute(_chunk(grad_logits, c, MC), (0, 2, 1)).to(Q.dtype.element_ty)
            grad_k += _dot(own_grad, own_q3, PREC, WIDEN)

        d = tl.arange(0, DP)
        cols = (b * H + own_q_heads[:, None]) * T + s[None, :]
        col_ok = (own_ok[:, None] & (s[None, :] < T))[:, :, None] & (d[None, None, :] < D)
        tl.store(DK + cols[:, :, None] * D + d[None, None, :], grad_k * scale, mask=col_ok)
        tl.store(DV + cols[:, :, None] * D + d[None, None, :], grad_v, mask=col_ok)
        if KEY_WISE:
            if PRE:
                _store_weights(DWK, bg, s0, T, 0, pre_gw1, pre_gw2, pre_gdd, stored, R, RP, M, MP, BS, SLOTS)
            if POST:
                _store_weights(DWK, bg, s0, T, SLOTS - 1, post_gw1, post_gw2, post_gdd, stored, R, RP, M, MP, BS,
                               SLOTS)  # fmt: skip

    INTERPRETED = not isinstance(_forward_kernel, triton.runtime.JITFunction)  # TRITON_INTERPRET=1: CPU tensors
    KERNELS_BY_NAME = {
        "forward": _forward_kernel,
        "backward_query": _backward_query_kernel,
        "backward_key": _backward_key_kernel,
    }
