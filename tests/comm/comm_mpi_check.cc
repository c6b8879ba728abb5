// Run under mpirun: the Comm contract on the MPI backend, and failure
// propagation. Exit 0 when every rank passes.
//   comm_mpi_check contract     all checks (also with injected delays)
//   comm_mpi_check fail         rank 1 fails; the job must end non-zero
//   comm_mpi_check kill         rank 1 is killed by SIGKILL; the job must end
#include <csignal>
#include <cstdio>
#include <cstring>

#include "comm/comm_checks.h"

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "contract";
  distca::CommOptions o;
  o.backend = distca::CommOptions::Backend::kMpi;
  const distca::Status s = distca::RunOnRanks(o, [&](distca::Comm& c) -> distca::Status {
    if (std::strcmp(mode, "contract") == 0) {
      // mpirun starts every rank on this machine: they all share it.
      if (c.machine_ranks() != c.size())
        return distca::Status::Internal("machine_ranks() is not size() with every rank on one machine");
      DISTCA_RETURN_IF_ERROR(distca::testing::CheckCommContract(c));
      auto faulty = distca::MakeFaultInjectingComm(&c, {.seed = uint64_t(c.rank()) + 7, .max_delay_us = 300});
      return distca::testing::CheckCommContract(*faulty);
    }
    DISTCA_RETURN_IF_ERROR(c.Barrier());
    if (c.rank() == 1) {
      if (std::strcmp(mode, "kill") == 0) std::raise(SIGKILL);
      return distca::Status::InvalidArgument("injected failure on rank 1");
    }
    int64_t x = 0;
    return c.Recv(&x, sizeof x, 1, 0);  // never arrives: the job must still end
  });
  if (!s.ok()) {
    std::fprintf(stderr, "comm_mpi_check: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
