// Sizing a job: the (tp, pp) shapes of a cluster and the search over them.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "distca/sim.h"
#include "sim_test_util.h"

namespace distca {
namespace {

using sim_test::TestOptions;
using Shapes = std::vector<std::pair<int, int>>;

TEST(ParallelShapesTest, TpWithinANodePpDividingTheLayersBothDividingTheGpus) {
  SimOptions o = TestOptions();  // 2 GPUs per node, 2 layers, 4 query / 2 K/V heads
  o.gpus = 4;
  EXPECT_EQ(ParallelShapes(o), (Shapes{{1, 1}, {1, 2}, {2, 1}, {2, 2}}));
  o.gpus = 2;  // tp x pp = 4 does not divide 2
  EXPECT_EQ(ParallelShapes(o), (Shapes{{1, 1}, {1, 2}, {2, 1}}));
  o.gpus = 8;
  o.hardware.gpus_per_node = 4;  // tp 4 would split the 2 K/V heads unevenly: replicated, allowed
  EXPECT_EQ(ParallelShapes(o), (Shapes{{1, 1}, {1, 2}, {2, 1}, {2, 2}, {4, 1}, {4, 2}}));
  o.model.q_heads = 6;  // tp 4 does not divide 6 query heads
  o.model.hidden = 96;
  EXPECT_EQ(ParallelShapes(o), (Shapes{{1, 1}, {1, 2}, {2, 1}, {2, 2}}));
  // Huge nodes and many layers: tp x pp stays within the GPUs (no overflow).
  o = TestOptions();
  o.gpus = 16;
  o.hardware.gpus_per_node = 1 << 20;
  o.model.num_layers = 4096;
  EXPECT_EQ(ParallelShapes(o),
            (Shapes{{1, 1}, {1, 2}, {1, 4}, {1, 8}, {1, 16}, {2, 1}, {2, 2}, {2, 4}, {2, 8}, {4, 1}, {4, 2}, {4, 4}}));
}

// What SearchParallelism must pick, from each shape simulated on its own.
struct Expected {
  int tp = 0, pp = 0;
  double iteration_s = 0;
  bool fits = false;
};
Expected Pick(const SimOptions& base, const std::vector<std::vector<int64_t>>& batches, SimStrategy s) {
  Expected e;
  double memory = std::numeric_limits<double>::infinity();
  for (const auto& [tp, pp] : ParallelShapes(base)) {
    SimOptions o = base;
    o.tp = tp;
    o.pp = pp;
    std::vector<SimResult> r;
    if (!Simulate(o, batches, {s}, &r).ok()) continue;
    const bool better = r[0].memory_fits != e.fits ? r[0].memory_fits
                        : e.fits                   ? r[0].iteration_s < e.iteration_s
                                                   : r[0].memory_max_bytes < memory;
    if (e.tp == 0 || better) {
      e = {tp, pp, r[0].iteration_s, r[0].memory_fits};
      memory = r[0].memory_max_bytes;
    }
  }
  return e;
}

TEST(SearchParallelismTest, FastestShapeThatFitsPerStrategy) {
  SimOptions o = TestOptions();
  o.gpus = 4;
  o.batch_size = 4;  // divisible by every shape's ranks per stage (4, 2, 2, 1)
  // Small logits and 8 layers: pp 2 (half the weights per stage) needs less
  // memory than the fastest shape, pp 1, whose layers' backward working set
  // is the same.
  o.model.vocab_size = 32;
  o.model.num_layers = 8;
  const std::vector<std::vector<int64_t>> batches = {{2048, 1024, 512, 256, 128, 64, 32, 32}, {4096}};
  const std::vector<SimStrategy> strategies = {SimStrategy::kWlbIdeal, SimStrategy::kMegatron, SimStrategy::kDistca,
                                               SimStrategy::kColocated};
  // Unlimited memory, then just too little for wlb-ideal's fastest shape (some
  // other shape needs less), then too little for any.
  o.hardware.memory_bytes = 1e12;
  std::vector<ShapeChoice> unlimited;
  std::vector<ShapeTrial> trials;
  ASSERT_TRUE(SearchParallelism(o, batches, strategies, ParallelShapes(o), &unlimited, &trials).ok());
  double least = std::numeric_limits<double>::infinity();
  for (const ShapeTrial& t : trials)
    if (t.status[0].ok()) least = std::min(least, t.results[0].memory_max_bytes);
  const double tight = unlimited[0].result.memory_max_bytes * (1 - 1e-9);
  ASSERT_LT(least, tight);
  for (double capacity : {1e12, tight, 1.0}) {
    o.hardware.memory_bytes = capacity;
    std::vector<ShapeChoice> best;
    ASSERT_TRUE(SearchParallelism(o, batches, strategies, ParallelShapes(o), &best, &trials).ok()) << capacity;
    ASSERT_EQ(best.size(), strategies.size());
    EXPECT_EQ(trials.size(), ParallelShapes(o).size());
    for (size_t i = 0; i < strategies.size(); ++i) {
      const Expected want = Pick(o, batches, strategies[i]);
      EXPECT_EQ(best[i].tp, want.tp) << SimStrategyName(strategies[i]) << " at " << capacity;
      EXPECT_EQ(best[i].pp, want.pp) << SimStrategyName(strategies[i]) << " at " << capacity;
      EXPECT_EQ(best[i].result.iteration_s, want.iteration_s);
      EXPECT_EQ(best[i].result.memory_fits, want.fits);
      EXPECT_DOUBLE_EQ(best[i].result.speedup, best[0].result.iteration_s / best[i].result.iteration_s);
    }
    if (capacity == tight) {
      EXPECT_TRUE(best[0].result.memory_fits);
      EXPECT_NE(std::pair(best[0].tp, best[0].pp), std::pair(unlimited[0].tp, unlimited[0].pp));
      EXPECT_GT(best[0].result.iteration_s, unlimited[0].result.iteration_s);
    }
    if (capacity == 1.0) {
      EXPECT_FALSE(best[0].result.memory_fits);
    }
  }
}

TEST(SearchParallelismTest, AStrategyThatCannotRunAtTheFirstShapesPicksAmongTheOthers) {
  SimOptions o = TestOptions();
  o.gpus = 4;
  o.batch_size = 2;  // colocated needs the stage's ranks to divide it: not 4 (tp 1, pp 1)
  const std::vector<std::vector<int64_t>> batches = {{1024, 512, 256, 256}, {2048}};
  const std::vector<SimStrategy> strategies = {SimStrategy::kWlbIdeal, SimStrategy::kColocated};
  std::vector<ShapeChoice> best;
  std::vector<ShapeTrial> trials;
  // Each shape is reported as soon as it is simulated, in order, with its
  // statuses (the tool prints the table's rows from it).
  std::vector<std::pair<int, int>> reported;
  std::vector<bool> colocated_ran;
  const auto on_shape = [&](const ShapeTrial& t) {
    reported.emplace_back(t.tp, t.pp);
    colocated_ran.push_back(t.status[1].ok());
  };
  ASSERT_TRUE(SearchParallelism(o, batches, strategies, ParallelShapes(o), &best, &trials, on_shape).ok());
  ASSERT_EQ(trials.size(), 4u);
  ASSERT_EQ(reported.size(), trials.size());
  for (size_t t = 0; t < trials.size(); ++t) {
    EXPECT_EQ(reported[t], std::pair(trials[t].tp, trials[t].pp)) << t;
    EXPECT_EQ(colocated_ran[t], trials[t].status[1].ok()) << t;
  }
  EXPECT_EQ(std::pair(trials[0].tp, trials[0].pp), std::pair(1, 1));
  EXPECT_TRUE(trials[0].status[0].ok());
  EXPECT_FALSE(trials[0].status[1].ok());
  EXPECT_NE(trials[0].status[1].message().find("colocated"), std::string::npos) << trials[0].status[1].message();
  for (size_t t = 1; t < trials.size(); ++t) EXPECT_TRUE(trials[t].status[1].ok()) << t;
  for (size_t i = 0; i < strategies.size(); ++i) {
    const Expected want = Pick(o, batches, strategies[i]);
    EXPECT_EQ(std::pair(best[i].tp, best[i].pp), std::pair(want.tp, want.pp)) << SimStrategyName(strategies[i]);
    EXPECT_EQ(best[i].result.iteration_s, want.iteration_s);
  }
}

TEST(SearchParallelismTest, ReasonsForShapesAndStrategiesThatCannotRun) {
  SimOptions o = TestOptions();
  std::vector<ShapeChoice> best;
  std::vector<ShapeTrial> trials;
  // 3 GPUs: only tp 1, pp 1 (3 ranks per stage); wlb-ideal's CP degrees
  // (powers of two dividing 3: 1) leave 3 replicas, over which 2 chunks do
  // not split.
  o.gpus = 3;
  o.batch_size = 2;
  const Status s = SearchParallelism(o, {{1024, 1024}}, {SimStrategy::kWlbIdeal}, ParallelShapes(o), &best, &trials);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("wlb-ideal runs at no (tp, pp) shape; tp 1 pp 1: "), std::string::npos) << s.message();
  ASSERT_EQ(trials.size(), 1u);
  EXPECT_FALSE(trials[0].status[0].ok());
  // With a strategy that runs there, the search goes on: at 4 GPUs and tp
  // 1, pp 1 alone, colocated (whose 4 ranks do not divide B = 2) gets no
  // shape and its reasons, wlb-ideal its choice.
  {
    SimOptions four = TestOptions();
    four.gpus = 4;
    four.batch_size = 2;
    ASSERT_TRUE(SearchParallelism(four, {{1024, 512, 256, 256}}, {SimStrategy::kWlbIdeal, SimStrategy::kColocated},
                                  {{1, 1}}, &best, &trials)
                    .ok());
    ASSERT_EQ(best.size(), 2u);
    EXPECT_TRUE(best[0].status.ok()) << best[0].status.ToString();
    EXPECT_EQ(std::pair(best[0].tp, best[0].pp), std::pair(1, 1));
    EXPECT_EQ(best[0].result.speedup, 1.0);
    EXPECT_EQ(std::pair(best[1].tp, best[1].pp), std::pair(0, 0));
    EXPECT_EQ(best[1].result.strategy, SimStrategy::kColocated);
    EXPECT_NE(best[1].status.message().find("colocated runs at no (tp, pp) shape; tp 1 pp 1: "), std::string::npos)
        << best[1].status.message();
  }
  // No shape at all.
  o.max_doc_len = 0;
  EXPECT_TRUE(ParallelShapes(o).empty());
  const Status none = SearchParallelism(o, {{1024, 1024}}, {SimStrategy::kWlbIdeal}, {}, &best, &trials);
  EXPECT_NE(none.message().find("no (tp, pp) shape to search"), std::string::npos) << none.message();
}

}  // namespace
}  // namespace distca
