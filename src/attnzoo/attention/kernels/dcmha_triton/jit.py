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
    def _store_weights(ptr, bg, first, length, slot, g_w1, g_w2, g_dd, R: tl.constexpr, RP: tl.constexpr,
                       M: tl.constexpr, MP: tl.constexpr, BL: tl.constexpr, SLOTS: tl.constexpr):  # fmt: skip
        """The inverse of :func:`_load_weights`, for their gradients."""
        r = tl.arange(0, RP)[:, None, None]
        m = tl.arange(0, MP)[None, :, None]
        pos = first + tl.arange(0, BL)[None, None, :]
        row = ptr + ((bg * length + pos) * SLOTS + slot) * (2 * R + 1) * M
        ok = (r < R) & (m < M) & (pos < length)
        tl.store(row + r * M + m, g_w1, mask=ok)
        tl.store(row + (R + r) * M + m, g_w2, mask=ok)
        m2 = tl.arange(0, MP)[:, None]
        pos2 = first + tl.arange(0, BL)[None, :]
        dd_row = ptr + ((bg * length + pos2) * SLOTS + slot) * (2 * R + 1) * M + 2 * R * M
        tl.store(dd_row + m2, g_dd, mask=(m2 < M) & (pos2 < length))

    @triton.jit
    def _compose(x, qw1, qw2, qdd, kw1, kw2, kdd, KEY_WISE: tl.constexpr):
        """x (M, BT, BS) composed across heads; also X_r, Y_r (R, BT, BS), the rank-R mixes the backward needs.

        Query-side weights come as (R, M, BT, 1) and (M, BT, 1), key-side as (R, M, 1, BS) and (M, 1, BS)."""
        mix_q = tl.sum(qw1 * x[None, :, :, :], axis=1)
        out = x * (1.0 + qdd) + tl.sum(qw2 * mix_q[:, None, :, :], axis=0)
        mix_k = mix_q
        if KEY_WISE:
            mix_k = tl.sum(kw1 * x[None, :, :, :], axis=1)
            out += x * kdd + tl.sum(kw2 * mix_k[:, None, :, :], axis=0)
        return out, mix_q, mix_k

    @triton.jit
    def _compose_backward(grad, x, mix_q, mix_k, qw1, qw2, qdd, kw1, kw2, kdd, KEY_WISE: tl.constexpr,
                          QUERY_SIDE: tl.constexpr):  # fmt: skip
        """The gradient of :func:`_compose` with respect to x, and the tile's share of the gradients of one
        side's weights: summed over keys (QUERY_SIDE, shapes (R, M, BT) and (M, BT)) or over queries."""
        grad_mix_q = tl.sum(qw2 * grad[None, :, :, :], axis=1)
        grad_x = grad * (1.0 + qdd) + tl.sum(qw1 * grad_mix_q[:, None, :, :], axis=0)
        grad_mix_k = grad_mix_q
        if KEY_WISE:
            grad_mix_k = tl.sum(kw2 * grad[None, :, :, :], axis=1)
            grad_x += grad * kdd + tl.sum(kw1 * grad_mix_k[:, None, :, :], axis=0)
        if QUERY_SIDE:
            g_w1 = tl.sum(grad_mix_q[:, None, :, :] * x[None, :, :, :], axis=3)
            g_w2 = tl.sum(grad[None, :, :, :] * mix_q[:, None, :, :], axis=3)
            g_dd = tl.sum(grad * x, axis=2)
        else:
            g_w1 = tl.sum(grad_mix_k[:, None, :, :] * x[None, :, :, :], axis=2)
            g_w2 = tl.sum(grad[None, :, :, :] * mix_k[:, None, :, :], axis=2)
            g_dd = tl.sum(grad * x, axis=1)
        return grad_x, g_w1, g_w2, g_dd

    @triton.jit
    def _allowed(t, s, head_ok, T, window, LOCAL: tl.constexpr):
        """(MP, BT, BS): query t sees key s (causal, within the window if local), both in range, real head."""
        distance = t[:, None] - s[None, :]
        ok = (distance >= 0) & (t[:, None] < T) & (s[None, :] < T)
        if LOCAL:
            ok = ok & (distance < window)
        return head_ok[:, None, None] & ok[None, :, :]

    @triton.jit
    def _query_rows(ptr, b, heads, head_ok, t, stride_b, stride_h, stride_t, T, D: tl.constexpr,
                    DP: tl.constexpr):  # fmt: skip
        """(MP, BT, DP) rows t of the heads' q (or dO), 0 outside."""
        d = tl.arange(0, DP)
        offsets = b * stride_b + heads[:, None, None] * stride_h + t[None, :, None] * stride_t + d[None, None, :]
        ok = head_ok[:, None, None] & (t[None, :, None] < T) & (d[None, None, :] < D)
        return tl.load(ptr + offsets, mask=ok, other=0.0)

    @triton.jit
    def _key_columns(ptr, b, kv_heads, head_ok, s, stride_b, stride_h, stride_t, T, D: tl.constexpr,
                     DP: tl.constexpr):  # fmt: skip
        """(MP, DP, BS) columns s of each head's k (or v), transposed, 0 outside."""
        d = tl.arange(0, DP)
        offsets = b * stride_b + kv_heads[:, None, None] * stride_h + d[None, :, None] + s[None, None, :] * stride_t
        ok = head_ok[:, None, None] & (d[None, :, None] < D) & (s[None, None, :] < T)
        return tl.load(ptr + offsets, mask=ok, other=0.0)

    @triton.jit
    def _probabilities(
        q3, kt3, lse, allowed, scale,
        pre_qw1, pre_qw2, pre_qdd, pre_kw1, pre_kw2, pre_kdd,
        post_qw1, post_qw2, post_qdd, post_kw1, post_kw2, post_kdd,
        PRE: tl.constexpr, POST: tl.constexpr, KEY_WISE: tl.constexpr, PREC: tl.constexpr,
        WIDEN: tl.constexpr,
    ):  # fmt: skip
        """A tile recomputed from the saved log-sum-exp: the logits and their pre-mixes, the probabilities P, and
        the post-composed P' with its mixes."""
        logits = _dot(q3, kt3, PREC, WIDEN) * scale
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
        return logits, pre_mix_q, pre_mix_k, probs, mixed, post_mix_q, post_mix_k

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
        M: tl.constexpr, MP: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
        BT: tl.constexpr, BS: tl.constexpr, PRE: tl.constexpr, POST: tl.constexpr, KEY_WISE: tl.constexpr,
        LOCAL: tl.constexpr, PREC: tl.constexpr, WIDEN: tl.constexpr,
    ):  # fmt: skip
        """The output and per-head log-sum-exp of one query block of one (batch, group)."""
        SLOTS: tl.constexpr = PRE + POST
        bg = tl.program_id(1)
        b = bg // G
        t0 = tl.program_id(0) * BT
        heads = tl.arange(0, MP)
        head_ok = heads < M
        q_heads = (bg % G) * M + heads
        kv_heads = tl.where(head_ok, q_heads // n_rep, 0)
        t = t0 + tl.arange(0, BT)
        q3 = _query_rows(Q, b, q_heads, head_ok, t, stride_qb, stride_qh, stride_qt, T, D, DP)
        # Weights of a switched-off composition or side are never read: placeholders.
        pre_qw1, pre_qw2, pre_qdd, post_qw1, post_qw2, post_qdd = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
        if PRE:
            pre_qw1, pre_qw2, pre_qdd = _query_weights(WQ, bg, t0, T, 0, R, RP, M, MP, BT, SLOTS)
        if POST:
            post_qw1, post_qw2, post_qdd = _query_weights(WQ, bg, t0, T, SLOTS - 1, R, RP, M, MP, BT, SLOTS)
        lo = 0
        if LOCAL:
            lo = tl.maximum(t0 - window + 1, 0) // BS * BS
        hi = tl.minimum(t0 + BT, T)

        # Pass 1: each head's running max and sum of the composed logits (and without post-composition the
        # output itself, by online softmax).
        row_max = tl.full((MP, BT), float("-inf"), tl.float32)
        row_sum = tl.zeros((MP, BT), tl.float32)
        acc = tl.zeros((MP, BT, DP), tl.float32)
        for s0 in range(lo, hi, BS):
            s = s0 + tl.arange(0, BS)
            kt3 = _key_columns(K, b, kv_heads, head_ok, s, stride_kb, stride_kh, stride_kt, T, D, DP)
            logits = _dot(q3, kt3, PREC, WIDEN) * scale
            if PRE:
                pre_kw1, pre_kw2, pre_kdd = 0.0, 0.0, 0.0
                if KEY_WISE:
                    pre_kw1, pre_kw2, pre_kdd = _key_weights(WK, bg, s0, T, 0, R, RP, M, MP, BS, SLOTS)
                logits, _, _ = _compose(logits, pre_qw1, pre_qw2, pre_qdd, pre_kw1, pre_kw2, pre_kdd, KEY_WISE)
            logits = tl.where(_allowed(t, s, head_ok, T, window, LOCAL), logits, float("-inf"))
            new_max = tl.maximum(row_max, tl.max(logits, axis=2))
            # Rows that have seen no key yet keep max -inf: shift them by 0 so that exp gives 0, not NaN.
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)
            p = tl.exp(logits - shift[:, :, None])
            rescale = tl.exp(row_max - shift)
            row_sum = row_sum * rescale + tl.sum(p, axis=2)
            row_max = new_max
            if not POST:
                vt3 = _key_columns(V, b, kv_heads, head_ok, s, stride_vb, stride_vh, stride_vt, T, D, DP)
                pv = _dot(p.to(V.dtype.element_ty), tl.permute(vt3, (0, 2, 1)), PREC, WIDEN)
                acc = acc * rescale[:, :, None] + pv
        # Rows past the end (and padded heads) saw no key: lse 0, never used.
        seen = row_sum > 0
        lse = tl.where(seen, row_max + tl.log(tl.where(seen, row_sum, 1.0)), 0.0)

        if POST:
            # Pass 2: exact probabilities from the log-sum-exp, post-composed, times V.
            for s0 in range(lo, hi, BS):
                s = s0 + tl.arange(0, BS)
                pre_kw1, pre_kw2, pre_kdd, post_kw1, post_kw2, post_kdd = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
                if KEY_WISE:
                    if PRE:
                        pre_kw1, pre_kw2, pre_kdd = _key_weights(WK, bg, s0, T, 0, R, RP, M, MP, BS, SLOTS)
                    post_kw1, post_kw2, post_kdd = _key_weights(WK, bg, s0, T, SLOTS - 1, R, RP, M, MP, BS, SLOTS)
                kt3 = _key_columns(K, b, kv_heads, head_ok, s, stride_kb, stride_kh, stride_kt, T, D, DP)
                allowed = _allowed(t, s, head_ok, T, window, LOCAL)
                _, _, _, _, mixed, _, _ = _probabilities(
                    q3, kt3, lse, allowed, scale,
                    pre_qw1, pre_qw2, pre_qdd, pre_kw1, pre_kw2, pre_kdd,
                    post_qw1, post_qw2, post_qdd, post_kw1, post_kw2, post_kdd,
                    PRE, POST, KEY_WISE, PREC, WIDEN,
                )  # fmt: skip
                vt3 = _key_columns(V, b, kv_heads, head_ok, s, stride_vb, stride_vh, stride_vt, T, D, DP)
                acc += _dot(mixed.to(V.dtype.element_ty), tl.permute(vt3, (0, 2, 1)), PREC, WIDEN)
        else:
            acc = acc / tl.where(seen, row_sum, 1.0)[:, :, None]

        d = tl.arange(0, DP)
        rows = (b * H + q_heads[:, None]) * T + t[None, :]
        row_ok = head_ok[:, None] & (t[None, :] < T)
        tl.store(LSE + rows, lse, mask=row_ok)
        out_ok = row_ok[:, :, None] & (d[None, None, :] < D)
        tl.store(OUT + rows[:, :, None] * D + d[None, None, :], acc.to(OUT.dtype.element_ty), mask=out_ok)

    @triton.jit
    def _backward_query_kernel(
        Q, K, V, DO, WQ, WK, LSE, DELTA, DQ, DWQ,
        stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
        stride_ob, stride_oh, stride_ot,
        H, T, G, n_rep, window, scale,
        M: tl.constexpr, MP: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
        BT: tl.constexpr, BS: tl.constexpr, PRE: tl.constexpr, POST: tl.constexpr, KEY_WISE: tl.constexpr,
        LOCAL: tl.constexpr, PREC: tl.constexpr, WIDEN: tl.constexpr,
    ):  # fmt: skip
        """dq and the query-side weight gradients of one query block (with post-composition, D first)."""
        SLOTS: tl.constexpr = PRE + POST
        bg = tl.program_id(1)
        b = bg // G
        t0 = tl.program_id(0) * BT
        heads = tl.arange(0, MP)
        head_ok = heads < M
        q_heads = (bg % G) * M + heads
        kv_heads = tl.where(head_ok, q_heads // n_rep, 0)
        t = t0 + tl.arange(0, BT)
        q3 = _query_rows(Q, b, q_heads, head_ok, t, stride_qb, stride_qh, stride_qt, T, D, DP)
        do3 = _query_rows(DO, b, q_heads, head_ok, t, stride_ob, stride_oh, stride_ot, T, D, DP)
        rows = (b * H + q_heads[:, None]) * T + t[None, :]
        row_ok = head_ok[:, None] & (t[None, :] < T)
        lse = tl.load(LSE + rows, mask=row_ok, other=0.0)
        pre_qw1, pre_qw2, pre_qdd, post_qw1, post_qw2, post_qdd = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
        if PRE:
            pre_qw1, pre_qw2, pre_qdd = _query_weights(WQ, bg, t0, T, 0, R, RP, M, MP, BT, SLOTS)
        if POST:
            post_qw1, post_qw2, post_qdd = _query_weights(WQ, bg, t0, T, SLOTS - 1, R, RP, M, MP, BT, SLOTS)
        lo = 0
        if LOCAL:
            lo = tl.maximum(t0 - window + 1, 0) // BS * BS
        hi = tl.minimum(t0 + BT, T)

        if POST:
            # D_n[t] = Σ_s P_n·dP_n, with dP the gradient of P once the post-mix is undone: one more pass.
            delta = tl.zeros((MP, BT), tl.float32)
            for s0 in range(lo, hi, BS):
                s = s0 + tl.arange(0, BS)
                pre_kw1, pre_kw2, pre_kdd, post_kw1, post_kw2, post_kdd = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
                if KEY_WISE:
                    if PRE:
                        pre_kw1, pre_kw2, pre_kdd = _key_weights(WK, bg, s0, T, 0, R, RP, M, MP, BS, SLOTS)
                    post_kw1, post_kw2, post_kdd = _key_weights(WK, bg, s0, T, SLOTS - 1, R, RP, M, MP, BS, SLOTS)
                kt3 = _key_columns(K, b, kv_heads, head_ok, s, stride_kb, stride_kh, stride_kt, T, D, DP)
                vt3 = _key_columns(V, b, kv_heads, head_ok, s, stride_vb, stride_vh, stride_vt, T, D, DP)
                allowed = _allowed(t, s, head_ok, T, window, LOCAL)
                _, _, _, probs, _, post_mix_q, post_mix_k = _probabilities(
                    q3, kt3, lse, allowed, scale,
                    pre_qw1, pre_qw2, pre_qdd, pre_kw1, pre_kw2, pre_kdd,
                    post_qw1, post_qw2, post_qdd, post_kw1, post_kw2, post_kdd,
                    PRE, POST, KEY_WISE, PREC, WIDEN,
                )  # fmt: skip
                grad_mixed = _dot(do3, vt3, PREC, WIDEN)
                grad_probs, _, _, _ = _compose_backward(
                    grad_mixed, probs, post_mix_q, post_mix_k,
                    post_qw1, post_qw2, post_qdd, post_kw1, post_kw2, post_kdd, KEY_WISE, True,
                )  # fmt: skip
                delta += tl.sum(probs * grad_probs, axis=2)
            tl.store(DELTA + rows, delta, mask=row_ok)
        else:
            delta = tl.load(DELTA + rows, mask=row_ok, other=0.0)

        grad_q = tl.zeros((MP, BT, DP), tl.float32)
        pre_gw1 = tl.zeros((RP, MP, BT), tl.float32)
        pre_gw2 = tl.zeros((RP, MP, BT), tl.float32)
        pre_gdd = tl.zeros((MP, BT), tl.float32)
        post_gw1 = tl.zeros((RP, MP, BT), tl.float32)
        post_gw2 = tl.zeros((RP, MP, BT), tl.float32)
        post_gdd = tl.zeros((MP, BT), tl.float32)
        for s0 in range(lo, hi, BS):
            s = s0 + tl.arange(0, BS)
            pre_kw1, pre_kw2, pre_kdd, post_kw1, post_kw2, post_kdd = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
            if KEY_WISE:
                if PRE:
                    pre_kw1, pre_kw2, pre_kdd = _key_weights(WK, bg, s0, T, 0, R, RP, M, MP, BS, SLOTS)
                if POST:
                    post_kw1, post_kw2, post_kdd = _key_weights(WK, bg, s0, T, SLOTS - 1, R, RP, M, MP, BS, SLOTS)
            kt3 = _key_columns(K, b, kv_heads, head_ok, s, stride_kb, stride_kh, stride_kt, T, D, DP)
            vt3 = _key_columns(V, b, kv_heads, head_ok, s, stride_vb, stride_vh, stride_vt, T, D, DP)
            allowed = _allowed(t, s, head_ok, T, window, LOCAL)
            logits, pre_mix_q, pre_mix_k, probs, _, post_mix_q, post_mix_k = _probabilities(
                q3, kt3, lse, allowed, scale,
                pre_qw1, pre_qw2, pre_qdd, pre_kw1, pre_kw2, pre_kdd,
                post_qw1, post_qw2, post_qdd, post_kw1, post_kw2, post_kdd,
                PRE, POST, KEY_WISE, PREC, WIDEN,
            )  # fmt: skip
            grad_probs = _dot(do3, vt3, PREC, WIDEN)
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
            grad_q += _dot(grad_logits.to(Q.dtype.element_ty), tl.permute(kt3, (0, 2, 1)), PREC, WIDEN)

        d = tl.arange(0, DP)
        out_ok = row_ok[:, :, None] & (d[None, None, :] < D)
        tl.store(DQ + rows[:, :, None] * D + d[None, None, :], (grad_q * scale).to(DQ.dtype.element_ty), mask=out_ok)
        if PRE:
            _store_weights(DWQ, bg, t0, T, 0, pre_gw1, pre_gw2, pre_gdd, R, RP, M, MP, BT, SLOTS)
        if POST:
            _store_weights(DWQ, bg, t0, T, SLOTS - 1, post_gw1, post_gw2, post_gdd, R, RP, M, MP, BT, SLOTS)

    @triton.jit
    def _backward_key_kernel(
        Q, K, V, DO, WQ, WK, LSE, DELTA, DK, DV, DWK,
        stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
        stride_ob, stride_oh, stride_ot,
        H, T, G, n_rep, window, scale,
        M: tl.constexpr, MP: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
        BT: tl.constexpr, BS: tl.constexpr, PRE: tl.constexpr, POST: tl.constexpr, KEY_WISE: tl.constexpr,
        LOCAL: tl.constexpr, PREC: tl.constexpr, WIDEN: tl.constexpr,
    ):  # fmt: skip
        """dk, dv (per query head) and the key-side weight gradients of one key block, over the queries that see it."""
        SLOTS: tl.constexpr = PRE + POST
        bg = tl.program_id(1)
        b = bg // G
        s0 = tl.program_id(0) * BS
        heads = tl.arange(0, MP)
        head_ok = heads < M
        q_heads = (bg % G) * M + heads
        kv_heads = tl.where(head_ok, q_heads // n_rep, 0)
        s = s0 + tl.arange(0, BS)
        kt3 = _key_columns(K, b, kv_heads, head_ok, s, stride_kb, stride_kh, stride_kt, T, D, DP)
        vt3 = _key_columns(V, b, kv_heads, head_ok, s, stride_vb, stride_vh, stride_vt, T, D, DP)
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

        grad_k = tl.zeros((MP, BS, DP), tl.float32)
        grad_v = tl.zeros((MP, BS, DP), tl.float32)
        pre_gw1 = tl.zeros((RP, MP, BS), tl.float32)
        pre_gw2 = tl.zeros((RP, MP, BS), tl.float32)
        pre_gdd = tl.zeros((MP, BS), tl.float32)
        post_gw1 = tl.zeros((RP, MP, BS), tl.float32)
        post_gw2 = tl.zeros((RP, MP, BS), tl.float32)
        post_gdd = tl.zeros((MP, BS), tl.float32)
        for t0 in range(lo, hi, BT):
            t = t0 + tl.arange(0, BT)
            q3 = _query_rows(Q, b, q_heads, head_ok, t, stride_qb, stride_qh, stride_qt, T, D, DP)
            do3 = _query_rows(DO, b, q_heads, head_ok, t, stride_ob, stride_oh, stride_ot, T, D, DP)
            rows = (b * H + q_heads[:, None]) * T + t[None, :]
            row_ok = head_ok[:, None] & (t[None, :] < T)
            lse = tl.load(LSE + rows, mask=row_ok, other=0.0)
            delta = tl.load(DELTA + rows, mask=row_ok, other=0.0)
            pre_qw1, pre_qw2, pre_qdd, post_qw1, post_qw2, post_qdd = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
            if PRE:
                pre_qw1, pre_qw2, pre_qdd = _query_weights(WQ, bg, t0, T, 0, R, RP, M, MP, BT, SLOTS)
            if POST:
                post_qw1, post_qw2, post_qdd = _query_weights(WQ, bg, t0, T, SLOTS - 1, R, RP, M, MP, BT, SLOTS)
            allowed = _allowed(t, s, head_ok, T, window, LOCAL)
            logits, pre_mix_q, pre_mix_k, probs, mixed, post_mix_q, post_mix_k = _probabilities(
                q3, kt3, lse, allowed, scale,
                pre_qw1, pre_qw2, pre_qdd, pre_kw1, pre_kw2, pre_kdd,
                post_qw1, post_qw2, post_qdd, post_kw1, post_kw2, post_kdd,
                PRE, POST, KEY_WISE, PREC, WIDEN,
            )  # fmt: skip
            grad_v += _dot(tl.permute(mixed, (0, 2, 1)).to(DO.dtype.element_ty), do3, PREC, WIDEN)
            grad_probs = _dot(do3, vt3, PREC, WIDEN)
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
            grad_k += _dot(tl.permute(grad_logits, (0, 2, 1)).to(Q.dtype.element_ty), q3, PREC, WIDEN)

        d = tl.arange(0, DP)
        cols = (b * H + q_heads[:, None]) * T + s[None, :]
        col_ok = (head_ok[:, None] & (s[None, :] < T))[:, :, None] & (d[None, None, :] < D)
        tl.store(DK + cols[:, :, None] * D + d[None, None, :], grad_k * scale, mask=col_ok)
        tl.store(DV + cols[:, :, None] * D + d[None, None, :], grad_v, mask=col_ok)
        if KEY_WISE:
            if PRE:
                _store_weights(DWK, bg, s0, T, 0, pre_gw1, pre_gw2, pre_gdd, R, RP, M, MP, BS, SLOTS)
            if POST:
                _store_weights(DWK, bg, s0, T, SLOTS - 1, post_gw1, post_gw2, post_gdd, R, RP, M, MP, BS, SLOTS)

    INTERPRETED = not isinstance(_forward_kernel, triton.runtime.JITFunction)  # TRITON_INTERPRET=1: CPU tensors
    KERNELS_BY_NAME = {
        "forward": _forward_kernel,
        "backward_query": _backward_query_kernel,
        "backward_key": _backward_key_kernel,
    }
