// megatron: fixed-length packing (documents cut in order into L-token chunks,
// pieces become documents), spread over CP groups of c ranks with zig-zag
// sharding (each document's attention split evenly); chunk i goes to
// data-parallel replica i mod d (d = G / c); 1F1B. A micro-batch is one chunk
// or, with SimOptions::micro_batches = m, a replica's chunks in m
// consecutive groups (as even as the count allows; fewer when a replica has
// fewer than m chunks).
#include "sim/strategy.h"

namespace distca::sim {

Status SimulateMegatron(const SimContext& ctx, const std::vector<int64_t>& batch, int cp, BatchOutcome* out,
                        BatchCarry* /*carry*/) {
  const std::vector<std::vector<int64_t>> chunks = CutIntoChunks(batch, ctx.options.max_doc_len);
  const int replicas = ctx.stage_ranks / cp;
  std::vector<std::vector<int>> assignment(replicas);
  for (size_t i = 0; i < chunks.size(); ++i) assignment[i % replicas].push_back(int(i));
  const int m = ctx.options.micro_batches;
  // Ring attention passes K/V around again in the backward pass: nothing
  // gathered is kept.
  if (m == 0)
    return RunContextParallel(ctx, CostCpMicroBatches(ctx, chunks, cp, /*keeps_gathered_kv=*/false), assignment, cp,
                              out);
  std::vector<std::vector<int64_t>> micro_batches;
  std::vector<std::vector<int>> grouped(replicas);
  for (int r = 0; r < replicas; ++r) {
    const size_t k = assignment[r].size();
    for (int g = 0; g < m; ++g) {
      const size_t begin = k * g / m, end = k * (g + 1) / m;
      if (begin == end) continue;
      grouped[r].push_back(int(micro_batches.size()));
      micro_batches.emplace_back();
      for (size_t i = begin; i < end; ++i) {
        const std::vector<int64_t>& c = chunks[assignment[r][i]];
        micro_batches.back().insert(micro_batches.back().end(), c.begin(), c.end());
      }
    }
  }
  return RunContextParallel(ctx, CostCpMicroBatches(ctx, micro_batches, cp, /*keeps_gathered_kv=*/false), grouped, cp,
                            out);
}

}  // namespace distca::sim
