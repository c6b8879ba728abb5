// wlb-ideal (the paper's baseline, after WLB-LLM): variable-length packing of
// whole documents into B micro-batches of nominal L tokens (hard cap 2 L)
// balancing the WLB cost; each micro-batch is spread over a CP group of c
// ranks with per-document context parallelism (head/tail shards); the
// micro-batches go to the d = G / c data-parallel replicas, B / d each, by
// longest-processing-time-first on their simulated time ("ideal": exact
// knowledge); 1F1B. The memory check (Simulate's CP sweep) sees the largest
// micro-batch.
#include "sim/strategy.h"

namespace distca::sim {

Status SimulateWlbIdeal(const SimContext& ctx, const std::vector<int64_t>& batch, int cp, BatchOutcome* out) {
  const int64_t L = ctx.options.max_doc_len;
  const std::vector<std::vector<int64_t>> micro_batches = WlbPack(batch, ctx.options.batch_size, L, 2 * L);
  std::vector<double> seconds;
  for (const auto& mb : micro_batches) {
    const CpStageCost c = CostCpMicroBatch(ctx, mb, cp);
    seconds.push_back(c.forward + c.backward);
  }
  return RunContextParallel(ctx, micro_batches, AssignLpt(seconds, ctx.stage_ranks / cp), cp, out);
}

}  // namespace distca::sim
