// Local ranks that outnumber this machine's cores: the benchmarks' times then
// include each rank's wait for a core, and say so.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>
#include <thread>

#include "distca/comm.h"

namespace distca::bench {

// "" unless `comm` runs more local ranks than this machine has cores; then
// a warning line for `tool` ("distca-bench train"), ending in a newline.
inline std::string OversubscribedWarning(const Comm& comm, std::string_view tool) {
  const unsigned cores = std::thread::hardware_concurrency();
  if (std::string_view(comm.backend()) != "local" || cores == 0 || unsigned(comm.size()) <= cores) return "";
  return fmt::format("{}: warning: {} local ranks on {} cores; times include waits for a core\n", tool, comm.size(),
                     cores);
}

}  // namespace distca::bench
