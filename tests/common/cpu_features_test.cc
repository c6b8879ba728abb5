#include "common/cpu_features.h"

#include <gtest/gtest.h>

namespace distca {
namespace {

TEST(CpuFeaturesTest, Avx512ImpliesAvx2) {
  const CpuFeatures& f = DetectCpuFeatures();
  if (f.avx512) {
    EXPECT_TRUE(f.avx2_fma);
  }
  EXPECT_EQ(&f, &DetectCpuFeatures());  // detected once
}

}  // namespace
}  // namespace distca
