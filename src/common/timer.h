// Wall-clock and per-thread CPU timers.
#pragma once

#include <chrono>
#include <ctime>

namespace distca {

// Seconds on a monotonic wall clock since construction or the last Reset().
class WallTimer {
 public:
  WallTimer() { Reset(); }
  void Reset() { start_ = std::chrono::steady_clock::now(); }
  double Seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

 private:
  std::chrono::steady_clock::time_point start_;
};

// CPU time consumed by the calling thread, in seconds. Use it to measure the
// busy time of one rank when ranks outnumber cores.
inline double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace distca
