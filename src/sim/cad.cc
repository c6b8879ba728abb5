// Core attention disaggregation, costed from real plans (docs/simulator.md,
// "CAD"). The batch's documents, whole, form m = B c / G waves of about G / c
// chunks, laid out over the G ranks (L / c tokens each; c is c_min), or, with
// micro_batches set, m waves of B L / (m G) tokens per rank: in order
// (SplitIntoWaves), or, for distca with pipeline stages, balanced by tokens
// (BalanceWaves). Ticks follow the aligned pipeline schedule: m + P - 1 forward ticks,
// in which stage s holds wave k - s, then as many backward ticks (stage s
// holds wave k - (P - 1 - s)); a backward tick pools the same waves as the
// forward tick of the same index, so it reuses its plans. With P = 1 a tick
// is a wave. In every tick the core attention of all active stages is pooled
// and planned over all ranks (each stage's documents stay on its own ranks):
// those of idle stages (and any dedicated servers) are attention servers that
// hold no tokens. The colocated variant plans the
// active stages' ranks only, with the colocated policy, one plan per wave.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>

#include "sim/strategy.h"

namespace distca::sim {
namespace {

// One planned nano-batch, costed per physical rank.
struct NanoCost {
  std::vector<double> tokens;              // tokens held (linear layout)
  std::vector<double> attention;           // forward CA seconds of its tasks
  std::vector<double> attention_backward;  // and backward
  // Bytes by all-to-all (index: PlanExchange), sent and received, and of the
  // rows a rank serves for itself (PlanTraffic::exchange_local).
  std::array<std::vector<double>, kPlanExchanges> exchange_sent, exchange_received, exchange_local;
};

int64_t Sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

// Bytes in the planner's int64 units, capped where they would not fit
// (unlimited in practice).
int64_t CappedBytes(double bytes) { return bytes >= 9e18 ? int64_t{9'000'000'000'000'000'000} : int64_t(bytes); }

}  // namespace

Status StageLayout(const std::vector<std::vector<int64_t>>& stage_docs, int ranks_per_stage,
                   std::vector<PlanDocument>* layout) {
  if (layout == nullptr || ranks_per_stage <= 0) return Status::Internal("StageLayout: bad arguments");
  layout->clear();
  for (size_t a = 0; a < stage_docs.size(); ++a) {
    if (stage_docs[a].empty()) continue;
    std::vector<PlanDocument> local;
    DISTCA_RETURN_IF_ERROR(
        LinearLayout(stage_docs[a], int(std::min<int64_t>(ranks_per_stage, Sum(stage_docs[a]))), &local));
    for (PlanDocument& d : local) {
      for (PlanPiece& p : d.pieces) p.rank += int(a) * ranks_per_stage;
      layout->push_back(std::move(d));
    }
  }
  return Status::Ok();
}

double CadMemoryBytes(const SimContext& ctx, int c, int buffer_copies) {
  const SimOptions& o = ctx.options;
  const double tokens = ctx.CadRankTokens(c);
  MemoryInput mem = ctx.StageStateMemory();
  mem.buffer_bytes = double(buffer_copies) * double(o.comm_budget) * o.tp;
  mem.working_tokens = tokens;
  // The first stage holds the most waves in flight, the last one a single
  // wave and its logits; with one stage they are the same.
  mem.activation_tokens = tokens * ctx.CadInFlight(ctx.MicroBatchesPerReplica(c)) * ctx.stage_layers;
  const double first = o.pp > 1 ? DeviceMemoryBytes(ctx.costs, mem) : 0.0;
  mem.activation_tokens = tokens * ctx.stage_layers;
  mem.logits_tokens = tokens;
  return std::max(first, DeviceMemoryBytes(ctx.costs, mem));
}

double DistcaArtifactEnlargedBuffer(double need_bytes) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  return (std::ceil(need_bytes / kGiB) + 0.5) * kGiB;
}

Status SimulateCad(const SimContext& ctx, const std::vector<int64_t>& batch, int c_min, const CadVariant& variant,
                   BatchOutcome* out, BatchCarry* carry) {
  const SimOptions& opt = ctx.options;
  const RankCosts& k = ctx.costs;
  const bool colocated = variant.policy == PlanPolicy::kColocated;
  const int P = opt.pp, G = ctx.stage_ranks, S = colocated ? 0 : variant.extra_servers;
  const int m = ctx.MicroBatchesPerReplica(c_min);
  if (m <= 0) return Status::Internal(fmt::format("c_min {} does not split the batch into whole waves", c_min));
  const int stride = G + S;  // ranks per stage, servers included
  const int total_ranks = P * stride;
  const double rank_tokens = ctx.CadRankTokens(c_min);  // per rank and wave, nominal

  // Waves, each split into two nano-batches with ping-pong (balanced, or its
  // halves in order; a wave of one document cannot be split: documents stay
  // whole, so it runs as one); with ping-pong off, and for colocated, one
  // plan per wave, as distca-train runs.
  const std::vector<std::vector<int64_t>> waves =
      variant.balanced_waves ? BalanceWaves(batch, m)
                             : SplitIntoWaves(batch, m, std::max<int64_t>(1, int64_t(rank_tokens * G + 0.5)));
  std::vector<std::vector<std::vector<int64_t>>> nanos(m);
  for (int w = 0; w < m; ++w) {
    if (waves[w].size() < 2 || !opt.ping_pong || colocated) {
      nanos[w] = {waves[w]};
      continue;
    }
    if (!variant.balanced_nano_batches) {
      nanos[w] = SplitIntoWaves(waves[w], 2, (Sum(waves[w]) + 1) / 2);
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
  // The budget is per device (a rank's tp devices each carry 1/tp of the
  // heads) and per all-to-all: the buffer holds one exchange at a time, and
  // DistCA checks each of the four against it; for distca the planner does,
  // with budget_per_exchange, for distca-paper DistCA's loop below (capped
  // where it would not fit in int64: unlimited in practice).
  base.comm_budget = colocated ? 0 : CappedBytes(double(opt.comm_budget) * opt.tp);
  base.budget_per_exchange = true;
  base.budget_counts_local = variant.artifact_buffer;
  base.model = {opt.model.q_heads, RankKvHeads(opt.model, opt.tp), opt.model.head_dim(), opt.hardware.dtype_bytes,
                variant.wire};
  const CostModel flops = CostModel::Flops(base.model);
  const bool by_table = variant.plan_by_measured_time && k.attention_table() != nullptr;
  const CostModel& plan_cost = by_table ? *k.attention_table() : flops;
  // Other plans for each tick, the fastest kept (CadVariant::
  // keep_faster_tick, looser_tolerances): by FLOPs at eps where the first
  // are the table's, and by FLOPs at each looser bound.
  std::vector<double> other_tolerances;
  if (!variant.artifact_buffer) {
    if (by_table && variant.keep_faster_tick) other_tolerances.push_back(opt.tolerance);
    double looser = std::max(opt.tolerance, kLooserToleranceBase);
    for (int i = 0; i < variant.looser_tolerances; ++i) other_tolerances.push_back(looser *= 2);
  }

  // What the ticks accumulate: the outcome, and per rank the peaks over
  // the ticks. A tick writes these and nothing else, so a candidate tick
  // can be run from a copy and kept or dropped whole (keep_faster_tick).
  struct Accumulated {
    BatchOutcome o;
    // Tokens held; the per-layer send + receive; the runtime's buffers
    // alive at once (see the memory below); and, without the resend, what a
    // server keeps: the Q, K/V and O of every row it serves (copies out of
    // its receive buffer, its own rows included) until the layer's
    // backward, less what owners drop after the dispatch (their Q, K and
    // V; the artifact's layout_mlp_to_attn), negative where a rank serves
    // fewer rows than it holds.
    std::vector<double> held_max, buffer_max, alive_max, kept_max;
  };
  Accumulated acc;
  BatchOutcome& o = acc.o;
  o.busy_s.assign(total_ranks, 0.0);
  std::vector<double>& held_max = acc.held_max;
  std::vector<double>& buffer_max = acc.buffer_max;
  std::vector<double>& alive_max = acc.alive_max;
  std::vector<double>& kept_max = acc.kept_max;
  held_max.assign(total_ranks, 0.0);
  buffer_max.assign(total_ranks, 0.0);
  alive_max.assign(total_ranks, 0.0);
  kept_max.assign(total_ranks, std::numeric_limits<double>::lowest());
  const bool servers_keep = base.model.wire == PlanWire::kDistcaArtifactNoResend;
  // With DistCA's loop, the buffer as allocated (own rows included),
  // enlarged where no tolerance fitted, in this batch or (carry) one before it.
  double buffer_need = 0;
  const bool artifact_loop = variant.artifact_buffer && base.comm_budget > 0;
  int64_t artifact_buffer = artifact_loop ? std::max(base.comm_budget, carry != nullptr ? carry->buffer : 0) : 0;
  // Its tolerances, those not below the requested one: with one stage its
  // list (the requested one alone when the list has none that high), with
  // stages its pipeline list and the requested one.
  std::vector<double> artifact_tolerances;
  if (P == 1) {
    for (double e : kDistcaArtifactTolerances)
      if (e >= opt.tolerance) artifact_tolerances.push_back(e);
    if (artifact_tolerances.empty()) artifact_tolerances.push_back(opt.tolerance);
  } else {
    artifact_tolerances = {opt.tolerance};
    for (double e : kDistcaArtifactPipelineTolerances)
      if (e > opt.tolerance) artifact_tolerances.push_back(e);
  }

  for (int tick = 0; tick < m + P - 1; ++tick) {
    std::vector<int> active, idle;
    // A stage whose wave is empty (documents longer than a wave) idles.
    for (int s = 0; s < P; ++s)
      (tick - s >= 0 && tick - s < m && !waves[tick - s].empty() ? active : idle).push_back(s);
    // Physical rank of each plan server: active stages' ranks hold tokens;
    // idle stages' ranks, then dedicated servers, serve attention only.
    std::vector<int> phys;
    for (int s : active)
      for (int j = 0; j < G; ++j) phys.push_back(s * stride + j);
    const int plan_ranks = static_cast<int>(phys.size());
    if (!colocated)
      for (int s : idle)
        for (int j = 0; j < G; ++j) phys.push_back(s * stride + j);
    for (int s = 0; s < P; ++s)
      for (int j = 0; j < S; ++j) phys.push_back(s * stride + G + j);

    // A tick whose stages all have empty waves costs nothing.
    if (active.empty()) continue;
    // Nano-batch n of every active stage's wave: parts[n][a] for the a-th
    // active stage. One plan per nano-batch pools the stages' attention over
    // every server, but each stage's documents stay on its own G ranks.
    std::vector<std::vector<std::vector<int64_t>>> parts(2, std::vector<std::vector<int64_t>>(active.size()));
    bool split = false;  // some stage's wave has a second nano-batch
    // Every stage whose wave is in a nano-batch gives each of its own ranks
    // a token there (as distca-train requires; the stage's documents stay on
    // its ranks, so the stages are checked one by one, not pooled). A wave
    // of one document is in the first only: its ranks serve attention in
    // the second, as an idle stage's do.
    bool every_rank_a_token = true;
    for (size_t a = 0; a < active.size(); ++a) {
      const std::vector<std::vector<int64_t>>& wave = nanos[tick - active[a]];
      for (size_t n = 0; n < wave.size(); ++n) {
        if (wave[n].empty()) continue;
        parts[n][a] = wave[n];
        if (Sum(wave[n]) < G) every_rank_a_token = false;
        if (n == 1) split = true;
      }
    }
    // Nothing to overlap with, or too few tokens: one plan of whole waves.
    if (!split || !every_rank_a_token) {
      for (size_t a = 0; a < active.size(); ++a) parts[0][a] = waves[tick - active[a]];
      parts.pop_back();
    }
    for (size_t a = 0; a < active.size(); ++a) {
      const int64_t wave_tokens = Sum(waves[tick - active[a]]);
      // FailedPrecondition: with pipeline stages Simulate goes on to the
      // next degree (a larger c cuts more, smaller waves).
      if (wave_tokens < G)
        return Status::FailedPrecondition(
            fmt::format("tick {}: stage {} holds {} tokens for {} ranks in one of its {} waves: some rank would hold "
                        "none (fewer waves, from a lower CP degree or fewer micro-batches, or fewer ranks would give "
                        "each rank a token)",
                        tick, active[a], wave_tokens, G, m));
    }

    PlanOptions po = base;
    po.ranks = plan_ranks;
    po.dedicated_servers = static_cast<int>(phys.size()) - plan_ranks;
    // The all-to-all crosses nodes when the plan's ranks' devices (rank r:
    // [r tp, (r + 1) tp)) are not all on one node: when its lowest and
    // highest devices are not.
    const auto [low, high] = std::minmax_element(phys.begin(), phys.end());
    const bool inter = ctx.SpansNodes(int64_t{*low} * opt.tp, int64_t{*high - *low + 1} * opt.tp);
    // Each nano-batch's layout, once; DistCA's loop plans it again at every
    // tolerance it tries.
    std::vector<std::vector<PlanDocument>> layouts(parts.size());
    for (size_t n = 0; n < parts.size(); ++n) DISTCA_RETURN_IF_ERROR(StageLayout(parts[n], G, &layouts[n]));
    std::vector<Plan> plans(parts.size());
    std::vector<std::vector<Plan>> others;  // the other candidates that could be made
    auto plan_into = [&](size_t n, const PlanOptions& q, const CostModel& cost, std::vector<Plan>& into) {
      return BuildPlanForLayout(layouts[n], q, cost, &into[n])
          .WithContext(fmt::format("tick {}, nano-batch {}", tick, n));
    };
    auto plan_one = [&](size_t n, const PlanOptions& q) { return plan_into(n, q, plan_cost, plans); };
    auto plan_all = [&](const PlanOptions& q) {
      for (size_t n = 0; n < parts.size(); ++n) DISTCA_RETURN_IF_ERROR(plan_one(n, q));
      return Status::Ok();
    };
    if (!artifact_loop) {
      // The planner's rank is tp devices: its budget is tp x the per-device one.
      Status planned = plan_all(po);
      if (!planned.ok() && po.comm_budget > 0) {
        planned = planned.WithContext(
            fmt::format("a rank of tp {} devices: comm budget {} x {} bytes", opt.tp, opt.tp, opt.comm_budget));
        // Where the budget alone is what fails (the same waves plan without
        // it), this degree cannot run: FailedPrecondition, so that Simulate
        // tries the next one, whose smaller waves move less per exchange.
        PlanOptions unbounded = po;
        unbounded.comm_budget = 0;
        if (plan_all(unbounded).ok()) planned = Status::FailedPrecondition(planned.message());
      }
      DISTCA_RETURN_IF_ERROR(planned);
      // The other candidates, by FLOPs (a bound where one cannot be made
      // offers none).
      for (double eps : other_tolerances) {
        PlanOptions q = po;
        q.tolerance = eps;
        std::vector<Plan> candidate(parts.size());
        bool made = true;
        for (size_t n = 0; n < parts.size() && made; ++n) made = plan_into(n, q, flops, candidate).ok();
        if (made) others.push_back(std::move(candidate));
      }
    } else if (P == 1) {
      // DistCA's artifact (test_e2e_combined.py): every nano-batch of the
      // tick at one tolerance, in its order, until all of them fit the
      // buffer; when none does, the last plans, in a buffer enlarged to
      // their need.
      PlanOptions q = po;
      q.comm_budget = 0;  // the loop checks the buffer
      int64_t need = 0;
      for (double eps : artifact_tolerances) {
        q.tolerance = eps;
        DISTCA_RETURN_IF_ERROR(plan_all(q));
        need = 0;
        for (const Plan& p : plans) need = std::max(need, p.stats.traffic.max_exchange_bytes(true));
        if (need <= artifact_buffer) break;
      }
      if (need > artifact_buffer)
        artifact_buffer =
            std::max(artifact_buffer, CappedBytes(DistcaArtifactEnlargedBuffer(double(need) / opt.tp) * opt.tp));
    } else {
      // With pipeline stages (create_qkv_dispatch_pipeline_tick, once per
      // nano-batch): each nano-batch at its list's tolerances until its plan
      // fits; where none does, the artifact stops (it raises), and so does
      // this degree (FailedPrecondition: Simulate tries the next one).
      PlanOptions q = po;
      q.comm_budget = 0;
      for (size_t n = 0; n < parts.size(); ++n) {
        int64_t need = 0;
        for (double eps : artifact_tolerances) {
          q.tolerance = eps;
          DISTCA_RETURN_IF_ERROR(plan_one(n, q));
          need = plans[n].stats.traffic.max_exchange_bytes(true);
          if (need <= artifact_buffer) break;
        }
        if (need > artifact_buffer)
          return Status::FailedPrecondition(fmt::format(
              "tick {}, nano-batch {}: no tolerance up to {} fits the buffer of {:.3g} GB per device (the plan needs "
              "{:.3g} GB in one exchange); DistCA's pipeline schedule stops here (a larger --comm-budget would run)",
              tick, n, artifact_tolerances.back(), double(artifact_buffer) / opt.tp * 1e-9,
              double(need) / opt.tp * 1e-9));
      }
    }
    if (artifact_loop) buffer_need = std::max(buffer_need, double(artifact_buffer));
    // Costs the tick run with `tick_plans`: its time, busy time and
    // breakdown into o, its peaks into the *_max vectors.
    auto run_tick = [&](const std::vector<Plan>& tick_plans) {
      std::vector<NanoCost> costs;
      for (size_t n = 0; n < parts.size(); ++n) {
        const Plan& plan = tick_plans[n];
        NanoCost c;
        c.tokens.assign(total_ranks, 0.0);
        c.attention.assign(total_ranks, 0.0);
        c.attention_backward.assign(total_ranks, 0.0);
        for (const PlanDocument& d : plan.documents)
          for (const PlanPiece& p : d.pieces) c.tokens[phys[p.rank]] += double(p.end - p.begin);
        // The server's varlen kernel runs touching tasks of a document as one
        // range, so efficiency follows the merged length.
        for (const PlanTask& t : MergeTouchingTasks(plan.tasks)) {
          const RankCosts::AttentionSeconds a = k.Attention(t.q_begin, t.q_end);
          c.attention[phys[t.server]] += a.forward;
          c.attention_backward[phys[t.server]] += a.backward;
        }
        const PlanTraffic& tr = plan.stats.traffic;
        for (int e = 0; e < kPlanExchanges; ++e) {
          c.exchange_sent[e].assign(total_ranks, 0.0);
          c.exchange_received[e].assign(total_ranks, 0.0);
          c.exchange_local[e].assign(total_ranks, 0.0);
        }
        for (size_t sv = 0; sv < phys.size(); ++sv) {
          for (int e = 0; e < kPlanExchanges; ++e) {
            c.exchange_sent[e][phys[sv]] = double(tr.exchange_sent[e][sv]);
            c.exchange_received[e][phys[sv]] = double(tr.exchange_received[e][sv]);
            c.exchange_local[e][phys[sv]] = double(tr.exchange_local[e][sv]);
          }
        }
        costs.push_back(std::move(c));
        o.tolerance_sum += plan.tolerance_used;
        o.load_ratio_sum += plan.stats.max_over_mean();
        ++o.plans;
        o.bytes_moved += ctx.stage_layers * double(tr.total_bytes());
      }
      const bool overlap = opt.ping_pong && costs.size() == 2;
      // Tokens each rank holds in this tick (all nano-batches): what the LM
      // head runs over on the last stage and what crosses a stage boundary.
      std::vector<double> tick_tokens(total_ranks, 0.0);
      for (const NanoCost& c : costs)
        for (int r = 0; r < total_ranks; ++r) tick_tokens[r] += c.tokens[r];
      // The tick ends with the active stages' messages to the next stage
      // (backward: the previous one, the stages mirrored); a tick whose only
      // active stage is the last sends none.
      const bool sends = std::any_of(active.begin(), active.end(), [&](int s) { return s < P - 1; });
      const double p2p =
          sends ? k.PointToPoint(*std::max_element(tick_tokens.begin(), tick_tokens.end()) * k.HiddenBytesPerToken(),
                                 ctx.pipeline_inter_node)
                : 0.0;

      // One layer, forward (pass 0) and backward (pass 1), per physical rank
      // and nano-batch: the linear part before core attention (forward: the
      // QKV projection; backward: the O projection and MLP), the dispatch of
      // Q/K/V (backward: also dO and statistics), the attention served, the
      // return of O (backward: dQ, dK/dV), and the linear part after it.
      // Only the all-to-alls synchronize the ranks (see `step` below).
      for (int pass = 0; pass < 2; ++pass) {
        const double head_factor = pass == 0 ? 1.0 : kBackwardLinearFactor;
        const size_t nn = costs.size();
        // distca-paper: idle stages' ranks run a dummy micro-batch's linear
        // layers, split over the nano-batches.
        const RankCosts::LinearSplit dummy = k.LinearPass(rank_tokens, pass == 1);
        using PerRank = std::vector<double>;
        std::vector<PerRank> before(nn, PerRank(total_ranks, 0.0)),
            after = before, ca = before, dispatch = before, back = before, dummy_before = before, dummy_after = before;
        std::vector<double> compute(total_ranks, 0.0);
        double linear_sum = 0, attention_sum = 0;
        for (size_t n = 0; n < nn; ++n) {
          const NanoCost& c = costs[n];
          // This pass's dispatch and return, as the plan counts them.
          const int out_ex =
              static_cast<int>(pass == 0 ? PlanExchange::kForwardDispatch : PlanExchange::kBackwardDispatch);
          const int back_ex = out_ex + 1;
          for (int r = 0; r < total_ranks; ++r) {
            const RankCosts::LinearSplit own = k.LinearPass(c.tokens[r], pass == 1);
            before[n][r] = own.before;
            after[n][r] = own.after;
            linear_sum += own.before + own.after;
            if (variant.dummy_bubble_work && r % stride < G &&
                std::find(idle.begin(), idle.end(), r / stride) != idle.end()) {
              dummy_before[n][r] = dummy.before / double(nn);
              dummy_after[n][r] = dummy.after / double(nn);
            }
            const double lin = before[n][r] + after[n][r] + dummy_before[n][r] + dummy_after[n][r];
            ca[n][r] = pass == 0 ? c.attention[r] : c.attention_backward[r];
            attention_sum += ca[n][r];
            compute[r] += lin + ca[n][r];
            const double out_s = c.exchange_sent[out_ex][r], out_r = c.exchange_received[out_ex][r];
            const double back_s = c.exchange_sent[back_ex][r], back_r = c.exchange_received[back_ex][r];
            // A rank with no bytes in this pass takes no part in its exchanges;
            // one with some pays each exchange's latency (the runtime calls
            // every all-to-all, empty or not).
            if (out_s > 0 || out_r > 0 || back_s > 0 || back_r > 0) {
              dispatch[n][r] = k.AllToAll(out_s, out_r, inter);
              back[n][r] = k.AllToAll(back_s, back_r, inter);
            }
          }
        }
        // The stage's pass over its layers, step by step, on a clock per rank:
        // each rank computes at its own pace, and an all-to-all starts when
        // every rank with bytes in it has produced its data (the latest of
        // their clocks) and ends, for each of them, when its slowest transfer
        // does; a rank with none takes no part. So a
        // rank early out of one step starts the next step's compute early, and
        // only the exchanges synchronize (DistCA's all-to-all waits for its
        // peers' signals, and MPI's for their data, not for a barrier). A
        // step's compute_of(r, dummy) is rank r's time in it, with or without
        // distca-paper's dummy work: that work takes time, but its results are
        // thrown away, so it counts as waiting (idle), not as busy; comm_of(r)
        // is its transfer in the exchange the step hides (0: none).
        const int layers = ctx.stage_layers;
        std::vector<double> clock(total_ranks, 0.0);
        auto step = [&](auto&& compute_of, auto&& comm_of) {
          // The exchange's ranks: those with bytes in it.
          double ready = 0, transfer = 0;
          for (int r = 0; r < total_ranks; ++r) {
            if (comm_of(r) <= 0) continue;
            ready = std::max(ready, clock[r]);
            transfer = std::max(transfer, comm_of(r));
          }
          for (int r = 0; r < total_ranks; ++r) {
            const double with = compute_of(r, true), without = compute_of(r, false);
            // The dummy work counts as idle.
            o.busy_s[r] += comm_of(r) > 0 ? StepBusySeconds(without, comm_of(r), ready - clock[r]) : without;
            o.bubble_work_s += with - without;
            clock[r] += with;
            if (comm_of(r) > 0) clock[r] = std::max(clock[r], ready + transfer);
          }
        };
        const auto none = [](int) { return 0.0; };
        const auto idle_step = [](int, bool) { return 0.0; };
        // Runs layer(l) for l = 0 .. layers - 1, the layers from first_steady
        // on all alike. A step depends on the clocks' differences only, so
        // once such a layer moves every clock by the same amount, each later
        // one does too: they are added at once (busy and dummy time as the
        // layer's), which keeps a pass of thousands of layers cheap.
        std::vector<double> clock_in, busy_in;
        auto run_layers = [&](int first_steady, auto&& layer) {
          for (int l = 0; l < layers; ++l) {
            const bool check = l >= first_steady && l + 1 < layers;
            const double bubble_in = o.bubble_work_s;
            if (check) {
              clock_in = clock;
              busy_in = o.busy_s;
            }
            layer(l);
            if (!check) continue;
            const double shift = clock[0] - clock_in[0];
            bool uniform = true;
            for (int r = 0; r < total_ranks && uniform; ++r)
              uniform = std::abs(clock[r] - clock_in[r] - shift) <= 1e-12 * std::max(1.0, std::abs(clock[r]));
            if (!uniform) continue;
            const double rest = double(layers - 1 - l);
            for (int r = 0; r < total_ranks; ++r) {
              clock[r] += rest * (clock[r] - clock_in[r]);
              o.busy_s[r] += rest * (o.busy_s[r] - busy_in[r]);
            }
            o.bubble_work_s += rest * (o.bubble_work_s - bubble_in);
            return;
          }
        };
        // Linear work before / after core attention, with the dummy work or not.
        const auto pre = [&](size_t n, int r, bool with) { return before[n][r] + (with ? dummy_before[n][r] : 0.0); };
        const auto post = [&](size_t n, int r, bool with) { return after[n][r] + (with ? dummy_after[n][r] : 0.0); };
        if (overlap) {
          // Ping-pong (DistCA's Figure 7): each transfer of one nano-batch runs
          // under the other's compute. Layer l: nano 0's linear work (after
          // attention of layer l - 1, before it in layer l) hides nano 1's
          // return; nano 1's linear work hides nano 0's dispatch; nano 0's
          // attention hides nano 1's dispatch; nano 1's attention hides nano
          // 0's return. A transfer longer than its cover shows. Fill and
          // drain: the pass opens with nano 0's work before attention, alone;
          // in the last layer nano 1's return has only nano 0's work after
          // attention to hide under, and nano 1's closes the pass, alone.
          run_layers(1, [&](int l) {
            if (l == 0)
              step([&](int r, bool d) { return pre(0, r, d); }, none);
            else
              step([&](int r, bool d) { return post(0, r, d) + pre(0, r, d); }, [&](int r) { return back[1][r]; });
            step([&](int r, bool d) { return (l > 0 ? post(1, r, d) : 0.0) + pre(1, r, d); },
                 [&](int r) { return dispatch[0][r]; });
            step([&](int r, bool) { return ca[0][r]; }, [&](int r) { return dispatch[1][r]; });
            step([&](int r, bool) { return ca[1][r]; }, [&](int r) { return back[0][r]; });
          });
          step([&](int r, bool d) { return post(0, r, d); }, [&](int r) { return back[1][r]; });
          step([&](int r, bool d) { return post(1, r, d); }, none);
        } else {
          // One plan (or nano-batches back to back): nothing overlaps.
          run_layers(0, [&](int) {
            for (size_t n = 0; n < nn; ++n) {
              step([&](int r, bool d) { return pre(n, r, d); }, none);
              step(idle_step, [&](int r) { return dispatch[n][r]; });
              step([&](int r, bool) { return ca[n][r]; }, none);
              step(idle_step, [&](int r) { return back[n][r]; });
              step([&](int r, bool d) { return post(n, r, d); }, none);
            }
          });
        }
        const double pass_s = *std::max_element(clock.begin(), clock.end());
        const double max_compute = *std::max_element(compute.begin(), compute.end());

        // The LM head on the last stage's ranks, over the tokens each holds
        // (the slowest sets the tick), and the activations crossing stage
        // boundaries.
        double head = 0;
        if (std::find(active.begin(), active.end(), P - 1) != active.end()) {
          for (int j = 0; j < G; ++j) {
            const int r = (P - 1) * stride + j;
            const double h = head_factor * k.HeadForward(tick_tokens[r]);
            o.busy_s[r] += h;
            head = std::max(head, h);
          }
        }
        o.iteration_s += pass_s + head + p2p;

        SimBreakdown& b = o.breakdown;
        // Work per token-holding rank of the pipeline (P * G of them); the
        // exposed transfer counts for the stages that hold tokens in this tick.
        (pass == 0 ? b.forward_linear_s : b.backward_linear_s) += linear_sum / (P * G);
        (pass == 0 ? b.forward_attention_s : b.backward_attention_s) += attention_sum / (P * G);
        // Exposed: what the pass took beyond its compute. The two are summed
        // in different orders and may differ by a rounding, which is not
        // communication (colocated, with none, showed 1.9e-17 s).
        const double exposed = pass_s / layers - max_compute;
        (pass == 0 ? b.forward_comm_s : b.backward_comm_s) +=
            exposed > 1e-12 * max_compute ? exposed * double(active.size()) / P : 0.0;
      }

      for (int r = 0; r < total_ranks; ++r) {
        // buffer: every exchange of the layer. alive: what distca's runtime
        // (src/runtime/dispatcher.cc) holds for each nano-batch in flight, at
        // the peak of a pass (forward: exchanges 0 and 1, backward: 2 and 3):
        // a send and a receive buffer sized for the pass's larger exchange
        // each way (refilled, not shrunk, between its two exchanges), the
        // server's copies of the rows it serves (the dispatch's, received and
        // its own) and of its results (the return's, sent and its own).
        double buffer = 0, alive = 0;
        for (const NanoCost& c : costs) {
          double peak = 0;
          for (int e = 0; e < kPlanExchanges; ++e) buffer += c.exchange_sent[e][r] + c.exchange_received[e][r];
          for (int dispatch : {0, 2}) {
            const int ret = dispatch + 1;
            const double exchange = std::max(c.exchange_sent[dispatch][r], c.exchange_sent[ret][r]) +
                                    std::max(c.exchange_received[dispatch][r], c.exchange_received[ret][r]);
            const double server = c.exchange_received[dispatch][r] + c.exchange_local[dispatch][r] +
                                  c.exchange_sent[ret][r] + c.exchange_local[ret][r];
            peak = std::max(peak, exchange + server);
          }
          alive += peak;
        }
        held_max[r] = std::max(held_max[r], tick_tokens[r]);
        buffer_max[r] = std::max(buffer_max[r], buffer);
        alive_max[r] = std::max(alive_max[r], alive);
        if (servers_keep) {
          double kept = 0;
          constexpr int kDispatch = int(PlanExchange::kForwardDispatch), kReturn = int(PlanExchange::kForwardReturn);
          for (const NanoCost& c : costs)
            kept += c.exchange_received[kDispatch][r] + c.exchange_local[kDispatch][r] + c.exchange_sent[kReturn][r] +
                    c.exchange_local[kReturn][r];
          // Less the owner's Q, K and V of this tick's tokens, which the
          // activations count: the largest difference over ticks (a rank's
          // tokens vary between waves unless they are whole chunks).
          kept_max[r] = std::max(kept_max[r], kept - (k.HiddenBytesPerToken() + k.KvBytesPerToken()) * tick_tokens[r]);
        }
      }
    };
    if (others.empty()) {
      run_tick(plans);
      continue;
    }
    // Every candidate from the same state; the first plans kept unless
    // another's tick is shorter (the first of equals). The references above
    // stay bound to acc's members, which only assignments replace.
    const Accumulated before = acc;
    run_tick(plans);
    Accumulated fastest = acc;
    for (const std::vector<Plan>& candidate : others) {
      acc = before;
      run_tick(candidate);
      if (o.iteration_s < fastest.o.iteration_s) fastest = std::move(acc);
    }
    acc = std::move(fastest);
  }

  // Activations: stage s holds at most CadInFlight(m, s) waves at once, its
  // largest each (distca-paper's dummy micro-batches run without autograd
  // and hold none). Buffers: distca-paper with a comm budget, DistCA's
  // NVSHMEM region of comm_budget bytes per device, four times and enlarged
  // where its loop enlarged it, the same on every rank; without one, the
  // largest per-layer send + receive of the rank. distca and colocated (the
  // runtime here) allocate per pass: alive_max (a budget bounds the
  // exchanges, it is not allocated).
  o.memory_bytes.assign(total_ranks, 0.0);
  o.buffer_bytes.assign(total_ranks, 0.0);
  for (int s = 0; s < P; ++s) {
    for (int j = 0; j < stride; ++j) {
      const int r = s * stride + j;
      MemoryInput mem;
      if (j < G) {
        mem = ctx.StageStateMemory();
        mem.activation_tokens = held_max[r] * ctx.CadInFlight(m, s) * ctx.stage_layers;
        if (s == P - 1) mem.logits_tokens = held_max[r];  // the logits of its largest wave
        mem.working_tokens = held_max[r];
      }
      mem.buffer_bytes = artifact_loop
                             ? kDistcaArtifactBufferCopies * std::max(double(opt.comm_budget) * opt.tp, buffer_need)
                         : variant.artifact_buffer ? buffer_max[r]
                                                   : alive_max[r];
      // Kept per layer (less the owner's Q, K and V, above), for every layer
      // of the micro-batches in flight (as activations; the LSE, a few
      // percent of O, is left out).
      if (servers_keep) mem.server_bytes = kept_max[r] * ctx.CadInFlight(m, s) * ctx.stage_layers;
      o.memory_bytes[r] = DeviceMemoryBytes(k, mem);
      o.buffer_bytes[r] = mem.buffer_bytes / opt.tp;
      o.max_buffer_bytes = std::max(o.max_buffer_bytes, buffer_max[r] / opt.tp);
    }
  }
  if (carry != nullptr && artifact_loop) carry->buffer = artifact_buffer;
  // Every token crosses each of the P - 1 stage boundaries once forward
  // (activations) and once backward (their gradients).
  o.bytes_moved += 2.0 * (P - 1) * double(Sum(batch)) * k.HiddenBytesPerToken();
  *out = std::move(o);
  return Status::Ok();
}

}  // namespace distca::sim
