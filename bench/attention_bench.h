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
  // When set, measure per-task forward and backward seconds over a grid of
  // (q_len, kv_len) and write the planner's cost table (CSV
  // q_len,kv_len,seconds, forward + backward) here, and the forward seconds
  // alone on the same grid to ForwardTablePath(table_out) (a simulator
  // profile's forward_file), instead of running the throughput benchmark.
  // One thread; heads below.
  std::string table_out;
  int q_heads = 8;     // Default: 8 (table mode)
  int kv_heads = 2;    // Default: 2 (table mode)
  int head_dim = 128;  // Default: 128 (table mode)
};

// Runs the benchmark and prints its results to stdout. Returns false, with a
// message in *error, when the kernel fails validation against the reference.
bool RunAttentionBench(const AttentionBenchOptions& options, std::string* error);

// The tables RunAttentionBench's table mode writes (options.table_out, which
// this ignores), as CSV text: forward + backward seconds per task in *csv,
// the forward seconds alone in *forward_csv; silent.
bool MeasureAttentionCostTable(const AttentionBenchOptions& options, std::string* csv, std::string* forward_csv,
                               std::string* error);

// Where the forward-only table goes next to a table file: "t.csv" ->
// "t-forward.csv" (the extension, if any, kept at the end).
std::string ForwardTablePath(const std::string& table_path);

}  // namespace distca::bench
