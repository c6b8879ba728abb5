// The median the benchmarks report (0 for no samples).
#pragma once

#include <algorithm>
#include <vector>

namespace distca::bench {

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace distca::bench
