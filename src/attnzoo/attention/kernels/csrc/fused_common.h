// What the fused CPU kernels share: the fp32 vector type, the subnormal flush each task runs under, the balanced
// order of query tiles, and strided matrices with their BLAS product. Included by alibi_flash.cpp, diff_flash.cpp
// and dcmha_fused.cpp (kernels/build.py names the library after the whole csrc/ directory's content, so
// an edit here rebuilds all three).
#pragma once

#include <ATen/ATen.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>
#endif

// BLAS's single-precision product under its Fortran name, which the BLAS that PyTorch links exports (MKL in the x86
// wheels, OpenBLAS in others). Weak: where no loaded library defines it, the symbol is null and the library still
// loads, its tile products going through ATen.
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc) __attribute__((weak));

namespace attnzoo_cpu {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kLanes = Vec::size();

// Subnormal floats cost x86 cores a microcode assist per operation, tens of times a normal one: ALiBi's far keys
// give probabilities below FLT_MIN, and the backward pass's products of small numbers more (an ALiBi training step
// at T = 4096 took 3.2 s with them and 1.9 s without, against MHA's 1.9 s). Each task flushes them (FTZ and DAZ on
// its thread, restored when it ends): values below 1.2e-38 count as 0, far below any fp32 tolerance.
class FlushSubnormals {
 public:
  FlushSubnormals() {
#if defined(__x86_64__) || defined(_M_X64)
    saved_ = _mm_getcsr();
    _mm_setcsr(saved_ | 0x8040);  // FTZ (bit 15) and DAZ (bit 6)
#endif
  }
  ~FlushSubnormals() {
#if defined(__x86_64__) || defined(_M_X64)
    _mm_setcsr(saved_);
#endif
  }
  FlushSubnormals(const FlushSubnormals&) = delete;
  FlushSubnormals& operator=(const FlushSubnormals&) = delete;

 private:
  unsigned int saved_ = 0;
};

// The i-th of n query tiles in an order that pairs short causal rows with long ones (0, n−1, 1, n−2, …), so that
// the contiguous ranges of tasks parallel_for hands each thread carry equal work.
inline int64_t balanced_tile(int64_t i, int64_t n) {
  return i % 2 == 0 ? i / 2 : n - 1 - i / 2;
}

// A 2-D fp32 matrix over memory a tensor owns: rows × cols at any strides. A block or a transpose of it is pointer
// arithmetic, where an at::Tensor view (select, narrow, t) passes through the dispatcher at about 1 µs a view: the
// tile loops took enough of them to cost a DCMHA training step 8% (benchmarks/results/source-comments.md).
struct Mat {
  float* data;
  int64_t rows, cols, row_stride, col_stride;

  Mat t() const { return {data, cols, rows, col_stride, row_stride}; }
  Mat rows_at(int64_t first, int64_t count) const {
    return {data + first * row_stride, count, cols, row_stride, col_stride};
  }
  Mat cols_at(int64_t first, int64_t count) const {
    return {data + first * col_stride, rows, count, row_stride, col_stride};
  }
};

// The row-major rows × cols matrix at `data`.
inline Mat dense(float* data, int64_t rows, int64_t cols) {
  return {data, rows, cols, cols, 1};
}

// The index-th of a contiguous tensor's trailing (rows × cols) matrices, in memory order: matrix b·H + h of a
// (B, H, T, d) tensor is its (b, h) head.
inline Mat matrix_of(const at::Tensor& x, int64_t index) {
  TORCH_INTERNAL_ASSERT_DEBUG_ONLY(x.is_contiguous() && x.scalar_type() == at::kFloat);
  const int64_t rows = x.size(-2), cols = x.size(-1);
  return dense(x.data_ptr<float>() + index * rows * cols, rows, cols);
}

// x as the column-major operand xᵀ that BLAS reads: 'N' over row-major memory, 'T' over a transposed view; false
// where its strides fit neither.
inline bool blas_operand(const Mat& x, char* op, int* ld) {
  if (x.col_stride == 1 && (x.rows == 1 || x.row_stride >= x.cols)) {
    *op = 'N', *ld = static_cast<int>(std::max<int64_t>({x.rows == 1 ? x.cols : x.row_stride, x.cols, 1}));
    return true;
  }
  if (x.row_stride == 1 && (x.cols == 1 || x.col_stride >= x.rows)) {
    *op = 'T', *ld = static_cast<int>(std::max<int64_t>({x.cols == 1 ? x.rows : x.col_stride, x.rows, 1}));
    return true;
  }
  return false;
}

// Whether tile products may call BLAS directly: on unless switched off (fused_common.cpp), one flag for the library.
inline std::atomic<bool>& blas_enabled() {
  static std::atomic<bool> enabled{true};
  return enabled;
}

// Whether they do: switched on, and BLAS exported.
inline bool blas_in_use() {
  return sgemm_ != nullptr && blas_enabled().load(std::memory_order_relaxed);
}

// A tensor over x's memory, for ATen's fallback.
inline at::Tensor as_tensor(const Mat& x) {
  return at::from_blob(x.data, {x.rows, x.cols}, {x.row_stride, x.col_stride}, at::TensorOptions(at::kFloat));
}

// out ← alpha·a·b + beta·out, by one BLAS call: ATen's matmul entry points cost a few µs of dispatch and checks per
// call, which a tile's product at head size 32 does not amortise (the tile-size comment in
// attention/kernels/cpu.py). beta = 0 leaves out unread, as BLAS defines it. Falls back to at::addmm_ where BLAS is
// not exported, a matrix's strides do not fit it, or a size is 0.
inline void gemm(const Mat& out, const Mat& a, const Mat& b, float alpha = 1.f, float beta = 0.f) {
  const int64_t m = out.rows, n = out.cols, k = a.cols;
  char op_a = 'N', op_b = 'N';
  int ld_a = 0, ld_b = 0;
  const bool blas = blas_in_use() && m > 0 && n > 0 && k > 0 && out.col_stride == 1 &&
                    (m == 1 || out.row_stride >= n) && blas_operand(a, &op_a, &ld_a) && blas_operand(b, &op_b, &ld_b);
  if (!blas) {
    // beta = 0 ignores out, NaN included, as BLAS does.
    as_tensor(out).addmm_(as_tensor(a), as_tensor(b), beta, alpha);
    return;
  }
  // Row-major out = a·b is column-major outᵀ = bᵀ·aᵀ.
  const int mi = static_cast<int>(n), ni = static_cast<int>(m), ki = static_cast<int>(k);
  const int ld_out = static_cast<int>(std::max<int64_t>({m == 1 ? n : out.row_stride, n, 1}));
  sgemm_(&op_b, &op_a, &mi, &ni, &ki, &alpha, b.data, &ld_b, a.data, &ld_a, &beta, out.data, &ld_out);
}

}  // namespace attnzoo_cpu
