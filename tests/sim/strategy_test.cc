// Every strategy on tiny configurations whose iteration time is worked out by
// hand here (test profile and model in sim_test_util.h: 2 layers, tp 2).
#include <gtest/gtest.h>

#include <algorithm>

#include "distca/plan.h"
#include "sim/costs.h"
#include "sim_test_util.h"

namespace distca {
namespace {

using sim_test::TestOptions;

// Sums of a few dozen products: a relative 1e-12 is far above rounding and
// far below any modeling difference.
constexpr double kRel = 1e-12;

bool Contains(const Status& s, const std::string& needle) { return s.message().find(needle) != std::string::npos; }

SimResult SimulateOne(const SimOptions& o, const std::vector<std::vector<int64_t>>& batches, SimStrategy strategy) {
  std::vector<SimResult> results;
  const Status s = Simulate(o, batches, {strategy}, &results);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return results.empty() ? SimResult{} : results[0];
}

struct Parts {
  double lin, ca, head;  // one layer, one rank: 1024 tokens; attention of one 1024 document
};
Parts PartsFor(const SimOptions& o) {
  const sim::RankCosts k(o.model, o.hardware, o.tp);
  return {k.LinearForward(1024), k.AttentionForward(0, 1024), k.HeadForward(1024)};
}

// Two ranks (tp 2), one 1024-token chunk each (m = 1), 2 layers:
//   forward  = 2 * (lin + ca) + head,  backward = 2 * (2 lin + 2.5 ca) + 2 head.
double OneChunkPerRank(const Parts& p) {
  return 2 * (p.lin + p.ca) + p.head + 2 * (2 * p.lin + 2.5 * p.ca) + 2 * p.head;
}

TEST(MegatronTest, DataParallelOnly) {
  SimOptions o = TestOptions();
  o.cp = 1;
  const SimResult r = SimulateOne(o, {{1024, 1024}}, SimStrategy::kMegatron);
  const double want = OneChunkPerRank(PartsFor(o));
  EXPECT_NEAR(r.iteration_s, want, want * kRel);
  EXPECT_NEAR(r.idle_fraction, 0.0, 1e-12);
  EXPECT_EQ(r.bytes_moved, 0.0);
  EXPECT_EQ(r.cp, 1);
  EXPECT_NEAR(r.tokens_per_s, 2048 / want, 2048 / want * kRel);
}

TEST(MegatronTest, ContextParallelPaysTheAllGather) {
  SimOptions o = TestOptions();
  o.cp = 2;
  const sim::RankCosts k(o.model, o.hardware, o.tp);
  const Parts p = PartsFor(o);
  // One micro-batch of both chunks over the 2 ranks: 1024 tokens each; each
  // document's pairs halve, on 256-row shards; the group spans 4 devices > 2
  // per node: K/V of 2048 tokens (128 B each) ring-gathered at 10 GB/s.
  const double ca = 2 * k.AttentionForwardCp(1024, 2);
  const double ag = 1e-5 + 2048.0 * 128 / 2 / (2 * 10e9);
  const double want = 2 * (p.lin + ca + ag) + p.head + 2 * (2 * p.lin + 2.5 * ca + ag) + 2 * p.head;
  const SimResult r = SimulateOne(o, {{1024, 1024}}, SimStrategy::kMegatron);
  EXPECT_NEAR(r.iteration_s, want, want * kRel);
  // Gather forward + scatter backward, 2 layers, half the K/V to each rank.
  EXPECT_DOUBLE_EQ(r.bytes_moved, 2.0 * 2 * 2048 * 128 * 1);
  EXPECT_NEAR(r.breakdown.forward_comm_s, ag, ag * kRel);
}

TEST(MegatronTest, SweepPicksTheFasterCp) {
  SimOptions o = TestOptions();
  o.cp = 1;
  const double t1 = SimulateOne(o, {{1024, 1024}}, SimStrategy::kMegatron).iteration_s;
  o.cp = 2;
  const double t2 = SimulateOne(o, {{1024, 1024}}, SimStrategy::kMegatron).iteration_s;
  o.cp = 0;
  const SimResult r = SimulateOne(o, {{1024, 1024}}, SimStrategy::kMegatron);
  EXPECT_DOUBLE_EQ(r.iteration_s, std::min(t1, t2));
  EXPECT_EQ(r.cp, t1 <= t2 ? 1 : 2);
}

TEST(WlbIdealTest, PacksWholeDocumentsAndWaitsForTheSlowestReplica) {
  SimOptions o = TestOptions();
  o.cp = 1;
  const sim::RankCosts k(o.model, o.hardware, o.tp);
  const Parts p = PartsFor(o);
  // {1024, 512, 512} into 2 bins: {1024} and {512, 512}; one per replica.
  const double slow = OneChunkPerRank(p);
  const double ca512 = 2 * k.AttentionForward(0, 512);
  const double fast = 2 * (p.lin + ca512) + p.head + 2 * (2 * p.lin + 2.5 * ca512) + 2 * p.head;
  const SimResult r = SimulateOne(o, {{1024, 512, 512}}, SimStrategy::kWlbIdeal);
  EXPECT_NEAR(r.iteration_s, slow, slow * kRel);
  EXPECT_NEAR(r.idle_fraction, (slow - fast) / slow / 2, 1e-12);
}

TEST(CadTest, OneDocumentOneRankIsTheColocatedTime) {
  // 2 devices: one rank, one 1024 document, nothing to plan.
  SimOptions o = TestOptions();
  o.gpus = 2;
  o.batch_size = 1;
  const double want = OneChunkPerRank(PartsFor(o));
  for (SimStrategy s : {SimStrategy::kDistca, SimStrategy::kDistcaPaper}) {
    const SimResult r = SimulateOne(o, {{1024}}, s);
    EXPECT_NEAR(r.iteration_s, want, want * kRel) << SimStrategyName(s);
    EXPECT_EQ(r.bytes_moved, 0.0);
    EXPECT_EQ(r.cp, 0);
  }
}

// The iteration of {1024, 512, 512} on 2 ranks (m = 1) from the planner's
// own plans of the two nano-batches, {1024} and {512, 512}: per rank, linear
// over the tokens it holds, CA = its load / 2e12 (efficiency 1 everywhere),
// and an all-to-all of its bytes (forward or backward share) across nodes.
//   ping-pong on:  layer = max_r max(sum_n C, sum_n M) + min_n max_r M_n / 2
//   ping-pong off: layer = max_r (sum_n C + sum_n M)
double PlannedIteration(const SimOptions& o, const std::vector<int64_t>& docs, PlanPolicy policy, bool ping_pong,
                        double* bytes) {
  std::vector<std::vector<int>> nano_index;
  EXPECT_TRUE(SplitNanoBatches(docs, 2, &nano_index).ok());
  const sim::RankCosts k(o.model, o.hardware, o.tp);
  double layer[2] = {0, 0};
  *bytes = 0;
  for (int pass = 0; pass < 2; ++pass) {
    const double lin_factor = pass == 0 ? 1.0 : 2.0, ca_factor = pass == 0 ? 1.0 : 2.5;
    std::vector<double> c(2, 0.0), m(2, 0.0), dispatch;
    for (const auto& index : nano_index) {
      std::vector<int64_t> nano;
      for (int d : index) nano.push_back(docs[d]);
      PlanOptions po;
      po.ranks = 2;
      po.policy = policy;
      po.tolerance = o.tolerance;
      po.model = {4, 2, 16, 2};
      Plan plan;
      EXPECT_TRUE(BuildPlan(nano, po, CostModel::Flops(po.model), &plan).ok());
      const PlanTraffic& t = plan.stats.traffic;
      if (pass == 0) *bytes += 2.0 * double(t.total_bytes());  // 2 layers
      const double share = t.total_bytes() == 0 ? 0.0
                           : pass == 0          ? double(t.forward_bytes) / double(t.total_bytes())
                                                : double(t.backward_bytes) / double(t.total_bytes());
      std::vector<double> tokens(2, 0.0);
      for (const PlanDocument& d : plan.documents)
        for (const PlanPiece& p : d.pieces) tokens[p.rank] += double(p.end - p.begin);
      double slowest = 0;
      for (int r = 0; r < 2; ++r) {
        c[r] += lin_factor * k.LinearForward(tokens[r]) + ca_factor * plan.stats.load[r] / 2e12;
        if (t.sent[r] > 0 || t.received[r] > 0) {
          const double a2a = k.AllToAll(share * t.sent[r], share * t.received[r], true);
          m[r] += a2a;
          slowest = std::max(slowest, a2a);
        }
      }
      dispatch.push_back(slowest);
    }
    for (int r = 0; r < 2; ++r) layer[pass] = std::max(layer[pass], ping_pong ? std::max(c[r], m[r]) : c[r] + m[r]);
    if (ping_pong) layer[pass] += 0.5 * std::min(dispatch[0], dispatch[1]);
  }
  const double head = k.HeadForward(1024);
  return 2 * layer[0] + head + 2 * layer[1] + 2 * head;
}

TEST(CadTest, CostsThePlannersTasksAndTraffic) {
  SimOptions o = TestOptions();
  o.comm_budget = 0;
  o.hardware.attention_efficiency = {{1.0, 1.0}};
  const std::vector<int64_t> docs = {1024, 512, 512};
  for (bool ping_pong : {true, false}) {
    o.ping_pong = ping_pong;
    for (SimStrategy s : {SimStrategy::kDistca, SimStrategy::kDistcaPaper}) {
      const PlanPolicy policy = s == SimStrategy::kDistca ? PlanPolicy::kDistca : PlanPolicy::kPaper;
      double bytes = 0;
      const double want = PlannedIteration(o, docs, policy, ping_pong, &bytes);
      ASSERT_GT(bytes, 0);  // the {1024} nano-batch's second half is costlier: work moves
      const SimResult r = SimulateOne(o, {docs}, s);
      EXPECT_NEAR(r.iteration_s, want, want * kRel) << SimStrategyName(s) << " ping-pong " << ping_pong;
      EXPECT_DOUBLE_EQ(r.bytes_moved, bytes);
    }
  }
}

TEST(PipelineStrategiesTest, OneFOneBAgainstAlignedTicks) {
  // 4 devices, tp 2, pp 2: one rank per stage, one layer per stage, m = 2.
  SimOptions o = TestOptions();
  o.pp = 2;
  o.cp = 1;
  o.tolerance = 10;  // CAD: nothing is worth moving, so ticks are hand-computable
  const sim::RankCosts k(o.model, o.hardware, o.tp);
  const Parts p = PartsFor(o);
  const double a = p.lin + p.ca, c = 2 * p.lin + 2.5 * p.ca;
  const double p2p = k.PointToPoint(1024.0 * 128, true);  // 4 devices > 2 per node
  // 1F1B with f1 = a + head and b1 = c + 2 head on the last stage:
  //   makespan = a + 2 p2p + 2 (f1 + b1) + c.
  const double one_f_one_b = a + 2 * p2p + 2 * (a + p.head + c + 2 * p.head) + c;
  const SimResult mega = SimulateOne(o, {{1024, 1024}}, SimStrategy::kMegatron);
  EXPECT_NEAR(mega.iteration_s, one_f_one_b, one_f_one_b * kRel);
  // Aligned: 3 forward and 3 backward ticks, each one layer plus a p2p; the
  // head runs in the 2 ticks of each pass where the last stage is busy.
  const double aligned = 3 * (a + p2p) + 3 * (c + p2p) + 2 * (p.head + 2 * p.head);
  const SimResult distca = SimulateOne(o, {{1024, 1024}}, SimStrategy::kDistca);
  const SimResult paper = SimulateOne(o, {{1024, 1024}}, SimStrategy::kDistcaPaper);
  EXPECT_NEAR(distca.iteration_s, aligned, aligned * kRel);
  EXPECT_NEAR(paper.iteration_s, aligned, aligned * kRel);
  // The paper's bubbles run dummy linear work: busier, not faster.
  EXPECT_LT(paper.idle_fraction, distca.idle_fraction);
}

TEST(SimulateTest, SpeedupIsOverWlbIdeal) {
  SimOptions o = TestOptions();
  std::vector<SimResult> results;
  ASSERT_TRUE(
      Simulate(o, {{1024, 512, 512}, {1024, 1024}}, {SimStrategy::kWlbIdeal, SimStrategy::kMegatron}, &results).ok());
  ASSERT_EQ(results.size(), 2u);
  EXPECT_DOUBLE_EQ(results[0].speedup, 1.0);
  EXPECT_DOUBLE_EQ(results[1].speedup, results[0].iteration_s / results[1].iteration_s);
  EXPECT_EQ(results[0].iteration_per_batch.size(), 2u);
}

TEST(SimulateTest, RejectsBadOptionsAndBatches) {
  std::vector<SimResult> r;
  SimOptions o = TestOptions();
  o.gpus = 6;
  o.pp = 2;
  EXPECT_TRUE(Contains(Simulate(o, {{1024, 1024}}, {SimStrategy::kDistca}, &r), "not a multiple of tp x pp"));
  o = TestOptions();
  o.batch_size = 3;
  EXPECT_TRUE(Contains(ValidateSimOptions(o), "multiple of the 2 ranks per stage"));
  o = TestOptions();
  o.cp = 3;
  EXPECT_TRUE(Contains(ValidateSimOptions(o), "cp (3) must divide"));
  o = TestOptions();
  o.model.num_layers = 3;
  o.pp = 2;
  EXPECT_TRUE(Contains(ValidateSimOptions(o), "do not split into pp = 2"));
  o = TestOptions();
  EXPECT_TRUE(Contains(Simulate(o, {{1024, 1000}}, {SimStrategy::kDistca}, &r), "holds 2024 tokens"));
  EXPECT_TRUE(Contains(Simulate(o, {{2048}}, {SimStrategy::kDistca}, &r), "outside [1, max_doc_len = 1024]"));
  EXPECT_TRUE(Contains(Simulate(o, {}, {SimStrategy::kDistca}, &r), "no batches"));
  o.hardware = HardwareProfile{};
  EXPECT_TRUE(Contains(ValidateSimOptions(o), "hardware profile is incomplete"));
}

TEST(SimulateTest, ParsesStrategyLists) {
  std::vector<SimStrategy> s;
  ASSERT_TRUE(ParseSimStrategies("distca,wlb-ideal", &s).ok());
  EXPECT_EQ(s, (std::vector<SimStrategy>{SimStrategy::kDistca, SimStrategy::kWlbIdeal}));
  EXPECT_TRUE(Contains(ParseSimStrategies("distca,fast", &s), "unknown strategy 'fast'"));
  EXPECT_TRUE(Contains(ParseSimStrategies("distca,distca", &s), "listed twice"));
  EXPECT_TRUE(Contains(ParseSimStrategies("", &s), "unknown strategy ''"));
}

TEST(GridTest, PaperGridShapesAndCsv) {
  std::vector<GridPoint> points;
  ASSERT_TRUE(PaperGrid("3d", &points).ok());
  EXPECT_EQ(points.size(), 24u);  // 2 models x 3 lengths x 4 GPU counts
  for (const GridPoint& p : points) {
    EXPECT_EQ(p.pp, 1);
    EXPECT_EQ(p.batch_size, 2 * p.gpus / p.tp);  // m = 2
  }
  ASSERT_TRUE(PaperGrid("4d", &points).ok());
  EXPECT_EQ(points.size(), 24u);
  for (const GridPoint& p : points) {
    EXPECT_EQ(p.pp, p.model == "llama3-8b" ? 2 : 4);
    EXPECT_EQ(p.batch_size / (p.gpus / (p.tp * p.pp)), 2 * p.pp);  // m = 2 pp
    if (p.model == "llama-34b") {
      EXPECT_LE(p.max_doc_len, 384 * 1024);
    }
    EXPECT_DOUBLE_EQ(p.elongate, double(p.max_doc_len) / (128 * 1024));
  }
  EXPECT_EQ(points[0].Label(), "8B 128K 64");
  EXPECT_FALSE(PaperGrid("5d", &points).ok());

  const std::string header = GridCsvHeader();
  SimResult r;
  r.strategy = SimStrategy::kDistcaPaper;
  const std::string row = GridCsvRow(points[0], r);
  EXPECT_EQ(std::count(header.begin(), header.end(), ','), std::count(row.begin(), row.end(), ','));
  EXPECT_NE(row.find(",distca-paper,"), std::string::npos);
  const std::string script = SpeedupPlotScript("g.csv", "s.png", "t", {SimStrategy::kWlbIdeal, SimStrategy::kDistca});
  EXPECT_NE(script.find("set output 's.png'"), std::string::npos);
  EXPECT_NE(script.find("every 2::1 using 11:xtic(1) title 'distca'"), std::string::npos);
  EXPECT_EQ(script.find("title 'wlb-ideal'"), std::string::npos);  // the reference is the dashed line at 1
}

}  // namespace
}  // namespace distca
