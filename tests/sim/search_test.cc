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

// A search where distca plans by a measured table, its four-shape options
// and batches, and each shape's result simulated on its own (in full, or
// as screened: without the table).
struct TableSearch {
  SimOptions options = TestOptions();
  std::vector<std::vector<int64_t>> batches = {{2048, 1024, 512, 256, 128, 64, 32, 32}, {4096}};
  std::vector<SimStrategy> strategies = {SimStrategy::kWlbIdeal, SimStrategy::kDistca};
  TableSearch() {
    options.gpus = 4;
    options.batch_size = 4;
    options.model.vocab_size = 32;
    options.model.num_layers = 8;
    options.hardware.attention_tables = {sim_test::ByPrefixTable()};
  }
  double Alone(const ShapeTrial& t, bool screen) const {
    SimOptions o = options;
    o.tp = t.tp;
    o.pp = t.pp;
    o.screen_planning = screen;
    std::vector<SimResult> r;
    EXPECT_TRUE(Simulate(o, batches, {SimStrategy::kDistca}, &r).ok());
    return r.empty() ? 0.0 : r[0].iteration_s;
  }
};

TEST(SearchParallelismTest, ScreensDistcaWithoutTheTableAndSimulatesInFullWhereItCouldBeFastest) {
  TableSearch s;
  const auto shapes = ParallelShapes(s.options);
  std::vector<ShapeChoice> exact, best;
  std::vector<ShapeTrial> exact_trials, trials;
  s.options.search_screen_margin = std::numeric_limits<double>::infinity();
  ASSERT_TRUE(SearchParallelism(s.options, s.batches, s.strategies, shapes, &exact, &exact_trials).ok());
  s.options.search_screen_margin = kSearchScreenMargin;
  int reported = 0;
  ASSERT_TRUE(SearchParallelism(s.options, s.batches, s.strategies, shapes, &best, &trials, [&](const ShapeTrial&) {
                ++reported;
              }).ok());
  ASSERT_EQ(trials.size(), shapes.size());
  ASSERT_EQ(exact_trials.size(), shapes.size());
  EXPECT_EQ(reported, int(shapes.size()));
  // The fastest screen, planned by FLOPs.
  double fastest = std::numeric_limits<double>::infinity();
  for (const ShapeTrial& t : trials) fastest = std::min(fastest, s.Alone(t, /*screen=*/true));
  int screened = 0;
  for (size_t k = 0; k < trials.size(); ++k) {
    const ShapeTrial& t = trials[k];
    ASSERT_TRUE(t.status[1].ok() && t.results[1].memory_fits) << k;
    EXPECT_FALSE(t.screened[0]) << "wlb-ideal has no table to plan by";
    EXPECT_EQ(t.results[0].iteration_s, exact_trials[k].results[0].iteration_s);
    EXPECT_FALSE(exact_trials[k].screened[1]);
    const double screen = s.Alone(t, true);
    // Screened exactly where the screen is over the margin slower than the
    // fastest screen, and then the screen's result; else the full one,
    // which is at most the screen's.
    EXPECT_EQ(t.screened[1], screen > (1 + kSearchScreenMargin) * fastest) << k;
    EXPECT_EQ(t.results[1].iteration_s, t.screened[1] ? screen : exact_trials[k].results[1].iteration_s) << k;
    EXPECT_EQ(exact_trials[k].results[1].iteration_s, s.Alone(t, false)) << k;
    EXPECT_LE(exact_trials[k].results[1].iteration_s, screen) << k;
    screened += t.screened[1];
  }
  EXPECT_GT(screened, 0);
  EXPECT_LT(screened, int(shapes.size()));
  for (size_t i = 0; i < s.strategies.size(); ++i) {
    EXPECT_EQ(std::pair(best[i].tp, best[i].pp), std::pair(exact[i].tp, exact[i].pp)) << i;
    EXPECT_EQ(best[i].result.iteration_s, exact[i].result.iteration_s) << i;
  }
  // Planning one way alone, or without a table for the model, there is
  // nothing to screen; an invalid margin is refused.
  for (int alone = 0; alone < 3; ++alone) {
    TableSearch one;
    one.options.plan_by_flops = alone == 0;
    one.options.plan_by_table = alone == 1;
    if (alone == 2) one.options.hardware.attention_tables.clear();
    ASSERT_TRUE(SearchParallelism(one.options, one.batches, one.strategies, shapes, &best, &trials).ok());
    for (const ShapeTrial& t : trials) EXPECT_FALSE(t.screened[1]) << alone;
  }
  s.options.plan_by_flops = true;
  s.options.search_screen_margin = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(SearchParallelism(s.options, s.batches, s.strategies, shapes, &best, &trials).ok());
}

TEST(SearchParallelismTest, AScreenThatWouldBeChosenIsSimulatedInFull) {
  // A margin below zero simulates no shape in full after the screen: each
  // shape whose screen is the best is then simulated in full and reported
  // again, until the best is a shape so simulated.
  TableSearch s;
  s.options.search_screen_margin = -0.9;
  const auto shapes = ParallelShapes(s.options);
  std::vector<ShapeChoice> best;
  std::vector<ShapeTrial> trials;
  std::vector<std::pair<int, int>> reported;
  ASSERT_TRUE(SearchParallelism(s.options, s.batches, s.strategies, shapes, &best, &trials, [&](const ShapeTrial& t) {
                reported.emplace_back(t.tp, t.pp);
              }).ok());
  ASSERT_EQ(trials.size(), shapes.size());
  int by_table = 0;
  for (const ShapeTrial& t : trials) {
    by_table += !t.screened[1];
    EXPECT_EQ(t.results[1].iteration_s, s.Alone(t, /*screen=*/t.screened[1]));
  }
  // Here once: the full run (each tick the faster of two plannings) is at
  // most the screen's, so the first shape simulated in full stays the best.
  EXPECT_GE(by_table, 1);
  EXPECT_EQ(reported.size(), shapes.size() + by_table);
  const auto chosen = std::find_if(trials.begin(), trials.end(), [&](const ShapeTrial& t) {
    return std::pair(t.tp, t.pp) == std::pair(best[1].tp, best[1].pp);
  });
  ASSERT_NE(chosen, trials.end());
  EXPECT_FALSE(chosen->screened[1]);
  EXPECT_EQ(best[1].result.iteration_s, s.Alone(*chosen, false));
  for (const ShapeTrial& t : trials) EXPECT_LE(best[1].result.iteration_s, t.results[1].iteration_s);
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
