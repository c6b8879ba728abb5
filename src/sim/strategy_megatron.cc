// megatron: fixed-length packing (documents cut in order into L-token chunks,
// pieces become documents), zig-zag context parallelism over c ranks (each
// document's attention split evenly), micro-batches of c consecutive chunks
// to the data-parallel replicas round-robin, 1F1B.
#include "sim/strategy.h"

namespace distca::sim {

Status SimulateMegatron(const SimContext& ctx, const std::vector<int64_t>& batch, int cp, BatchOutcome* out) {
  const std::vector<std::vector<int64_t>> chunks = CutIntoChunks(batch, ctx.options.max_doc_len);
  const int replicas = ctx.stage_ranks / cp;
  std::vector<std::vector<int64_t>> micro_batches;
  for (size_t first = 0; first < chunks.size(); first += cp) {
    std::vector<int64_t> docs;
    for (size_t i = first; i < first + size_t(cp) && i < chunks.size(); ++i)
      docs.insert(docs.end(), chunks[i].begin(), chunks[i].end());
    micro_batches.push_back(std::move(docs));
  }
  std::vector<std::vector<int>> assignment(replicas);
  for (size_t i = 0; i < micro_batches.size(); ++i) assignment[i % replicas].push_back(int(i));
  return RunContextParallel(ctx, micro_batches, assignment, cp, out);
}

}  // namespace distca::sim
