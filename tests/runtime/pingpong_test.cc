#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <thread>

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

// How FailingOnceStack fails: it returns an error, or throws.
enum class Failure { kError, kException };

// A SyntheticStack whose BeforeAttention fails once, at one (layer, nano-batch).
class FailingOnceStack : public SyntheticStack {
 public:
  template <class... Args>
  explicit FailingOnceStack(Failure how, Args&&... args) : SyntheticStack(std::forward<Args>(args)...), how_(how) {}
  Status BeforeAttention(int l, int n, float* q, float* k, float* v) override {
    if (l == 1 && n == 1 && !failed_) {
      failed_ = true;
      if (how_ == Failure::kException) throw std::runtime_error("injected");
      return Status::Internal("injected");
    }
    return SyntheticStack::BeforeAttention(l, n, q, k, v);
  }
  // What the executor's error says for the failure.
  static const char* Message(Failure how) {
    return how == Failure::kError ? "layer 1, nano-batch 1, before attention: injected"
                                  : "layer 1, forward: exception: injected";
  }

 private:
  Failure how_;
  bool failed_ = false;
};

// A failure (an error or an exception) names where it happened, and leaves
// no transfer behind: the other nano-batch's exchange, posted before the
// failure, is waited for, and the next step runs as on a fresh executor, to
// the bit.
TEST(PingPongTest, AFailureNamesItsPlaceAndTheNextStepRuns) {
  std::vector<Plan> plans;
  ASSERT_TRUE(NanoPlans({200, 100, 150, 50}, 2, PlanPolicy::kDistca, 4, 2, 8, &plans).ok());
  for (Failure how : {Failure::kError, Failure::kException})
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
        FailingOnceStack stack(how, *ex, plans, 2, 4, 2, 8);
        const Status failed = ex->Forward(stack);
        if (failed.message().find(FailingOnceStack::Message(how)) == std::string::npos)
          return Status::Internal("the failed forward: " + failed.ToString());
        DISTCA_RETURN_IF_ERROR(ex->Forward(stack));
        DISTCA_RETURN_IF_ERROR(ex->Backward(stack));
        if (stack.Results() != reference.Results()) return Status::Internal("the step after the failure differs");
        return Status::Ok();
      });
      EXPECT_TRUE(s.ok()) << (how == Failure::kError ? "error, " : "exception, ")
                          << (mode == BackwardMode::kCached ? "cached: " : "stateless: ") << s.ToString();
    }
}

// A Comm whose nonblocking requests complete no earlier than `delay` after
// they were posted, and which counts the requests not yet waited for.
class SlowComm : public Comm {
 public:
  SlowComm(Comm* inner, std::chrono::milliseconds delay) : inner_(inner), delay_(delay) {}
  int pending() const { return pending_->load(); }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  int machine_ranks() const override { return inner_->machine_ranks(); }
  const char* backend() const override { return inner_->backend(); }
  Status Barrier() override { return inner_->Barrier(); }
  Status AllreduceSum(float* data, int64_t count) override { return inner_->AllreduceSum(data, count); }
  Status Broadcast(void* data, int64_t bytes, int root) override { return inner_->Broadcast(data, bytes, root); }
  CommRequest ISend(const void* data, int64_t bytes, int peer, int tag) override {
    return Slow(inner_->ISend(data, bytes, peer, tag));
  }
  CommRequest IRecv(void* data, int64_t bytes, int peer, int tag) override {
    return Slow(inner_->IRecv(data, bytes, peer, tag));
  }
  CommRequest IAlltoallv(const void* send, std::span<const int64_t> send_counts, void* recv,
                         std::span<const int64_t> recv_counts) override {
    return Slow(inner_->IAlltoallv(send, send_counts, recv, recv_counts));
  }
  void Abort(const Status& why) override { inner_->Abort(why); }

 private:
  using Clock = std::chrono::steady_clock;
  class Request : public CommRequest::Impl {
   public:
    Request(CommRequest inner, Clock::time_point ready, std::shared_ptr<std::atomic<int>> pending)
        : inner_(std::move(inner)), ready_(ready), pending_(std::move(pending)) {
      ++*pending_;
    }
    ~Request() override {
      if (!waited_) --*pending_;  // dropped unwaited: counted until here
    }
    Status Wait() override {
      std::this_thread::sleep_until(ready_);
      Status s = inner_.Wait();
      if (!waited_) --*pending_;
      waited_ = true;
      return s;
    }
    bool Test() override { return Clock::now() >= ready_ && inner_.Test(); }

   private:
    CommRequest inner_;
    Clock::time_point ready_;
    std::shared_ptr<std::atomic<int>> pending_;
    bool waited_ = false;
  };
  CommRequest Slow(CommRequest r) {
    return CommRequest(std::make_shared<Request>(std::move(r), Clock::now() + delay_, pending_));
  }

  Comm* inner_;
  std::chrono::milliseconds delay_;
  std::shared_ptr<std::atomic<int>> pending_ = std::make_shared<std::atomic<int>>(0);
};

// After a failure the executor returns only once every transfer it posted
// has completed: here nano-batch 0's exchange, posted just before nano-batch
// 1 fails and held in flight for 300 ms. (Returning at once would leave it
// pending for most of that time, with the comm thread polling contexts the
// next call reuses.)
TEST(PingPongTest, AFailureWaitsForTheTransfersItPosted) {
  std::vector<Plan> plans;
  ASSERT_TRUE(NanoPlans({200, 100, 150, 50}, 2, PlanPolicy::kDistca, 4, 2, 8, &plans).ok());
  for (Failure how : {Failure::kError, Failure::kException}) {
    const Status s = RunLocal(2, [&](Comm& c) -> Status {
      SlowComm slow(&c, std::chrono::milliseconds(300));
      std::unique_ptr<PingPongExecutor> ex;
      DISTCA_RETURN_IF_ERROR(PingPongExecutor::Create(&slow, plans, SmallStack(BackwardMode::kCached), &ex));
      FailingOnceStack stack(how, *ex, plans, 2, 4, 2, 8);
      if (ex->Forward(stack).ok()) return Status::Internal("the forward did not fail");
      if (slow.pending() != 0)
        return Status::Internal(fmt::format("{} transfers still in flight after the failed forward", slow.pending()));
      return Status::Ok();
    });
    EXPECT_TRUE(s.ok()) << (how == Failure::kError ? "error: " : "exception: ") << s.ToString();
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
