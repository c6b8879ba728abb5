// Run under mpirun: the ping-pong executor gives the same bits with and
// without ping-pong (and with injected delays) on MPI ranks.
#include <cstdio>

#include "runtime/pingpong_testing.h"

int main() {
  using namespace distca;
  CommOptions o;
  o.backend = CommOptions::Backend::kMpi;
  const Status s = RunOnRanks(o, [&](Comm& comm) -> Status {
    for (PlanPolicy policy : {PlanPolicy::kColocated, PlanPolicy::kDistca}) {
      for (BackwardMode mode : {BackwardMode::kStateless, BackwardMode::kCached}) {
        std::vector<Plan> plans;
        DISTCA_RETURN_IF_ERROR(
            testing::NanoPlans({300, 40, 512, 77, 128, 9, 260, 33}, comm.size(), policy, 4, 2, 8, &plans));
        DISTCA_RETURN_IF_ERROR(testing::CheckPingPongEquivalence(comm, plans, mode));
      }
    }
    return Status::Ok();
  });
  if (!s.ok()) {
    std::fprintf(stderr, "pingpong_mpi_check: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("pingpong_mpi_check: identical with and without ping-pong\n");
  return 0;
}
