// wlb-ideal (the paper's baseline, after WLB-LLM): variable-length packing of
// whole documents, per-document context parallelism (head/tail shards) over
// CP groups of c ranks, d = G / c data-parallel replicas, 1F1B. Two ways to
// form micro-batches (SimOptions::micro_batches):
// - chunk micro-batches (0): B micro-batches of nominal L tokens (hard cap
//   2 L) balancing the WLB cost (WlbPack), assigned to the replicas by
//   longest-processing-time-first on their simulated time ("ideal": exact
//   knowledge), B / d each;
// - m per replica (the DistCA artifact's runs), by SimOptions::wlb_scope
//   (docs/simulator.md, "wlb-ideal"): kWholeBatchArtifactCap (default)
//   repacks the whole batch at once into d m bins with the artifact's
//   balancer (WlbBalance), bin i to replica i mod d, under a cap m times
//   smaller than a bin's share B L / (d m), as the artifact's WLB benchmark
//   (tests/test_wlb_e2e.py) passes it; kWholeBatch the same with the cap at
//   the share; kPerMicroBatch forms m groups of about B L / m tokens from
//   the batch's documents in order and repacks each into d bins of at most
//   its tokens / d, bin r to replica r.
// Both packers' workload breakpoint is SimOptions::wlb_breakpoint if set,
// else where a document's attention FLOPs equal its linear FLOPs, l =
// linear FLOPs per token / (2 D Hq): 53K tokens for Llama-3-8B, 84K for
// Llama-34B (the artifact's scripts set 64000 and 131072 by hand).
// The memory check (Simulate's CP sweep) sees the largest micro-batch.
#include "sim/strategy.h"

namespace distca::sim {

Status SimulateWlbIdeal(const SimContext& ctx, const std::vector<int64_t>& batch, int cp, BatchOutcome* out,
                        BatchCarry* /*carry*/) {
  const SimOptions& o = ctx.options;
  const int64_t L = o.max_doc_len;
  const int replicas = ctx.stage_ranks / cp;
  const double breakpoint = o.wlb_breakpoint > 0
                                ? double(o.wlb_breakpoint)
                                : ctx.costs.LinearFlopsPerToken() / (2.0 * o.model.head_dim() * o.model.q_heads);
  if (o.micro_batches > 0) {
    const int m = o.micro_batches;
    const int64_t total = int64_t{o.batch_size} * L;
    const bool whole = o.wlb_scope != WlbScope::kPerMicroBatch;
    const std::vector<std::vector<int64_t>> groups =
        whole ? std::vector<std::vector<int64_t>>{batch} : SplitIntoWaves(batch, m, (total + m - 1) / m);
    const int bins_per_group = whole ? replicas * m : replicas;
    const int cap_divisor = o.wlb_scope == WlbScope::kWholeBatchArtifactCap ? m : 1;
    std::vector<std::vector<int64_t>> micro_batches;
    std::vector<std::vector<int>> assignment(replicas);
    for (const std::vector<int64_t>& group : groups) {
      int64_t tokens = 0;
      for (int64_t len : group) tokens += len;
      std::vector<std::vector<int64_t>> bins =
          WlbBalance(group, bins_per_group, (tokens + bins_per_group - 1) / bins_per_group / cap_divisor, breakpoint);
      for (int i = 0; i < bins_per_group; ++i) {
        if (bins[i].empty()) continue;
        assignment[i % replicas].push_back(int(micro_batches.size()));
        micro_batches.push_back(std::move(bins[i]));
      }
    }
    return RunContextParallel(ctx, CostCpMicroBatches(ctx, micro_batches, cp, /*keeps_gathered_kv=*/true), assignment,
                              cp, out);
  }
  const std::vector<CpStageCost> costs =
      CostCpMicroBatches(ctx, WlbPack(batch, o.batch_size, breakpoint, 2 * L), cp, /*keeps_gathered_kv=*/true);
  std::vector<double> seconds;
  for (const CpStageCost& c : costs) seconds.push_back(c.forward + c.backward);
  return RunContextParallel(ctx, costs, AssignLpt(seconds, replicas), cp, out);
}

}  // namespace distca::sim
