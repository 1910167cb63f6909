// Causal ALiBi attention on the CPU without a T×T bias: a flash-style tiled kernel, forward and backward.
//
//   O = softmax(S) V,   S_ij = scale · q_i·k_j + m_h · (j − i)  for j ≤ i,   −∞ for j > i
//
// (Press, Smith & Lewis, ICLR 2022, §3: the bias −m_h·(i − j) on the scaled logits, m_h the head's slope.)
// The bias is a function of (h, i, j), so each score tile adds it as it is computed and no (H, T, T) tensor
// exists. The forward pass is FlashAttention's online softmax (Dao et al., 2022, Alg. 1; Dao, 2023, Alg. 1):
// per query tile, over the key tiles at or left of the diagonal (the rest are skipped),
//
//   m' = max(m, rowmax S),  P = exp(S − m'),  l' = e^{m − m'} l + rowsum P,  O' = e^{m − m'} O + P V,
//
// ending with O / l and the log-sum-exp L = m + log l, which is all the backward pass keeps (FlashAttention-2,
// Alg. 2): it recomputes P = exp(S − L) tile by tile and with D_i = rowsum(dO_i ∘ O_i) takes
//
//   dV = Pᵀ dO,  dP = dO Vᵀ,  dS = P ∘ (dP − D),  dQ = scale · dS K,  dK = scale · dSᵀ Q.
//
// Tile products are BLAS calls on views of the operands and of per-task scratch (attnzoo_cpu::gemm: the BLAS
// PyTorch was built with, without ATen's dispatch); only the elementwise softmax steps are written here, with
// ATen's vector type. Math is fp32 throughout: the Python side upcasts bf16 operands (kernels/cpu.py).
//
// Grouped-query attention reads kv head h / n_rep for query head h without copying k and v. Parallelism: the
// forward pass over (batch·head, query tile), whose outputs are disjoint; the backward pass over (batch, kv head),
// so that the query heads sharing a kv head, which all add into its dK and dV, run in one task without atomics.

#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
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
using attnzoo_cpu::scale_row;
using attnzoo_cpu::Vec;

void check_operands(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& slopes) {
  for (const at::Tensor* x : {&q, &k, &v, &slopes}) {
    TORCH_CHECK(x->device().is_cpu() && x->scalar_type() == at::kFloat && x->is_contiguous(),
                "alibi_flash: operands must be contiguous fp32 CPU tensors");
  }
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "alibi_flash: q, k, v must be (B, heads, T, d)");
  TORCH_CHECK(k.size(2) == q.size(2) && v.size(2) == q.size(2), "alibi_flash: a fresh sequence, T queries, T keys");
  TORCH_CHECK(q.size(1) % k.size(1) == 0 && v.size(1) == k.size(1), "alibi_flash: heads must be a multiple of kv heads");
  TORCH_CHECK(slopes.dim() == 1 && slopes.size(0) == q.size(1), "alibi_flash: one slope per query head");
}

}  // namespace

// q (B, H, T, d), k (B, H_kv, T, d), v (B, H_kv, T, d_v), slopes (H,): all contiguous fp32.
// Returns O (B, H, T, d_v) and L (B, H, T), the log-sum-exp of each row's scores.
std::tuple<at::Tensor, at::Tensor> alibi_flash_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& slopes, double scale,
    int64_t q_tile, int64_t k_tile) {
  check_operands(q, k, v, slopes);
  const int64_t batch = q.size(0), heads = q.size(1), kv_heads = k.size(1), len = q.size(2);
  const int64_t d = q.size(3), dv = v.size(3), n_rep = heads / kv_heads;
  const int64_t q_tiles = (len + q_tile - 1) / q_tile;
  at::Tensor out = at::empty({batch, heads, len, dv}, q.options());
  at::Tensor lse = at::empty({batch, heads, len}, q.options());
  const float* slope_of = slopes.data_ptr<float>();
  const float fscale = static_cast<float>(scale);

  at::parallel_for(0, batch * heads * q_tiles, 1, [&](int64_t begin, int64_t end) {
    // Scratch for one task at a time, O(q_tile·k_tile): a score tile, the running output and row statistics.
    std::vector<float> scores(q_tile * k_tile), acc(q_tile * dv), row_max(q_tile), row_sum(q_tile);
    const FlushSubnormals flush;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bh = task / q_tiles, i0 = balanced_tile(task % q_tiles, q_tiles) * q_tile;
      const int64_t rows = std::min(q_tile, len - i0);
      const int64_t b = bh / heads, h = bh % heads, g = h / n_rep;
      const float slope = slope_of[h];
      const Mat q_i = matrix_of(q, bh).rows_at(i0, rows), k_bg = matrix_of(k, b * kv_heads + g);
      const Mat v_bg = matrix_of(v, b * kv_heads + g), acc_i = dense(acc.data(), rows, dv);
      float* acc_ptr = acc.data();
      std::fill(acc_ptr, acc_ptr + rows * dv, 0.f);
      std::fill(row_max.begin(), row_max.end(), -std::numeric_limits<float>::infinity());
      std::fill(row_sum.begin(), row_sum.end(), 0.f);
      // Causal tile skipping: key tiles that start after the tile's last query hold only masked scores.
      for (int64_t j0 = 0; j0 < i0 + rows; j0 += k_tile) {
        const int64_t cols = std::min(k_tile, len - j0);
        const Mat s = dense(scores.data(), rows, cols);
        gemm(s, q_i, k_bg.rows_at(j0, cols).t());
        float* s_ptr = s.data;
        for (int64_t r = 0; r < rows; ++r) {
          online_softmax_row(s_ptr + r * cols, cols, fscale, slope, j0, i0 + r, row_max[r], row_sum[r],
                             acc_ptr + r * dv, dv);
        }
        gemm(acc_i, s, v_bg.rows_at(j0, cols), 1.f, 1.f);
      }
      // Every row saw key 0 in the first tile, so its sum is at least exp(0) = 1 of the max: no division by 0.
      float* lse_ptr = lse.data_ptr<float>() + bh * len + i0;
      float* out_ptr = out.data_ptr<float>() + (bh * len + i0) * dv;
      for (int64_t r = 0; r < rows; ++r) {
        lse_ptr[r] = row_max[r] + std::log(row_sum[r]);
        std::copy(acc_ptr + r * dv, acc_ptr + (r + 1) * dv, out_ptr + r * dv);
        scale_row(out_ptr + r * dv, dv, 1.f / row_sum[r]);
      }
    }
  });
  return {out, lse};
}

// The gradients of alibi_flash_forward's O with respect to q, k, v, given dO and the saved O and L; fp32.
std::tuple<at::Tensor, at::Tensor, at::Tensor> alibi_flash_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& slopes, double scale, int64_t q_tile,
    int64_t k_tile) {
  check_operands(q, k, v, slopes);
  TORCH_CHECK(grad_out.sizes() == out.sizes() && grad_out.is_contiguous() && grad_out.scalar_type() == at::kFloat,
              "alibi_flash: dO must be contiguous fp32, shaped as O");
  const int64_t batch = q.size(0), heads = q.size(1), kv_heads = k.size(1), len = q.size(2);
  const int64_t dv = v.size(3), n_rep = heads / kv_heads;
  // D_i = rowsum(dO_i ∘ O_i) = Σ_j P_ij dP_ij: the softmax's Jacobian term, one number per query.
  at::Tensor delta = (grad_out * out.to(at::kFloat)).sum(-1);
  at::Tensor grad_q = at::zeros_like(q), grad_k = at::zeros_like(k), grad_v = at::zeros_like(v);
  const float* slope_of = slopes.data_ptr<float>();
  const float fscale = static_cast<float>(scale);

  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> probs(q_tile * k_tile), dprobs(q_tile * k_tile);
    const FlushSubnormals flush;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / kv_heads, g = task % kv_heads;
      // Key tiles outside, so that a tile's dK and dV rows stay in cache while every query that sees them adds in.
      for (int64_t j0 = 0; j0 < len; j0 += k_tile) {
        const int64_t cols = std::min(k_tile, len - j0);
        const Mat k_j = matrix_of(k, task).rows_at(j0, cols), v_j = matrix_of(v, task).rows_at(j0, cols);
        const Mat dk_j = matrix_of(grad_k, task).rows_at(j0, cols), dv_j = matrix_of(grad_v, task).rows_at(j0, cols);
        for (int64_t h = g * n_rep; h < (g + 1) * n_rep; ++h) {
          const float slope = slope_of[h];
          const float* lse_ptr = lse.data_ptr<float>() + (b * heads + h) * len;
          const float* delta_ptr = delta.data_ptr<float>() + (b * heads + h) * len;
          // Causal tile skipping: only query tiles that reach key j0 see this key tile.
          for (int64_t i0 = (j0 / q_tile) * q_tile; i0 < len; i0 += q_tile) {
            const int64_t rows = std::min(q_tile, len - i0);
            const Mat q_i = matrix_of(q, b * heads + h).rows_at(i0, rows);
            const Mat do_i = matrix_of(grad_out, b * heads + h).rows_at(i0, rows);
            const Mat p = dense(probs.data(), rows, cols), dp = dense(dprobs.data(), rows, cols);
            gemm(p, q_i, k_j.t());
            gemm(dp, do_i, v_j.t());
            float* p_ptr = p.data;
            float* dp_ptr = dp.data;
            for (int64_t r = 0; r < rows; ++r) {
              const int64_t i = i0 + r;
              float* p_row = p_ptr + r * cols;
              float* ds_row = dp_ptr + r * cols;
              probability_row(p_row, cols, fscale, slope, j0, i, lse_ptr[i]);
              // dS = P ∘ (dP − D); the masked columns have P = 0 and so dS = 0.
              const Vec d_i(delta_ptr[i]);
              int64_t c = 0;
              for (; c + kLanes <= cols; c += kLanes) {
                (Vec::loadu(p_row + c) * (Vec::loadu(ds_row + c) - d_i)).store(ds_row + c);
              }
              for (; c < cols; ++c) {
                ds_row[c] = p_row[c] * (ds_row[c] - delta_ptr[i]);
              }
            }
            gemm(dv_j, p.t(), do_i, 1.f, 1.f);
            gemm(dk_j, dp.t(), q_i, static_cast<float>(scale), 1.f);
            gemm(matrix_of(grad_q, b * heads + h).rows_at(i0, rows), dp, k_j, static_cast<float>(scale), 1.f);
          }
        }
      }
    }
  });
  return {grad_q, grad_k, grad_v};
}

TORCH_LIBRARY(attnzoo, m) {
  m.def("alibi_flash_forward(Tensor q, Tensor k, Tensor v, Tensor slopes, float scale, int q_tile, int k_tile)"
        " -> (Tensor, Tensor)");
  m.def("alibi_flash_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor slopes,"
        " float scale, int q_tile, int k_tile) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(attnzoo, CPU, m) {
  m.impl("alibi_flash_forward", &alibi_flash_forward);
  m.impl("alibi_flash_backward", &alibi_flash_backward);
}
