// The tiled CA kernel compiled for one instruction set (scalar). This file is
// built with that instruction set's compiler flags (src/attn/CMakeLists.txt).
#include <cmath>
#include <cstdint>
#include <utility>

#include <sched.h>

#include "attn/tiled_kernel.h"

namespace distca::attn {
namespace scalar {
// Order matters: common pieces, then the traits, then the kernel using them.
// clang-format off
#include "attn/simd_common.inc"
#include "attn/simd_scalar.inc"
#include "attn/tiled_kernel_impl.inc"
// clang-format on
}  // namespace scalar

const TiledKernel& ScalarTiledKernel() {
  static const TiledKernel kernel = scalar::MakeTiledKernel("scalar");
  return kernel;
}

}  // namespace distca::attn
