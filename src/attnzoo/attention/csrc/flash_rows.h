// The row steps of a flash-style causal kernel with a linear bias, shared by alibi_flash.cpp and diff_flash.cpp:
// the scaled, biased scores of a row, their exponentials and a row's rescaling, vectorised with ATen's vector type.
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
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    Vec distance = Vec::arange(first + static_cast<float>(c), 1.f);
    Vec x = at::vec::fmadd(Vec::loadu(s + c), Vec(scale), distance * Vec(slope));
    x.store(s + c);
    vmax = at::vec::maximum(vmax, x);
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

}  // namespace attnzoo_cpu
