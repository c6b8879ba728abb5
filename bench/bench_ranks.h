// The ranks a benchmark runs on: too few to measure a link, or more local
// ranks than this machine's cores (times then include waits for a core).
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>
#include <thread>

#include "distca/comm.h"

namespace distca::bench {

// The benchmarks that measure traffic between ranks need two.
inline std::string TooFewRanks(int ranks) {
  return fmt::format("needs at least 2 ranks to measure a link, got {}", ranks);
}

// "" unless `comm` runs more local ranks than this machine has cores; then
// a warning line for `tool` ("distca-bench train"), ending in a newline.
inline std::string OversubscribedWarning(const Comm& comm, std::string_view tool) {
  const unsigned cores = std::thread::hardware_concurrency();
  if (std::string_view(comm.backend()) != "local" || cores == 0 || unsigned(comm.size()) <= cores) return "";
  return fmt::format("{}: warning: {} local ranks on {} cores; times include waits for a core\n", tool, comm.size(),
                     cores);
}

}  // namespace distca::bench
