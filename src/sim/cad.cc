// Core attention disaggregation, costed from real plans (docs/simulator.md,
// "CAD"). The batch's documents, whole and in order, form m waves of about G
// chunks (one micro-batch per rank). Ticks follow the aligned pipeline schedule: m + P - 1 forward
// ticks, in which stage s holds wave k - s, then as many backward ticks (stage
// s holds wave k - (P - 1 - s)); a backward tick pools the same waves as the
// forward tick of the same index, so it reuses its plans. With P = 1 a tick
// is a wave. In every tick the core attention of all active stages is pooled
// and planned over all ranks: those of idle stages (and any dedicated servers)
// are attention servers that hold no tokens.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "sim/strategy.h"

namespace distca::sim {
namespace {

// One planned nano-batch, costed per physical rank.
struct NanoCost {
  std::vector<double> tokens;          // tokens held (linear layout)
  std::vector<double> attention;       // forward CA seconds of its tasks
  std::vector<double> sent, received;  // bytes, forward + backward
  double forward_share = 0;            // forward bytes / all bytes
};

// Tasks of one document on one server whose query ranges touch, merged: the
// server's varlen kernel runs [a, b) and [b, c) as the one range [a, c) (same
// causal pairs), so efficiency follows the merged length.
std::vector<PlanTask> MergeContiguous(std::vector<PlanTask> tasks) {
  std::sort(tasks.begin(), tasks.end(), [](const PlanTask& x, const PlanTask& y) {
    return x.server != y.server ? x.server < y.server : (x.doc != y.doc ? x.doc < y.doc : x.q_begin < y.q_begin);
  });
  std::vector<PlanTask> merged;
  for (const PlanTask& t : tasks) {
    if (!merged.empty() && merged.back().server == t.server && merged.back().doc == t.doc &&
        merged.back().q_end == t.q_begin)
      merged.back().q_end = t.q_end;
    else
      merged.push_back(t);
  }
  return merged;
}

// BuildPlan, raising eps until the comm budget fits. BuildPlan's own loop
// stops with kInternal once eps passes the colocated plan's imbalance while
// the policy still moves work (the paper policy does: a server far below the
// mean keeps asking until eps reaches 1). The published loop would go on
// raising eps; at eps = 1 the paper policy moves nothing, so the outcome is
// the colocated plan, which this reproduces (tolerance_used = 1).
Status PlanWithinBudget(const std::vector<int64_t>& docs, const PlanOptions& options, const CostModel& cost,
                        Plan* plan) {
  const Status s = BuildPlan(docs, options, cost, plan);
  if (s.ok() || s.code() != StatusCode::kInternal || options.comm_budget == 0) return s;
  PlanOptions o = options;
  o.comm_budget = 0;
  o.tolerance = 1.0;
  DISTCA_RETURN_IF_ERROR(BuildPlan(docs, o, cost, plan));
  if (plan->stats.traffic.max_rank_bytes() <= options.comm_budget) return Status::Ok();
  o.policy = PlanPolicy::kColocated;
  DISTCA_RETURN_IF_ERROR(BuildPlan(docs, o, cost, plan));
  plan->tolerance_used = 1.0;
  return Status::Ok();
}

int64_t Sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

}  // namespace

Status SimulateCad(const SimContext& ctx, const std::vector<int64_t>& batch, const CadVariant& variant,
                   BatchOutcome* out) {
  const SimOptions& opt = ctx.options;
  const RankCosts& k = ctx.costs;
  const int P = opt.pp, G = ctx.stage_ranks, S = variant.extra_servers, m = ctx.micro_batches;
  const int stride = G + S;  // ranks per stage, servers included
  const int total_ranks = P * stride;
  const int64_t L = opt.max_doc_len;

  // Waves, each split into two nano-batches. With ping-pong off the same
  // nano-batches run back to back without overlap, so the ablation changes
  // the overlap and nothing else. A wave of one document cannot be split
  // (documents stay whole) and runs as one nano-batch.
  const std::vector<std::vector<int64_t>> waves = SplitIntoWaves(batch, m, int64_t{G} * L);
  std::vector<std::vector<std::vector<int64_t>>> nanos(m);
  for (int w = 0; w < m; ++w) {
    if (waves[w].size() < 2) {
      nanos[w] = {waves[w]};
      continue;
    }
    std::vector<std::vector<int>> index;
    DISTCA_RETURN_IF_ERROR(SplitNanoBatches(waves[w], 2, &index));
    for (const auto& docs : index) {
      nanos[w].emplace_back();
      for (int d : docs) nanos[w].back().push_back(waves[w][d]);
    }
  }

  PlanOptions base;
  base.policy = variant.policy;
  base.tolerance = opt.tolerance;
  // The budget is per device; a rank's tp devices each carry 1/tp of the heads.
  base.comm_budget = opt.comm_budget * opt.tp;
  base.model = {opt.model.q_heads, opt.model.kv_heads, opt.model.head_dim(), opt.hardware.dtype_bytes};
  const CostModel flops = CostModel::Flops(base.model);

  BatchOutcome o;
  o.busy_s.assign(total_ranks, 0.0);
  std::vector<double> held_max(total_ranks, 0.0), buffer_max(total_ranks, 0.0);
  const double p2p = P > 1 ? k.PointToPoint(double(L) * k.HiddenBytesPerToken(), ctx.pipeline_inter_node) : 0.0;

  for (int tick = 0; tick < m + P - 1; ++tick) {
    std::vector<int> active, idle;
    for (int s = 0; s < P; ++s) (tick - s >= 0 && tick - s < m ? active : idle).push_back(s);
    // Physical rank of each plan server: active stages' ranks hold tokens;
    // idle stages' ranks, then dedicated servers, serve attention only.
    std::vector<int> phys;
    for (int s : active)
      for (int j = 0; j < G; ++j) phys.push_back(s * stride + j);
    const int plan_ranks = static_cast<int>(phys.size());
    for (int s : idle)
      for (int j = 0; j < G; ++j) phys.push_back(s * stride + j);
    for (int s = 0; s < P; ++s)
      for (int j = 0; j < S; ++j) phys.push_back(s * stride + G + j);

    // Pool nano-batch n of every active stage's wave.
    std::vector<std::vector<int64_t>> pooled(2);
    for (int s : active)
      for (size_t n = 0; n < nanos[tick - s].size(); ++n)
        pooled[n].insert(pooled[n].end(), nanos[tick - s][n].begin(), nanos[tick - s][n].end());
    if (pooled[1].empty() || Sum(pooled[0]) < plan_ranks || Sum(pooled[1]) < plan_ranks) {
      pooled[0].insert(pooled[0].end(), pooled[1].begin(), pooled[1].end());
      pooled.pop_back();
    }

    PlanOptions po = base;
    po.ranks = plan_ranks;
    po.dedicated_servers = static_cast<int>(phys.size()) - plan_ranks;
    const bool inter = int64_t{opt.tp} * int64_t(phys.size()) > opt.hardware.gpus_per_node;
    std::vector<NanoCost> costs;
    for (size_t n = 0; n < pooled.size(); ++n) {
      Plan plan;
      DISTCA_RETURN_IF_ERROR(
          PlanWithinBudget(pooled[n], po, flops, &plan).WithContext(fmt::format("tick {}, nano-batch {}", tick, n)));
      NanoCost c;
      c.tokens.assign(total_ranks, 0.0);
      c.attention.assign(total_ranks, 0.0);
      c.sent.assign(total_ranks, 0.0);
      c.received.assign(total_ranks, 0.0);
      for (const PlanDocument& d : plan.documents)
        for (const PlanPiece& p : d.pieces) c.tokens[phys[p.rank]] += double(p.end - p.begin);
      for (const PlanTask& t : MergeContiguous(plan.tasks))
        c.attention[phys[t.server]] += k.AttentionForward(t.q_begin, t.q_end);
      const PlanTraffic& tr = plan.stats.traffic;
      for (size_t sv = 0; sv < phys.size(); ++sv) {
        c.sent[phys[sv]] = double(tr.sent[sv]);
        c.received[phys[sv]] = double(tr.received[sv]);
      }
      c.forward_share = tr.total_bytes() > 0 ? double(tr.forward_bytes) / double(tr.total_bytes()) : 0.0;
      costs.push_back(std::move(c));
      o.tolerance_sum += plan.tolerance_used;
      ++o.plans;
      o.bytes_moved += ctx.stage_layers * double(tr.total_bytes());
    }
    const bool overlap = opt.ping_pong && costs.size() == 2;

    // One layer, forward (pass 0) and backward (pass 1), per physical rank.
    for (int pass = 0; pass < 2; ++pass) {
      const double lin_factor = pass == 0 ? 1.0 : kBackwardLinearFactor;
      const double ca_factor = pass == 0 ? 1.0 : kBackwardAttentionFactor;
      std::vector<double> compute(total_ranks, 0.0), comm(total_ranks, 0.0);
      std::vector<double> nano_dispatch(costs.size(), 0.0);
      double linear_sum = 0, attention_sum = 0;
      for (size_t n = 0; n < costs.size(); ++n) {
        const NanoCost& c = costs[n];
        const double share = pass == 0 ? c.forward_share : 1.0 - c.forward_share;
        for (int r = 0; r < total_ranks; ++r) {
          const double lin = lin_factor * k.LinearForward(c.tokens[r]);
          const double ca = ca_factor * c.attention[r];
          compute[r] += lin + ca;
          linear_sum += lin;
          attention_sum += ca;
          const double sent = share * c.sent[r], received = share * c.received[r];
          if (sent > 0 || received > 0) {
            const double t = k.AllToAll(sent, received, inter);
            comm[r] += t;
            nano_dispatch[n] = std::max(nano_dispatch[n], t);
          }
        }
      }
      if (variant.dummy_bubble_work)
        for (int s : idle)
          for (int j = 0; j < G; ++j) compute[s * stride + j] += lin_factor * k.LinearForward(double(L));
      double layer = 0, max_compute = 0;
      for (int r = 0; r < total_ranks; ++r) {
        const double own = overlap ? std::max(compute[r], comm[r]) : compute[r] + comm[r];
        layer = std::max(layer, own);
        max_compute = std::max(max_compute, compute[r]);
        o.busy_s[r] += ctx.stage_layers * own;
      }
      // Ping-pong hides all traffic but the first nano-batch's dispatch
      // (about half of its exchange: Q and K/V out, before O comes back).
      if (overlap) layer += 0.5 * *std::min_element(nano_dispatch.begin(), nano_dispatch.end());

      // The LM head on the last stage (its ranks hold about L tokens), and the
      // activations crossing stage boundaries.
      double head = 0;
      if (std::find(active.begin(), active.end(), P - 1) != active.end()) {
        head = lin_factor * k.HeadForward(double(L));
        for (int j = 0; j < G; ++j) o.busy_s[(P - 1) * stride + j] += head;
      }
      o.iteration_s += ctx.stage_layers * layer + head + p2p;

      SimBreakdown& b = o.breakdown;
      // Work per token-holding rank of the pipeline (P * G of them); the
      // exposed transfer counts for the stages that hold tokens in this tick.
      (pass == 0 ? b.forward_linear_s : b.backward_linear_s) += linear_sum / (P * G);
      (pass == 0 ? b.forward_attention_s : b.backward_attention_s) += attention_sum / (P * G);
      (pass == 0 ? b.forward_comm_s : b.backward_comm_s) += (layer - max_compute) * double(active.size()) / P;
    }

    for (int r = 0; r < total_ranks; ++r) {
      double held = 0, buffer = 0;
      for (const NanoCost& c : costs) {
        held += c.tokens[r];
        buffer += c.sent[r] + c.received[r];
      }
      held_max[r] = std::max(held_max[r], held);
      buffer_max[r] = std::max(buffer_max[r], buffer);
    }
  }

  // Activations: a stage holds at most min(P - s, m) micro-batches at once
  // (1F1B order within the aligned ticks).
  o.memory_bytes.assign(total_ranks, 0.0);
  for (int s = 0; s < P; ++s) {
    for (int j = 0; j < stride; ++j) {
      const int r = s * stride + j;
      MemoryInput mem;
      if (j < G) {
        mem.stage_params = ctx.stage_params;
        mem.optimizer_shards = G;
        mem.activation_tokens = held_max[r] * std::min(P - s, m) * ctx.stage_layers;
      }
      mem.buffer_bytes = buffer_max[r];
      o.memory_bytes[r] = DeviceMemoryBytes(k, mem);
      o.max_buffer_bytes = std::max(o.max_buffer_bytes, buffer_max[r] / opt.tp);
    }
  }
  o.bytes_moved += 2.0 * (P - 1) * m * double(G) * double(L) * k.HiddenBytesPerToken();
  *out = std::move(o);
  return Status::Ok();
}

}  // namespace distca::sim
