// `distca-bench train`: colocated vs CAD training steps on fixed batch mixes:
// step times against the ideal balanced time, and peak memory across ranks.
#pragma once

#include <string>

namespace distca::bench {

struct TrainBenchOptions {
  bool short_mode = false;
  bool json = false;    // one JSON record per mix
  int local_ranks = 2;  // ranks when not launched by mpirun. Default: 2
};

// Runs on every rank of the backend (MPI under mpirun, else local threads);
// rank 0 prints. False with *error on failure.
bool RunTrainBench(const TrainBenchOptions& options, std::string* error);

}  // namespace distca::bench
