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
// Tile products are BLAS calls on views of the operands and of per-task scratch (attnzoo_cpu::gemm); the
// elementwise steps (composition, softmax and their adjoints) are written here with ATen's vector type, over each
// row's visible columns only. Math is fp32: the Python side upcasts bf16 operands (attnzoo.attention.kernels.dcmha_fused).
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
#include <type_traits>
#include <vector>

#include "fused_common.h"

namespace {

using attnzoo_cpu::balanced_tile;
using attnzoo_cpu::dense;
using attnzoo_cpu::FlushSubnormals;
using attnzoo_cpu::gemm;
using attnzoo_cpu::kLanes;
using attnzoo_cpu::Mat;
using attnzoo_cpu::matrix_of;
using attnzoo_cpu::Vec;

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

// Floats in a 64-byte cache line: the unit of the scratch buffers' padding, whatever the vector width.
constexpr int64_t kLine = 16;

// The row stride of a buffer of `width` columns: whole cache lines, an odd number of them. A power-of-2 stride (T =
// 256 or 1024 keys) put every row of a column chunk, and the same row of every head, in one L1 set (its 8 or 12
// ways) and evicted them between the passes that read a chunk's rows again; an odd line count walks the sets.
inline int64_t padded_stride(int64_t width) {
  const int64_t lines = (width + kLine - 1) / kLine;
  return (lines | 1) * kLine;
}

// Floats between the heads of a (M, rows, stride) buffer: one line more than its rows, so that row r of head n and
// of head n + 1 fall in different sets too.
inline int64_t padded_head(int64_t rows, int64_t stride) {
  return rows * stride + kLine;
}

// One tile's rows, as (M, rows, width) blocks of scratch with padded strides: x_i[r][c] at x + i·head + r·stride + c.
struct Tile {
  int64_t b, g, i0, rows, lo, width, stride;
  int64_t head() const { return padded_head(rows, stride); }
  // Row r's visible columns [c0, c1) of the tile's keys [lo, lo + width).
  int64_t c0(const Problem& p, int64_t r) const { return p.first_key(i0 + r) - lo; }
  int64_t c1(int64_t r) const { return i0 + r + 1 - lo; }
};

Tile make_tile(const Problem& p, int64_t b, int64_t g, int64_t i0, int64_t q_tile) {
  const int64_t rows = std::min(q_tile, p.len - i0), lo = p.first_key(i0);
  const int64_t width = i0 + rows - lo;
  return Tile{b, g, i0, rows, lo, width, padded_stride(width)};
}

// A block of a tile's columns (keys), [begin, end): every pass works a block at a time, so that the block's
// scores of the M heads stay in cache from one step to the next.
struct Cols {
  int64_t begin, end;
  int64_t size() const { return end - begin; }
};

// Head h of sequence b of a (B, heads, T, d) tensor with contiguous rows at any other strides: q, k, v and dO come as
// the layer's views of its (B, T, heads, d) projections, which need no copy, and O and the gradients are returned
// in the same order of memory (out_like).
inline Mat head_of(const at::Tensor& x, int64_t b, int64_t h) {
  return Mat{x.data_ptr<float>() + b * x.stride(0) + h * x.stride(1), x.size(2), x.size(3), x.stride(2), 1};
}

// An uninitialised (B, heads, T, cols) tensor laid out in memory as x is: (B, T, heads, cols) when x is the
// (1, 2)-transpose of a contiguous tensor, else contiguous.
at::Tensor out_like(const at::Tensor& x, int64_t cols) {
  const bool tokens_first = x.size(1) > 1 && x.size(2) > 1 && x.stride(1) == x.size(3) &&
                            x.stride(2) == x.size(1) * x.size(3);
  return tokens_first ? at::empty({x.size(0), x.size(2), x.size(1), cols}, x.options()).transpose(1, 2)
                      : at::empty({x.size(0), x.size(1), x.size(2), cols}, x.options());
}

// Row r's visible columns within the block: [first, last), empty when first >= last.
inline std::pair<int64_t, int64_t> visible_in(const Problem& p, const Tile& t, int64_t r, Cols cols) {
  return {std::max(t.c0(p, r), cols.begin), std::min(t.c1(r), cols.end)};
}

// Whether row r sees any of the columns [col, col + n).
inline bool sees(const Problem& p, const Tile& t, int64_t r, int64_t col, int64_t n) {
  return col < t.c1(r) && col + n > t.c0(p, r);
}

inline float sum_all(const Vec& x) {
  return at::vec::vec_reduce_all<float>([](const Vec& a, const Vec& b) { return a + b; }, x);
}

inline float max_all(const Vec& x) {
  return at::vec::vec_reduce_all<float>([](const Vec& a, const Vec& b) { return at::vec::maximum(a, b); }, x);
}

// max of x over [first, last), last > first.
inline float max_of(const float* x, int64_t first, int64_t last) {
  Vec vmax(-std::numeric_limits<float>::infinity());
  for (int64_t c = first; c < last; c += kLanes) {
    const int n = static_cast<int>(std::min(kLanes, last - c));
    vmax = at::vec::maximum(vmax, Vec::set(vmax, Vec::loadu(x + c, n), n));
  }
  return max_all(vmax);
}

// x ← exp(x − shift) over [first, last); returns the sum.
inline float exp_of(float* x, int64_t first, int64_t last, float shift) {
  Vec sum(0.f);
  for (int64_t c = first; c < last; c += kLanes) {
    const int n = static_cast<int>(std::min(kLanes, last - c));
    const Vec e = (Vec::loadu(x + c, n) - Vec(shift)).exp_u20();
    e.store(x + c, n);
    sum = sum + Vec::set(Vec(0.f), e, n);  // the lanes past n loaded as 0, but exp(0 − shift) is not 0
  }
  return sum_all(sum);
}

// x ← a·x over [first, last).
inline void scale_of(float* x, int64_t first, int64_t last, float a) {
  for (int64_t c = first; c < last; c += kLanes) {
    const int n = static_cast<int>(std::min(kLanes, last - c));
    (Vec::loadu(x + c, n) * Vec(a)).store(x + c, n);
  }
}

// Row r of head n in a tile buffer.
inline float* row_of(float* x, const Tile& t, int64_t n, int64_t r) {
  return x + n * t.head() + r * t.stride;
}

// Head n's block of a tile buffer: the tile's rows × the block's columns.
inline Mat block_of(const Tile& t, float* x, int64_t n, Cols cols) {
  return Mat{x + n * t.head(), t.rows, t.width, t.stride, 1}.cols_at(cols.begin, cols.size());
}

// The floats a tile buffer needs for M heads of up to `rows` rows and `width` columns.
inline int64_t tile_floats(int64_t m, int64_t rows, int64_t width) {
  return m * padded_head(rows, padded_stride(width));
}

// Zeroes the block's columns of every row of the M heads that the row does not see, in a buffer whose tile column
// c of row r of head n is at x + n·head + r·row_stride + (c − col0).
void zero_hidden(const Problem& p, const Tile& t, float* x, int64_t head, int64_t row_stride, int64_t col0,
                 Cols cols) {
  for (int64_t n = 0; n < p.m; ++n) {
    for (int64_t r = 0; r < t.rows; ++r) {
      float* row = x + n * head + r * row_stride - col0;
      const auto [first, last] = visible_in(p, t, r, cols);
      if (first >= last) {
        std::fill(row + cols.begin, row + cols.end, 0.f);
        continue;
      }
      std::fill(row + cols.begin, row + first, 0.f);
      std::fill(row + last, row + cols.end, 0.f);
    }
  }
}

// The same in a tile buffer.
void zero_hidden(const Problem& p, const Tile& t, float* x, Cols cols) {
  zero_hidden(p, t, x, t.head(), t.stride, 0, cols);
}

// The block's logits S_n = scale·q_n·k_nᵀ (+ m_n·(s − t)) of the M heads into `scores`. The scale is the product's
// alpha rather than a scaled copy of q, a (B, H, T, d) tensor written and read again per call; the two round
// differently by about one ulp of the logit.
void tile_logits(const Problem& p, const Tile& t, const at::Tensor& q, const at::Tensor& k, float* scores,
                 Cols cols) {
  for (int64_t n = 0; n < p.m; ++n) {
    const int64_t h = t.g * p.m + n;
    gemm(block_of(t, scores, n, cols), head_of(q, t.b, h).rows_at(t.i0, t.rows),
         head_of(k, t.b, h / p.n_rep).rows_at(t.lo + cols.begin, cols.size()).t(), p.scale);
    if (p.slopes != nullptr) {
      const float slope = p.slopes[h];
      for (int64_t r = 0; r < t.rows; ++r) {
        float* row = row_of(scores, t, n, r);
        const auto [first, last] = visible_in(p, t, r, cols);
        for (int64_t c = first; c < last; ++c) {
          row[c] += slope * static_cast<float>(t.lo + c - (t.i0 + r));
        }
      }
    }
  }
}

// Calls f with the number of heads per group as a compile-time constant where it is a common one, so that the
// loops over heads unroll and their per-head vectors live in registers; 0 (read at run time) otherwise.
template <typename F>
void with_heads(int64_t m, F&& f) {
  switch (m) {
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 8: return f(std::integral_constant<int, 8>{});
    case 12: return f(std::integral_constant<int, 12>{});
    case 16: return f(std::integral_constant<int, 16>{});
    default: return f(std::integral_constant<int, 0>{});
  }
}

// A chunk of n ≤ kLanes columns: whole vectors where kFull, so that the hot loops carry no count.
template <bool kFull>
inline Vec load(const float* ptr, int n) {
  if constexpr (kFull) {
    return Vec::loadu(ptr);
  } else {
    return Vec::loadu(ptr, n);
  }
}

template <bool kFull>
inline void store(const Vec& x, float* ptr, int n) {
  if constexpr (kFull) {
    x.store(ptr);
  } else {
    x.store(ptr, n);
  }
}

// One row's chunk of a composition: out_o = Σ_i x_i · (qw[i, o] + kw[i, o]), or the adjoint Σ_o x_o · W[i, o].
template <int kM, bool kAdjoint, bool kKeyWise, bool kFull>
inline void compose_chunk(int64_t heads, const float* x, int64_t head, const float* qw, const float* kw,
                          int64_t kw_stride, float* out, int64_t out_head, int n) {
  const int64_t m = kM > 0 ? kM : heads;
  // One accumulator per output head, so that the M multiply-adds into each are M independent chains.
  Vec acc[kM > 0 ? kM : kMaxHeads];
  for (int64_t o = 0; o < m; ++o) {
    acc[o] = Vec(0.f);
  }
  for (int64_t i = 0; i < m; ++i) {
    const Vec x_i = load<kFull>(x + i * head, n);
    for (int64_t o = 0; o < m; ++o) {
      const int64_t w = kAdjoint ? o * m + i : i * m + o;
      Vec weight(qw[w]);
      if constexpr (kKeyWise) {
        weight = weight + load<kFull>(kw + w * kw_stride, n);
      }
      acc[o] = at::vec::fmadd(x_i, weight, acc[o]);
    }
  }
  for (int64_t o = 0; o < m; ++o) {
    store<kFull>(acc[o], out + o * out_head, n);
  }
}

// Composition c over the block, x → out (out may be x): out_o = Σ_i x_i · (QW[t] + KW[s])[i, o] for the M heads,
// or with `adjoint` the transposed map out_i = Σ_o x_o · W[i, o] (the gradient with respect to the composition's
// input). `out` is addressed as out + i·out_head + r·out_row + (col − out_col0), so it may be a block-sized buffer.
// Columns outside, rows inside, so that a column chunk's key-side weights (M² vectors) stay in L1 for every row:
// copied first into one contiguous block, as in KW (keys last) they lie T floats apart, and at T = 256 or 1024 all
// M² of them map to the same few L1 sets, more than their ways hold, and were fetched again for every row. A
// chunk's columns past a row's visible ones are computed too, from whatever x holds there (0 where callers have
// zeroed it, which keeps out 0 there too).
template <int kM, bool kAdjoint, bool kKeyWise>
void compose_block_m(const Problem& p, const Tile& t, int c, const float* x, float* out, int64_t out_head,
                     int64_t out_row, int64_t out_col0, Cols cols) {
  const int64_t m = kM > 0 ? kM : p.m;
  const float* kw = p.key_w(c, t.b, t.g);
  const int64_t head = t.head();
  std::vector<float> kw_chunk(kKeyWise ? m * m * kLanes : 0);
  for (int64_t col = cols.begin; col < cols.end; col += kLanes) {
    const int n = static_cast<int>(std::min(kLanes, cols.end - col));
    if constexpr (kKeyWise) {
      for (int64_t w = 0; w < m * m; ++w) {
        Vec::loadu(kw + w * p.len + t.lo + col, n).store(kw_chunk.data() + w * kLanes);
      }
    }
    const float* kw_col = kKeyWise ? kw_chunk.data() : nullptr;
    const int64_t kw_stride = kLanes;
    for (int64_t r = 0; r < t.rows; ++r) {
      if (!sees(p, t, r, col, n)) {
        continue;
      }
      const float* qw = p.query_w(c, t.b, t.g, t.i0 + r);
      const float* x_row = x + r * t.stride + col;
      float* out_row_ptr = out + r * out_row + (col - out_col0);
      if (n == kLanes) {
        compose_chunk<kM, kAdjoint, kKeyWise, true>(p.m, x_row, head, qw, kw_col, kw_stride, out_row_ptr, out_head, n);
      } else {
        compose_chunk<kM, kAdjoint, kKeyWise, false>(p.m, x_row, head, qw, kw_col, kw_stride, out_row_ptr, out_head, n);
      }
    }
  }
}

void compose_block(const Problem& p, const Tile& t, int c, const float* x, float* out, int64_t out_head,
                   int64_t out_row, int64_t out_col0, bool adjoint, Cols cols) {
  const bool key_wise = p.kw[c] != nullptr;
  with_heads(p.m, [&](auto heads) {
    constexpr int kM = decltype(heads)::value;
    if (adjoint) {
      key_wise ? compose_block_m<kM, true, true>(p, t, c, x, out, out_head, out_row, out_col0, cols)
               : compose_block_m<kM, true, false>(p, t, c, x, out, out_head, out_row, out_col0, cols);
    } else {
      key_wise ? compose_block_m<kM, false, true>(p, t, c, x, out, out_head, out_row, out_col0, cols)
               : compose_block_m<kM, false, false>(p, t, c, x, out, out_head, out_row, out_col0, cols);
    }
  });
}

void compose_block(const Problem& p, const Tile& t, int c, const float* x, float* out, bool adjoint, Cols cols) {
  compose_block(p, t, c, x, out, t.head(), t.stride, 0, adjoint, cols);
}

// Columns per slab of the query-side weight gradient: a slab of a row's M heads' x and dy (18 KB at M = 8) stays
// in L1 while it is read once per output head, where a whole row at T = 1024 (36 KB) did not on a 32 KB L1.
constexpr int64_t kSlabCols = 512;

// The query-side weight gradient of a composition from the block: dQW[t][i, o] += Σ_s x_i·dy_o over each row's
// visible columns, accumulated in registers over a slab of the row and in `sums` (M² vectors) over its slabs;
// `dqw` is (T, M, M) at query 0. (x·dy is 0 wherever a key is hidden: x is P, zero there, or dy is dA', zero there.)
template <int kM>
void query_weight_grads_m(const Problem& p, const Tile& t, const float* x, const float* dy, float* dqw, Cols cols) {
  const int64_t m = kM > 0 ? kM : p.m, head = t.head();
  Vec acc[kM > 0 ? kM : kMaxHeads];
  std::vector<Vec> sums(m * m);
  for (int64_t r = 0; r < t.rows; ++r) {
    const auto [first, last] = visible_in(p, t, r, cols);
    if (first >= last) {
      continue;
    }
    float* dqw_row = dqw + (t.i0 + r) * m * m;
    const float* x_row = x + r * t.stride;
    const float* dy_row = dy + r * t.stride;
    std::fill(sums.begin(), sums.end(), Vec(0.f));
    for (int64_t s0 = first; s0 < last; s0 += kSlabCols) {
      const int64_t s1 = std::min(last, s0 + kSlabCols), whole = s0 + (s1 - s0) / kLanes * kLanes;
      for (int64_t o = 0; o < m; ++o) {
        for (int64_t i = 0; i < m; ++i) {
          acc[i] = Vec(0.f);
        }
        for (int64_t col = s0; col < whole; col += kLanes) {
          const Vec dy_o = Vec::loadu(dy_row + o * head + col);
          for (int64_t i = 0; i < m; ++i) {
            acc[i] = at::vec::fmadd(Vec::loadu(x_row + i * head + col), dy_o, acc[i]);
          }
        }
        if (whole < s1) {
          const int n = static_cast<int>(s1 - whole);
          const Vec dy_o = Vec::loadu(dy_row + o * head + whole, n);
          for (int64_t i = 0; i < m; ++i) {
            acc[i] = at::vec::fmadd(Vec::loadu(x_row + i * head + whole, n), dy_o, acc[i]);
          }
        }
        for (int64_t i = 0; i < m; ++i) {
          sums[i * m + o] = sums[i * m + o] + acc[i];
        }
      }
    }
    for (int64_t w = 0; w < m * m; ++w) {
      dqw_row[w] += sum_all(sums[w]);
    }
  }
}

// Rows per slab of the key-side weight gradient: a slab's chunk of the M heads' x and dy (M + 1 lines a row) stays
// in L1 while it is read once per output head, where the whole tile's rows (64 rows: 36 KB at M = 8) did not on a
// 32 KB L1.
constexpr int64_t kSlabRows = 16;

// The key-side weight gradient from the block: dKW[s][i, o] += Σ_t x_i·dy_o, a column chunk at a time, accumulated
// in registers over a slab's rows and in `sums` (M² vectors) over the slabs; `dkw` is (M·M, T) at key 0.
template <int kM, bool kFull>
inline void key_weight_chunk(const Problem& p, const Tile& t, const float* x, const float* dy, float* dkw, int64_t col,
                             int n, Vec* sums) {
  const int64_t m = kM > 0 ? kM : p.m, head = t.head();
  Vec acc[kM > 0 ? kM : kMaxHeads];
  for (int64_t w = 0; w < m * m; ++w) {
    sums[w] = Vec(0.f);
  }
  for (int64_t r0 = 0; r0 < t.rows; r0 += kSlabRows) {
    const int64_t r1 = std::min(t.rows, r0 + kSlabRows);
    for (int64_t o = 0; o < m; ++o) {
      for (int64_t i = 0; i < m; ++i) {
        acc[i] = Vec(0.f);
      }
      for (int64_t r = r0; r < r1; ++r) {
        if (!sees(p, t, r, col, n)) {
          continue;
        }
        const int64_t offset = r * t.stride + col;
        const Vec dy_o = load<kFull>(dy + o * head + offset, n);
        for (int64_t i = 0; i < m; ++i) {
          acc[i] = at::vec::fmadd(load<kFull>(x + i * head + offset, n), dy_o, acc[i]);
        }
      }
      for (int64_t i = 0; i < m; ++i) {
        sums[i * m + o] = sums[i * m + o] + acc[i];
      }
    }
  }
  for (int64_t w = 0; w < m * m; ++w) {
    float* key = dkw + w * p.len + t.lo + col;
    store<kFull>(load<kFull>(key, n) + sums[w], key, n);
  }
}

template <int kM>
void key_weight_grads_m(const Problem& p, const Tile& t, const float* x, const float* dy, float* dkw, Cols cols) {
  std::vector<Vec> sums(p.m * p.m);
  for (int64_t col = cols.begin; col < cols.end; col += kLanes) {
    const int n = static_cast<int>(std::min(kLanes, cols.end - col));
    if (n == kLanes) {
      key_weight_chunk<kM, true>(p, t, x, dy, dkw, col, n, sums.data());
    } else {
      key_weight_chunk<kM, false>(p, t, x, dy, dkw, col, n, sums.data());
    }
  }
}

void query_weight_grads(const Problem& p, const Tile& t, const float* x, const float* dy, float* dqw, Cols cols) {
  with_heads(p.m, [&](auto heads) { query_weight_grads_m<decltype(heads)::value>(p, t, x, dy, dqw, cols); });
}

void key_weight_grads(const Problem& p, const Tile& t, const float* x, const float* dy, float* dkw, Cols cols) {
  with_heads(p.m, [&](auto heads) { key_weight_grads_m<decltype(heads)::value>(p, t, x, dy, dkw, cols); });
}

// The tile's key blocks of `k_block` columns.
std::vector<Cols> blocks_of(const Tile& t, int64_t k_block) {
  std::vector<Cols> blocks;
  for (int64_t begin = 0; begin < t.width; begin += k_block) {
    blocks.push_back({begin, std::min(t.width, begin + k_block)});
  }
  return blocks;
}

Problem make_problem(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const std::array<const OptTensor*, 4>& weights, const OptTensor& slopes, int64_t groups,
                     int64_t window, double scale) {
  for (const at::Tensor* x : {&q, &k, &v}) {
    TORCH_CHECK(x->device().is_cpu() && x->scalar_type() == at::kFloat && x->dim() == 4 &&
                    (x->stride(3) == 1 || x->size(3) == 1),
                "dcmha_fused: q, k, v must be fp32 CPU tensors (B, heads, T, d) with contiguous rows");
  }
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

// The kv heads group g reads, [first, first + count).
std::pair<int64_t, int64_t> kv_span(const Problem& p, int64_t g) {
  const int64_t first = g * p.m / p.n_rep, last = ((g + 1) * p.m - 1) / p.n_rep;
  return {first, last - first + 1};
}

}  // namespace

// q (B, H, T, d), k (B, H_kv, T, d), v (B, H_kv, T, d_v) fp32 with contiguous rows (head_of); per composition (pre,
// post) the query-side matrices (B, G, T, M, M) and key-side matrices (B, G, M, M, T), contiguous, each optional;
// ALiBi slopes (H,), optional; window 0 for every earlier key; query tiles of q_tile rows, key blocks of k_block
// columns. Returns O (B, H, T, d_v), in q's order of memory (out_like), and L (B, H, T), each row's log-sum-exp.
//
// Per tile, two passes over its key blocks. The first computes a block's logits, pre-composes them in place and
// takes the online softmax's step (FlashAttention's running max m and sum l per row), storing exp(A' − m) as of
// that block; the second rescales each block to the final statistics, exp(m_block − m) / l, post-composes it in
// place and adds its product with V. The tile buffer is written once and read once; everything else a block needs
// stays in cache.
std::tuple<at::Tensor, at::Tensor> dcmha_fused_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const OptTensor& pre_qw, const OptTensor& pre_kw,
    const OptTensor& post_qw, const OptTensor& post_kw, const OptTensor& slopes, int64_t groups, int64_t window,
    double scale, int64_t q_tile, int64_t k_block) {
  const Problem p = make_problem(q, k, v, {&pre_qw, &pre_kw, &post_qw, &post_kw}, slopes, groups, window, scale);
  TORCH_CHECK(q_tile >= 1 && k_block >= 1, "dcmha_fused: q_tile and k_block must be >= 1");
  const int64_t q_tiles = (p.len + q_tile - 1) / q_tile;
  const int64_t max_width = std::min(p.len, q_tile + (p.window > 0 ? p.window - 1 : p.len));
  const int64_t max_blocks = (max_width + k_block - 1) / k_block;
  // Written by each tile's first block (beta 0) and added to by the rest: no pass to zero it first.
  at::Tensor out = out_like(q, p.dv);
  at::Tensor lse = at::empty({p.batch, p.heads, p.len}, q.options());

  at::parallel_for(0, p.batch * p.groups * q_tiles, 1, [&](int64_t begin, int64_t end) {
    at::Tensor scores = at::empty({tile_floats(p.m, q_tile, max_width)}, q.options());
    // Per (head, row): the running max and sum, and the max each block's exponentials were taken against.
    std::vector<float> row_max(p.m * q_tile), row_sum(p.m * q_tile), block_max(p.m * q_tile * max_blocks);
    const FlushSubnormals flush;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bg = task / q_tiles, i0 = balanced_tile(task % q_tiles, q_tiles) * q_tile;
      const Tile t = make_tile(p, bg / p.groups, bg % p.groups, i0, q_tile);
      const std::vector<Cols> blocks = blocks_of(t, k_block);
      float* x = scores.data_ptr<float>();
      std::fill(row_max.begin(), row_max.end(), -std::numeric_limits<float>::infinity());
      std::fill(row_sum.begin(), row_sum.end(), 0.f);
      for (size_t kb = 0; kb < blocks.size(); ++kb) {
        const Cols cols = blocks[kb];
        tile_logits(p, t, q, k, x, cols);
        if (p.qw[0] != nullptr) {
          compose_block(p, t, 0, x, x, false, cols);
        }
        for (int64_t n = 0; n < p.m; ++n) {
          for (int64_t r = 0; r < t.rows; ++r) {
            const auto [first, last] = visible_in(p, t, r, cols);
            if (first >= last) {
              continue;
            }
            float* row = row_of(x, t, n, r);
            const int64_t nr = n * t.rows + r;
            const float new_max = std::max(row_max[nr], max_of(row, first, last));
            // exp(−∞) = 0 on a row's first visible block.
            row_sum[nr] = row_sum[nr] * std::exp(row_max[nr] - new_max) + exp_of(row, first, last, new_max);
            row_max[nr] = new_max;
            block_max[nr * max_blocks + kb] = new_max;
          }
        }
      }
      for (int64_t n = 0; n < p.m; ++n) {
        float* lse_rows = lse.data_ptr<float>() + (t.b * p.heads + t.g * p.m + n) * p.len + t.i0;
        for (int64_t r = 0; r < t.rows; ++r) {
          lse_rows[r] = row_max[n * t.rows + r] + std::log(row_sum[n * t.rows + r]);  // every row sees its own key
        }
      }
      for (size_t kb = 0; kb < blocks.size(); ++kb) {
        const Cols cols = blocks[kb];
        for (int64_t n = 0; n < p.m; ++n) {
          for (int64_t r = 0; r < t.rows; ++r) {
            const auto [first, last] = visible_in(p, t, r, cols);
            if (first < last) {
              const int64_t nr = n * t.rows + r;
              scale_of(row_of(x, t, n, r), first, last, std::exp(block_max[nr * max_blocks + kb] - row_max[nr]) / row_sum[nr]);
            }
          }
        }
        zero_hidden(p, t, x, cols);
        if (p.qw[1] != nullptr) {
          compose_block(p, t, 1, x, x, false, cols);  // hidden P is 0, so hidden P' is 0
        }
        for (int64_t n = 0; n < p.m; ++n) {
          const int64_t h = t.g * p.m + n;
          gemm(head_of(out, t.b, h).rows_at(t.i0, t.rows), block_of(t, x, n, cols),
               head_of(v, t.b, h / p.n_rep).rows_at(t.lo + cols.begin, cols.size()), 1.f,
               kb == 0 ? 0.f : 1.f);
        }
      }
    }
  });
  return {out, lse};
}

// The gradients of dcmha_fused_forward's O with respect to q, k, v and each given composition matrix (an empty
// tensor in the place of one not given), from dO (rows contiguous) and the saved L; `parts` query-tile sets per
// (batch, group). dQ, dK and dV are laid out in memory as q, k and v.
//
// Per tile, two passes over its key blocks. The first recomputes S, P = exp(A' − L) and P', adds the block's
// dV = P'ᵀ dO and post-composition weight gradients, turns dP' = dO Vᵀ into dP, and sums each row's
// D = Σ P·dP; the second, which needs D, forms dA' = P ∘ (dP − D), the pre-composition's weight gradients and
// dS, and adds dQ and dK. S, P and dP wait in tile buffers between the passes.
std::vector<at::Tensor> dcmha_fused_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const OptTensor& pre_qw, const OptTensor& pre_kw, const OptTensor& post_qw, const OptTensor& post_kw,
    const OptTensor& slopes, const at::Tensor& lse, int64_t groups, int64_t window, double scale, int64_t q_tile,
    int64_t k_block, int64_t parts) {
  const Problem p = make_problem(q, k, v, {&pre_qw, &pre_kw, &post_qw, &post_kw}, slopes, groups, window, scale);
  TORCH_CHECK(grad_out.scalar_type() == at::kFloat && (grad_out.stride(3) == 1 || grad_out.size(3) == 1) &&
                  grad_out.sizes() == at::IntArrayRef({p.batch, p.heads, p.len, p.dv}),
              "dcmha_fused: dO must be fp32 (B, H, T, d_v) with contiguous rows");
  TORCH_CHECK(q_tile >= 1 && k_block >= 1 && parts >= 1, "dcmha_fused: q_tile, k_block and parts must be >= 1");
  const int64_t q_tiles = (p.len + q_tile - 1) / q_tile;
  const int64_t max_width = std::min(p.len, q_tile + (p.window > 0 ? p.window - 1 : p.len));
  int64_t kv_count = 0;  // the most kv heads a group reads: groups may straddle kv heads differently
  for (int64_t g = 0; g < p.groups; ++g) {
    kv_count = std::max(kv_count, kv_span(p, g).second);
  }
  const at::TensorOptions options = q.options();

  // dQ is written by each tile's first block (beta 0), as the forward pass's O.
  at::Tensor grad_q = at::empty_like(q);
  // With one part per (batch, group) and groups that read disjoint kv heads (as MHA's), each task owns its slices
  // of dK, dV and dKW and adds into them directly; otherwise into per-part sums reduced afterwards. Either way
  // each value is summed in the same order, so the direct route gives the same bits, without two zeroed
  // (parts × K)-sized tensors, their reduction and its copy (about 4% of a training step at T = 1024).
  const bool direct = parts == 1 && p.m % p.n_rep == 0;
  const int64_t part_count = direct ? 0 : parts;
  at::Tensor grad_k = at::zeros_like(k), grad_v = at::zeros_like(v);
  std::array<at::Tensor, 2> grad_qw, grad_kw, grad_kw_parts;
  for (int c = 0; c < 2; ++c) {
    if (p.qw[c] != nullptr) {
      grad_qw[c] = at::zeros({p.batch, p.groups, p.len, p.m, p.m}, options);
    }
    if (p.kw[c] != nullptr) {
      grad_kw_parts[c] = at::zeros({p.batch, p.groups, part_count, p.m * p.m, p.len}, options);
      grad_kw[c] = direct ? at::zeros({p.batch, p.groups, p.m, p.m, p.len}, options) : at::Tensor();
    }
  }
  at::Tensor grad_k_parts = at::zeros({p.batch, p.groups, part_count, kv_count, p.len, p.d}, options);
  at::Tensor grad_v_parts = at::zeros({p.batch, p.groups, part_count, kv_count, p.len, p.dv}, options);

  at::parallel_for(0, p.batch * p.groups * parts, 1, [&](int64_t begin, int64_t end) {
    // Tile buffers: the logits S, the probabilities P (S's own buffer without pre-composition) and dP' → dP → dA'
    // → dS; P' of one block.
    const int64_t floats = tile_floats(p.m, q_tile, max_width);
    at::Tensor logits_t = at::empty({floats}, options);
    at::Tensor probs_t = p.qw[0] != nullptr ? at::empty({floats}, options) : logits_t;
    at::Tensor grads_t = at::empty({floats}, options);
    at::Tensor mixed_t = at::empty({tile_floats(p.m, q_tile, std::min(k_block, max_width))}, options);
    std::vector<float> row_dot(p.m * q_tile);
    const FlushSubnormals flush;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bg = task / parts, part = task % parts, b = bg / p.groups, g = bg % p.groups;
      const auto [kv_first, kv_heads] = kv_span(p, g);
      // (1, kv heads, T, d) views: this task's kv heads of dK and dV, or its part's sums.
      const at::Tensor grad_k_part = direct ? grad_k.narrow(0, b, 1).narrow(1, kv_first, kv_heads)
                                            : grad_k_parts[b][g][part].unsqueeze(0);
      const at::Tensor grad_v_part = direct ? grad_v.narrow(0, b, 1).narrow(1, kv_first, kv_heads)
                                            : grad_v_parts[b][g][part].unsqueeze(0);
      float* dqw[2] = {nullptr, nullptr};
      float* dkw[2] = {nullptr, nullptr};
      for (int c = 0; c < 2; ++c) {
        if (p.qw[c] != nullptr) {
          dqw[c] = grad_qw[c].data_ptr<float>() + (b * p.groups + g) * p.len * p.m * p.m;
        }
        if (p.kw[c] != nullptr) {
          dkw[c] = direct ? grad_kw[c].data_ptr<float>() + (b * p.groups + g) * p.m * p.m * p.len
                          : grad_kw_parts[c][b][g][part].data_ptr<float>();
        }
      }
      for (int64_t tile = part; tile < q_tiles; tile += parts) {
        const Tile t = make_tile(p, b, g, tile * q_tile, q_tile);
        const std::vector<Cols> blocks = blocks_of(t, k_block);
        float* logits = logits_t.data_ptr<float>();
        float* probs = probs_t.data_ptr<float>();
        float* grads = grads_t.data_ptr<float>();
        float* mixed = mixed_t.data_ptr<float>();
        std::fill(row_dot.begin(), row_dot.end(), 0.f);
        for (const Cols cols : blocks) {
          const int64_t mixed_stride = padded_stride(cols.size()), mixed_head = padded_head(t.rows, mixed_stride);
          tile_logits(p, t, q, k, logits, cols);
          if (p.qw[0] != nullptr) {
            compose_block(p, t, 0, logits, probs, false, cols);
          }
          for (int64_t n = 0; n < p.m; ++n) {
            const float* lse_rows = lse.data_ptr<float>() + (b * p.heads + g * p.m + n) * p.len + t.i0;
            for (int64_t r = 0; r < t.rows; ++r) {
              const auto [first, last] = visible_in(p, t, r, cols);
              if (first < last) {
                exp_of(row_of(probs, t, n, r), first, last, lse_rows[r]);
              }
            }
          }
          zero_hidden(p, t, probs, cols);
          for (int64_t n = 0; n < p.m; ++n) {
            const int64_t h = g * p.m + n;
            gemm(block_of(t, grads, n, cols), head_of(grad_out, b, h).rows_at(t.i0, t.rows),
                 head_of(v, b, h / p.n_rep).rows_at(t.lo + cols.begin, cols.size()).t());
          }
          if (p.qw[1] != nullptr) {
            query_weight_grads(p, t, probs, grads, dqw[1], cols);
            if (dkw[1] != nullptr) {
              key_weight_grads(p, t, probs, grads, dkw[1], cols);
            }
            // P' is 0 on the columns a row does not see; compose_block skips a row's chunks it does not see.
            zero_hidden(p, t, mixed, mixed_head, mixed_stride, cols.begin, cols);
            compose_block(p, t, 1, probs, mixed, mixed_head, mixed_stride, cols.begin, false, cols);
            compose_block(p, t, 1, grads, grads, true, cols);  // dP' → dP, in place
          }
          for (int64_t n = 0; n < p.m; ++n) {
            const int64_t h = g * p.m + n, kv = h / p.n_rep;
            // dV's P': P itself without post-composition.
            const Mat mixed_n = p.qw[1] != nullptr ? Mat{mixed + n * mixed_head, t.rows, cols.size(), mixed_stride, 1}
                                                   : block_of(t, probs, n, cols);
            gemm(head_of(grad_v_part, 0, kv - kv_first).rows_at(t.lo + cols.begin, cols.size()), mixed_n.t(),
                 head_of(grad_out, b, h).rows_at(t.i0, t.rows), 1.f, 1.f);
            for (int64_t r = 0; r < t.rows; ++r) {
              const auto [first, last] = visible_in(p, t, r, cols);
              const float* prob = row_of(probs, t, n, r);
              const float* grad = row_of(grads, t, n, r);
              Vec dot(0.f);
              for (int64_t c = first; c < last; c += kLanes) {
                const int w = static_cast<int>(std::min(kLanes, last - c));
                dot = at::vec::fmadd(Vec::loadu(prob + c, w), Vec::loadu(grad + c, w), dot);
              }
              row_dot[n * t.rows + r] += sum_all(dot);
            }
          }
        }
        for (const Cols cols : blocks) {
          // dA' = P ∘ (dP − D); 0 on hidden keys.
          for (int64_t n = 0; n < p.m; ++n) {
            for (int64_t r = 0; r < t.rows; ++r) {
              const auto [first, last] = visible_in(p, t, r, cols);
              const float* prob = row_of(probs, t, n, r);
              float* grad = row_of(grads, t, n, r);
              const Vec d(row_dot[n * t.rows + r]);
              for (int64_t c = first; c < last; c += kLanes) {
                const int w = static_cast<int>(std::min(kLanes, last - c));
                (Vec::loadu(prob + c, w) * (Vec::loadu(grad + c, w) - d)).store(grad + c, w);
              }
            }
          }
          zero_hidden(p, t, grads, cols);
          if (p.qw[0] != nullptr) {
            query_weight_grads(p, t, logits, grads, dqw[0], cols);
            if (dkw[0] != nullptr) {
              key_weight_grads(p, t, logits, grads, dkw[0], cols);
            }
            compose_block(p, t, 0, grads, grads, true, cols);  // dA' → dS, in place; 0 stays 0 on hidden keys
          }
          // dQ = scale·dS K, dK += scale·dSᵀ Q.
          for (int64_t n = 0; n < p.m; ++n) {
            const int64_t h = g * p.m + n, kv = h / p.n_rep;
            const Mat grad_logits = block_of(t, grads, n, cols);
            gemm(head_of(grad_q, b, h).rows_at(t.i0, t.rows), grad_logits,
                 head_of(k, b, kv).rows_at(t.lo + cols.begin, cols.size()), p.scale,
                 cols.begin == 0 ? 0.f : 1.f);
            gemm(head_of(grad_k_part, 0, kv - kv_first).rows_at(t.lo + cols.begin, cols.size()), grad_logits.t(),
                 head_of(q, b, h).rows_at(t.i0, t.rows), p.scale, 1.f);
          }
        }
      }
    }
  });

  if (!direct) {  // the partial sums in a fixed order: over parts, then over the groups that share a kv head
    const at::Tensor grad_k_groups = grad_k_parts.sum(2), grad_v_groups = grad_v_parts.sum(2);
    for (int64_t g = 0; g < p.groups; ++g) {
      const auto [first, count] = kv_span(p, g);
      grad_k.narrow(1, first, count).add_(grad_k_groups.select(1, g).narrow(1, 0, count));
      grad_v.narrow(1, first, count).add_(grad_v_groups.select(1, g).narrow(1, 0, count));
    }
    for (int c = 0; c < 2; ++c) {
      if (p.kw[c] != nullptr) {
        grad_kw[c] = grad_kw_parts[c].sum(2).view({p.batch, p.groups, p.m, p.m, p.len});
      }
    }
  }
  std::vector<at::Tensor> grads{grad_q, grad_k, grad_v};
  for (int c = 0; c < 2; ++c) {
    grads.push_back(p.qw[c] != nullptr ? grad_qw[c] : at::empty({0}, options));
    grads.push_back(p.kw[c] != nullptr ? grad_kw[c] : at::empty({0}, options));
  }
  return grads;
}

namespace {

// A · b over d floats.
inline float dot(const float* a, const float* b, int64_t d) {
  Vec acc(0.f);
  int64_t i = 0;
  for (; i + kLanes <= d; i += kLanes) {
    acc = at::vec::fmadd(Vec::loadu(a + i), Vec::loadu(b + i), acc);
  }
  if (i < d) {
    const int n = static_cast<int>(d - i);
    acc = at::vec::fmadd(Vec::loadu(a + i, n), Vec::loadu(b + i, n), acc);
  }
  return sum_all(acc);
}

// y ← y + a·x over d floats.
inline void axpy(float a, const float* x, float* y, int64_t d) {
  int64_t i = 0;
  for (; i + kLanes <= d; i += kLanes) {
    at::vec::fmadd(Vec(a), Vec::loadu(x + i), Vec::loadu(y + i)).store(y + i);
  }
  if (i < d) {
    const int n = static_cast<int>(d - i);
    at::vec::fmadd(Vec(a), Vec::loadu(x + i, n), Vec::loadu(y + i, n)).store(y + i, n);
  }
}

// One row's composition over its S keys, in place: x_o ← Σ_i x_i · (qw[i, o] + kw[i, o, s]); `kw` nullptr when
// query-wise, else the (M, M, S) matrices at key 0, `kw_stride` floats apart.
template <int kM>
void compose_row(int64_t m, float* x, int64_t keys, const float* qw, const float* kw, int64_t kw_stride) {
  for (int64_t col = 0; col < keys; col += kLanes) {
    const int n = static_cast<int>(std::min(kLanes, keys - col));
    const float* kw_col = kw == nullptr ? nullptr : kw + col;
    if (n == kLanes) {
      kw == nullptr ? compose_chunk<kM, false, false, true>(m, x + col, keys, qw, nullptr, 0, x + col, keys, n)
                    : compose_chunk<kM, false, true, true>(m, x + col, keys, qw, kw_col, kw_stride, x + col, keys, n);
    } else {
      kw == nullptr ? compose_chunk<kM, false, false, false>(m, x + col, keys, qw, nullptr, 0, x + col, keys, n)
                    : compose_chunk<kM, false, true, false>(m, x + col, keys, qw, kw_col, kw_stride, x + col, keys, n);
    }
  }
}

// Rows of a cache view (B, heads, S, d) with contiguous rows: the base of (b, h) and the row stride.
struct CacheRows {
  const float* data;
  int64_t batch_stride, head_stride, row_stride;
  const float* at(int64_t b, int64_t h) const { return data + b * batch_stride + h * head_stride; }
};

CacheRows cache_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 4 && x.stride(3) == 1,
              "dcmha_decode: ", name, " must be a (B, heads, S, d) fp32 CPU tensor with contiguous rows");
  return {x.data_ptr<float>(), x.stride(0), x.stride(1), x.stride(2)};
}

}  // namespace

// One decoding step of DCMHA: each sequence's newest query q (B, H, 1, d), at position `query_position`, against
// the S keys and values of its cache k (B, H_kv, S, d), v (B, H_kv, S, d_v), held in any slot order (a local
// layer's ring): key s is at key_positions[s] (S,) int64, and a query sees the keys at positions in
// (query_position − window, query_position] (window 0: every earlier key). Per composition (pre, post) the
// query-side matrices (B, G, 1, M, M), contiguous, and the key-side matrices (B, G, M, M, S) as the cache holds
// them (keys contiguous, any stride between matrices); ALiBi slopes (H,), optional. Returns O (B, H, 1, d_v).
//
// The row of dcmha_fused_forward that a fresh sequence's last query computes, written for one row: one task per
// (batch, group) computes the M heads' logits over every key, pre-composes them, takes each head's softmax over
// the visible keys (masked after the pre-composition, as the reference), post-composes and multiplies by V. The
// dot products are vector loops rather than ATen calls, whose dispatch would cost more than their arithmetic.
at::Tensor dcmha_decode_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const OptTensor& pre_qw, const OptTensor& pre_kw, const OptTensor& post_qw,
                                const OptTensor& post_kw, const OptTensor& slopes, const at::Tensor& key_positions,
                                int64_t query_position, int64_t groups, int64_t window, double scale) {
  TORCH_CHECK(q.device().is_cpu() && q.scalar_type() == at::kFloat && q.is_contiguous() && q.dim() == 4 &&
                  q.size(2) == 1,
              "dcmha_decode: q must be a contiguous fp32 CPU tensor (B, H, 1, d)");
  const CacheRows keys = cache_rows(k, "k"), values = cache_rows(v, "v");
  const int64_t batch = q.size(0), heads = q.size(1), d = q.size(3), len = k.size(2), dv = v.size(3);
  TORCH_CHECK(k.size(0) == batch && v.size(0) == batch && k.size(3) == d && v.size(2) == len &&
                  v.size(1) == k.size(1) && heads % k.size(1) == 0,
              "dcmha_decode: k and v must be (B, H_kv, S, d) and (B, H_kv, S, d_v) with H a multiple of H_kv");
  TORCH_CHECK(groups >= 1 && heads % groups == 0, "dcmha_decode: groups must divide the heads");
  const int64_t m = heads / groups, n_rep = heads / k.size(1);
  TORCH_CHECK(m <= kMaxHeads, "dcmha_decode: at most ", kMaxHeads, " heads per group, got ", m);
  TORCH_CHECK(key_positions.scalar_type() == at::kLong && key_positions.is_contiguous() &&
                  key_positions.numel() == len,
              "dcmha_decode: key_positions must be (S,) contiguous int64");
  const float* slope = nullptr;
  if (slopes.has_value()) {
    TORCH_CHECK(slopes->scalar_type() == at::kFloat && slopes->is_contiguous() && slopes->numel() == heads,
                "dcmha_decode: slopes must be (H,) contiguous fp32");
    slope = slopes->data_ptr<float>();
  }
  std::array<const float*, 2> qw{nullptr, nullptr}, kw{nullptr, nullptr};
  std::array<int64_t, 2> kw_batch{0, 0}, kw_group{0, 0}, kw_stride{0, 0};
  const OptTensor* given[4] = {&pre_qw, &pre_kw, &post_qw, &post_kw};
  for (int c = 0; c < 2; ++c) {
    const OptTensor& query_side = *given[2 * c];
    const OptTensor& key_side = *given[2 * c + 1];
    if (query_side.has_value()) {
      TORCH_CHECK(query_side->scalar_type() == at::kFloat && query_side->is_contiguous() &&
                      query_side->sizes() == at::IntArrayRef({batch, groups, 1, m, m}),
                  "dcmha_decode: query-side matrices must be contiguous fp32 (B, G, 1, M, M)");
      qw[c] = query_side->data_ptr<float>();
    }
    if (key_side.has_value()) {
      TORCH_CHECK(query_side.has_value(), "dcmha_decode: key-side matrices come with query-side ones");
      TORCH_CHECK(key_side->scalar_type() == at::kFloat && key_side->sizes() == at::IntArrayRef({batch, groups, m, m, len}) &&
                      key_side->stride(4) == 1 && key_side->stride(2) == m * key_side->stride(3),
                  "dcmha_decode: key-side matrices must be fp32 (B, G, M, M, S), keys contiguous");
      kw[c] = key_side->data_ptr<float>();
      kw_batch[c] = key_side->stride(0), kw_group[c] = key_side->stride(1), kw_stride[c] = key_side->stride(3);
    }
  }
  // Which cached slots the query sees; every one, on a global layer's cache.
  const int64_t* position = key_positions.data_ptr<int64_t>();
  std::vector<char> visible(len);
  bool all_visible = true;
  for (int64_t s = 0; s < len; ++s) {
    visible[s] = position[s] <= query_position && (window <= 0 || position[s] > query_position - window);
    all_visible = all_visible && visible[s];
  }
  at::Tensor out = at::zeros({batch, heads, 1, dv}, q.options());
  const float* q_data = q.data_ptr<float>();
  float* out_data = out.data_ptr<float>();

  at::parallel_for(0, batch * groups, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> x(m * len), q_scaled(d);
    const FlushSubnormals flush;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / groups, g = task % groups;
      for (int64_t n = 0; n < m; ++n) {
        const int64_t h = g * m + n;
        for (int64_t i = 0; i < d; ++i) {
          q_scaled[i] = q_data[(b * heads + h) * d + i] * static_cast<float>(scale);
        }
        const float* key = keys.at(b, h / n_rep);
        float* row = x.data() + n * len;
        for (int64_t s = 0; s < len; ++s) {
          row[s] = dot(q_scaled.data(), key + s * keys.row_stride, d);
        }
        if (slope != nullptr) {
          for (int64_t s = 0; s < len; ++s) {
            row[s] += slope[h] * static_cast<float>(position[s] - query_position);
          }
        }
      }
      const auto compose = [&](int c) {
        if (qw[c] == nullptr) {
          return;
        }
        const float* query_w = qw[c] + (b * groups + g) * m * m;
        const float* key_w = kw[c] == nullptr ? nullptr : kw[c] + b * kw_batch[c] + g * kw_group[c];
        with_heads(m, [&](auto heads) {
          compose_row<decltype(heads)::value>(m, x.data(), len, query_w, key_w, kw_stride[c]);
        });
      };
      compose(0);
      for (int64_t n = 0; n < m; ++n) {  // each head's softmax over the visible keys, masked after pre-composing
        float* row = x.data() + n * len;
        if (!all_visible) {
          for (int64_t s = 0; s < len; ++s) {
            row[s] = visible[s] ? row[s] : -std::numeric_limits<float>::infinity();
          }
        }
        scale_of(row, 0, len, 1.f / exp_of(row, 0, len, max_of(row, 0, len)));
      }
      compose(1);  // hidden keys' probabilities are 0 in every head, so they stay 0
      for (int64_t n = 0; n < m; ++n) {
        const int64_t h = g * m + n;
        const float* value = values.at(b, h / n_rep);
        const float* row = x.data() + n * len;
        float* o = out_data + (b * heads + h) * dv;
        for (int64_t s = 0; s < len; ++s) {
          axpy(row[s], value + s * values.row_stride, o, dv);
        }
      }
    }
  });
  return out;
}

// The composition matrices of one token per sequence, for a decoding step: DynamicWeightProjection (DCFormer
// Eq. 6–7) and query_matrices / key_matrices of attnzoo.attention.dcmha in one call, where the PyTorch path runs
// about 85 small operators a layer (a decoding step's cost at this size is their dispatch, not their arithmetic).
//
//   h = GELU(x·dw1) (exact GELU);  [w1 | w2] = h·qkw per (group, slot);  w1 ← w1 / √(mean_m w1² + 1e−6);
//   d = tanh(x·dd);  W_slot[i, o] = Σ_r w1[r, i]·w2[r, o] + δ_io·d[i]  (+ δ_io + W_b[i, o] on a query slot)
//
// x (B, D) fp32; dw1 (D, G, 4, K), qkw (G, 4, K, 2R, M), dd (D, G, 4M) as the module holds them; static_w (2, G, M,
// M) or none; `compositions` the enabled ones of {0: pre, 1: post} in order. Slots [pre_q, pre_k, post_q, post_k].
// Returns QW (C, B, G, 1, M, M) and, unless query-wise, KW (B, C, G, M, M): the cache's layout for one token.
std::tuple<at::Tensor, at::Tensor> dcmha_step_weights(const at::Tensor& x, const at::Tensor& dw1,
                                                      const at::Tensor& qkw, const at::Tensor& dd,
                                                      const OptTensor& static_w, std::vector<int64_t> compositions,
                                                      bool query_wise) {
  for (const at::Tensor* t : {&x, &dw1, &qkw, &dd}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kFloat && t->is_contiguous(),
                "dcmha_step_weights: x and the weights must be contiguous fp32 CPU tensors");
  }
  TORCH_CHECK(x.dim() == 2 && dw1.dim() == 4 && qkw.dim() == 5 && dd.dim() == 3 && dw1.size(2) == 4,
              "dcmha_step_weights: x (B, D), dw1 (D, G, 4, K), qkw (G, 4, K, 2R, M), dd (D, G, 4M)");
  const int64_t batch = x.size(0), dim = x.size(1), groups = qkw.size(0), hidden = qkw.size(2);
  const int64_t rank = qkw.size(3) / 2, m = qkw.size(4), count = static_cast<int64_t>(compositions.size());
  TORCH_CHECK(dw1.size(0) == dim && dw1.size(1) == groups && dw1.size(3) == hidden && dd.size(0) == dim &&
                  dd.size(1) == groups && dd.size(2) == 4 * m && qkw.size(1) == 4 && qkw.size(3) == 2 * rank,
              "dcmha_step_weights: the weights' shapes disagree");
  TORCH_CHECK(count >= 1 && count <= 2, "dcmha_step_weights: one or two compositions");
  const float* static_ptr = nullptr;
  if (static_w.has_value()) {
    TORCH_CHECK(static_w->scalar_type() == at::kFloat && static_w->is_contiguous() &&
                    static_w->sizes() == at::IntArrayRef({2, groups, m, m}),
                "dcmha_step_weights: static_w must be contiguous fp32 (2, G, M, M)");
    static_ptr = static_w->data_ptr<float>();
  }
  const at::TensorOptions options = x.options();
  at::Tensor h = at::empty({batch, groups * 4 * hidden}, options), d = at::empty({batch, groups * 4 * m}, options);
  gemm(matrix_of(h, 0), matrix_of(x, 0), dense(dw1.data_ptr<float>(), dim, groups * 4 * hidden));
  gemm(matrix_of(d, 0), matrix_of(x, 0), dense(dd.data_ptr<float>(), dim, groups * 4 * m));
  at::Tensor query_w = at::empty({count, batch, groups, 1, m, m}, options);
  at::Tensor key_w = at::empty({query_wise ? 0 : batch, count, groups, m, m}, options);
  float* hs = h.data_ptr<float>();
  float* ds = d.data_ptr<float>();
  const float* qkw_ptr = qkw.data_ptr<float>();
  std::vector<float> w(2 * rank * m);
  constexpr float kSqrtHalf = 0.70710678118654752f;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t j = 0; j < groups * 4 * hidden; ++j) {
      const float v = hs[b * groups * 4 * hidden + j];
      hs[b * groups * 4 * hidden + j] = 0.5f * v * (1.f + std::erf(v * kSqrtHalf));
    }
    for (int64_t c = 0; c < count; ++c) {
      const int64_t which = compositions[c];
      TORCH_CHECK(which == 0 || which == 1, "dcmha_step_weights: compositions are 0 (pre) and 1 (post)");
      for (int64_t g = 0; g < groups; ++g) {
        for (int64_t key_side = 0; key_side < (query_wise ? 1 : 2); ++key_side) {
          const int64_t slot = 2 * which + key_side;
          const float* hg = hs + b * groups * 4 * hidden + (g * 4 + slot) * hidden;
          const float* proj = qkw_ptr + (g * 4 + slot) * hidden * 2 * rank * m;
          std::fill(w.begin(), w.end(), 0.f);
          for (int64_t k = 0; k < hidden; ++k) {
            axpy(hg[k], proj + k * 2 * rank * m, w.data(), 2 * rank * m);
          }
          for (int64_t r = 0; r < rank; ++r) {  // RMSNorm of w1 over the heads, no scale
            float* w1 = w.data() + r * m;
            const float inverse = 1.f / std::sqrt(dot(w1, w1, m) / static_cast<float>(m) + 1e-6f);
            for (int64_t i = 0; i < m; ++i) {
              w1[i] *= inverse;
            }
          }
          const float* diag = ds + b * groups * 4 * m + g * 4 * m + slot * m;
          float* out = key_side == 0 ? query_w.data_ptr<float>() + ((c * batch + b) * groups + g) * m * m
                                     : key_w.data_ptr<float>() + ((b * count + c) * groups + g) * m * m;
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t o = 0; o < m; ++o) {
              float sum = 0.f;
              for (int64_t r = 0; r < rank; ++r) {
                sum += w[r * m + i] * w[(rank + r) * m + o];
              }
              if (i == o) {
                sum += std::tanh(diag[i]) + (key_side == 0 ? 1.f : 0.f);
              }
              if (key_side == 0 && static_ptr != nullptr) {
                sum += static_ptr[((which * groups + g) * m + i) * m + o];
              }
              out[i * m + o] = sum;
            }
          }
        }
      }
    }
  }
  return {query_w, key_w};
}

TORCH_LIBRARY_FRAGMENT(attnzoo, m) {
  m.def("dcmha_fused_forward(Tensor q, Tensor k, Tensor v, Tensor? pre_qw, Tensor? pre_kw, Tensor? post_qw,"
        " Tensor? post_kw, Tensor? slopes, int groups, int window, float scale, int q_tile, int k_block)"
        " -> (Tensor, Tensor)");
  m.def("dcmha_fused_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor? pre_qw, Tensor? pre_kw,"
        " Tensor? post_qw, Tensor? post_kw, Tensor? slopes, Tensor lse, int groups, int window, float scale,"
        " int q_tile, int k_block, int parts) -> Tensor[]");
  m.def("dcmha_decode_forward(Tensor q, Tensor k, Tensor v, Tensor? pre_qw, Tensor? pre_kw, Tensor? post_qw,"
        " Tensor? post_kw, Tensor? slopes, Tensor key_positions, int query_position, int groups, int window,"
        " float scale) -> Tensor");
  m.def("dcmha_step_weights(Tensor x, Tensor dw1, Tensor qkw, Tensor dd, Tensor? static_w, int[] compositions,"
        " bool query_wise) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(attnzoo, CPU, m) {
  m.impl("dcmha_fused_forward", &dcmha_fused_forward);
  m.impl("dcmha_fused_backward", &dcmha_fused_backward);
  m.impl("dcmha_decode_forward", &dcmha_decode_forward);
  m.impl("dcmha_step_weights", &dcmha_step_weights);
}
