// The training benchmark's fixed mixes (bench/train_bench.cc).
#include <gtest/gtest.h>

#include <numeric>

#include "bench/train_bench.h"

namespace distca {
namespace {

TEST(TrainMixesTest, EveryMixFillsEveryRankAtAnyRankCount) {
  // The graded mix's lengths fall as t / 2^(r + 2) with the rank r: its
  // shift once overflowed an int at rank 29 (30 ranks) and divided by zero
  // from 31 ranks on.
  for (int ranks : {2, 3, 29, 30, 31, 64, 1024}) {
    for (int64_t t : {int64_t{2048}, int64_t{8192}}) {
      const std::vector<bench::TrainMix> mixes = bench::TrainMixes(ranks, t);
      ASSERT_EQ(mixes.size(), 4u);
      for (const bench::TrainMix& mix : mixes) {
        EXPECT_EQ(std::accumulate(mix.lengths.begin(), mix.lengths.end(), int64_t{0}), t * ranks)
            << mix.name << ", " << ranks << " ranks, t " << t;
        for (int64_t len : mix.lengths) ASSERT_GE(len, 1) << mix.name << ", " << ranks << " ranks";
      }
      // The graded mix's last rank: documents of t / 8 with 2 ranks; from
      // 29 ranks on the floor of 128 tokens.
      const bench::TrainMix& graded = mixes[2];
      ASSERT_EQ(graded.name, "graded");
      if (ranks == 2) {
        EXPECT_EQ(graded.lengths.back(), t / 8);
      }
      if (ranks >= 29) {
        EXPECT_EQ(graded.lengths.back(), 128) << ranks;
      }
    }
  }
}

}  // namespace
}  // namespace distca
