// Run under mpirun with 4 processes: disaggregated attention over MPI ranks
// equals single-process attention, for every policy and both backward modes,
// with and without a dedicated server; stateless traffic equals the plan's.
#include <cstdio>

#include "attn/attention_testing.h"
#include "runtime/dispatch_testing.h"

namespace distca::testing {
namespace {

Status CheckCase(Comm& comm, const DispatchCase& c) {
  Plan plan;
  DISTCA_RETURN_IF_ERROR(MakePlan(c, &plan));
  const GlobalBatch g = MakeGlobalBatch(c);
  DistributedResult r = EmptyResult(g, plan.servers());
  DISTCA_RETURN_IF_ERROR(RunDistributed(comm, c, plan, g, &r));
  // Rows are disjoint across ranks: summing assembles the whole result everywhere.
  for (auto* x : {&r.out, &r.lse, &r.dq, &r.dk, &r.dv})
    DISTCA_RETURN_IF_ERROR(comm.AllreduceSum(x->data(), int64_t(x->size())));
  std::vector<int64_t> traffic = {r.sent[comm.rank()], r.received[comm.rank()]};
  if (comm.rank() != 0) return comm.Send(traffic.data(), 2 * sizeof(int64_t), 0, 9);
  for (int p = 1; p < comm.size(); ++p) {
    DISTCA_RETURN_IF_ERROR(comm.Recv(traffic.data(), 2 * sizeof(int64_t), p, 9));
    r.sent[p] = traffic[0];
    r.received[p] = traffic[1];
  }
  const Batch whole = WholeBatch(g);
  ForwardResult ref;
  ref.out.assign(whole.QSize(), 0.0f);
  ref.lse.assign(whole.LseSize(), 0.0f);
  attn::ReferenceForward<float, double>(whole.shape, whole.tasks, whole.q.data(), whole.k.data(), whole.v.data(),
                                        ref.out.data(), ref.lse.data());
  std::vector<float> delta(whole.LseSize());
  attn::ComputeDeltaRows<float, double>(whole.shape, 0, whole.shape.total_q, whole.dout.data(), ref.out.data(),
                                        delta.data());
  BackwardResult grad;
  grad.dq.assign(whole.QSize(), 0.0f);
  grad.dk.assign(whole.KSize(), 0.0f);
  grad.dv.assign(whole.KSize(), 0.0f);
  attn::ReferenceBackward<float, double>(whole.shape, whole.tasks, whole.q.data(), whole.k.data(), whole.v.data(),
                                         whole.dout.data(), ref.lse.data(), delta.data(), grad.dq.data(),
                                         grad.dk.data(), grad.dv.data());
  ForwardResult naive;
  BackwardResult naive_grad;
  NaiveFp32(whole, &naive, &naive_grad);
  std::string why;
  const std::pair<const std::vector<float>*, std::pair<const std::vector<float>*, const std::vector<float>*>> checks[] =
      {{&r.out, {&naive.out, &ref.out}},
       {&r.lse, {&naive.lse, &ref.lse}},
       {&r.dq, {&naive_grad.dq, &grad.dq}},
       {&r.dk, {&naive_grad.dk, &grad.dk}},
       {&r.dv, {&naive_grad.dv, &grad.dv}}};
  const char* names[] = {"O", "LSE", "dQ", "dK", "dV"};
  for (int i = 0; i < 5; ++i)
    if (!WithinNaiveBound(*checks[i].first, *checks[i].second.first, *checks[i].second.second, names[i], &why))
      return Status::Internal(why);
  if (c.backward == BackwardMode::kStateless &&
      (r.sent != plan.stats.traffic.sent || r.received != plan.stats.traffic.received))
    return Status::Internal("bytes moved differ from the plan's estimate");
  return Status::Ok();
}

}  // namespace
}  // namespace distca::testing

int main() {
  using namespace distca;
  using namespace distca::testing;
  CommOptions o;
  o.backend = CommOptions::Backend::kMpi;
  int cases = 0;
  const Status s = RunOnRanks(o, [&](Comm& comm) -> Status {
    const int world = comm.size();
    uint64_t seed = 100;
    for (int servers : {0, 1}) {
      for (PlanPolicy policy : {PlanPolicy::kColocated, PlanPolicy::kPaper, PlanPolicy::kDistca}) {
        for (BackwardMode mode : {BackwardMode::kStateless, BackwardMode::kCached}) {
          DispatchCase c;
          c.ranks = world - servers;
          c.servers = servers;
          c.policy = policy;
          c.backward = mode;
          c.seed = seed++;
          c.lengths = {700, 90, 13, 256, 400, 31};
          DISTCA_RETURN_IF_ERROR(CheckCase(comm, c).WithContext(
              fmt::format("{} ranks + {} servers, {}, {}", c.ranks, servers, PlanPolicyName(policy),
                          mode == BackwardMode::kCached ? "cached" : "stateless")));
          ++cases;
        }
      }
    }
    return Status::Ok();
  });
  if (!s.ok()) {
    std::fprintf(stderr, "dispatch_mpi_check: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("dispatch_mpi_check: %d cases equal the single-process result\n", cases);
  return 0;
}
