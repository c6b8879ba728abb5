#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "runtime/pingpong_testing.h"

namespace distca::testing {
namespace {

Status RunLocal(int ranks, const std::function<Status(Comm&)>& fn) {
  CommOptions o;
  o.backend = CommOptions::Backend::kLocal;
  o.local_ranks = ranks;
  return RunOnRanks(o, fn);
}

TEST(PingPongTest, SameBitsWithAndWithoutPingPong) {
  const std::vector<int64_t> lengths = {300, 40, 512, 77, 128, 9, 260, 33};
  for (int ranks : {1, 2, 3, 4}) {
    for (PlanPolicy policy : {PlanPolicy::kColocated, PlanPolicy::kDistca}) {
      for (BackwardMode mode : {BackwardMode::kStateless, BackwardMode::kCached}) {
        std::vector<Plan> plans;
        ASSERT_TRUE(NanoPlans(lengths, ranks, policy, 4, 2, 8, &plans).ok());
        const Status s = RunLocal(ranks, [&](Comm& c) { return CheckPingPongEquivalence(c, plans, mode); });
        EXPECT_TRUE(s.ok()) << ranks << " ranks, " << PlanPolicyName(policy) << ": " << s.ToString();
      }
    }
  }
}

// The larger of the two sides' token share and work share.
double Imbalance(const std::vector<int64_t>& lengths, const std::vector<bool>& side) {
  double tokens[2] = {0, 0}, work[2] = {0, 0};
  for (size_t d = 0; d < lengths.size(); ++d) {
    tokens[side[d]] += double(lengths[d]);
    work[side[d]] += double(CausalPairs(0, lengths[d]));
  }
  return std::max(std::max(tokens[0], tokens[1]) / (tokens[0] + tokens[1]),
                  std::max(work[0], work[1]) / (work[0] + work[1]));
}

TEST(PingPongTest, NanoBatchesBalanceTokensAndWork) {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<int64_t> lengths;
    for (int i = 0; i < 2 + int(rng() % 11); ++i) lengths.push_back(1 + int64_t(rng() % (rng() % 4 ? 2000 : 20000)));
    std::vector<std::vector<int>> nano;
    ASSERT_TRUE(SplitNanoBatches(lengths, 2, &nano).ok());
    std::vector<bool> side(lengths.size(), false);
    for (int d : nano[1]) side[d] = true;
    EXPECT_EQ(nano[0].size() + nano[1].size(), lengths.size());
    EXPECT_FALSE(nano[0].empty() || nano[1].empty());
    // Against the best split of whole documents (exhaustive: at most 4096).
    double best = 1.0;
    for (uint32_t mask = 1; mask + 1 < (1u << lengths.size()); ++mask) {
      std::vector<bool> s(lengths.size());
      for (size_t d = 0; d < lengths.size(); ++d) s[d] = (mask >> d) & 1;
      best = std::min(best, Imbalance(lengths, s));
    }
    // Greedy longest-first is within a few percent of the best possible here.
    EXPECT_LE(Imbalance(lengths, side), best * 1.1 + 1e-12) << "trial " << trial;
  }
  std::vector<std::vector<int>> nano;
  EXPECT_EQ(SplitNanoBatches({5}, 2, &nano).code(), StatusCode::kInvalidArgument);
  // Lengths whose causal pairs would overflow are refused.
  EXPECT_EQ(SplitNanoBatches({kMaxDocumentLength + 1, 5}, 2, &nano).code(), StatusCode::kOutOfRange);
}

// Two layers of 4 query heads, 2 K/V heads and head dimension 8: the
// NanoPlans below are costed for these rows.
PingPongOptions SmallStack(BackwardMode mode) {
  PingPongOptions o;
  o.layers = 2;
  o.dispatch.q_heads = 4;
  o.dispatch.kv_heads = 2;
  o.dispatch.head_dim = 8;
  o.dispatch.backward = mode;
  return o;
}

// Backward runs on what the last completed Forward kept: without one (or a
// second time after one) it is refused in both modes, not run on zeros.
TEST(PingPongTest, BackwardNeedsACompletedForward) {
  std::vector<Plan> plans;
  ASSERT_TRUE(NanoPlans({200, 100, 150, 50}, 2, PlanPolicy::kDistca, 4, 2, 8, &plans).ok());
  for (BackwardMode mode : {BackwardMode::kStateless, BackwardMode::kCached}) {
    const Status s = RunLocal(2, [&](Comm& c) -> Status {
      std::unique_ptr<PingPongExecutor> ex;
      DISTCA_RETURN_IF_ERROR(PingPongExecutor::Create(&c, plans, SmallStack(mode), &ex));
      SyntheticStack stack(*ex, plans, 2, 4, 2, 8);
      const Status early = ex->Backward(stack);
      if (early.code() != StatusCode::kFailedPrecondition)
        return Status::Internal("a backward before any forward: " + early.ToString());
      DISTCA_RETURN_IF_ERROR(ex->Forward(stack));
      DISTCA_RETURN_IF_ERROR(ex->Backward(stack));
      const Status again = ex->Backward(stack);
      if (again.code() != StatusCode::kFailedPrecondition)
        return Status::Internal("a second backward: " + again.ToString());
      // The next step's forward makes a backward valid again.
      DISTCA_RETURN_IF_ERROR(ex->Forward(stack));
      return ex->Backward(stack);
    });
    EXPECT_TRUE(s.ok()) << (mode == BackwardMode::kCached ? "cached: " : "stateless: ") << s.ToString();
  }
}

// A SyntheticStack whose BeforeAttention fails once, at one (layer, nano-batch).
class FailingOnceStack : public SyntheticStack {
 public:
  using SyntheticStack::SyntheticStack;
  Status BeforeAttention(int l, int n, float* q, float* k, float* v) override {
    if (l == 1 && n == 1 && !failed_) {
      failed_ = true;
      return Status::Internal("injected");
    }
    return SyntheticStack::BeforeAttention(l, n, q, k, v);
  }

 private:
  bool failed_ = false;
};

// A failure names where it happened, and leaves no transfer behind: the
// other nano-batch's exchange, posted before the failure, is waited for, and
// the next step runs as on a fresh executor, to the bit.
TEST(PingPongTest, AFailureNamesItsPlaceAndTheNextStepRuns) {
  std::vector<Plan> plans;
  ASSERT_TRUE(NanoPlans({200, 100, 150, 50}, 2, PlanPolicy::kDistca, 4, 2, 8, &plans).ok());
  for (BackwardMode mode : {BackwardMode::kStateless, BackwardMode::kCached}) {
    PingPongOptions o = SmallStack(mode);
    o.dispatch.exec.num_threads = 1;  // one-thread sums: the same bits run to run
    const Status s = RunLocal(2, [&](Comm& c) -> Status {
      std::unique_ptr<PingPongExecutor> clean, ex;
      DISTCA_RETURN_IF_ERROR(PingPongExecutor::Create(&c, plans, o, &clean));
      SyntheticStack reference(*clean, plans, 2, 4, 2, 8);
      DISTCA_RETURN_IF_ERROR(clean->Forward(reference));
      DISTCA_RETURN_IF_ERROR(clean->Backward(reference));
      DISTCA_RETURN_IF_ERROR(PingPongExecutor::Create(&c, plans, o, &ex));
      FailingOnceStack stack(*ex, plans, 2, 4, 2, 8);
      const Status failed = ex->Forward(stack);
      if (failed.message().find("layer 1, nano-batch 1, before attention: injected") == std::string::npos)
        return Status::Internal("the failed forward: " + failed.ToString());
      DISTCA_RETURN_IF_ERROR(ex->Forward(stack));
      DISTCA_RETURN_IF_ERROR(ex->Backward(stack));
      if (stack.Results() != reference.Results()) return Status::Internal("the step after the failure differs");
      return Status::Ok();
    });
    EXPECT_TRUE(s.ok()) << (mode == BackwardMode::kCached ? "cached: " : "stateless: ") << s.ToString();
  }
}

TEST(PingPongTest, TracesEverySpanAsChromeJson) {
  std::vector<Plan> plans;
  ASSERT_TRUE(NanoPlans({200, 100, 150, 50}, 2, PlanPolicy::kDistca, 4, 2, 8, &plans).ok());
  Tracer tracer;
  const Status s = RunLocal(2, [&](Comm& c) -> Status {
    PingPongOptions o = SmallStack(BackwardMode::kStateless);
    o.tracer = &tracer;
    std::unique_ptr<PingPongExecutor> ex;
    DISTCA_RETURN_IF_ERROR(PingPongExecutor::Create(&c, plans, o, &ex));
    SyntheticStack stack(*ex, plans, 2, 4, 2, 8);
    DISTCA_RETURN_IF_ERROR(ex->Forward(stack));
    return ex->Backward(stack);
  });
  ASSERT_TRUE(s.ok()) << s.ToString();
  const nlohmann::json j = nlohmann::json::parse(tracer.ToChromeJson());
  int comm_spans = 0, compute_spans = 0;
  for (const auto& e : j["traceEvents"]) {
    EXPECT_EQ(e["ph"], "X");
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    (e["tid"] == "comm" ? comm_spans : compute_spans) += 1;
  }
  // Per rank, layer and nano-batch: 2 transfers forward and 2 backward.
  EXPECT_EQ(comm_spans, 2 * 2 * 2 * 4);
  EXPECT_GT(compute_spans, comm_spans);
}

}  // namespace
}  // namespace distca::testing
