// What both fused CPU kernels share: the fp32 vector type, the subnormal flush each task runs under and the
// balanced order of query tiles. Included by alibi_flash.cpp and dcmha_fused.cpp (attnzoo.attention.fused_cpu
// names the library after the whole csrc/ directory's content, so an edit here rebuilds both).
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

// A 2-D fp32 view x (rows × cols) as the column-major operand xᵀ that BLAS reads: 'N' over row-major memory, 'T'
// over a transposed view; false where its strides fit neither.
inline bool blas_operand(const at::Tensor& x, char* op, int* ld) {
  const int64_t rows = x.size(0), cols = x.size(1), s0 = x.stride(0), s1 = x.stride(1);
  if (s1 == 1 && (rows == 1 || s0 >= cols)) {
    *op = 'N', *ld = static_cast<int>(std::max<int64_t>({rows == 1 ? cols : s0, cols, 1}));
    return true;
  }
  if (s0 == 1 && (cols == 1 || s1 >= rows)) {
    *op = 'T', *ld = static_cast<int>(std::max<int64_t>({cols == 1 ? rows : s1, rows, 1}));
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

// out ← alpha·a·b + beta·out for 2-D fp32 CPU views, by one BLAS call: ATen's matmul entry points cost a few µs of
// dispatch and checks per call, which a tile's product at head size 32 does not amortise (the tile-size comment in
// attention/fused_cpu.py). beta = 0 leaves out unread, as BLAS defines it. Falls back to at::addmm_ where BLAS is
// not exported, a view's strides do not fit it, or a size is 0.
inline void gemm(at::Tensor out, const at::Tensor& a, const at::Tensor& b, float alpha = 1.f, float beta = 0.f) {
  const int64_t m = out.size(0), n = out.size(1), k = a.size(1);
  char op_a = 'N', op_b = 'N';
  int ld_a = 0, ld_b = 0;
  const bool blas = blas_in_use() && m > 0 && n > 0 && k > 0 && out.stride(1) == 1 &&
                    (m == 1 || out.stride(0) >= n) && blas_operand(a, &op_a, &ld_a) && blas_operand(b, &op_b, &ld_b);
  if (!blas) {
    out.addmm_(a, b, beta, alpha);  // beta = 0 ignores out, NaN included, as BLAS does
    return;
  }
  // Row-major out = a·b is column-major outᵀ = bᵀ·aᵀ.
  const int mi = static_cast<int>(n), ni = static_cast<int>(m), ki = static_cast<int>(k);
  const int ld_out = static_cast<int>(std::max<int64_t>({m == 1 ? n : out.stride(0), n, 1}));
  sgemm_(&op_b, &op_a, &mi, &ni, &ki, &alpha, b.data_ptr<float>(), &ld_b, a.data_ptr<float>(), &ld_a, &beta,
         out.data_ptr<float>(), &ld_out);
}

}  // namespace attnzoo_cpu
