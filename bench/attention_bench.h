// `distca-bench attention`: forward and backward GFLOP/s of the CA engine on
// single documents and on batches of shards, next to this machine's GEMM rate.
#pragma once

#include <string>
#include <vector>

#include "distca/attention.h"

namespace distca::bench {

struct AttentionBenchOptions {
  bool short_mode = false;                          // CI mode: well under a minute
  bool json = false;                                // print one JSON array instead of a table
  std::vector<int> threads = {1, 2};                // Default: 1 and 2 threads
  AttentionKernel kernel = AttentionKernel::kAuto;  // Default: the fastest on this CPU
  double min_seconds = 0.0;                         // per measurement; Default: 0 = by mode
};

// Runs the benchmark and prints its results to stdout. Returns false, with a
// message in *error, when the kernel fails validation against the reference.
bool RunAttentionBench(const AttentionBenchOptions& options, std::string* error);

}  // namespace distca::bench
