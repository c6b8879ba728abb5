// The tiled CA kernel compiled for one instruction set (avx2). This file is
// built with that instruction set's compiler flags (src/attn/CMakeLists.txt).
#include <immintrin.h>
#include <sched.h>

#include <cmath>
#include <cstdint>
#include <utility>

#include "attn/tiled_kernel.h"

namespace distca::attn {
namespace avx2 {
// Order matters: common pieces, then the traits, then the kernel using them.
// clang-format off
#include "attn/simd_common.inc"
#include "attn/simd_avx2.inc"
#include "attn/tiled_kernel_impl.inc"
// clang-format on
}  // namespace avx2

const TiledKernel& Avx2TiledKernel() {
  static const TiledKernel kernel = avx2::MakeTiledKernel("avx2");
  return kernel;
}

}  // namespace distca::attn
