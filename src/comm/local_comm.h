// The local backend: ranks as threads of one process, exchanging messages
// through a shared mailbox.
#pragma once

#include <functional>

#include "distca/comm.h"

namespace distca::comm {

// Runs fn on `ranks` threads, each with its own local Comm; see RunOnRanks.
Status RunLocal(int ranks, double timeout_seconds, const std::function<Status(Comm&)>& fn);

}  // namespace distca::comm
