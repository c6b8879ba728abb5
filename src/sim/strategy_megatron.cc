// megatron: fixed-length packing (documents cut in order into L-token chunks,
// pieces become documents); a micro-batch is one chunk, spread over a CP
// group of c ranks with zig-zag sharding (each document's attention split
// evenly); chunks go to the d = G / c data-parallel replicas round-robin
// (B / d each); 1F1B.
#include "sim/strategy.h"

namespace distca::sim {

Status SimulateMegatron(const SimContext& ctx, const std::vector<int64_t>& batch, int cp, BatchOutcome* out) {
  const std::vector<std::vector<int64_t>> chunks = CutIntoChunks(batch, ctx.options.max_doc_len);
  const int replicas = ctx.stage_ranks / cp;
  std::vector<std::vector<int>> assignment(replicas);
  for (size_t i = 0; i < chunks.size(); ++i) assignment[i % replicas].push_back(int(i));
  return RunContextParallel(ctx, chunks, assignment, cp, out);
}

}  // namespace distca::sim
