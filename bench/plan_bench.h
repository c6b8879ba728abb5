// `distca-bench plan`: the planner's policies side by side on batches sampled
// from the shared document-length distribution.
#pragma once

#include <string>

namespace distca::bench {

struct PlanBenchOptions {
  bool short_mode = false;   // CI mode: fewer batches
  bool json = false;         // one JSON object per (ranks, policy) line
  std::string lengths_file;  // Default: data/doc-lengths-pretrain.json in the source tree
};

// Prints the comparison; false with *error on failure (including a plan that
// does not validate).
bool RunPlanBench(const PlanBenchOptions& options, std::string* error);

}  // namespace distca::bench
