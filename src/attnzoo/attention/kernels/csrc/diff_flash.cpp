// Causal differential attention on the CPU in one kernel, forward and backward, for Diff (Ye et al., 2024, Eq. 1) and
// DIFF V2 (its official multihead_flashdiffv2.py):
//
//   O = (A1 − Λ·A2) V,   A_m = softmax(S_m),   S_m,ij = scale · q_m,i·k_m,j + s_h·(j − i) for j ≤ i, −∞ for j > i
//
// for the query/key sub-heads m = 1, 2 of one differential head h (sub-heads 2h and 2h+1 of q; of k, 2g and 2g+1 for
// its kv head g, or for V2 kv head g itself, whose keys both maps share) and its value head; s_h is ALiBi's slope
// where the model uses ALiBi, else 0. Λ = diag(λ_i) weighs row i of the second map: one λ for every row in Diff,
// sigmoid(x_i W_λ) per token and head in V2.
//
// Two SDPA calls (Diff) or one over 2H query heads (V2), which the PyTorch paths make, multiply V once per map in
// the forward pass and, in the backward pass, take dP = dO Vᵀ and dV once per map. Here one task holds both maps of a
// query tile: the forward pass keeps both online softmaxes (FlashAttention, Dao et al., 2022, Alg. 1) and multiplies
// the two maps' tiles, stacked as one (2·rows, cols) matrix, by V in one product; the backward pass
// (FlashAttention-2, Alg. 2) shares the one dP = dO Vᵀ between the maps and multiplies the difference map by dO once:
//
//   dV = (A1 − ΛA2)ᵀ dO,   dS1 = A1 ∘ (dP − D1),   dS2 = −Λ·A2 ∘ (dP − D2),   D_m = rowsum(dO ∘ O_m),
//   dQ_m = scale · dS_m K_m,   dK_m = scale · dS_mᵀ Q_m   (summed into one dK where the maps share their keys),
//
// with O_m = A_m V the normalised output of each map (O2 is saved; O1 = O + Λ·O2). dλ_i = −D2_i is taken by the
// Python side. The tile products are BLAS calls (attnzoo_cpu::gemm), in fp32.
//
// Grouped-query attention reads kv head h / n_rep without copying. Parallelism as alibi_flash.cpp: the forward
// pass over (batch·head, query tile), the backward pass over (batch, kv head), whose dK and dV are its own.
//
// diff_decode_forward is Diff's decoding step: one query row of each head against a growing cache, both maps' scores,
// their softmaxes and the difference map in one task per (batch, head), then one product with V.

#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "flash_rows.h"
#include "fused_common.h"

namespace {

using attnzoo_cpu::balanced_tile;
using attnzoo_cpu::bias_row;
using attnzoo_cpu::dense;
using attnzoo_cpu::exp_row;
using attnzoo_cpu::FlushSubnormals;
using attnzoo_cpu::gemm;
using attnzoo_cpu::kLanes;
using attnzoo_cpu::Mat;
using attnzoo_cpu::matrix_of;
using attnzoo_cpu::online_softmax_row;
using attnzoo_cpu::probability_row;
using attnzoo_cpu::Vec;

void check_operands(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& lambdas,
                    const at::Tensor& slopes) {
  for (const at::Tensor* x : {&q, &k, &v, &lambdas, &slopes}) {
    TORCH_CHECK(x->device().is_cpu() && x->scalar_type() == at::kFloat && x->is_contiguous(),
                "diff_flash: operands must be contiguous fp32 CPU tensors");
  }
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "diff_flash: q, k, v must be (B, heads, T, d)");
  TORCH_CHECK(q.size(1) % 2 == 0 && (k.size(1) == 2 * v.size(1) || k.size(1) == v.size(1)),
              "diff_flash: two q sub-heads per head, and two k sub-heads or one shared k head per kv head");
  TORCH_CHECK(k.size(2) == q.size(2) && v.size(2) == q.size(2), "diff_flash: a fresh sequence, T queries, T keys");
  TORCH_CHECK((q.size(1) / 2) % v.size(1) == 0, "diff_flash: heads must be a multiple of kv heads");
  TORCH_CHECK(lambdas.sizes() == at::IntArrayRef({q.size(0), q.size(1) / 2, q.size(2)}),
              "diff_flash: one λ per (batch, head, row)");
  TORCH_CHECK(slopes.dim() == 1 && slopes.size(0) == q.size(1) / 2, "diff_flash: one slope per differential head");
}

// Index of the key matrix of map m (0 or 1) of kv head `kv` (b·H_kv + g) among k's (B·heads) matrices.
inline int64_t key_index(bool shared_keys, int64_t kv, int64_t m) {
  return shared_keys ? kv : 2 * kv + m;
}

}  // namespace

// q (B, 2H, T, d): sub-heads 2h and 2h+1 of head h; k (B, 2H_kv, T, d), sub-heads 2g and 2g+1 of kv head g, or
// (B, H_kv, T, d), one key head both maps share; v (B, H_kv, T, dv); lambdas (B, H, T), λ of each row; slopes (H,);
// all contiguous fp32. Returns O (B, H, T, dv), O2 (B, H, T, dv), the second map's own output, and L (B, H, 2, T),
// the log-sum-exp of each row of each map.
std::tuple<at::Tensor, at::Tensor, at::Tensor> diff_flash_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& lambdas,
    const at::Tensor& slopes, double scale, int64_t q_tile, int64_t k_tile) {
  check_operands(q, k, v, lambdas, slopes);
  const int64_t batch = q.size(0), heads = q.size(1) / 2, kv_heads = v.size(1), len = q.size(2);
  const int64_t dv = v.size(3), n_rep = heads / kv_heads;
  const bool shared_keys = k.size(1) == kv_heads;
  const int64_t q_tiles = (len + q_tile - 1) / q_tile;
  at::Tensor out = at::empty({batch, heads, len, dv}, q.options());
  at::Tensor out2 = at::empty({batch, heads, len, dv}, q.options());
  at::Tensor lse = at::empty({batch, heads, 2, len}, q.options());
  const float* slope_of = slopes.data_ptr<float>();
  const float* lambda_of = lambdas.data_ptr<float>();
  const float fscale = static_cast<float>(scale);

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
      const int64_t kv = b * kv_heads + g;
      const Mat k1 = matrix_of(k, key_index(shared_keys, kv, 0)), k2 = matrix_of(k, key_index(shared_keys, kv, 1));
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
      const float* lambda_ptr = lambda_of + bh * len + i0;
      for (int64_t r = 0; r < rows; ++r) {
        lse_ptr[r] = row_max[r] + std::log(row_sum[r]);
        lse_ptr[len + r] = row_max[rows + r] + std::log(row_sum[rows + r]);
        const float flambda = lambda_ptr[r];
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
// rows' D_m = rowsum(dO ∘ O_m); fp32. Where the maps share their keys, dK sums both maps' parts.
std::tuple<at::Tensor, at::Tensor, at::Tensor> diff_flash_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& lse,
    const at::Tensor& delta, const at::Tensor& lambdas, const at::Tensor& slopes, double scale, int64_t q_tile,
    int64_t k_tile) {
  check_operands(q, k, v, lambdas, slopes);
  const int64_t batch = q.size(0), heads = q.size(1) / 2, kv_heads = v.size(1), len = q.size(2);
  const int64_t dv = v.size(3), n_rep = heads / kv_heads;
  const bool shared_keys = k.size(1) == kv_heads;
  TORCH_CHECK(grad_out.is_contiguous() && grad_out.scalar_type() == at::kFloat &&
                  grad_out.sizes() == at::IntArrayRef({batch, heads, len, dv}),
              "diff_flash: dO must be contiguous fp32 (B, H, T, dv)");
  TORCH_CHECK(lse.is_contiguous() && delta.is_contiguous() && lse.sizes() == at::IntArrayRef({batch, heads, 2, len}) &&
                  delta.sizes() == lse.sizes(),
              "diff_flash: L and D must be contiguous (B, H, 2, T)");
  at::Tensor grad_q = at::zeros_like(q), grad_k = at::zeros_like(k), grad_v = at::zeros_like(v);
  const float* slope_of = slopes.data_ptr<float>();
  const float* lambda_of = lambdas.data_ptr<float>();
  const float fscale = static_cast<float>(scale);

  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    // probs: both maps' probabilities stacked; after each row's step it holds the difference map A1 − λA2 in map
    // 1's rows and dS2 in map 2's. dprobs: dP = dO Vᵀ, then dS1.
    std::vector<float> probs(2 * q_tile * k_tile), dprobs(q_tile * k_tile);
    const FlushSubnormals flush;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / kv_heads, g = task % kv_heads;
      for (int64_t j0 = 0; j0 < len; j0 += k_tile) {
        const int64_t cols = std::min(k_tile, len - j0);
        const int64_t key1 = key_index(shared_keys, task, 0), key2 = key_index(shared_keys, task, 1);
        const Mat k1 = matrix_of(k, key1).rows_at(j0, cols), k2 = matrix_of(k, key2).rows_at(j0, cols);
        const Mat v_j = matrix_of(v, task).rows_at(j0, cols);
        const Mat dk1 = matrix_of(grad_k, key1).rows_at(j0, cols);  // dk2 is dk1 where the keys are shared
        const Mat dk2 = matrix_of(grad_k, key2).rows_at(j0, cols);
        const Mat dv_j = matrix_of(grad_v, task).rows_at(j0, cols);
        for (int64_t h = g * n_rep; h < (g + 1) * n_rep; ++h) {
          const float slope = slope_of[h];
          const float* lse_ptr = lse.data_ptr<float>() + (b * heads + h) * 2 * len;
          const float* delta_ptr = delta.data_ptr<float>() + (b * heads + h) * 2 * len;
          const float* lambda_ptr = lambda_of + (b * heads + h) * len;
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
              const float flambda = lambda_ptr[i];
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

// Diff's decoding step: q (B, 2H, 1, d) contiguous, one query row per sub-head at position S − 1; k (B, 2H_kv, S, d)
// and v (B, H_kv, S, dv), the cache's keys and values so far at any strides with unit stride along a row; slopes (H,).
// Returns (A1 − λ·A2)·V, (B, H, 1, dv): each task scores its head's two query rows against its kv head's keys,
// takes both softmaxes and their difference in one buffer, and multiplies it by V.
at::Tensor diff_decode_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& slopes,
                               double lambda, double scale) {
  for (const at::Tensor* x : {&q, &k, &v, &slopes}) {
    TORCH_CHECK(x->device().is_cpu() && x->scalar_type() == at::kFloat, "diff_decode: operands must be fp32 CPU");
  }
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.size(2) == 1 && q.is_contiguous(),
              "diff_decode: q must be contiguous (B, 2H, 1, d), k and v (B, heads, S, ·)");
  TORCH_CHECK(q.size(1) % 2 == 0 && k.size(1) == 2 * v.size(1) && (q.size(1) / 2) % v.size(1) == 0,
              "diff_decode: two q/k sub-heads per head, heads a multiple of kv heads");
  TORCH_CHECK(k.size(2) == v.size(2) && k.size(3) == q.size(3) && k.stride(3) == 1 && v.stride(3) == 1,
              "diff_decode: keys and values of one length, unit stride along a row");
  TORCH_CHECK(slopes.is_contiguous() && slopes.dim() == 1 && slopes.size(0) == q.size(1) / 2,
              "diff_decode: one slope per differential head");
  const int64_t batch = q.size(0), heads = q.size(1) / 2, kv_heads = v.size(1), len = k.size(2), d = q.size(3);
  const int64_t dv = v.size(3), n_rep = heads / kv_heads;
  at::Tensor out = at::empty({batch, heads, 1, dv}, q.options());
  const float* slope_of = slopes.data_ptr<float>();
  const float fscale = static_cast<float>(scale), flambda = static_cast<float>(lambda);
  float* k_data = k.data_ptr<float>();
  float* v_data = v.data_ptr<float>();

  at::parallel_for(0, batch * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(2 * len);  // map 1's row, then map 2's; then the difference map in map 1's
    const FlushSubnormals flush;
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / heads, g = (bh % heads) / n_rep;
      const float slope = slope_of[bh % heads];
      float* s1 = scores.data();
      float* s2 = s1 + len;
      for (int64_t m = 0; m < 2; ++m) {
        const Mat keys{k_data + b * k.stride(0) + (2 * g + m) * k.stride(1), len, d, k.stride(2), 1};
        gemm(dense(m == 0 ? s1 : s2, 1, len), matrix_of(q, 2 * bh + m), keys.t());
      }
      const float sum1 = exp_row(s1, len, len, bias_row(s1, len, fscale, slope, 0, len - 1));
      const float sum2 = exp_row(s2, len, len, bias_row(s2, len, fscale, slope, 0, len - 1));
      const Vec a1(1.f / sum1), a2(flambda / sum2);
      int64_t c = 0;
      for (; c + kLanes <= len; c += kLanes) {
        (Vec::loadu(s1 + c) * a1 - Vec::loadu(s2 + c) * a2).store(s1 + c);
      }
      for (; c < len; ++c) {
        s1[c] = s1[c] / sum1 - flambda * s2[c] / sum2;
      }
      const Mat values{v_data + b * v.stride(0) + g * v.stride(1), len, dv, v.stride(2), 1};
      gemm(dense(out.data_ptr<float>() + bh * dv, 1, dv), dense(s1, 1, len), values);
    }
  });
  return out;
}

// DIFF V2 runs the same functions under its own names, so that a trace of the dispatched operators tells which
// mechanism's kernel ran (Kernel.ops in attention/kernels/kernel.py).
TORCH_LIBRARY_FRAGMENT(attnzoo, m) {
  for (const std::string name : {"diff_flash", "diff_v2_flash"}) {
    m.def((name + "_forward(Tensor q, Tensor k, Tensor v, Tensor lambdas, Tensor slopes, float scale, int q_tile,"
                  " int k_tile) -> (Tensor, Tensor, Tensor)")
              .c_str());
    m.def((name + "_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor lse, Tensor delta,"
                  " Tensor lambdas, Tensor slopes, float scale, int q_tile, int k_tile) -> (Tensor, Tensor, Tensor)")
              .c_str());
  }
  m.def("diff_decode_forward(Tensor q, Tensor k, Tensor v, Tensor slopes, float lam, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(attnzoo, CPU, m) {
  for (const std::string name : {"diff_flash", "diff_v2_flash"}) {
    m.impl((name + "_forward").c_str(), &diff_flash_forward);
    m.impl((name + "_backward").c_str(), &diff_flash_backward);
  }
  m.impl("diff_decode_forward", &diff_decode_forward);
}
