// The MPI backend (built when DISTCA_WITH_MPI is on).
#pragma once

#include <functional>

#include "distca/comm.h"

namespace distca::comm {

bool MpiBackendAvailable();
// Initializes MPI (MPI_THREAD_MULTIPLE), runs fn with this process's rank,
// and finalizes; a failure aborts the job. Once per process.
Status RunMpi(const std::function<Status(Comm&)>& fn);

}  // namespace distca::comm
