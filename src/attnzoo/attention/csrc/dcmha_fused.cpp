// DCMHA attention on the CPU without a (B, N, T, S) score tensor: a fused kernel, forward and backward.
//
// For one composition group of M heads (DCFormer, Xiao et al., ICML 2024, Eq. 5–7, in the merged form of
// attnzoo.attention.dcmha.compose_merged), query t and key s:
//
//   S_n  = scale · q_n,t · k_n,s + m_n · (s − t)                  logits (+ the ALiBi bias, where given)
//   A'_o = Σ_i S_i · (QW[t] + KW[s])[i, o]                        pre-composition (QW holds I and W_b)
//   P_o  = softmax_s(A'_o) over the visible keys (causal, or the last `window`)
//   P'_o = Σ_i P_i · (QW'[t] + KW'[s])[i, o]                      post-composition
//   O_o  = Σ_s P'_o · v_o,s
//
// Post-composition mixes probabilities that each head normalises by its own row sum, so the softmax must be
// exact before it. A task is one query tile of one group: it computes the tile's scores against every key the
// tile can see (a (M, rows, width) block, width ≤ T), so each row's softmax is exact in one pass and the
// forward pass keeps only O and each row's log-sum-exp L. Memory is O(M·rows·T) of scratch per thread, linear
// in T; no score-sized tensor outlives a task. (The flash-style alternative, keys in tiles with an online
// softmax, would need a second pass over the keys for the post-composition, ../shared/notes/dcmha_kernel.md.)
//
// The backward pass recomputes a tile's S, A', P = exp(A' − L) and P' and runs the chain rule back:
//
//   dV_o += P'_oᵀ dO_o,   dP'_o = dO_o V_oᵀ
//   dQW'[t][i, o] = Σ_s P_i dP'_o,   dKW'[s][i, o] = Σ_t P_i dP'_o,   dP_i = Σ_o dP'_o (QW'[t] + KW'[s])[i, o]
//   dA'_o = P_o ∘ (dP_o − D_o),  D_o[t] = Σ_s P_o dP_o     (the row sum is over this row's keys, all in the tile)
//   dQW[t][i, o] = Σ_s S_i dA'_o,     dKW[s][i, o] = Σ_t S_i dA'_o,     dS_i = Σ_o dA'_o (QW[t] + KW[s])[i, o]
//   dQ_n = scale · dS_n K_n,   dK_n += scale · dS_nᵀ Q_n
//
// Tile products are ATen matmuls on views of the operands and of per-task scratch (BLAS); the elementwise steps
// (composition, softmax and their adjoints) are written here with ATen's vector type, over each row's visible
// columns only. Math is fp32: the Python side upcasts bf16 operands (attnzoo.attention.dcmha_cpu).
//
// Parallelism: the forward pass over (batch, group, query tile), whose outputs are disjoint. In the backward
// pass the key-side gradients (dK, dV, dKW, dKW') of one (batch, group) collect every query tile's share; each
// task (batch, group, part) takes every P-th query tile (interleaved, so causal work is balanced) and adds into
// its own partial sums, which are reduced in a fixed order afterwards: no atomics, no locks, and the same bits
// whatever the thread count's timing. Query head h reads kv head h / n_rep (grouped-query attention).

#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kLanes = Vec::size();
constexpr int64_t kMaxHeads = 32;  // M: the heads of one row of columns are held as kMaxHeads vectors

using OptTensor = std::optional<at::Tensor>;

// The sizes of one call and raw fp32 pointers to its per-token composition matrices.
struct Problem {
  int64_t batch, heads, kv_heads, len, d, dv, groups, m, n_rep, window;  // window 0: every earlier key
  float scale;
  const float* slopes;             // (H,) ALiBi slopes, or nullptr
  std::array<const float*, 2> qw;  // [pre, post]: (B, G, T, M, M), [input head, output head]; nullptr where off
  std::array<const float*, 2> kw;  // [pre, post]: (B, G, M, M, T), keys last; nullptr where off or query-wise

  int64_t first_key(int64_t i) const { return window > 0 ? std::max<int64_t>(0, i - window + 1) : 0; }
  // Query-side matrix of composition c for query i of (b, g), and the key-side matrices' base at key 0.
  const float* query_w(int c, int64_t b, int64_t g, int64_t i) const {
    return qw[c] + ((b * groups + g) * len + i) * m * m;
  }
  const float* key_w(int c, int64_t b, int64_t g) const {
    return kw[c] == nullptr ? nullptr : kw[c] + (b * groups + g) * m * m * len;
  }
};

// One tile's rows, as (M, rows, width) blocks of scratch: x_i[r][c] at x + i·head + r·width + c.
struct Tile {
  int64_t b, g, i0, rows, lo, width;
  int64_t head() const { return rows * width; }
  // Row r's visible columns [c0, c1) of the tile's keys [lo, lo + width).
  int64_t c0(const Problem& p, int64_t r) const { return p.first_key(i0 + r) - lo; }
  int64_t c1(int64_t r) const { return i0 + r + 1 - lo; }
};

Tile make_tile(const Problem& p, int64_t b, int64_t g, int64_t i0, int64_t q_tile) {
  const int64_t rows = std::min(q_tile, p.len - i0), lo = p.first_key(i0);
  return Tile{b, g, i0, rows, lo, i0 + rows - lo};
}

// p ← exp(x − shift) over [c0, c1) and 0 over the rest of the row; returns Σ p.
inline float exp_row(float* x, int64_t width, int64_t c0, int64_t c1, float shift) {
  Vec sum(0.f);
  for (int64_t c = c0; c < c1; c += kLanes) {
    const int n = static_cast<int>(std::min(kLanes, c1 - c));
    const Vec p = (Vec::loadu(x + c, n) - Vec(shift)).exp_u20();
    p.store(x + c, n);
    sum = sum + Vec::set(Vec(0.f), p, n);  // the lanes past n loaded as 0 but exp(0 − shift) is not
  }
  std::fill(x, x + c0, 0.f);
  std::fill(x + c1, x + width, 0.f);
  return at::vec::vec_reduce_all<float>([](const Vec& a, const Vec& b) { return a + b; }, sum);
}

// Softmax of one row in place over [c0, c1), 0 elsewhere; returns its log-sum-exp.
inline float softmax_row(float* x, int64_t width, int64_t c0, int64_t c1) {
  Vec vmax(-std::numeric_limits<float>::infinity());
  for (int64_t c = c0; c < c1; c += kLanes) {
    const int n = static_cast<int>(std::min(kLanes, c1 - c));
    vmax = at::vec::maximum(vmax, Vec::set(vmax, Vec::loadu(x + c, n), n));
  }
  const float row_max =
      at::vec::vec_reduce_all<float>([](const Vec& a, const Vec& b) { return at::vec::maximum(a, b); }, vmax);
  const float sum = exp_row(x, width, c0, c1, row_max);
  const Vec inverse(1.f / sum);
  for (int64_t c = c0; c < c1; c += kLanes) {
    const int n = static_cast<int>(std::min(kLanes, c1 - c));
    (Vec::loadu(x + c, n) * inverse).store(x + c, n);
  }
  return row_max + std::log(sum);
}

// The tile's logits S_n = (scale·q_n)·k_nᵀ (+ m_n·(s − t)) of the M heads into `scores`; `q_scaled` is scale·q,
// scaled before the product as the eager reference does in fp32.
void tile_logits(const Problem& p, const Tile& t, const at::Tensor& q_scaled, const at::Tensor& k, at::Tensor& scores) {
  for (int64_t n = 0; n < p.m; ++n) {
    const int64_t h = t.g * p.m + n;
    at::Tensor s = scores.narrow(0, n * t.head(), t.head()).view({t.rows, t.width});
    at::mm_out(s, q_scaled[t.b][h].narrow(0, t.i0, t.rows), k[t.b][h / p.n_rep].narrow(0, t.lo, t.width).t());
    if (p.slopes != nullptr) {
      const float slope = p.slopes[h];
      float* s_ptr = s.data_ptr<float>();
      for (int64_t r = 0; r < t.rows; ++r) {
        float* row = s_ptr + r * t.width;
        const int64_t i = t.i0 + r;
        for (int64_t c = t.c0(p, r); c < t.c1(r); ++c) {
          row[c] += slope * static_cast<float>(t.lo + c - i);
        }
      }
    }
  }
}

// Composition c of the tile, x → out: out_o = Σ_i x_i · (QW[t] + KW[s])[i, o] for the M heads, or with `adjoint`
// the transposed map out_i = Σ_o x_o · W[i, o] (the gradient with respect to the composition's input). Column
// blocks outside, rows inside, so that a block's key-side weights (M² vectors) stay in L1 for every row. Columns
// of a row's last block past its visible ones are computed too (callers mask them); nothing past the tile's width.
void compose_tile(const Problem& p, const Tile& t, int c, const float* x, float* out, bool adjoint) {
  const float* kw = p.key_w(c, t.b, t.g);
  const int64_t m = p.m, head = t.head();
  Vec xs[kMaxHeads];
  for (int64_t col = 0; col < t.width; col += kLanes) {
    const int n = static_cast<int>(std::min(kLanes, t.width - col));
    const float* kw_col = kw == nullptr ? nullptr : kw + t.lo + col;
    for (int64_t r = 0; r < t.rows; ++r) {
      if (col >= t.c1(r) || col + n <= t.c0(p, r)) {
        continue;
      }
      const float* qw = p.query_w(c, t.b, t.g, t.i0 + r);
      const float* x_row = x + r * t.width + col;
      float* out_row = out + r * t.width + col;
      for (int64_t i = 0; i < m; ++i) {
        xs[i] = Vec::loadu(x_row + i * head, n);
      }
      for (int64_t o = 0; o < m; ++o) {
        Vec acc(0.f);
        for (int64_t i = 0; i < m; ++i) {
          const int64_t w = adjoint ? o * m + i : i * m + o;
          Vec weight(qw[w]);
          if (kw_col != nullptr) {
            weight = weight + Vec::loadu(kw_col + w * p.len, n);
          }
          acc = at::vec::fmadd(xs[i], weight, acc);
        }
        acc.store(out_row + o * head, n);
      }
    }
  }
}

// The query-side weight gradient of composition c from the tile: dQW[t][i, o] += Σ_s x_i·dy_o over each row's
// visible columns, accumulated in registers along the row. (x·dy is 0 wherever a key is hidden: x is P, zero
// there, or dy is dA', zero there.)
void query_weight_grads(const Problem& p, const Tile& t, const float* x, const float* dy, float* dqw) {
  const int64_t m = p.m, head = t.head();
  Vec acc[kMaxHeads];
  for (int64_t r = 0; r < t.rows; ++r) {
    const int64_t c0 = t.c0(p, r), c1 = t.c1(r);
    float* dqw_row = dqw + (t.i0 + r) * m * m;
    for (int64_t o = 0; o < m; ++o) {
      std::fill(acc, acc + m, Vec(0.f));
      for (int64_t col = c0; col < c1; col += kLanes) {
        const int n = static_cast<int>(std::min(kLanes, c1 - col));
        const Vec dy_o = Vec::loadu(dy + o * head + r * t.width + col, n);
        for (int64_t i = 0; i < m; ++i) {
          acc[i] = at::vec::fmadd(Vec::loadu(x + i * head + r * t.width + col, n), dy_o, acc[i]);
        }
      }
      for (int64_t i = 0; i < m; ++i) {
        dqw_row[i * m + o] += at::vec::vec_reduce_all<float>([](const Vec& a, const Vec& b) { return a + b; }, acc[i]);
      }
    }
  }
}

// The key-side weight gradient from the tile: dKW[s][i, o] += Σ_t x_i·dy_o, a column block at a time, accumulated
// in registers over the rows; `dkw` is (M·M, T) at key 0.
void key_weight_grads(const Problem& p, const Tile& t, const float* x, const float* dy, float* dkw) {
  const int64_t m = p.m, head = t.head();
  Vec acc[kMaxHeads];
  for (int64_t col = 0; col < t.width; col += kLanes) {
    const int n = static_cast<int>(std::min(kLanes, t.width - col));
    for (int64_t o = 0; o < m; ++o) {
      std::fill(acc, acc + m, Vec(0.f));
      for (int64_t r = 0; r < t.rows; ++r) {
        if (col >= t.c1(r) || col + n <= t.c0(p, r)) {
          continue;
        }
        const int64_t offset = r * t.width + col;
        const Vec dy_o = Vec::loadu(dy + o * head + offset, n);
        for (int64_t i = 0; i < m; ++i) {
          acc[i] = at::vec::fmadd(Vec::loadu(x + i * head + offset, n), dy_o, acc[i]);
        }
      }
      for (int64_t i = 0; i < m; ++i) {
        float* key = dkw + (i * m + o) * p.len + t.lo + col;
        (Vec::loadu(key, n) + acc[i]).store(key, n);
      }
    }
  }
}

// Zeroes each row's columns outside [c0, c1) in the M heads of x.
void zero_hidden(const Problem& p, const Tile& t, float* x) {
  for (int64_t n = 0; n < p.m; ++n) {
    for (int64_t r = 0; r < t.rows; ++r) {
      float* row = x + n * t.head() + r * t.width;
      std::fill(row, row + t.c0(p, r), 0.f);
      std::fill(row + t.c1(r), row + t.width, 0.f);
    }
  }
}

Problem make_problem(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const std::array<const OptTensor*, 4>& weights, const OptTensor& slopes, int64_t groups,
                     int64_t window, double scale) {
  for (const at::Tensor* x : {&q, &k, &v}) {
    TORCH_CHECK(x->device().is_cpu() && x->scalar_type() == at::kFloat && x->is_contiguous(),
                "dcmha_fused: q, k, v must be contiguous fp32 CPU tensors");
  }
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "dcmha_fused: q, k, v must be (B, heads, T, d)");
  TORCH_CHECK(k.size(2) == q.size(2) && v.size(2) == q.size(2), "dcmha_fused: a fresh sequence, T queries, T keys");
  TORCH_CHECK(q.size(1) % k.size(1) == 0 && v.size(1) == k.size(1), "dcmha_fused: heads must be a multiple of kv heads");
  TORCH_CHECK(groups >= 1 && q.size(1) % groups == 0, "dcmha_fused: groups must divide the heads");
  Problem p{};
  p.batch = q.size(0), p.heads = q.size(1), p.kv_heads = k.size(1), p.len = q.size(2), p.d = q.size(3);
  p.dv = v.size(3), p.groups = groups, p.m = p.heads / groups, p.n_rep = p.heads / p.kv_heads, p.window = window;
  p.scale = static_cast<float>(scale);
  TORCH_CHECK(p.m <= kMaxHeads, "dcmha_fused: at most ", kMaxHeads, " heads per group, got ", p.m);
  p.slopes = nullptr;
  if (slopes.has_value()) {
    TORCH_CHECK(slopes->scalar_type() == at::kFloat && slopes->is_contiguous() && slopes->numel() == p.heads,
                "dcmha_fused: slopes must be (H,) contiguous fp32");
    p.slopes = slopes->data_ptr<float>();
  }
  const std::vector<int64_t> query_shape{p.batch, groups, p.len, p.m, p.m};
  const std::vector<int64_t> key_shape{p.batch, groups, p.m, p.m, p.len};
  for (int c = 0; c < 2; ++c) {
    const OptTensor& qw = *weights[2 * c];
    const OptTensor& kw = *weights[2 * c + 1];
    p.qw[c] = nullptr, p.kw[c] = nullptr;
    if (qw.has_value()) {
      TORCH_CHECK(qw->scalar_type() == at::kFloat && qw->is_contiguous() && qw->sizes() == query_shape,
                  "dcmha_fused: query-side matrices must be contiguous fp32 (B, G, T, M, M)");
      p.qw[c] = qw->data_ptr<float>();
    }
    if (kw.has_value()) {
      TORCH_CHECK(qw.has_value(), "dcmha_fused: key-side matrices come with query-side ones");
      TORCH_CHECK(kw->scalar_type() == at::kFloat && kw->is_contiguous() && kw->sizes() == key_shape,
                  "dcmha_fused: key-side matrices must be contiguous fp32 (B, G, M, M, T)");
      p.kw[c] = kw->data_ptr<float>();
    }
  }
  return p;
}

// The kv heads group g reads, [first, first + count): the same count for every group.
std::pair<int64_t, int64_t> kv_span(const Problem& p, int64_t g) {
  const int64_t first = g * p.m / p.n_rep, last = ((g + 1) * p.m - 1) / p.n_rep;
  return {first, last - first + 1};
}

}  // namespace

// q (B, H, T, d), k (B, H_kv, T, d), v (B, H_kv, T, d_v) contiguous fp32; per composition (pre, post) the
// query-side matrices (B, G, T, M, M) and key-side matrices (B, G, M, M, T), each optional; ALiBi slopes (H,),
// optional; window 0 for every earlier key. Returns O (B, H, T, d_v) and L (B, H, T), each row's log-sum-exp.
std::tuple<at::Tensor, at::Tensor> dcmha_fused_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const OptTensor& pre_qw, const OptTensor& pre_kw,
    const OptTensor& post_qw, const OptTensor& post_kw, const OptTensor& slopes, int64_t groups, int64_t window,
    double scale, int64_t q_tile) {
  const Problem p = make_problem(q, k, v, {&pre_qw, &pre_kw, &post_qw, &post_kw}, slopes, groups, window, scale);
  const int64_t q_tiles = (p.len + q_tile - 1) / q_tile;
  const int64_t max_width = std::min(p.len, q_tile + (p.window > 0 ? p.window - 1 : p.len));
  at::Tensor out = at::empty({p.batch, p.heads, p.len, p.dv}, q.options());
  at::Tensor lse = at::empty({p.batch, p.heads, p.len}, q.options());
  const at::Tensor q_scaled = q * scale;

  at::parallel_for(0, p.batch * p.groups * q_tiles, 1, [&](int64_t begin, int64_t end) {
    at::Tensor first = at::empty({p.m * q_tile * max_width}, q.options());
    at::Tensor second = at::empty({p.m * q_tile * max_width}, q.options());
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bg = task / q_tiles;
      const Tile t = make_tile(p, bg / p.groups, bg % p.groups, (task % q_tiles) * q_tile, q_tile);
      tile_logits(p, t, q_scaled, k, first);
      float* logits = first.data_ptr<float>();
      float* probs = logits;
      if (p.qw[0] != nullptr) {
        probs = second.data_ptr<float>();
        compose_tile(p, t, 0, logits, probs, false);
      }
      for (int64_t n = 0; n < p.m; ++n) {
        float* lse_row = lse.data_ptr<float>() + ((t.b * p.heads + t.g * p.m + n) * p.len + t.i0);
        for (int64_t r = 0; r < t.rows; ++r) {
          lse_row[r] = softmax_row(probs + n * t.head() + r * t.width, t.width, t.c0(p, r), t.c1(r));
        }
      }
      float* mixed = probs;
      if (p.qw[1] != nullptr) {
        mixed = probs == logits ? second.data_ptr<float>() : logits;
        compose_tile(p, t, 1, probs, mixed, false);
        zero_hidden(p, t, mixed);
      }
      at::Tensor mixed_t = (mixed == logits ? first : second).narrow(0, 0, p.m * t.head());
      for (int64_t n = 0; n < p.m; ++n) {
        const int64_t h = t.g * p.m + n;
        at::Tensor out_rows = out[t.b][h].narrow(0, t.i0, t.rows);
        at::mm_out(out_rows, mixed_t.narrow(0, n * t.head(), t.head()).view({t.rows, t.width}),
                   v[t.b][h / p.n_rep].narrow(0, t.lo, t.width));
      }
    }
  });
  return {out, lse};
}

// The gradients of dcmha_fused_forward's O with respect to q, k, v and each given composition matrix (an empty
// tensor in the place of one not given), from dO and the saved L; `parts` query-tile sets per (batch, group).
std::vector<at::Tensor> dcmha_fused_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const OptTensor& pre_qw, const OptTensor& pre_kw, const OptTensor& post_qw, const OptTensor& post_kw,
    const OptTensor& slopes, const at::Tensor& lse, int64_t groups, int64_t window, double scale, int64_t q_tile,
    int64_t parts) {
  const Problem p = make_problem(q, k, v, {&pre_qw, &pre_kw, &post_qw, &post_kw}, slopes, groups, window, scale);
  TORCH_CHECK(grad_out.scalar_type() == at::kFloat && grad_out.is_contiguous() &&
                  grad_out.sizes() == at::IntArrayRef({p.batch, p.heads, p.len, p.dv}),
              "dcmha_fused: dO must be contiguous fp32 (B, H, T, d_v)");
  TORCH_CHECK(parts >= 1, "dcmha_fused: parts must be >= 1");
  const int64_t q_tiles = (p.len + q_tile - 1) / q_tile;
  const int64_t max_width = std::min(p.len, q_tile + (p.window > 0 ? p.window - 1 : p.len));
  const int64_t kv_count = kv_span(p, 0).second;
  const at::TensorOptions options = q.options();

  at::Tensor grad_q = at::zeros_like(q);
  std::array<at::Tensor, 2> grad_qw, grad_kw_parts;
  for (int c = 0; c < 2; ++c) {
    if (p.qw[c] != nullptr) {
      grad_qw[c] = at::zeros({p.batch, p.groups, p.len, p.m, p.m}, options);
    }
    if (p.kw[c] != nullptr) {
      grad_kw_parts[c] = at::zeros({p.batch, p.groups, parts, p.m * p.m, p.len}, options);
    }
  }
  at::Tensor grad_k_parts = at::zeros({p.batch, p.groups, parts, kv_count, p.len, p.d}, options);
  const at::Tensor q_scaled = q * scale;
  at::Tensor grad_v_parts = at::zeros({p.batch, p.groups, parts, kv_count, p.len, p.dv}, options);

  at::parallel_for(0, p.batch * p.groups * parts, 1, [&](int64_t begin, int64_t end) {
    // logits S, probabilities P (then dS), P' (then dP) and dP' of one tile, (M, rows, width) each.
    std::array<at::Tensor, 4> scratch;
    for (at::Tensor& x : scratch) {
      x = at::empty({p.m * q_tile * max_width}, options);
    }
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bg = task / parts, part = task % parts, b = bg / p.groups, g = bg % p.groups;
      const int64_t kv_first = kv_span(p, g).first;
      at::Tensor grad_k_part = grad_k_parts[b][g][part], grad_v_part = grad_v_parts[b][g][part];
      for (int64_t tile = part; tile < q_tiles; tile += parts) {
        const Tile t = make_tile(p, b, g, tile * q_tile, q_tile);
        const int64_t head = t.head();
        auto view = [&](int which, int64_t n) { return scratch[which].narrow(0, n * head, head).view({t.rows, t.width}); };
        // Without pre-composition P takes the logits' place, without post-composition P' is P.
        const int probs_at = p.qw[0] != nullptr ? 1 : 0;
        const int mixed_at = p.qw[1] != nullptr ? 2 : probs_at;
        float* logits = scratch[0].data_ptr<float>();
        float* probs = scratch[probs_at].data_ptr<float>();
        float* mixed = scratch[mixed_at].data_ptr<float>();
        float* grad_mixed = scratch[3].data_ptr<float>();

        tile_logits(p, t, q_scaled, k, scratch[0]);
        if (p.qw[0] != nullptr) {
          compose_tile(p, t, 0, logits, probs, false);
        }
        for (int64_t n = 0; n < p.m; ++n) {
          const float* lse_row = lse.data_ptr<float>() + ((b * p.heads + g * p.m + n) * p.len + t.i0);
          for (int64_t r = 0; r < t.rows; ++r) {
            exp_row(probs + n * head + r * t.width, t.width, t.c0(p, r), t.c1(r), lse_row[r]);
          }
        }
        if (p.qw[1] != nullptr) {
          compose_tile(p, t, 1, probs, mixed, false);
          zero_hidden(p, t, mixed);
        }
        // dV += P'ᵀ dO and dP' = dO Vᵀ per head; without post-composition dP' is dP.
        for (int64_t n = 0; n < p.m; ++n) {
          const int64_t h = g * p.m + n, kv = h / p.n_rep;
          at::Tensor grad_out_rows = grad_out[b][h].narrow(0, t.i0, t.rows);
          grad_v_part[kv - kv_first].narrow(0, t.lo, t.width).addmm_(view(mixed_at, n).t(), grad_out_rows);
          at::Tensor grad_mixed_n = view(3, n);
          at::mm_out(grad_mixed_n, grad_out_rows, v[b][kv].narrow(0, t.lo, t.width).t());
        }
        float* grad_probs = grad_mixed;
        if (p.qw[1] != nullptr) {
          grad_probs = mixed;  // P' is spent: dP takes its place
          query_weight_grads(p, t, probs, grad_mixed, grad_qw[1].data_ptr<float>() + (b * p.groups + g) * p.len * p.m * p.m);
          if (p.kw[1] != nullptr) {
            key_weight_grads(p, t, probs, grad_mixed, grad_kw_parts[1][b][g][part].data_ptr<float>());
          }
          compose_tile(p, t, 1, grad_mixed, grad_probs, true);
        }
        // dA' = P ∘ (dP − D), D the row's Σ P·dP; 0 outside the visible columns.
        for (int64_t n = 0; n < p.m; ++n) {
          for (int64_t r = 0; r < t.rows; ++r) {
            const int64_t offset = n * head + r * t.width, c0 = t.c0(p, r), c1 = t.c1(r);
            const float* prob = probs + offset;
            float* grad = grad_probs + offset;
            Vec dot(0.f);
            for (int64_t c = c0; c < c1; c += kLanes) {
              const int w = static_cast<int>(std::min(kLanes, c1 - c));
              dot = at::vec::fmadd(Vec::loadu(prob + c, w), Vec::loadu(grad + c, w), dot);
            }
            const Vec row_dot(at::vec::vec_reduce_all<float>([](const Vec& a, const Vec& x) { return a + x; }, dot));
            for (int64_t c = c0; c < c1; c += kLanes) {
              const int w = static_cast<int>(std::min(kLanes, c1 - c));
              (Vec::loadu(prob + c, w) * (Vec::loadu(grad + c, w) - row_dot)).store(grad + c, w);
            }
            std::fill(grad, grad + c0, 0.f);
            std::fill(grad + c1, grad + t.width, 0.f);
          }
        }
        int grad_logits_at = p.qw[1] != nullptr ? 2 : 3;
        if (p.qw[0] != nullptr) {
          query_weight_grads(p, t, logits, grad_probs, grad_qw[0].data_ptr<float>() + (b * p.groups + g) * p.len * p.m * p.m);
          if (p.kw[0] != nullptr) {
            key_weight_grads(p, t, logits, grad_probs, grad_kw_parts[0][b][g][part].data_ptr<float>());
          }
          compose_tile(p, t, 0, grad_probs, probs, true);
          zero_hidden(p, t, probs);  // P is spent: dS takes its place
          grad_logits_at = probs_at;
        }
        // dQ = scale·dS K, dK += dSᵀ (scale·Q).
        for (int64_t n = 0; n < p.m; ++n) {
          const int64_t h = g * p.m + n, kv = h / p.n_rep;
          at::Tensor grad_logits = view(grad_logits_at, n);
          at::Tensor grad_q_rows = grad_q[b][h].narrow(0, t.i0, t.rows);
          grad_q_rows.addmm_(grad_logits, k[b][kv].narrow(0, t.lo, t.width), 0.0, p.scale);
          grad_k_part[kv - kv_first].narrow(0, t.lo, t.width).addmm_(grad_logits.t(), q_scaled[b][h].narrow(0, t.i0, t.rows));
        }
      }
    }
  });

  // The partial sums in a fixed order: over parts, then over the groups that share a kv head.
  at::Tensor grad_k = at::zeros_like(k), grad_v = at::zeros_like(v);
  const at::Tensor grad_k_groups = grad_k_parts.sum(2), grad_v_groups = grad_v_parts.sum(2);
  for (int64_t g = 0; g < p.groups; ++g) {
    const auto [first, count] = kv_span(p, g);
    grad_k.narrow(1, first, count).add_(grad_k_groups.select(1, g));
    grad_v.narrow(1, first, count).add_(grad_v_groups.select(1, g));
  }
  std::vector<at::Tensor> grads{grad_q, grad_k, grad_v};
  for (int c = 0; c < 2; ++c) {
    grads.push_back(p.qw[c] != nullptr ? grad_qw[c] : at::empty({0}, options));
    grads.push_back(p.kw[c] != nullptr
                        ? grad_kw_parts[c].sum(2).view({p.batch, p.groups, p.m, p.m, p.len})
                        : at::empty({0}, options));
  }
  return grads;
}

TORCH_LIBRARY_FRAGMENT(attnzoo, m) {
  m.def("dcmha_fused_forward(Tensor q, Tensor k, Tensor v, Tensor? pre_qw, Tensor? pre_kw, Tensor? post_qw,"
        " Tensor? post_kw, Tensor? slopes, int groups, int window, float scale, int q_tile) -> (Tensor, Tensor)");
  m.def("dcmha_fused_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor? pre_qw, Tensor? pre_kw,"
        " Tensor? post_qw, Tensor? post_kw, Tensor? slopes, Tensor lse, int groups, int window, float scale,"
        " int q_tile, int parts) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(attnzoo, CPU, m) {
  m.impl("dcmha_fused_forward", &dcmha_fused_forward);
  m.impl("dcmha_fused_backward", &dcmha_fused_backward);
}
