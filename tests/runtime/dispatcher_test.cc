// Disaggregated attention over ranks equals single-process attention over the
// whole batch, forward and backward, for every policy and both backward
// modes; and the bytes moved equal the planner's exact estimate.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "attn/attention_testing.h"
#include "common/file_util.h"
#include "distca/workload.h"
#include "runtime/dispatch_testing.h"

namespace distca::testing {
namespace {

std::string Name(const DispatchCase& c) {
  std::ostringstream s;
  s << "docs" << c.lengths.size() << "_r" << c.ranks << "s" << c.servers << "_" << PlanPolicyName(c.policy) << "_"
    << (c.backward == BackwardMode::kCached ? "cached" : "stateless") << "_seed" << c.seed;
  return s.str();
}

std::vector<DispatchCase> MakeCases() {
  std::vector<DispatchCase> cases;
  std::mt19937_64 rng(42);
  std::string text;
  std::vector<int64_t> pool;
  EXPECT_TRUE(ReadTextFile(DISTCA_SOURCE_DIR "/data/doc-lengths-pretrain.json", &text).ok());
  EXPECT_TRUE(ParseLengthsJson(text, &pool).ok());
  uint64_t seed = 1;
  for (int ranks : {1, 2, 3, 4, 8}) {
    for (PlanPolicy policy : {PlanPolicy::kColocated, PlanPolicy::kPaper, PlanPolicy::kDistca}) {
      for (BackwardMode mode : {BackwardMode::kStateless, BackwardMode::kCached}) {
        DispatchCase c;
        c.ranks = ranks;
        c.policy = policy;
        c.backward = mode;
        c.seed = seed++;
        if (seed % 3 == 0) {
          // Sampled from the pretraining distribution, scaled to a small budget.
          WorkloadRecipe r;
          r.tokens_per_batch = int64_t{ranks} * 320;
          r.elongate = 0.25;
          r.seed = c.seed;
          std::vector<std::vector<int64_t>> b;
          EXPECT_TRUE(SampleBatches(pool, r, 1, &b).ok());
          c.lengths = b[0];
        } else {
          // A skewed batch: one long document among short ones.
          c.lengths = {int64_t(300 + rng() % 900)};
          for (int i = 0; i < 1 + int(rng() % 6); ++i) c.lengths.push_back(1 + int64_t(rng() % 200));
          std::shuffle(c.lengths.begin(), c.lengths.end(), rng);
        }
        if (ranks >= 2 && seed % 4 == 0) c.servers = 1 + int(seed % 2);  // dedicated attention servers
        cases.push_back(c);
      }
    }
  }
  return cases;
}

class DispatcherTest : public ::testing::TestWithParam<DispatchCase> {};

// Runs the plan over local ranks and checks the results against the
// oracle, the bytes against the plan, and what servers hold.
void ExpectEqualsSingleProcessAttention(const DispatchCase& c, const Plan& plan) {
  const GlobalBatch g = MakeGlobalBatch(c);

  // The oracle (double accumulation) and the naive fp32 baseline over the whole batch.
  const Batch whole = WholeBatch(g);
  const ForwardResult ref = RunForward(whole, AttentionKernel::kReference, 1);
  const BackwardResult ref_grad = RunBackward(whole, ref, AttentionKernel::kReference, 1);
  ForwardResult naive;
  BackwardResult naive_grad;
  NaiveFp32(whole, &naive, &naive_grad);

  DistributedResult r = EmptyResult(g, plan.servers());
  CommOptions o;
  o.backend = CommOptions::Backend::kLocal;
  o.local_ranks = plan.servers();
  const Status s = RunOnRanks(o, [&](Comm& comm) { return RunDistributed(comm, c, plan, g, &r); });
  ASSERT_TRUE(s.ok()) << s.ToString();

  // Same rule as the kernel tests: at most twice the naive fp32 error plus 16
  // ulps. Summing dK/dV partials from a few servers adds a few roundings,
  // far inside the naive implementation's sequential fp32 sums.
  ExpectWithinNaiveBound(r.out, naive.out, ref.out, "O");
  ExpectWithinNaiveBound(r.lse, naive.lse, ref.lse, "LSE");
  ExpectWithinNaiveBound(r.dq, naive_grad.dq, ref_grad.dq, "dQ");
  ExpectWithinNaiveBound(r.dk, naive_grad.dk, ref_grad.dk, "dK");
  ExpectWithinNaiveBound(r.dv, naive_grad.dv, ref_grad.dv, "dV");

  // Stateless mode moves exactly what the planner counted, per rank.
  if (c.backward == BackwardMode::kStateless) {
    EXPECT_EQ(r.sent, plan.stats.traffic.sent);
    EXPECT_EQ(r.received, plan.stats.traffic.received);
  } else {
    int64_t moved = 0;
    for (int64_t x : r.sent) moved += x;
    EXPECT_LE(moved, plan.stats.traffic.total_bytes());  // cached sends no Q/K/V twice
  }

  // Memory: between the passes a server keeps its Q/K/V and statistics only
  // in cached mode; after the backward pass nothing stays allocated.
  int64_t between = 0;
  for (int rank = 0; rank < plan.servers(); ++rank) {
    EXPECT_EQ(r.held_after[rank], 0) << "rank " << rank;
    between += r.held_between[rank];
    if (c.backward == BackwardMode::kStateless) {
      EXPECT_EQ(r.held_between[rank], 0) << "rank " << rank;
    }
  }
  if (c.backward == BackwardMode::kCached) {
    EXPECT_GT(between, 0);
  }
}

TEST_P(DispatcherTest, EqualsSingleProcessAttention) {
  const DispatchCase& c = GetParam();
  Plan plan;
  ASSERT_TRUE(MakePlan(c, &plan).ok());
  ExpectEqualsSingleProcessAttention(c, plan);
}

// Plans as a file may hold them, beyond what the planner makes: a rank
// holding no tokens of the document it serves; one document in three pieces
// (rank 0, 1, 0) with tasks cut inside and across them, two non-adjacent
// query ranges of it on a dedicated server sharing one K/V prefix, and a
// dedicated server with no task at all.
TEST(DispatcherLayoutTest, HandWrittenPlans) {
  const char* model = R"("model": {"q_heads": 4, "kv_heads": 2, "head_dim": 8, "dtype_bytes": 4})";
  const std::vector<std::string> plans = {
      std::string(R"({"ranks": 2, "block": 128, )") + model + R"(,
        "documents": [{"id": 0, "length": 100, "pieces": [{"rank": 0, "begin": 0, "end": 100}]}],
        "tasks": [{"doc": 0, "q_begin": 0, "q_end": 100, "server": 1}]})",
      std::string(R"({"ranks": 2, "dedicated_servers": 2, "block": 16, )") + model + R"(,
        "documents": [{"id": 0, "length": 30, "pieces": [{"rank": 0, "begin": 0, "end": 10},
                        {"rank": 1, "begin": 10, "end": 20}, {"rank": 0, "begin": 20, "end": 30}]},
                      {"id": 1, "length": 7, "pieces": [{"rank": 1, "begin": 0, "end": 7}]}],
        "tasks": [{"doc": 0, "q_begin": 0, "q_end": 10, "server": 2}, {"doc": 0, "q_begin": 20, "q_end": 30, "server": 2},
                  {"doc": 0, "q_begin": 10, "q_end": 16, "server": 0}, {"doc": 0, "q_begin": 16, "q_end": 20, "server": 1},
                  {"doc": 1, "q_begin": 0, "q_end": 7, "server": 2}]})"};
  for (const std::string& json : plans) {
    for (BackwardMode mode : {BackwardMode::kStateless, BackwardMode::kCached}) {
      Plan plan;
      ASSERT_TRUE(PlanFromJson(json, &plan).ok()) << json;
      const CostModel cost = CostModel::Flops(plan.model);
      ASSERT_TRUE(ComputePlanStats(plan, cost, &plan.stats).ok());
      ASSERT_TRUE(ValidatePlanForLayout(plan, cost).ok()) << json;
      DispatchCase c;
      for (const PlanDocument& d : plan.documents) c.lengths.push_back(d.length);
      c.ranks = plan.ranks;
      c.servers = plan.dedicated_servers;
      c.backward = mode;
      c.head_dim = 8;
      SCOPED_TRACE(json);
      ExpectEqualsSingleProcessAttention(c, plan);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, DispatcherTest, ::testing::ValuesIn(MakeCases()),
                         [](const ::testing::TestParamInfo<DispatchCase>& p) { return Name(p.param); });

TEST(DispatcherErrorsTest, RejectsBadArguments) {
  DispatchCase c;
  c.lengths = {100, 50};
  c.ranks = 2;
  Plan plan;
  ASSERT_TRUE(MakePlan(c, &plan).ok());
  std::unique_ptr<AttentionDispatcher> d;
  DispatchOptions o;
  o.q_heads = 4;
  o.kv_heads = 3;
  o.head_dim = 16;
  EXPECT_EQ(AttentionDispatcher::Create(plan, 0, o, &d).code(), StatusCode::kInvalidArgument);
  o.kv_heads = 2;
  EXPECT_EQ(AttentionDispatcher::Create(plan, 5, o, &d).code(), StatusCode::kInvalidArgument);
  // A plan costed for the published DistCA's wire format is not what this
  // runtime sends.
  Plan artifact = plan;
  artifact.model.wire = PlanWire::kDistcaArtifact;
  const Status wrong_wire = AttentionDispatcher::Create(artifact, 0, o, &d);
  EXPECT_NE(wrong_wire.ToString().find("wire format"), std::string::npos) << wrong_wire.ToString();
  // Nor is a plan costed for other rows (bf16, as distca-plan's default, or
  // other heads): its bytes and budget would not be what moves.
  for (const auto& [set, what] : std::vector<std::pair<std::function<void(PlanModel*)>, const char*>>{
           {[](PlanModel* m) { m->dtype_bytes = 2; }, "in 2-byte elements"},
           {[](PlanModel* m) { m->q_heads = 8; }, "costed for q_heads 8"},
           {[](PlanModel* m) { m->head_dim = 32; }, "head_dim 32"}}) {
    Plan other = plan;
    set(&other.model);
    const Status wrong_rows = AttentionDispatcher::Create(other, 0, o, &d);
    EXPECT_NE(wrong_rows.message().find(what), std::string::npos) << wrong_rows.ToString();
  }
  // A malformed plan (as a file could hold) is refused before anything is
  // indexed by its ranks, documents or rows.
  Plan bad = plan;
  bad.documents[0].pieces[0].rank = 5;
  Status st = AttentionDispatcher::Create(bad, 0, o, &d);
  EXPECT_NE(st.message().find("plan: document 0 has a piece on rank 5, which does not exist"), std::string::npos)
      << st.ToString();
  bad = plan;
  bad.tasks[0].doc = 3;
  st = AttentionDispatcher::Create(bad, 0, o, &d);
  EXPECT_NE(st.message().find("names document 3, which does not exist"), std::string::npos) << st.ToString();
  bad = plan;
  bad.tasks.back().q_end = bad.documents[bad.tasks.back().doc].length + 128;
  st = AttentionDispatcher::Create(bad, 0, o, &d);
  EXPECT_NE(st.message().find("run past its length"), std::string::npos) << st.ToString();
  ASSERT_TRUE(AttentionDispatcher::Create(plan, 0, o, &d).ok());
  // A comm of the wrong size is refused, not deadlocked on.
  CommOptions co;
  co.backend = CommOptions::Backend::kLocal;
  co.local_ranks = 3;
  const Status s = RunOnRanks(co, [&](Comm& comm) -> Status {
    AttentionContext ctx;
    std::vector<float> x(1 << 16);
    return d->StartForward(comm, x.data(), x.data(), x.data(), &ctx);
  });
  EXPECT_NE(s.message().find("dispatcher was built for"), std::string::npos) << s.ToString();
  // The backward checks the same (it would otherwise fail later, inside an
  // all-to-all, without the dispatcher's context).
  const Status b = RunOnRanks(co, [&](Comm& comm) -> Status {
    AttentionContext ctx;
    std::vector<float> x(1 << 16);
    return d->StartBackward(comm, x.data(), x.data(), x.data(), x.data(), x.data(), x.data(), &ctx);
  });
  EXPECT_NE(b.message().find("dispatcher was built for"), std::string::npos) << b.ToString();
}

// A context's phases run in order; calling one out of order fails with a
// message instead of reading buffers another phase released (a second
// FinishForward used to copy from a freed buffer).
TEST(DispatcherErrorsTest, PhasesOutOfOrderAreRefused) {
  DispatchCase c;
  c.lengths = {100, 50};
  c.ranks = 2;
  Plan plan;
  ASSERT_TRUE(MakePlan(c, &plan).ok());
  DispatchOptions o;
  o.q_heads = 4;
  o.kv_heads = 2;
  o.head_dim = 16;
  // The rank that tries a second start: one that waits for the other's
  // rows in the forward dispatch (a rank that receives nothing may be done
  // with the exchange at once).
  const std::vector<int64_t>& received = plan.stats.traffic.exchange_received[0];
  const int tester = received[0] > 0 ? 0 : 1;
  ASSERT_GT(received[tester], 0);
  for (BackwardMode mode : {BackwardMode::kStateless, BackwardMode::kCached}) {
    SCOPED_TRACE(mode == BackwardMode::kCached ? "cached" : "stateless");
    o.backward = mode;
    std::atomic<bool> second_start_tried{false};
    CommOptions co;
    co.backend = CommOptions::Backend::kLocal;
    co.local_ranks = 2;
    const Status s = RunOnRanks(co, [&](Comm& comm) -> Status {
      std::unique_ptr<AttentionDispatcher> d;
      DISTCA_RETURN_IF_ERROR(AttentionDispatcher::Create(plan, comm.rank(), o, &d));
      const size_t rows = size_t(d->local_tokens());
      std::vector<float> q(rows * 64, 0.5f), kv(rows * 32, 0.25f), out(rows * 64), lse(rows * 4), dq(rows * 64),
          dk(rows * 32), dv(rows * 32);
      auto expect_refused = [](const Status& st, const std::string& what) -> Status {
        if (st.code() != StatusCode::kFailedPrecondition || st.message().find(what) == std::string::npos)
          return Status::Internal("expected a refusal naming '" + what + "', got: " + st.ToString());
        return Status::Ok();
      };
      AttentionContext ctx;
      DISTCA_RETURN_IF_ERROR(expect_refused(d->ServeForward(comm, &ctx), "ServeForward must follow StartForward"));
      DISTCA_RETURN_IF_ERROR(
          expect_refused(d->FinishBackward(comm, dq.data(), dk.data(), dv.data(), &ctx), "must follow ServeBackward"));
      if (mode == BackwardMode::kCached)
        DISTCA_RETURN_IF_ERROR(expect_refused(
            d->StartBackward(comm, q.data(), kv.data(), kv.data(), out.data(), lse.data(), q.data(), &ctx),
            "cached backward needs the forward"));
      if (comm.rank() == tester) {
        // The other rank has not posted its half: the exchange is in
        // flight, and a second start would reassign the buffers it fills.
        const Status first = d->StartForward(comm, q.data(), kv.data(), kv.data(), &ctx);
        const Status again = first.ok() ? d->StartForward(comm, q.data(), kv.data(), kv.data(), &ctx) : first;
        second_start_tried = true;
        DISTCA_RETURN_IF_ERROR(first);
        DISTCA_RETURN_IF_ERROR(expect_refused(again, "still in flight"));
      } else {
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (!second_start_tried) {
          if (std::chrono::steady_clock::now() > give_up) return Status::Unavailable("the other rank never started");
          std::this_thread::yield();
        }
        DISTCA_RETURN_IF_ERROR(d->StartForward(comm, q.data(), kv.data(), kv.data(), &ctx));
      }
      DISTCA_RETURN_IF_ERROR(expect_refused(d->FinishForward(comm, out.data(), lse.data(), &ctx),
                                            "FinishForward must follow ServeForward on its context; the last "
                                            "phase was: StartForward"));
      DISTCA_RETURN_IF_ERROR(d->ServeForward(comm, &ctx));
      DISTCA_RETURN_IF_ERROR(d->FinishForward(comm, out.data(), lse.data(), &ctx));
      // A second finish used to copy from the buffer the first released.
      DISTCA_RETURN_IF_ERROR(expect_refused(d->FinishForward(comm, out.data(), lse.data(), &ctx),
                                            "FinishForward must follow ServeForward"));
      DISTCA_RETURN_IF_ERROR(expect_refused(d->ServeBackward(comm, &ctx), "ServeBackward must follow StartBackward"));
      DISTCA_RETURN_IF_ERROR(d->Backward(comm, q.data(), kv.data(), kv.data(), out.data(), lse.data(), q.data(),
                                         dq.data(), dk.data(), dv.data(), &ctx));
      DISTCA_RETURN_IF_ERROR(
          expect_refused(d->FinishBackward(comm, dq.data(), dk.data(), dv.data(), &ctx), "must follow ServeBackward"));
      // A whole forward again after all that.
      return d->Forward(comm, q.data(), kv.data(), kv.data(), out.data(), lse.data(), &ctx);
    });
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
}

}  // namespace
}  // namespace distca::testing
