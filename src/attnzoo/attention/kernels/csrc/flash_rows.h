// The row steps of a flash-style causal kernel with a linear bias, shared by alibi_flash.cpp and diff_flash.cpp:
// the forward pass's online-softmax step of a score row and the backward pass's recomputed probabilities,
// vectorised with ATen's vector type.
#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "fused_common.h"

namespace attnzoo_cpu {

// Scores of row i against keys j0 .. j0+n−1, in place: s ← scale·s + m·(j − i), the distance taken as an exact
// float before the one multiply, as the eager reference rounds the bias. Returns the row maximum.
inline float bias_row(float* s, int64_t n, float scale, float slope, int64_t j0, int64_t i) {
  const float first = static_cast<float>(j0 - i);
  Vec vmax(-std::numeric_limits<float>::infinity());
  // Vec::arange fills its lanes one by one; stepping a vector of distances costs one add per chunk, with the same
  // exact integers (|j − i| < 2^24).
  Vec distance = Vec::arange(first, 1.f);
  const Vec step(static_cast<float>(kLanes));
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    Vec x = at::vec::fmadd(Vec::loadu(s + c), Vec(scale), distance * Vec(slope));
    x.store(s + c);
    vmax = at::vec::maximum(vmax, x);
    distance = distance + step;
  }
  float row_max = at::vec::vec_reduce_all<float>([](const Vec& a, const Vec& b) { return at::vec::maximum(a, b); }, vmax);
  for (; c < n; ++c) {
    s[c] = s[c] * scale + slope * (first + static_cast<float>(c));
    row_max = std::max(row_max, s[c]);
  }
  return row_max;
}

// p ← exp(s − shift) over the n visible keys and 0 over the masked rest of the tile row (width); returns Σ p.
inline float exp_row(float* s, int64_t n, int64_t width, float shift) {
  Vec vsum(0.f);
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    Vec p = (Vec::loadu(s + c) - Vec(shift)).exp_u20();
    p.store(s + c);
    vsum = vsum + p;
  }
  float sum = at::vec::vec_reduce_all<float>([](const Vec& a, const Vec& b) { return a + b; }, vsum);
  for (; c < n; ++c) {
    s[c] = std::exp(s[c] - shift);
    sum += s[c];
  }
  std::fill(s + n, s + width, 0.f);
  return sum;
}

// x ← a·x over n numbers.
inline void scale_row(float* x, int64_t n, float a) {
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    (Vec::loadu(x + c) * Vec(a)).store(x + c);
  }
  for (; c < n; ++c) {
    x[c] *= a;
  }
}

// How many keys of the tile starting at j0 (width keys) query i sees: those with j ≤ i.
inline int64_t visible(int64_t i, int64_t j0, int64_t width) {
  return std::clamp<int64_t>(i + 1 - j0, 0, width);
}


// One online-softmax step of query i's score row over the key tile at j0 (FlashAttention, Alg. 1), in place: the
// scaled, biased scores become exp(s − m') over the visible keys and 0 elsewhere, (row_max, row_sum) take the tile
// in, and the row's output accumulator (dv numbers) is rescaled to the new max before the caller adds P·V.
inline void online_softmax_row(float* s, int64_t cols, float scale, float slope, int64_t j0, int64_t i,
                               float& row_max, float& row_sum, float* acc, int64_t dv) {
  const int64_t n = visible(i, j0, cols);
  if (n == 0) {  // a query before this tile's first key (k_tile < q_tile): nothing to add
    std::fill(s, s + cols, 0.f);
    return;
  }
  const float new_max = std::max(row_max, bias_row(s, n, scale, slope, j0, i));
  const float rescale = std::exp(row_max - new_max);  // 0 on the first tile (max was −∞)
  row_sum = row_sum * rescale + exp_row(s, n, cols, new_max);
  row_max = new_max;
  if (rescale != 1.f) {
    scale_row(acc, dv, rescale);
  }
}

// The backward pass's P = exp(S − L) of query i's score row over the key tile at j0, in place, from the row's saved
// log-sum-exp L: the forward pass's probabilities, 0 where masked.
inline void probability_row(float* s, int64_t cols, float scale, float slope, int64_t j0, int64_t i, float lse) {
  const int64_t n = visible(i, j0, cols);
  if (n == 0) {
    std::fill(s, s + cols, 0.f);
    return;
  }
  bias_row(s, n, scale, slope, j0, i);
  exp_row(s, n, cols, lse);
}

}  // namespace attnzoo_cpu
