// The library-wide switch between the two ways the fused kernels run their tile products (fused_common.h's gemm):
// BLAS called directly, or ATen's matmul. attnzoo.attention.kernels.build.use_blas sets it; the tests run each kernel
// both ways.

#include <torch/extension.h>

#include "fused_common.h"

namespace {

// Sets whether tile products call BLAS directly (where it is exported); returns whether they do now.
bool fused_use_blas(bool enabled) {
  attnzoo_cpu::blas_enabled().store(enabled);
  return attnzoo_cpu::blas_in_use();
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(attnzoo, m) {
  m.def("fused_use_blas(bool enabled) -> bool", &fused_use_blas);
}
