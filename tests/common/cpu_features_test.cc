#include "common/cpu_features.h"

#include <gtest/gtest.h>
#include <strings.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace distca {
namespace {

// The CPU flags the kernel reports (the first "flags" line of
// /proc/cpuinfo): a source independent of the detector's CPUID queries.
// Empty when there is no such file (not Linux, or not x86).
std::set<std::string> ProcCpuFlags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags;
    for (std::string w; words >> w;) flags.insert(w);
    return flags;
  }
  return {};
}

// What the detector must report: the CPU's features (as the kernel lists
// them), capped by DISTCA_CPU_MAX_ISA when it is set (avx2 drops AVX-512;
// any value other than avx2 and avx512 drops both).
TEST(CpuFeaturesTest, AgreesWithTheKernelsFlagsUnderTheCap) {
  const std::set<std::string> flags = ProcCpuFlags();
#if !defined(__x86_64__)
  GTEST_SKIP() << "vector paths exist on x86-64 only";
#endif
  if (flags.empty()) GTEST_SKIP() << "no flags line in /proc/cpuinfo";
  CpuFeatures expected;
  expected.avx2_fma = flags.count("avx2") && flags.count("fma");
  expected.avx512 = expected.avx2_fma && flags.count("avx512f") && flags.count("avx512bw") && flags.count("avx512dq") &&
                    flags.count("avx512vl");
  if (const char* cap = std::getenv("DISTCA_CPU_MAX_ISA")) {
    if (strcasecmp(cap, "avx2") == 0) {
      expected.avx512 = false;
    } else if (strcasecmp(cap, "avx512") != 0) {
      expected = CpuFeatures{};
    }
  }
  const CpuFeatures& f = DetectCpuFeatures();
  EXPECT_EQ(f.avx2_fma, expected.avx2_fma);
  EXPECT_EQ(f.avx512, expected.avx512);
  EXPECT_EQ(&f, &DetectCpuFeatures());  // detected once
}

}  // namespace
}  // namespace distca
