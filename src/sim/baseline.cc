// The context-parallel baselines' shared machinery: the cost of one
// micro-batch on a CP group, and data-parallel replicas each running a 1F1B
// pipeline (docs/simulator.md, "Baselines").
#include <algorithm>
#include <numeric>
#include <unordered_map>

#include "sim/pipeline.h"
#include "sim/strategy.h"

namespace distca::sim {

namespace {

// CostCpMicroBatch with a memo of each document length's attention at this
// c (batches repeat lengths: documents cut at L, upsampled copies; with a
// measured table a length costs 2c lookups, so large CP sweeps spent most of
// their time here).
CpStageCost CostOne(const SimContext& ctx, const std::vector<int64_t>& docs, int c, bool keeps_gathered_kv,
                    std::unordered_map<int64_t, RankCosts::AttentionSeconds>* memo) {
  const RankCosts& k = ctx.costs;
  const double tokens = double(std::accumulate(docs.begin(), docs.end(), int64_t{0}));
  const bool inter = ctx.CpInterNode(c);
  CpStageCost cost;
  cost.tokens = tokens;
  cost.keeps_gathered_kv = keeps_gathered_kv;
  cost.linear_f = k.LinearForward(tokens / c);
  for (int64_t len : docs) {
    auto [it, added] = memo->try_emplace(len);
    if (added) it->second = k.AttentionCp(len, c);
    const RankCosts::AttentionSeconds& a = it->second;
    cost.attention_f += a.forward;
    cost.attention_b += a.backward;
  }
  // Forward: every rank gathers the K/V of the whole micro-batch; backward:
  // the dK/dV partials are reduce-scattered back, after the K/V travel once
  // more when they were not kept (ring attention). Nothing is overlapped.
  cost.all_gather = k.Ring(c, tokens * k.KvBytesPerToken(), inter);
  cost.backward_comm = (keeps_gathered_kv ? 1.0 : 2.0) * cost.all_gather;
  const int layers = ctx.stage_layers;
  cost.forward = layers * (cost.linear_f + cost.attention_f + cost.all_gather);
  cost.linear_b = k.LinearBackward(tokens / c);
  cost.backward = layers * (cost.linear_b + cost.attention_b + cost.backward_comm);
  cost.head_f = k.HeadForward(tokens / c);
  return cost;
}

}  // namespace

CpStageCost CostCpMicroBatch(const SimContext& ctx, const std::vector<int64_t>& docs, int c, bool keeps_gathered_kv) {
  std::unordered_map<int64_t, RankCosts::AttentionSeconds> memo;
  return CostOne(ctx, docs, c, keeps_gathered_kv, &memo);
}

std::vector<CpStageCost> CostCpMicroBatches(const SimContext& ctx,
                                            const std::vector<std::vector<int64_t>>& micro_batches, int c,
                                            bool keeps_gathered_kv) {
  std::vector<CpStageCost> costs;
  costs.reserve(micro_batches.size());
  std::unordered_map<int64_t, RankCosts::AttentionSeconds> memo;
  for (const std::vector<int64_t>& mb : micro_batches) costs.push_back(CostOne(ctx, mb, c, keeps_gathered_kv, &memo));
  return costs;
}

Status RunContextParallel(const SimContext& ctx, const std::vector<CpStageCost>& costs,
                          const std::vector<std::vector<int>>& replicas, int c, BatchOutcome* out) {
  const int stages = ctx.options.pp;
  const int G = ctx.stage_ranks;
  const int d = static_cast<int>(replicas.size());
  if (d * c != G) return Status::Internal("replicas x CP does not match the stage's ranks");
  const RankCosts& k = ctx.costs;
  // One strategy's micro-batches: all keep the gathered K/V, or none does.
  const bool keeps_gathered_kv = !costs.empty() && costs.front().keeps_gathered_kv;

  BatchOutcome o;
  o.busy_s.assign(size_t(stages) * G, 0.0);
  o.memory_bytes.assign(size_t(stages) * G, 0.0);
  const int layers_total = ctx.stage_layers * stages;
  for (int r = 0; r < d; ++r) {
    std::vector<MicroBatchTimes> times;
    std::vector<double> held;  // per-rank tokens of this replica's micro-batches
    double buffer = 0;         // per rank: one layer's CP buffers (below)
    for (int i : replicas[r]) {
      const CpStageCost& cc = costs[i];
      MicroBatchTimes t;
      t.forward.assign(stages, cc.forward);
      t.backward.assign(stages, cc.backward);
      t.forward.back() += cc.head_f;
      t.backward.back() += kBackwardLinearFactor * cc.head_f;
      t.p2p = k.PointToPoint(cc.tokens / c * k.HiddenBytesPerToken(), ctx.pipeline_inter_node);
      times.push_back(std::move(t));
      held.push_back(cc.tokens / c);
      // Per-document CP (the gathered K/V kept, counted below with the other
      // layers'): the layer's dK/dV partials for the whole micro-batch's K/V.
      // Ring attention: a shard's K/V in use and the next one arriving, and
      // in the backward their dK/dV travelling alongside.
      const double cp_buffer_tokens = cc.keeps_gathered_kv ? cc.tokens : 4.0 * cc.tokens / c;
      buffer = std::max(buffer, c > 1 ? cp_buffer_tokens * k.KvBytesPerToken() : 0.0);

      o.breakdown.forward_linear_s += cc.linear_f / d;
      o.breakdown.backward_linear_s += cc.linear_b / d;
      o.breakdown.forward_attention_s += cc.attention_f / d;
      o.breakdown.backward_attention_s += cc.attention_b / d;
      o.breakdown.forward_comm_s += cc.all_gather / d;
      o.breakdown.backward_comm_s += cc.backward_comm / d;
      // K/V gathered and dK/dV scattered (and, for ring attention, the K/V
      // once more in the backward pass): (c - 1) / c of the micro-batch's K/V
      // reaches each of the c ranks, in every layer; activations (tokens / c
      // on each of the c ranks) cross each stage boundary forward and their
      // gradients backward.
      o.bytes_moved += (cc.keeps_gathered_kv ? 2.0 : 3.0) * layers_total * cc.tokens * k.KvBytesPerToken() * (c - 1) +
                       2.0 * (stages - 1) * cc.tokens * k.HiddenBytesPerToken();
    }
    const PipelineRun run = Simulate1F1B(times);
    o.iteration_s = std::max(o.iteration_s, run.makespan);
    // 1F1B: stage s holds the activations of at most min(P - s, m)
    // micro-batches; the largest ones, to bound the memory.
    std::sort(held.begin(), held.end(), std::greater<>());
    for (int s = 0; s < stages; ++s) {
      const int in_flight = std::min<int>(stages - s, int(held.size()));
      const double act = std::accumulate(held.begin(), held.begin() + in_flight, 0.0) * ctx.stage_layers;
      // K/V kept for the backward pass, every layer of each micro-batch in
      // flight, in shares of a rank's tokens: the gathered K/V less the
      // rank's own (in its activations), c - 1; with wlb_artifact_kv, as the
      // DistCA artifact's per-document CP keeps it (wlbllm's
      // PerDocumentCPAttention.forward, save_for_backward), also the K/V
      // prefixes it concatenates per document for its two query chunks,
      // (2c + 1) / 2c of the micro-batch or c + 1/2 shares: 2c - 1/2 in all
      // (1.5 at c = 1, where the prefixes are still concatenated).
      const double kept_shares = ctx.options.wlb_artifact_kv ? 2.0 * c - 0.5 : double(c - 1);
      const double kept_kv = keeps_gathered_kv ? act * kept_shares * k.KvBytesPerToken() : 0.0;
      MemoryInput mem = ctx.StageStateMemory();
      mem.activation_tokens = act;
      // A layer backward's working set is that of the largest micro-batch,
      // and the last stage also holds its logits (for the bound).
      mem.working_tokens = held.empty() ? 0.0 : held.front();
      mem.logits_tokens = s == stages - 1 ? mem.working_tokens : 0.0;
      mem.buffer_bytes = buffer + kept_kv;
      for (int j = 0; j < c; ++j) {
        const size_t rank = size_t(s) * G + size_t(r) * c + j;
        o.busy_s[rank] = run.busy.empty() ? 0.0 : run.busy[s];
        o.memory_bytes[rank] = DeviceMemoryBytes(k, mem);
      }
    }
  }
  o.max_buffer_bytes = 0;
  *out = std::move(o);
  return Status::Ok();
}

}  // namespace distca::sim
