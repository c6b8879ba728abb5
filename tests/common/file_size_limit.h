// Writes that fail half way, for tests: the process's file-size limit.
#pragma once

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>

#include "distca/status.h"

namespace distca::testing {

// Runs `write` with files limited to `bytes` (SIGXFSZ ignored, so a write
// past the limit fails with EFBIG, "File too large"), then restores both.
template <class Write>
Status WithFileSizeLimit(rlim_t bytes, Write&& write) {
  rlimit saved{};
  if (::getrlimit(RLIMIT_FSIZE, &saved) != 0) return Status::Internal("getrlimit failed");
  const auto previous = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = saved;
  small.rlim_cur = bytes;
  if (::setrlimit(RLIMIT_FSIZE, &small) != 0) {
    std::signal(SIGXFSZ, previous);
    return Status::Internal("setrlimit failed");
  }
  const Status s = write();
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, previous);
  return s;
}

}  // namespace distca::testing
