// The tiled CA kernel compiled for one instruction set (avx512). This file is
// built with that instruction set's compiler flags (src/attn/CMakeLists.txt).
#include <immintrin.h>
#include <sched.h>

#include <cmath>
#include <cstdint>
#include <utility>

#include "attn/tiled_kernel.h"

namespace distca::attn {
namespace avx512 {
// Order matters: common pieces, then the traits, then the kernel using them.
// clang-format off
#include "attn/simd_common.inc"
#include "attn/simd_avx512.inc"
#include "attn/tiled_kernel_impl.inc"
// clang-format on
}  // namespace avx512

const TiledKernel& Avx512TiledKernel() {
  static const TiledKernel kernel = avx512::MakeTiledKernel("avx512");
  return kernel;
}

}  // namespace distca::attn
