// `distca-bench plan`: the planner's policies side by side on batches sampled
// from the shared document-length distribution.
#pragma once

#include <cstdint>
#include <string>

namespace distca::bench {

struct PlanBenchOptions {
  bool short_mode = false;   // CI mode: fewer batches
  bool json = false;         // one JSON object per (ranks, policy) line
  std::string lengths_file;  // Default: data/doc-lengths-pretrain.json in the source tree
  // Sampling seed of the batches at R ranks: seed + R. Default: 1000, the
  // batches docs/performance.md quotes
  uint64_t seed = 1000;
};

// Prints the comparison; false with *error on failure (including a plan that
// does not validate).
bool RunPlanBench(const PlanBenchOptions& options, std::string* error);

}  // namespace distca::bench
