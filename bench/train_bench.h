// `distca-bench train`: colocated vs CAD training steps on fixed batch mixes:
// step times against the ideal balanced time, and peak memory across ranks.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "distca/comm.h"
#include "distca/train.h"

namespace distca::bench {

struct TrainBenchOptions {
  bool short_mode = false;
  bool json = false;    // one JSON record per mix
  int local_ranks = 2;  // ranks when not launched by mpirun. Default: 2
};

// A fixed batch that every step of a run trains on.
struct TrainMix {
  std::string name;
  std::vector<int64_t> lengths;
};
// The benchmark's mixes for `ranks` ranks of `tokens_per_rank` tokens:
// long-first, long-last, graded (rank 0 slowest) and uniform.
std::vector<TrainMix> TrainMixes(int ranks, int64_t tokens_per_rank);

// Colocated ([0]) and CAD ([1]) runs of base.steps steps on `mix`, `reps` of
// each, alternating which mode runs first; every step after a run's first
// (its warm-up) is kept. Every rank calls it; the per-rank metrics are
// complete on rank 0.
using ModeSteps = std::array<std::vector<StepMetrics>, 2>;
Status TimeMix(Comm& comm, const TrainOptions& base, const TrainMix& mix, int reps, ModeSteps* steps);
// Median over steps of the slowest rank's step time.
double MedianStepSeconds(const std::vector<StepMetrics>& steps);

// Runs on every rank of the backend (MPI under mpirun, else local threads);
// rank 0 prints. False with *error on failure.
bool RunTrainBench(const TrainBenchOptions& options, std::string* error);

}  // namespace distca::bench
