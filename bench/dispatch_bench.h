// `distca-bench dispatch`: disaggregated attention over ranks: bytes moved
// against the planner's estimate, exchange rate, and the communication left
// exposed with and without ping-pong.
#pragma once

#include <string>

namespace distca::bench {

struct DispatchBenchOptions {
  bool short_mode = false;
  bool json = false;    // one JSON record per batch
  int local_ranks = 4;  // ranks when not launched by mpirun. Default: 4
  std::string lengths_file;
  // When set, the ping-pong run of the first batch is traced and written as
  // Chrome trace JSON here (under MPI, rank r > 0 writes FILE.rank<r>).
  std::string trace_file;
};

// Runs on every rank of the backend (MPI under mpirun, else local threads);
// rank 0 prints. False with *error on failure.
bool RunDispatchBench(const DispatchBenchOptions& options, std::string* error);

}  // namespace distca::bench
