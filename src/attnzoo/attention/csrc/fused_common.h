// What both fused CPU kernels share: the fp32 vector type, the subnormal flush each task runs under and the
// balanced order of query tiles. Included by alibi_flash.cpp and dcmha_fused.cpp (attnzoo.attention.fused_cpu
// names the library after the whole csrc/ directory's content, so an edit here rebuilds both).
#pragma once

#include <ATen/cpu/vec/vec.h>

#include <cstdint>

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>
#endif

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

}  // namespace attnzoo_cpu
