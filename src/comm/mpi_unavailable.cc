// Stand-in for the MPI backend in builds without MPI (DISTCA_WITH_MPI off).
#include "comm/mpi_comm.h"

namespace distca::comm {

bool MpiBackendAvailable() { return false; }

Status RunMpi(const std::function<Status(Comm&)>&) {
  return Status::Unavailable("this build has no MPI backend (DISTCA_WITH_MPI is off)");
}

}  // namespace distca::comm
