// Causal differential attention on the CPU in one kernel, forward and backward (Ye et al., 2024, Eq. 1):
//
//   O = (A1 − λ·A2) V,   A_m = softmax(S_m),   S_m,ij = scale · q_m,i·k_m,j + s_h·(j − i) for j ≤ i, −∞ for j > i
//
// for the query/key sub-heads m = 1, 2 of one differential head h (sub-heads 2h and 2h+1 of q, 2g and 2g+1 of k for
// its kv head g) and its value head of width 2d; s_h is ALiBi's slope where the model uses ALiBi, else 0.
//
// Two SDPA calls, which the PyTorch path makes, multiply V twice in the forward pass and, in the backward pass,
// take dP = dO Vᵀ and dV twice, once per map. Here one task holds both maps of a query tile: the forward pass
// keeps both online softmaxes (FlashAttention, Dao et al., 2022, Alg. 1) and multiplies the two maps' tiles,
// stacked as one (2·rows, cols) matrix, by V in one product; the backward pass (FlashAttention-2, Alg. 2) shares
// the one dP = dO Vᵀ between the maps and multiplies the difference map by dO once:
//
//   dV = (A1 − λA2)ᵀ dO,   dS1 = A1 ∘ (dP − D1),   dS2 = −λ·A2 ∘ (dP − D2),   D_m = rowsum(dO ∘ O_m),
//   dQ_m = scale · dS_m K_m,   dK_m = scale · dS_mᵀ Q_m,
//
// with O_m = A_m V the normalised output of each map (O2 is saved; O1 = O + λ·O2). dλ = −Σ D2 is taken by the
// Python side. The tile products are BLAS calls (attnzoo_cpu::gemm), in fp32.
//
// Grouped-query attention reads kv head h / n_rep without copying. Parallelism as alibi_flash.cpp: the forward
// pass over (batch·head, query tile), the backward pass over (batch, kv head), whose dK and dV are its own.

#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "flash_rows.h"
#include "fused_common.h"

namespace {

using attnzoo_cpu::balanced_tile;
using attnzoo_cpu::dense;
using attnzoo_cpu::FlushSubnormals;
using attnzoo_cpu::gemm;
using attnzoo_cpu::kLanes;
using attnzoo_cpu::Mat;
using attnzoo_cpu::matrix_of;
using attnzoo_cpu::online_softmax_row;
using attnzoo_cpu::probability_row;
using attnzoo_cpu::Vec;

void check_operands(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& slopes) {
  for (const at::Tensor* x : {&q, &k, &v, &slopes}) {
    TORCH_CHECK(x->device().is_cpu() && x->scalar_type() == at::kFloat && x->is_contiguous(),
                "diff_flash: operands must be contiguous fp32 CPU tensors");
  }
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "diff_flash: q, k, v must be (B, heads, T, d)");
  TORCH_CHECK(q.size(1) % 2 == 0 && k.size(1) == 2 * v.size(1), "diff_flash: two q/k sub-heads per head");
  TORCH_CHECK(k.size(2) == q.size(2) && v.size(2) == q.size(2), "diff_flash: a fresh sequence, T queries, T keys");
  TORCH_CHECK((q.size(1) / 2) % v.size(1) == 0, "diff_flash: heads must be a multiple of kv heads");
  TORCH_CHECK(slopes.dim() == 1 && slopes.size(0) == q.size(1) / 2, "diff_flash: one slope per differential head");
}

}  // namespace

// q (B, 2H, T, d), k (B, 2H_kv, T, d): sub-heads 2h and 2h+1 of head h; v (B, H_kv, T, 2d); slopes (H,); all
// contiguous fp32. Returns O (B, H, T, 2d), O2 (B, H, T, 2d), the second map's own output, and L (B, H, 2, T), the
// log-sum-exp of each row of each map.
std::tuple<at::Tensor, at::Tensor, at::Tensor> diff_flash_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& slopes, double lambda,
    double scale, int64_t q_tile, int64_t k_tile) {
  check_operands(q, k, v, slopes);
  const int64_t batch = q.size(0), heads = q.size(1) / 2, kv_heads = v.size(1), len = q.size(2);
  const int64_t dv = v.size(3), n_rep = heads / kv_heads;
  const int64_t q_tiles = (len + q_tile - 1) / q_tile;
  at::Tensor out = at::empty({batch, heads, len, dv}, q.options());
  at::Tensor out2 = at::empty({batch, heads, len, dv}, q.options());
  at::Tensor lse = at::empty({batch, heads, 2, len}, q.options());
  const float* slope_of = slopes.data_ptr<float>();
  const float fscale = static_cast<float>(scale), flambda = static_cast<float>(lambda);

  at::parallel_for(0, batch * heads * q_tiles, 1, [&](int64_t begin, int64_t end) {
    // Both maps' score tiles stacked, map 1's rows first: one (2·rows, cols) product with V serves both.
    std::vector<float> scores(2 * q_tile * k_tile), acc(2 * q_tile * dv), row_max(2 * q_tile), row_sum(2 * q_tile);
    const FlushSubnormals flush;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bh = task / q_tiles, i0 = balanced_tile(task % q_tiles, q_tiles) * q_tile;
      const int64_t rows = std::min(q_tile, len - i0);
      const int64_t b = bh / heads, h = bh % heads, g = h / n_rep;
      const float slope = slope_of[h];
      const Mat q1 = matrix_of(q, 2 * bh).rows_at(i0, rows), q2 = matrix_of(q, 2 * bh + 1).rows_at(i0, rows);
      const Mat k1 = matrix_of(k, 2 * (b * kv_heads + g)), k2 = matrix_of(k, 2 * (b * kv_heads + g) + 1);
      const Mat v_g = matrix_of(v, b * kv_heads + g), acc_i = dense(acc.data(), 2 * rows, dv);
      float* acc_ptr = acc.data();
      std::fill(acc_ptr, acc_ptr + 2 * rows * dv, 0.f);
      std::fill(row_max.begin(), row_max.end(), -std::numeric_limits<float>::infinity());
      std::fill(row_sum.begin(), row_sum.end(), 0.f);
      for (int64_t j0 = 0; j0 < i0 + rows; j0 += k_tile) {  // key tiles past the diagonal are skipped
        const int64_t cols = std::min(k_tile, len - j0);
        const Mat s = dense(scores.data(), 2 * rows, cols);
        gemm(s.rows_at(0, rows), q1, k1.rows_at(j0, cols).t());
        gemm(s.rows_at(rows, rows), q2, k2.rows_at(j0, cols).t());
        float* s_ptr = s.data;
        for (int64_t r = 0; r < 2 * rows; ++r) {  // stacked row r is query i0 + r mod rows of map 1 + r / rows
          online_softmax_row(s_ptr + r * cols, cols, fscale, slope, j0, i0 + r % rows, row_max[r], row_sum[r],
                             acc_ptr + r * dv, dv);
        }
        gemm(acc_i, s, v_g.rows_at(j0, cols), 1.f, 1.f);
      }
      float* lse_ptr = lse.data_ptr<float>() + bh * 2 * len + i0;
      float* out_ptr = out.data_ptr<float>() + (bh * len + i0) * dv;
      float* out2_ptr = out2.data_ptr<float>() + (bh * len + i0) * dv;
      for (int64_t r = 0; r < rows; ++r) {
        lse_ptr[r] = row_max[r] + std::log(row_sum[r]);
        lse_ptr[len + r] = row_max[rows + r] + std::log(row_sum[rows + r]);
        const Vec a1(1.f / row_sum[r]), a2(1.f / row_sum[rows + r]), lam(flambda);
        const float* o1 = acc_ptr + r * dv;
        const float* o2 = acc_ptr + (rows + r) * dv;
        int64_t c = 0;
        for (; c + kLanes <= dv; c += kLanes) {
          const Vec second = Vec::loadu(o2 + c) * a2;
          second.store(out2_ptr + r * dv + c);
          (Vec::loadu(o1 + c) * a1 - lam * second).store(out_ptr + r * dv + c);
        }
        for (; c < dv; ++c) {
          const float second = o2[c] / row_sum[rows + r];
          out2_ptr[r * dv + c] = second;
          out_ptr[r * dv + c] = o1[c] / row_sum[r] - flambda * second;
        }
      }
    }
  });
  return {out, out2, lse};
}

// The gradients of diff_flash_forward's O with respect to q, k, v, given dO, the saved L and D (B, H, 2, T), the
// rows' D_m = rowsum(dO ∘ O_m); fp32.
std::tuple<at::Tensor, at::Tensor, at::Tensor> diff_flash_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& lse,
    const at::Tensor& delta, const at::Tensor& slopes, double lambda, double scale, int64_t q_tile, int64_t k_tile) {
  check_operands(q, k, v, slopes);
  const int64_t batch = q.size(0), heads = q.size(1) / 2, kv_heads = v.size(1), len = q.size(2);
  const int64_t dv = v.size(3), n_rep = heads / kv_heads;
  TORCH_CHECK(grad_out.is_contiguous() && grad_out.scalar_type() == at::kFloat &&
                  grad_out.sizes() == at::IntArrayRef({batch, heads, len, dv}),
              "diff_flash: dO must be contiguous fp32 (B, H, T, 2d)");
  TORCH_CHECK(lse.is_contiguous() && delta.is_contiguous() && lse.sizes() == at::IntArrayRef({batch, heads, 2, len}) &&
                  delta.sizes() == lse.sizes(),
              "diff_flash: L and D must be contiguous (B, H, 2, T)");
  at::Tensor grad_q = at::zeros_like(q), grad_k = at::zeros_like(k), grad_v = at::zeros_like(v);
  const float* slope_of = slopes.data_ptr<float>();
  const float fscale = static_cast<float>(scale), flambda = static_cast<float>(lambda);

  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    // probs: both maps' probabilities stacked; after each row's step it holds the difference map A1 − λA2 in map
    // 1's rows and dS2 in map 2's. dprobs: dP = dO Vᵀ, then dS1.
    std::vector<float> probs(2 * q_tile * k_tile), dprobs(q_tile * k_tile);
    const FlushSubnormals flush;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / kv_heads, g = task % kv_heads;
      for (int64_t j0 = 0; j0 < len; j0 += k_tile) {
        const int64_t cols = std::min(k_tile, len - j0);
        const Mat k1 = matrix_of(k, 2 * task).rows_at(j0, cols), k2 = matrix_of(k, 2 * task + 1).rows_at(j0, cols);
        const Mat v_j = matrix_of(v, task).rows_at(j0, cols);
        const Mat dk1 = matrix_of(grad_k, 2 * task).rows_at(j0, cols);
        const Mat dk2 = matrix_of(grad_k, 2 * task + 1).rows_at(j0, cols);
        const Mat dv_j = matrix_of(grad_v, task).rows_at(j0, cols);
        for (int64_t h = g * n_rep; h < (g + 1) * n_rep; ++h) {
          const float slope = slope_of[h];
          const float* lse_ptr = lse.data_ptr<float>() + (b * heads + h) * 2 * len;
          const float* delta_ptr = delta.data_ptr<float>() + (b * heads + h) * 2 * len;
          for (int64_t i0 = (j0 / q_tile) * q_tile; i0 < len; i0 += q_tile) {
            const int64_t rows = std::min(q_tile, len - i0);
            const int64_t bh = b * heads + h;
            const Mat q1 = matrix_of(q, 2 * bh).rows_at(i0, rows), q2 = matrix_of(q, 2 * bh + 1).rows_at(i0, rows);
            const Mat do_i = matrix_of(grad_out, bh).rows_at(i0, rows);
            const Mat p = dense(probs.data(), 2 * rows, cols), dp = dense(dprobs.data(), rows, cols);
            const Mat p1 = p.rows_at(0, rows), p2 = p.rows_at(rows, rows);
            gemm(p1, q1, k1.t());
            gemm(p2, q2, k2.t());
            gemm(dp, do_i, v_j.t());
            float* p_ptr = p.data;
            float* dp_ptr = dp.data;
            for (int64_t r = 0; r < rows; ++r) {
              const int64_t i = i0 + r;
              float* a1 = p_ptr + r * cols;
              float* a2 = p_ptr + (rows + r) * cols;
              float* ds1 = dp_ptr + r * cols;
              probability_row(a1, cols, fscale, slope, j0, i, lse_ptr[i]);
              probability_row(a2, cols, fscale, slope, j0, i, lse_ptr[len + i]);
              // Masked columns have A1 = A2 = 0, so every quantity below is 0 there.
              const Vec d1(delta_ptr[i]), d2(delta_ptr[len + i]), lam(flambda);
              int64_t c = 0;
              for (; c + kLanes <= cols; c += kLanes) {
                const Vec x1 = Vec::loadu(a1 + c), x2 = Vec::loadu(a2 + c), dpc = Vec::loadu(ds1 + c);
                (x1 * (dpc - d1)).store(ds1 + c);
                (Vec(0.f) - lam * x2 * (dpc - d2)).store(a2 + c);
                (x1 - lam * x2).store(a1 + c);
              }
              for (; c < cols; ++c) {
                const float x1 = a1[c], x2 = a2[c], dpc = ds1[c];
                ds1[c] = x1 * (dpc - delta_ptr[i]);
                a2[c] = -flambda * x2 * (dpc - delta_ptr[len + i]);
                a1[c] = x1 - flambda * x2;
              }
            }
            gemm(dv_j, p1.t(), do_i, 1.f, 1.f);
            gemm(dk1, dp.t(), q1, fscale, 1.f);
            gemm(dk2, p2.t(), q2, fscale, 1.f);
            gemm(matrix_of(grad_q, 2 * bh).rows_at(i0, rows), dp, k1, fscale, 1.f);
            gemm(matrix_of(grad_q, 2 * bh + 1).rows_at(i0, rows), p2, k2, fscale, 1.f);
          }
        }
      }
    }
  });
  return {grad_q, grad_k, grad_v};
}

TORCH_LIBRARY_FRAGMENT(attnzoo, m) {
  m.def("diff_flash_forward(Tensor q, Tensor k, Tensor v, Tensor slopes, float lam, float scale, int q_tile,"
        " int k_tile) -> (Tensor, Tensor, Tensor)");
  m.def("diff_flash_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor lse, Tensor delta,"
        " Tensor slopes, float lam, float scale, int q_tile, int k_tile) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(attnzoo, CPU, m) {
  m.impl("diff_flash_forward", &diff_flash_forward);
  m.impl("diff_flash_backward", &diff_flash_backward);
}
