// Run under mpirun: training with CAD equals colocated training on MPI ranks.
#include <cstdio>

#include "train/train_testing.h"

int main() {
  using namespace distca;
  CommOptions o;
  o.backend = CommOptions::Backend::kMpi;
  const Status s = RunOnRanks(o, [](Comm& comm) { return testing::CheckCadEqualsColocated(comm); });
  if (!s.ok()) {
    std::fprintf(stderr, "train_mpi_check: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("train_mpi_check: CAD equals colocated on every policy\n");
  return 0;
}
