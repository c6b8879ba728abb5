// 1F1B pipeline schedule (PipeDream-Flush, as Megatron-LM runs it) as a
// dependency DAG, for the baselines (docs/simulator.md, "Pipeline").
#pragma once

#include <vector>

namespace distca::sim {

// One micro-batch: seconds of its forward and backward on each stage, and of
// sending its activations (or their gradients) across one stage boundary.
struct MicroBatchTimes {
  std::vector<double> forward;   // per stage
  std::vector<double> backward;  // per stage
  double p2p = 0.0;
};

struct PipelineRun {
  double makespan = 0.0;
  std::vector<double> busy;  // per stage: seconds of its own operations
};

// Runs micro-batches 0..m-1 in order through P = forward.size() stages. Stage
// s runs min(P - 1 - s, m) warm-up forwards, then alternates one forward and
// one backward, then drains its backwards. F(s, i) starts after the previous
// operation of stage s and after F(s - 1, i) plus p2p; B(s, i) after the
// previous operation and after B(s + 1, i) plus p2p. With uniform times f, b
// and no p2p the makespan is (m + P - 1)(f + b).
// REQUIRES: every micro-batch has the same number of stages (>= 1).
PipelineRun Simulate1F1B(const std::vector<MicroBatchTimes>& micro_batches);

}  // namespace distca::sim
