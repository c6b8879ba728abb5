// wlb-ideal (the paper's baseline, after WLB-LLM): variable-length packing of
// whole documents into B / c micro-batches of nominal c * L tokens (hard cap
// 2 c L) balancing the WLB cost, per-document context parallelism over c ranks
// (head/tail shards), micro-batches to the data-parallel replicas by
// longest-processing-time-first on their time, 1F1B.
#include "sim/strategy.h"

namespace distca::sim {

Status SimulateWlbIdeal(const SimContext& ctx, const std::vector<int64_t>& batch, int cp, BatchOutcome* out) {
  const int64_t L = ctx.options.max_doc_len;
  const int bins = ctx.options.batch_size / cp;
  const std::vector<std::vector<int64_t>> micro_batches = WlbPack(batch, bins, L, 2 * cp * L);
  std::vector<double> seconds;
  for (const auto& mb : micro_batches) {
    const CpStageCost c = CostCpMicroBatch(ctx, mb, cp);
    seconds.push_back(c.forward + c.backward);
  }
  return RunContextParallel(ctx, micro_batches, AssignLpt(seconds, ctx.stage_ranks / cp), cp, out);
}

}  // namespace distca::sim
