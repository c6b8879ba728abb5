#include "common/cpu_features.h"

#include <strings.h>
#include <cstdlib>

#include <cstring>

namespace distca {
namespace {

CpuFeatures Detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // GCC's __builtin_cpu_supports also checks XCR0, so a feature is reported only
  // when the OS saves the matching register state.
  f.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  f.avx512 = f.avx2_fma && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#endif
  // The cap: avx512 (none), avx2, or scalar. Any other value caps at scalar,
  // the choice that runs anywhere (a misspelt cap must not leave AVX-512 on).
  if (const char* cap = std::getenv("DISTCA_CPU_MAX_ISA")) {
    if (strcasecmp(cap, "avx2") == 0) {
      f.avx512 = false;
    } else if (strcasecmp(cap, "avx512") != 0) {
      f.avx2_fma = false;
      f.avx512 = false;
    }
  }
  return f;
}

}  // namespace

const CpuFeatures& DetectCpuFeatures() {
  static const CpuFeatures features = Detect();
  return features;
}

}  // namespace distca
