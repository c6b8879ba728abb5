// Profile JSON round trip, fixed-batch shapes, and fitting a profile to
// measured colocated steps: steps "measured" by the simulator itself under
// known constants must give those constants back.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "common/file_util.h"
#include "sim_test_util.h"

namespace distca {
namespace {

using sim_test::TestModel;
using sim_test::TestProfile;

using sim_test::Contains;

TEST(ProfileJsonTest, RoundTripsEveryField) {
  HardwareProfile p = TestProfile();
  p.attention_backward_factor = 3.25;
  p.tp_collectives = true;
  p.all_to_all = LinkProfile{7e9, 2e-5};
  p.attention_tables.push_back({"t.csv", 4, 2, 16, 1.5, "ignored"});
  HardwareProfile q;
  const Status s = ParseHardwareProfile(HardwareProfileJson(p), &q);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(q.name, p.name);
  EXPECT_EQ(q.source, p.source);
  EXPECT_EQ(q.gpus_per_node, p.gpus_per_node);
  EXPECT_EQ(q.peak_flops, p.peak_flops);
  EXPECT_EQ(q.linear_mfu, p.linear_mfu);
  EXPECT_EQ(q.attention_efficiency, p.attention_efficiency);
  EXPECT_EQ(q.attention_backward_factor, 3.25);
  EXPECT_TRUE(q.tp_collectives);
  ASSERT_EQ(q.attention_tables.size(), 1u);
  EXPECT_EQ(q.attention_tables[0].file, "t.csv");
  EXPECT_EQ(q.attention_tables[0].q_heads, 4);
  EXPECT_EQ(q.attention_tables[0].kv_heads, 2);
  EXPECT_EQ(q.attention_tables[0].head_dim, 16);
  EXPECT_EQ(q.attention_tables[0].scale, 1.5);
  EXPECT_TRUE(q.attention_tables[0].csv.empty());
  EXPECT_EQ(q.dtype_bytes, p.dtype_bytes);
  EXPECT_EQ(q.memory_bytes, p.memory_bytes);
  EXPECT_EQ(q.intra_node.bandwidth, p.intra_node.bandwidth);
  EXPECT_EQ(q.inter_node.latency_s, p.inter_node.latency_s);
  ASSERT_TRUE(q.all_to_all.has_value());
  EXPECT_EQ(q.all_to_all->bandwidth, 7e9);
  // And the rest: written again, the same file.
  EXPECT_EQ(HardwareProfileJson(q), HardwareProfileJson(p));
  p.all_to_all.reset();
  ASSERT_TRUE(ParseHardwareProfile(HardwareProfileJson(p), &q).ok());
  EXPECT_FALSE(q.all_to_all.has_value());
}

TEST(ShapeFromBatchesTest, TokensPerRankAreTheBatchOverTheRanks) {
  SimOptions o = sim_test::TestOptions();  // 4 devices, tp 2: 2 ranks
  ASSERT_TRUE(ShapeFromBatches({{1000, 24}, {512, 512}}, &o).ok());
  EXPECT_EQ(o.max_doc_len, 512);
  EXPECT_EQ(o.batch_size, 2);
  EXPECT_TRUE(Contains(ShapeFromBatches({{1000, 24}, {512}}, &o), "batches[1] holds 512 tokens, batches[0] 1024"));
  EXPECT_TRUE(Contains(ShapeFromBatches({{7}}, &o), "7 is not a positive multiple of the 2 ranks"));
  EXPECT_TRUE(Contains(ShapeFromBatches({}, &o), "no batches"));
  o.gpus = 6;
  o.pp = 2;
  EXPECT_TRUE(Contains(ShapeFromBatches({{8}}, &o), "multiple of tp x pp"));
}

// 2 ranks of one device, a long document on rank 0 in some steps.
struct FitCase {
  SimOptions options;
  std::vector<MeasuredStep> steps;
};

// Each batch's colocated step time under `truth`: steps "measured" by the
// simulator itself.
std::vector<MeasuredStep> MeasuredUnder(const SimOptions& truth, const std::vector<std::vector<int64_t>>& batches) {
  std::vector<MeasuredStep> steps;
  for (const auto& b : batches) {
    SimOptions o = truth;
    EXPECT_TRUE(ShapeFromBatches({b}, &o).ok());
    std::vector<SimResult> r;
    EXPECT_TRUE(Simulate(o, {b}, {SimStrategy::kColocated}, &r).ok());
    steps.push_back({b, r.empty() ? 0.0 : r[0].iteration_s});
  }
  return steps;
}

FitCase MakeCase(double true_mfu, double true_attention) {
  FitCase f;
  f.options = sim_test::TestOptions();
  f.options.gpus = 2;
  f.options.tp = 1;
  f.options.comm_budget = 0;
  const std::vector<std::vector<int64_t>> batches = {
      {2048, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64,
       64,   64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64},
      std::vector<int64_t>(16, 256),
      {1536, 512, 1024, 1024}};
  SimOptions truth = f.options;
  truth.hardware.linear_mfu = true_mfu;
  for (auto& point : truth.hardware.attention_efficiency) point.second /= true_attention;
  f.steps = MeasuredUnder(truth, batches);
  return f;
}

TEST(FitColocatedStepsTest, RecoversTheConstantsTheStepsWereMadeWith) {
  FitCase f = MakeCase(0.2, 1.6);  // the profile starts at 0.5 and 1
  ProfileFit fit;
  const Status s = FitColocatedSteps(f.steps, &f.options, &fit);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_NEAR(fit.linear_mfu, 0.2, 1e-9);
  EXPECT_NEAR(fit.attention_factor, 1.6, 1e-9);
  EXPECT_NEAR(f.options.hardware.linear_mfu, 0.2, 1e-9);
  EXPECT_NEAR(f.options.hardware.attention_efficiency[0].second, 0.5 / 1.6, 1e-9);
  ASSERT_EQ(fit.predicted_s.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(fit.predicted_s[i] / f.steps[i].step_s, 1.0, 1e-9);
  EXPECT_LT(fit.max_relative_error, 1e-9);
}

// The colocated step time a profile simulates for a step's batch.
double SimulatedStepSeconds(const SimOptions& options, const MeasuredStep& m) {
  SimOptions o = options;
  EXPECT_TRUE(ShapeFromBatches({m.lengths}, &o).ok());
  std::vector<SimResult> r;
  EXPECT_TRUE(Simulate(o, {m.lengths}, {SimStrategy::kColocated}, &r).ok());
  return r.empty() ? 0.0 : r[0].iteration_s;
}

// 4 ranks (tp 2, two devices a node: the exchanges cross nodes, here over a
// slow link), and in every step some rank with no bytes in the exchanges:
// its clock runs on unsynchronized, so a step's time is only piecewise
// linear in the two constants, and one linearization misses them (it found
// an attention factor of 0.518 here, and predicted the steps within 2.7%).
TEST(FitColocatedStepsTest, RecoversTheConstantsWhereSomeRanksExchangeNothing) {
  SimOptions base = sim_test::TestOptions();
  base.gpus = 8;
  base.comm_budget = 0;
  base.hardware.inter_node = {1e9, 1e-4};
  std::vector<std::vector<int64_t>> batches = {
      {1024, 256, 256, 256, 512}, {2048}, std::vector<int64_t>(16, 256), {1536, 512, 1024, 1024}};
  for (int i = 0; i < 7; ++i) batches[0].push_back(256);
  for (int i = 0; i < 32; ++i) batches[1].push_back(64);
  // The truth: linear MFU 0.4, the test profile's curve at 0.8 of its
  // level; the fit starts from it at 0.4 (attention factor 0.5 to find).
  SimOptions truth = base;
  truth.hardware.linear_mfu = 0.4;
  for (auto& point : truth.hardware.attention_efficiency) point.second *= 0.8;
  for (auto& point : base.hardware.attention_efficiency) point.second *= 0.4;
  const std::vector<MeasuredStep> steps = MeasuredUnder(truth, batches);
  ProfileFit fit;
  SimOptions o = base;
  const Status s = FitColocatedSteps(steps, &o, &fit);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_NEAR(fit.linear_mfu, 0.4, 1e-9);
  EXPECT_NEAR(fit.attention_factor, 0.5, 1e-9);
  ASSERT_EQ(fit.predicted_s.size(), steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_NEAR(fit.predicted_s[i] / steps[i].step_s, 1.0, 1e-9) << i;
    EXPECT_NEAR(SimulatedStepSeconds(o, steps[i]) / fit.predicted_s[i], 1.0, 1e-12) << i;
  }
  EXPECT_LT(fit.max_relative_error, 1e-9);
}

// Sum over steps of (predicted / measured - 1)^2 under a profile.
double Objective(const SimOptions& options, const std::vector<MeasuredStep>& steps) {
  double sum = 0;
  for (const MeasuredStep& m : steps) sum += std::pow(SimulatedStepSeconds(options, m) / m.step_s - 1, 2);
  return sum;
}

// The fitted profile is a least-squares minimum: no small move of
// linear_mfu, or of the attention level (`scale_attention` multiplies it),
// fits the steps better.
void ExpectNoSmallMoveFitsBetter(const SimOptions& fitted, const std::vector<MeasuredStep>& steps,
                                 const std::function<void(SimOptions*, double)>& scale_attention,
                                 const std::string& attention) {
  const double best = Objective(fitted, steps);
  for (double step : {1e-3, -1e-3}) {
    SimOptions o = fitted;
    o.hardware.linear_mfu *= 1 + step;
    EXPECT_GT(Objective(o, steps), best) << "linear_mfu x " << 1 + step;
    o = fitted;
    scale_attention(&o, 1 + step);
    EXPECT_GT(Objective(o, steps), best) << attention << " x " << 1 + step;
  }
}

TEST(FitColocatedStepsTest, ScalesTheTableWhenOneServesTheModel) {
  FitCase f = MakeCase(0.25, 1.0);
  // A table for the test model's heads (4 x 2 of 16 at tp 1), several times
  // slower than the curve: the fit scales it down to match steps made with
  // the curve.
  const char* csv = "q_len,kv_len,seconds\n64,64,2e-5\n64,4096,2e-3\n4096,4096,4e-2\n";
  ASSERT_TRUE(WriteTextFile(::testing::TempDir() + "/fit_table.csv", csv).ok());
  f.options.hardware.attention_tables.push_back({"fit_table.csv", 4, 2, 16, 1.0, csv});
  ProfileFit fit;
  const Status s = FitColocatedSteps(f.steps, &f.options, &fit);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_NEAR(f.options.hardware.attention_tables[0].scale, fit.attention_factor, 1e-12);
  EXPECT_LT(fit.attention_factor, 1.0);  // the table is slower than the steps' attention
  // The curve, divided by that factor, is capped at 1: it serves other shapes.
  EXPECT_EQ(f.options.hardware.attention_efficiency[0].second, std::min(1.0, 0.5 / fit.attention_factor));
  EXPECT_EQ(f.options.hardware.attention_efficiency[1].second, 1.0);
  // The table's shape is not the curve's, so two constants cannot match the
  // steps exactly: close (the linear time dominates the uniform step), not exact.
  EXPECT_NEAR(fit.linear_mfu, 0.25, 0.05);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(fit.predicted_s[i] / f.steps[i].step_s, 1.0, 0.2);
  // Its predictions are what the fitted profile simulates, and no small
  // move of either constant fits the steps better.
  for (size_t i = 0; i < 3; ++i)
    EXPECT_NEAR(SimulatedStepSeconds(f.options, f.steps[i]) / fit.predicted_s[i], 1.0, 1e-9) << i;
  ExpectNoSmallMoveFitsBetter(
      f.options, f.steps, [](SimOptions* o, double x) { o->hardware.attention_tables[0].scale *= x; }, "table scale");
}

TEST(FitColocatedStepsTest, InconsistentStepsGetTheLeastSquaresMinimum) {
  FitCase f = MakeCase(0.2, 1.6);
  // Noise no two constants can explain: the fit must then be the minimum of
  // the relative squared error, which no small move of either constant lowers.
  f.steps[0].step_s *= 1.10;
  f.steps[1].step_s *= 0.95;
  f.steps[2].step_s *= 1.02;
  ProfileFit fit;
  ASSERT_TRUE(FitColocatedSteps(f.steps, &f.options, &fit).ok());
  EXPECT_GT(fit.max_relative_error, 0.01);
  ExpectNoSmallMoveFitsBetter(
      f.options, f.steps,
      [](SimOptions* o, double x) {
        for (auto& point : o->hardware.attention_efficiency) point.second *= x;
      },
      "attention efficiency");
}

TEST(EfficiencyCurveFromTableTest, WholeDocumentTasksAtTheFlopCount) {
  // 4 heads of 16: a 128-token document has CausalPairs(0, 128) = 8256 pairs,
  // (1 + 2.5) x 4 x 8256 x 16 x 4 = 7,397,376 FLOPs; at 1e12 FLOP/s peak and
  // 1.4794752e-5 s that is 0.5 of peak. 1024: 524,800 pairs, 470,220,800 FLOPs
  // in 4.702208e-4 s = 1.0, and a faster entry is capped at 1.
  const char* csv = "q_len,kv_len,seconds\n128,128,1.4794752e-5\n128,1024,1e-4\n1024,1024,4.702208e-4\n";
  std::vector<std::pair<double, double>> curve;
  ASSERT_TRUE(EfficiencyCurveFromTable(csv, 1e12, 4, 16, 2.5, &curve).ok());
  ASSERT_EQ(curve.size(), 2u);
  EXPECT_EQ(curve[0].first, 128);
  EXPECT_NEAR(curve[0].second, 0.5, 1e-12);
  EXPECT_EQ(curve[1].first, 1024);
  EXPECT_NEAR(curve[1].second, 1.0, 1e-12);
  // Any number format the table parser takes reads the same.
  std::vector<std::pair<double, double>> decimal;
  ASSERT_TRUE(EfficiencyCurveFromTable(
                  "q_len,kv_len,seconds\n128.0,128,1.4794752e-5\n1.28e2,1024.0,1e-4\n1024,1.024e3,4.702208e-4\n", 1e12,
                  4, 16, 2.5, &decimal)
                  .ok());
  EXPECT_EQ(decimal, curve);
  ASSERT_TRUE(EfficiencyCurveFromTable(csv, 0.5e12, 4, 16, 2.5, &curve).ok());
  EXPECT_EQ(curve[0].second, 1.0);  // capped
  EXPECT_TRUE(Contains(EfficiencyCurveFromTable("q_len,kv_len,seconds\n128,1024,1\n", 1e12, 4, 16, 2.5, &curve),
                       "no whole-document"));
  EXPECT_FALSE(EfficiencyCurveFromTable("not a table", 1e12, 4, 16, 2.5, &curve).ok());
  EXPECT_FALSE(EfficiencyCurveFromTable(csv, 0, 4, 16, 2.5, &curve).ok());
}

TEST(MeasuredBackwardFactorTest, MedianOverWholeDocumentTasks) {
  // Whole documents of 128, 512 and 1024 rows: backward / forward
  // (1.5 - 0.5) / 0.5 = 2, (4 - 1) / 1 = 3, (9 - 2) / 2 = 3.5; median 3. The
  // 128-row task on a 1024 prefix (ratio 9) is not a whole document.
  AttentionTable t{"t.csv",
                   4,
                   2,
                   16,
                   1.0,
                   "q_len,kv_len,seconds\n128,128,1.5\n128,512,2\n128,1024,10\n512,512,4\n512,1024,6\n"
                   "1024,1024,9\n"};
  t.forward_file = "f.csv";
  t.forward_csv = "q_len,kv_len,seconds\n128,128,0.5\n128,512,0.7\n128,1024,1\n512,512,1\n512,1024,2\n1024,1024,2\n";
  double factor = 0;
  ASSERT_TRUE(MeasuredBackwardFactor(t, &factor).ok());
  EXPECT_DOUBLE_EQ(factor, 3.0);
  // Clamped to a profile's range: a backward faster than the forward reads 1.
  AttentionTable fast = t;
  fast.forward_csv = "q_len,kv_len,seconds\n128,128,1\n128,512,1.5\n128,1024,9\n512,512,3\n512,1024,5\n1024,1024,8\n";
  double median = 0;
  ASSERT_TRUE(MeasuredBackwardFactor(fast, &factor, &median).ok());
  EXPECT_DOUBLE_EQ(factor, 1.0);
  EXPECT_NEAR(median, 1.0 / 3.0, 1e-12);  // (4 - 3) / 3, the median of 0.5, 1/3 and 1/8: reported as measured
  AttentionTable none = t;
  none.forward_file.clear();
  none.forward_csv.clear();
  EXPECT_TRUE(Contains(MeasuredBackwardFactor(none, &factor), "has no forward table"));
  AttentionTable above = t;
  above.forward_csv = t.csv;
  EXPECT_TRUE(Contains(MeasuredBackwardFactor(above, &factor), "are not below"));
  AttentionTable rows{"r.csv", 4, 2, 16, 1.0, "q_len,kv_len,seconds\n128,1024,2\n"};
  rows.forward_file = "rf.csv";
  rows.forward_csv = "q_len,kv_len,seconds\n128,1024,1\n";
  EXPECT_TRUE(Contains(MeasuredBackwardFactor(rows, &factor), "no whole-document"));
}

TEST(FitColocatedStepsTest, HoldsAttentionAtThePeakJustBeyondIt) {
  // Attention 5% faster than the curve's top (1.0 at 1024 rows) allows:
  // within the slack for a measured peak, the level is held at the bound
  // and the linear MFU refitted alone; the steps are then close, not exact.
  FitCase f = MakeCase(0.2, 0.95);
  ProfileFit fit;
  const Status s = FitColocatedSteps(f.steps, &f.options, &fit);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(fit.attention_at_peak);
  EXPECT_NEAR(fit.attention_factor, 1.0, 1e-6);
  EXPECT_NEAR(f.options.hardware.attention_efficiency.back().second, 1.0, 1e-8);
  EXPECT_LE(f.options.hardware.attention_efficiency.back().second, 1.0);
  EXPECT_GT(fit.max_relative_error, 1e-4);
  EXPECT_LT(fit.max_relative_error, 0.05);
  for (size_t i = 0; i < f.steps.size(); ++i)
    EXPECT_NEAR(SimulatedStepSeconds(f.options, f.steps[i]) / fit.predicted_s[i], 1.0, 1e-12) << i;
  // Not held where the solution lies within the bound.
  FitCase g = MakeCase(0.2, 1.6);
  ASSERT_TRUE(FitColocatedSteps(g.steps, &g.options, &fit).ok());
  EXPECT_FALSE(fit.attention_at_peak);
}

TEST(MinimumTableScaleTest, TheScaleAtWhichTheTableMeetsThePeak) {
  // 4 x 2 heads of 16: a 64-row whole-document task does 2080 causal pairs
  // of 4 x 4 x 16 forward FLOPs each (4 per head and head dimension: the
  // planner's cost), 5.3248e5 in all: at a peak of 1e10 FLOP/s, 5.3248e-5
  // s; its cell says 2e-5 s, so the table needs a scale of at least 2.6624.
  const char* csv = "q_len,kv_len,seconds\n64,64,2e-5\n64,4096,2e-2\n4096,4096,4e-1\n";
  AttentionTable t{"t.csv", 4, 2, 16, 1.0, csv};
  double least = 0;
  ASSERT_TRUE(MinimumTableScale(t, 1e10, &least).ok());
  EXPECT_NEAR(least, 5.3248e-5 / 2e-5, 1e-9);
  t.scale = least * (1 + 1e-9);
  EXPECT_TRUE(ValidateAttentionTable(t, 1e10).ok());
  t.scale = least * (1 - 1e-9);
  EXPECT_TRUE(Contains(ValidateAttentionTable(t, 1e10), "at q_len 64, kv_len 64"));
  ASSERT_TRUE(MinimumTableScale(t, 0, &least).ok());
  EXPECT_EQ(least, 0.0);
}

TEST(FitColocatedStepsTest, RefusesWhatCannotBeFitted) {
  FitCase f = MakeCase(0.2, 1.0);
  ProfileFit fit;
  SimOptions o = f.options;
  EXPECT_TRUE(Contains(FitColocatedSteps({f.steps[0]}, &o, &fit), "at least two measured steps"));
  // Two copies of one step cannot tell linear from attention time apart.
  EXPECT_TRUE(Contains(FitColocatedSteps({f.steps[1], f.steps[1]}, &o, &fit), "do not tell linear from attention"));
  std::vector<MeasuredStep> bad = f.steps;
  bad[2].step_s = 0;
  EXPECT_TRUE(Contains(FitColocatedSteps(bad, &o, &fit), "step 2: measured time must be positive"));
  // Steps far faster than the peak allows: an MFU above 1.
  bad = f.steps;
  for (MeasuredStep& m : bad) m.step_s /= 20;
  EXPECT_TRUE(Contains(FitColocatedSteps(bad, &o, &fit), "exceeds 1"));
  // Attention twice as fast as the curve's top (1.0 at 1024 rows) allows,
  // with the curve serving the model: an efficiency above 1.
  bad = MakeCase(0.2, 0.5).steps;
  EXPECT_TRUE(Contains(FitColocatedSteps(bad, &o, &fit), "above 1"));
  // A long-document step cheaper than a uniform one: negative attention.
  bad = f.steps;
  bad[0].step_s = bad[1].step_s * 0.5;
  EXPECT_TRUE(Contains(FitColocatedSteps(bad, &o, &fit), "non-positive"));
  EXPECT_EQ(o.hardware.linear_mfu, f.options.hardware.linear_mfu);  // untouched on failure
}

}  // namespace
}  // namespace distca
