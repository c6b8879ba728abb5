// The 1F1B simulator and the packing helpers on cases small enough to
// schedule by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <random>

#include "sim/pipeline.h"
#include "sim/strategy.h"

namespace distca::sim {
namespace {

std::vector<MicroBatchTimes> Uniform(int m, int stages, double f, double b, double p2p = 0) {
  MicroBatchTimes t;
  t.forward.assign(stages, f);
  t.backward.assign(stages, b);
  t.p2p = p2p;
  return std::vector<MicroBatchTimes>(m, t);
}

TEST(PipelineTest, UniformIsMPlusPMinusOneTimesFPlusB) {
  for (int stages : {1, 2, 4}) {
    for (int m : {1, 2, 3, 8}) {
      const PipelineRun run = Simulate1F1B(Uniform(m, stages, 1.0, 2.0));
      EXPECT_DOUBLE_EQ(run.makespan, (m + stages - 1) * 3.0) << stages << " stages, m " << m;
      for (double busy : run.busy) EXPECT_DOUBLE_EQ(busy, m * 3.0);
    }
  }
  EXPECT_EQ(Simulate1F1B({}).makespan, 0.0);
}

TEST(PipelineTest, OneSlowMicroBatch) {
  // P 2, m 2, f 1, b 2; micro-batch 0's forward on stage 1 takes 2.
  //   s0: F0 [0,1] F1 [1,2]             B0 [5,7] B1 [8,10]
  //   s1:    F0 [1,3] B0 [3,5] F1 [5,6] B1 [6,8]
  std::vector<MicroBatchTimes> mbs = Uniform(2, 2, 1.0, 2.0);
  mbs[0].forward[1] = 2.0;
  const PipelineRun run = Simulate1F1B(mbs);
  EXPECT_DOUBLE_EQ(run.makespan, 10.0);
  EXPECT_DOUBLE_EQ(run.busy[0], 6.0);
  EXPECT_DOUBLE_EQ(run.busy[1], 7.0);
}

TEST(PipelineTest, PointToPointOnEveryStageBoundary) {
  // P 2, m 1: F0 [0,1], send 0.5, F1 [1.5,2.5], B1 [2.5,4.5], send 0.5, B0 [5,7].
  EXPECT_DOUBLE_EQ(Simulate1F1B(Uniform(1, 2, 1.0, 2.0, 0.5)).makespan, 7.0);
  // P 2, m 2: every message waits 0.5 on its way.
  //   s0: F0 [0,1] F1 [1,2]                    B0 [5,7]  B1 [8,10]
  //   s1:   F0 [1.5,2.5] B0 [2.5,4.5] F1 [4.5,5.5] B1 [5.5,7.5]
  const PipelineRun run = Simulate1F1B(Uniform(2, 2, 1.0, 2.0, 0.5));
  EXPECT_DOUBLE_EQ(run.makespan, 10.0);
  EXPECT_DOUBLE_EQ(run.busy[0], 6.0);  // the messages are not busy time
  EXPECT_DOUBLE_EQ(run.busy[1], 6.0);
}

TEST(PackingTest, CutIntoChunksCutsAtBoundaries) {
  const auto chunks = CutIntoChunks({3, 5, 2, 6}, 4);
  const std::vector<std::vector<int64_t>> want = {{3, 1}, {4}, {2, 2}, {4}};
  EXPECT_EQ(chunks, want);
}

TEST(PackingTest, BalanceWavesLongestFirstIntoTheLightest) {
  // 1536 -> wave 0; 512 -> wave 1 (512); 512 -> wave 1 (1024); 256 -> wave
  // 1 (1280); 256 -> wave 1 (1536): both waves hold 1536 tokens, each in
  // the batch's order.
  const auto waves = BalanceWaves({1536, 512, 256, 256, 512}, 2);
  const std::vector<std::vector<int64_t>> want = {{1536}, {512, 256, 256, 512}};
  EXPECT_EQ(waves, want);
  // Ties go to the lower wave; more waves than documents leave some empty.
  EXPECT_EQ(BalanceWaves({5, 5}, 3), (std::vector<std::vector<int64_t>>{{5}, {5}, {}}));
}

TEST(PackingTest, SplitIntoWavesKeepsDocumentsWhole) {
  // Middles at 1.5, 5.5, 9, 13 with waves of 8 tokens: waves 0, 0, 1, 1.
  const auto waves = SplitIntoWaves({3, 5, 2, 6}, 2, 8);
  const std::vector<std::vector<int64_t>> want = {{3, 5}, {2, 6}};
  EXPECT_EQ(waves, want);
  // The 7 spans [6, 13): its middle 9.5 is past the boundary at 8.
  const std::vector<std::vector<int64_t>> want2 = {{6}, {7, 3}};
  EXPECT_EQ(SplitIntoWaves({6, 7, 3}, 2, 8), want2);
}

TEST(PackingTest, WlbPackBalancesCostUnderTheCap) {
  // b 4: costs (l/4)^2 + l/4: 4 -> 2, 2 -> 0.75, 2 -> 0.75, 1 -> 0.3125.
  // 4 -> bin 0; 2 -> bin 1; 2 -> bin 1 (0.75 < 2); 1 -> bin 1 (1.5 < 2).
  const std::vector<std::vector<int64_t>> want = {{4}, {2, 2, 1}};
  EXPECT_EQ(WlbPack({2, 4, 1, 2}, 2, 4, 8), want);
  // Cap 4, 3 bins: bin 0 is full with the 4; the 2s go to bins 1 and 2; the 1
  // ties between them (0.75 each) and goes to the first.
  const std::vector<std::vector<int64_t>> capped = {{4}, {2, 1}, {2}};
  EXPECT_EQ(WlbPack({2, 4, 1, 2}, 3, 4, 4), capped);
  // The breakpoint weighs attention against linear work. At b 8: 4 -> 0.75,
  // 3 -> 0.516, 2 -> 0.3125, 1 -> 0.14: 4 -> bin 0, 3 -> bin 1, 2 -> bin 1
  // (0.516 < 0.75), 1 -> bin 0 (0.75 < 0.83). At b 2 the 4 weighs 6 against
  // 3.75 + 2 + 0.75 for the rest, which all go to bin 1.
  const std::vector<std::vector<int64_t>> linear_heavy = {{4, 1}, {3, 2}}, attention_heavy = {{4}, {3, 2, 1}};
  EXPECT_EQ(WlbPack({1, 2, 3, 4}, 2, 8, 16), linear_heavy);
  EXPECT_EQ(WlbPack({1, 2, 3, 4}, 2, 2, 16), attention_heavy);
}

TEST(PackingTest, LongestProcessingTimeFirst) {
  // 5 -> r0, 4 -> r1, 3 -> r1 (4 < 5), 2 -> r0 (5 < 7).
  const std::vector<std::vector<int>> want = {{1, 3}, {0, 2}};
  EXPECT_EQ(AssignLpt({4, 5, 3, 2}, 2), want);
  // Every replica runs the same number of micro-batches: 10 -> r0, 1 -> r1,
  // 1 -> r1, and the last 1 to r0 (r1 is full), not all three 1s to r1.
  const std::vector<std::vector<int>> equal = {{0, 3}, {1, 2}};
  EXPECT_EQ(AssignLpt({10, 1, 1, 1}, 2), equal);
}

// The packers keep their bins ordered (O(log n) a document); the plain scans
// they replaced, written out again here, pick the same bin every time: the
// least value, ties to the lowest index.
double PlainWlbCost(int64_t len, double b) { return double(len) / b * (double(len) / b) + double(len) / b; }

std::vector<int> LongestFirst(const std::vector<int64_t>& docs) {
  std::vector<int> order(docs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return docs[a] > docs[b]; });
  return order;
}

std::vector<std::vector<int64_t>> PlainBalanceWaves(const std::vector<int64_t>& docs, int waves) {
  std::vector<int> wave_of(docs.size());
  std::vector<int64_t> tokens(waves, 0);
  for (int d : LongestFirst(docs)) {
    wave_of[d] = int(std::min_element(tokens.begin(), tokens.end()) - tokens.begin());
    tokens[wave_of[d]] += docs[d];
  }
  std::vector<std::vector<int64_t>> out(waves);
  for (size_t d = 0; d < docs.size(); ++d) out[wave_of[d]].push_back(docs[d]);
  return out;
}

std::vector<std::vector<int64_t>> PlainWlbPack(const std::vector<int64_t>& docs, int bins, double b, int64_t cap) {
  std::vector<std::vector<int64_t>> out(bins);
  std::vector<double> load(bins, 0.0);
  std::vector<int64_t> tokens(bins, 0);
  for (int d : LongestFirst(docs)) {
    int best = -1;
    for (int i = 0; i < bins; ++i)
      if (tokens[i] + docs[d] <= cap && (best < 0 || load[i] < load[best])) best = i;
    if (best < 0) best = int(std::min_element(tokens.begin(), tokens.end()) - tokens.begin());
    out[best].push_back(docs[d]);
    load[best] += PlainWlbCost(docs[d], b);
    tokens[best] += docs[d];
  }
  return out;
}

std::vector<std::vector<int64_t>> PlainWlbBalance(const std::vector<int64_t>& docs, int bins, int64_t cap, double b) {
  std::vector<int64_t> sorted = docs;
  std::stable_sort(sorted.begin(), sorted.end(), std::greater<>());
  std::vector<std::vector<int64_t>> out(bins);
  std::vector<double> load(bins, 0.0);
  std::vector<int64_t> tokens(bins, 0);
  auto put = [&](int i, int64_t len) {
    out[i].push_back(len);
    load[i] += PlainWlbCost(len, b);
    tokens[i] += len;
  };
  std::vector<int64_t> aside;
  for (int64_t len : sorted) {
    const int lightest = int(std::min_element(load.begin(), load.end()) - load.begin());
    const int emptiest = int(std::min_element(tokens.begin(), tokens.end()) - tokens.begin());
    if (tokens[lightest] + len <= cap)
      put(lightest, len);
    else if (tokens[emptiest] + len <= cap)
      put(emptiest, len);
    else
      aside.push_back(len);
  }
  for (int64_t len : aside) put(int(std::min_element(load.begin(), load.end()) - load.begin()), len);
  return out;
}

std::vector<std::vector<int>> PlainAssignLpt(const std::vector<double>& times, int replicas) {
  std::vector<int> order(times.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return times[a] > times[b]; });
  const size_t most = (times.size() + size_t(replicas) - 1) / size_t(replicas);
  std::vector<std::vector<int>> out(replicas);
  std::vector<double> total(replicas, 0.0);
  for (int i : order) {
    int best = -1;
    for (int r = 0; r < replicas; ++r)
      if (out[r].size() < most && (best < 0 || total[r] < total[best])) best = r;
    out[best].push_back(i);
    total[best] += times[i];
  }
  return out;
}

TEST(PackingTest, OrderedPackersPickAsThePlainScans) {
  std::mt19937_64 rng(7);
  int capped = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    // Few distinct lengths, so that loads tie often.
    const int n = int(rng() % 40), bins = 1 + int(rng() % 9);
    const int64_t unit = 1 + int64_t(rng() % 3);
    std::vector<int64_t> docs(n);
    for (int64_t& len : docs) len = unit * (1 + int64_t(rng() % 6));
    const int64_t total = std::accumulate(docs.begin(), docs.end(), int64_t{0});
    // Caps around a bin's share, where they bind.
    const int64_t share = (total + bins - 1) / bins;
    const int64_t cap = std::max<int64_t>(1, share - 2 * unit + int64_t(rng() % uint64_t(share + 4 * unit)));
    const double b = double(1 + rng() % 8);
    ASSERT_EQ(BalanceWaves(docs, bins), PlainBalanceWaves(docs, bins)) << trial;
    ASSERT_EQ(WlbPack(docs, bins, b, cap), PlainWlbPack(docs, bins, b, cap)) << trial;
    ASSERT_EQ(WlbBalance(docs, bins, cap, b), PlainWlbBalance(docs, bins, cap, b)) << trial;
    std::vector<double> times(docs.begin(), docs.end());
    ASSERT_EQ(AssignLpt(times, bins), PlainAssignLpt(times, bins)) << trial;
    const int64_t no_cap = total + 1;
    capped += WlbPack(docs, bins, b, cap) != WlbPack(docs, bins, b, no_cap) ||
              WlbBalance(docs, bins, cap, b) != WlbBalance(docs, bins, no_cap, b);
  }
  EXPECT_GT(capped, 200);  // the cap changed the bins in 333 of them
}

}  // namespace
}  // namespace distca::sim
