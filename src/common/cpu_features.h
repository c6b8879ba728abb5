// Run-time CPU feature detection for choosing vector code paths.
#pragma once

namespace distca {

struct CpuFeatures {
  bool avx2_fma = false;  // AVX2 and FMA3, with OS support for ymm state
  bool avx512 = false;    // AVX-512 F/BW/DQ/VL, with OS support for zmm state
};

// Detected once; cheap to call. DISTCA_CPU_MAX_ISA=scalar|avx2|avx512 caps the
// result, so vector paths can be exercised or excluded on one machine.
const CpuFeatures& DetectCpuFeatures();

// The most OpenMP threads one rank (or one simulator run) may ask for: more
// than any CPU offers, fewer than make thread creation fail.
inline constexpr int kMaxThreads = 1024;

}  // namespace distca
