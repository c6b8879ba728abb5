// What every strategy shares: the configuration derived from SimOptions, the
// per-batch outcome, and the strategy functions (one file each).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "distca/plan.h"
#include "distca/sim.h"
#include "sim/costs.h"

namespace distca::sim {

struct SimContext {
  // REQUIRES: ValidateSimOptions(options) is OK.
  explicit SimContext(const SimOptions& options);

  SimOptions options;
  RankCosts costs;
  int stage_ranks = 0;       // G = gpus / (tp * pp)
  int stage_layers = 0;      // layers per pipeline stage
  double stage_params = 0;   // ParameterCount (with replicated K/V projections, RankKvHeads) / pp
  int optimizer_shards = 1;  // G with the distributed optimizer, else 1
  // The memory of a rank that holds this stage's weights, before its
  // activations and buffers: parameters, optimizer sharding and moments.
  MemoryInput StageStateMemory() const {
    MemoryInput mem;
    mem.stage_params = stage_params;
    mem.optimizer_shards = optimizer_shards;
    mem.optimizer_moments = options.optimizer_moments;
    return mem;
  }
  // Some stage's ranks span nodes (its devices do not all sit on one node):
  // the gradient sync runs at the inter-node bandwidth.
  bool stage_inter_node = false;
  // Some stage-to-stage message crosses nodes (every boundary's messages
  // are then costed at the inter-node link: the slowest sets the tick).
  bool pipeline_inter_node = false;
  // Some CP group of c ranks (consecutive ranks of a stage) spans nodes: the
  // baselines' rings run at the inter-node bandwidth (every replica waits for
  // the slowest). Rank r occupies devices [r tp, (r + 1) tp).
  bool CpInterNode(int c) const { return c > 0 && c < int(cp_inter_node_.size()) && cp_inter_node_[c]; }
  // Devices [first, first + count) do not all sit on one node.
  bool SpansNodes(int64_t first, int64_t count) const;
  // Micro-batches each of the G / c data-parallel replicas runs at CP degree
  // c: chunks B c / G (CAD: waves of G / c chunks), or options.micro_batches
  // when set. 0 when c does not divide G or, with chunk micro-batches, G / c
  // does not divide B.
  int MicroBatchesPerReplica(int c) const;
  // CAD: tokens a rank holds per wave, nominal: L / c with chunk
  // micro-batches, B L / (m G) with options.micro_batches = m.
  double CadRankTokens(int c) const;
  // Waves whose activations stage s holds at once in CAD's aligned schedule,
  // of m: min(2 (pp - s) - 1, m), where 1F1B (the baselines) holds
  // min(pp - s, m). Every stage runs in every tick: pp - 1 forward ticks,
  // then forward and backward ticks alternating, then pp - 1 backward ticks
  // (the DistCA artifact's forward_backward_func.py), and backward tick j
  // (stage s: wave j - (pp - 1 - s)) follows forward tick j + pp - 1
  // (stage s: wave j + pp - 1 - s).
  int CadInFlight(int m, int s = 0) const { return std::min(2 * (options.pp - s) - 1, m); }
  // The data-parallel gradient sync that closes an iteration
  // (SimOptions::grad_sync; 0 when off): on every stage at once, a ring
  // reduce-scatter of the float32 gradients (max(4, dtype_bytes) B a
  // parameter) over the stage's G ranks, then a ring all-gather of the
  // updated weights (dtype_bytes) with the distributed optimizer, of the
  // summed gradients without it (the all-reduce's second half); each device
  // moves its 1 / tp of them; inter-node when the stage spans nodes.
  double GradSyncSeconds() const;

 private:
  std::vector<char> cp_inter_node_;  // CpInterNode by c, for the c dividing G
};

// CAD's nominal memory (docs/simulator.md, "Memory"), per device: weights,
// gradients and the optimizer sharded over the stage's G ranks, the
// communication buffer (buffer_copies x comm_budget per device when set,
// else 0: unknown before planning), and the larger of the first stage's activations
// (CadRankTokens(c) tokens per wave, CadInFlight(m) waves in flight) and the last
// stage's (one wave and its logits).
double CadMemoryBytes(const SimContext& ctx, int c, int buffer_copies = 1);
// The linear layout of one CAD plan in a tick: stage_docs[a], the documents
// of the a-th active stage's nano-batch, over that stage's own plan ranks
// [a G, a G + G) (G = ranks_per_stage; over fewer if it has fewer tokens),
// so that pooling the stages' attention never moves a stage's tokens to
// another stage's ranks.
Status StageLayout(const std::vector<std::vector<int64_t>>& stage_docs, int ranks_per_stage,
                   std::vector<PlanDocument>* layout);

// One batch under one strategy. Ranks are numbered stage by stage; a stage's
// dedicated attention servers (if any) follow its G ranks.
struct BatchOutcome {
  double iteration_s = 0;
  std::vector<double> busy_s;        // per rank: seconds of its own work
  std::vector<double> memory_bytes;  // per rank, per device
  std::vector<double> buffer_bytes;  // CAD: the communication buffers memory_bytes counts, per rank, per device
  double bytes_moved = 0;
  double max_buffer_bytes = 0;  // per device
  double tolerance_sum = 0;     // CAD: sum of the plans' eps
  double load_ratio_sum = 0;    // CAD: sum of the plans' busiest load / mean load
  int plans = 0;                // CAD: plans built
  // distca-paper: seconds its ranks spent on dummy work in bubbles, summed
  // over ranks (counted as idle, not in busy_s).
  double bubble_work_s = 0;
  SimBreakdown breakdown;
};

// Appends the gradient sync to a batch's outcome: the iteration is that much
// longer, and every rank that holds weights (not a dedicated server) is busy
// for it. Internal error when busy_s is not pp stages of at least G ranks.
Status AddGradSync(const SimContext& ctx, BatchOutcome* out);

// What a strategy carries from one batch to the next when batches run in
// order: DistCA's buffer, once its artifact enlarges it, stays enlarged for
// the rest of the run.
struct BatchCarry {
  int64_t buffer = 0;  // per rank and exchange (the planner's units); 0: as configured
};

// Strategies. `cp` is the baselines' CP degree c, CAD's c_min (each rank
// holds CadRankTokens(cp) tokens per wave; with micro_batches set, cp is 1
// and unused), 1 for colocated. `carry` (may be null: each batch on its
// own) is read and updated by distca-paper only. REQUIRES:
// ctx.MicroBatchesPerReplica(cp) > 0.
Status SimulateWlbIdeal(const SimContext& ctx, const std::vector<int64_t>& batch, int cp, BatchOutcome* out,
                        BatchCarry* carry = nullptr);
Status SimulateMegatron(const SimContext& ctx, const std::vector<int64_t>& batch, int cp, BatchOutcome* out,
                        BatchCarry* carry = nullptr);
Status SimulateDistcaPaper(const SimContext& ctx, const std::vector<int64_t>& batch, int cp, BatchOutcome* out,
                           BatchCarry* carry = nullptr);
Status SimulateDistca(const SimContext& ctx, const std::vector<int64_t>& batch, int cp, BatchOutcome* out,
                      BatchCarry* carry = nullptr);
Status SimulateColocated(const SimContext& ctx, const std::vector<int64_t>& batch, int cp, BatchOutcome* out,
                         BatchCarry* carry = nullptr);

// --- shared by the context-parallel baselines (baseline.cc) ---

// Seconds of one micro-batch (documents spread over a CP group of c ranks) on
// one stage, forward and backward, and the per-layer parts.
struct CpStageCost {
  double tokens = 0;               // the micro-batch's, over its c ranks
  bool keeps_gathered_kv = false;  // CostCpMicroBatch's argument
  // Per layer, per rank. backward_comm: the dK/dV reduce-scatter, plus the
  // K/V's second pass when they were not kept (ring attention).
  double linear_f = 0, linear_b = 0, attention_f = 0, attention_b = 0, all_gather = 0, backward_comm = 0;
  double forward = 0, backward = 0;  // whole stage, no LM head
  double head_f = 0;                 // LM head forward (last stage)
};
CpStageCost CostCpMicroBatch(const SimContext& ctx, const std::vector<int64_t>& docs, int c, bool keeps_gathered_kv);
// CostCpMicroBatch of every micro-batch.
std::vector<CpStageCost> CostCpMicroBatches(const SimContext& ctx,
                                            const std::vector<std::vector<int64_t>>& micro_batches, int c,
                                            bool keeps_gathered_kv);

// Runs micro-batches (their costs, from CostCpMicroBatches at CP degree c)
// on d = G / c data-parallel replicas, replicas[r] listing the micro-batches
// of replica r in execution order, each spread over the replica's c ranks
// and run through the pp-stage 1F1B pipeline; fills everything in `out`.
// Memory per rank:
// the largest min(pp - s, m) micro-batches' tokens / c in flight and, when
// c > 1, one layer's CP buffers: without keeps_gathered_kv (ring
// attention), its gathered K/V plus their dK/dV partials (2 x tokens x K/V
// bytes of the largest micro-batch); with it (per-document CP with an
// all-gather, whose backward reuses the gathered K/V), the partials alone
// (1 x), and the other c - 1 ranks' K/V of every layer of the micro-batches
// in flight.
Status RunContextParallel(const SimContext& ctx, const std::vector<CpStageCost>& costs,
                          const std::vector<std::vector<int>>& replicas, int c, BatchOutcome* out);

// --- shared by the CAD strategies (cad.cc) ---

// CadVariant::looser_tolerances: the bounds double from 2 x max(eps,
// kLooserToleranceBase); distca tries kDistcaLooserTolerances of them
// (0.1, 0.2 and 0.4 at the default eps).
inline constexpr double kLooserToleranceBase = 0.05;
inline constexpr int kDistcaLooserTolerances = 3;

struct CadVariant {
  // kColocated: distca-train --attention colocated: one plan per wave, no
  // ping-pong, no comm budget, no pooling with idle stages' ranks.
  PlanPolicy policy = PlanPolicy::kDistca;
  // Ranks of stages idle in a tick (pipeline warm-up/drain) run a dummy
  // micro-batch's linear layers, as published.
  bool dummy_bubble_work = false;
  int extra_servers = 0;  // dedicated attention servers per stage
  // Waves balanced by tokens (BalanceWaves) instead of cut in order
  // (SplitIntoWaves): with attention balanced by the planner, a wave's
  // linear work is its tokens, and a pipeline stage can only work on its own
  // wave.
  bool balanced_waves = false;
  // Plan by the hardware profile's measured attention table (the seconds
  // the servers spend, forward + backward) where it has one, instead of by
  // FLOPs.
  bool plan_by_measured_time = false;
  // Without the artifact's buffer loop, other plans for each tick, the
  // plans whose tick the cost model predicts shortest kept: with
  // keep_faster_tick, plan_by_measured_time and a table, plans by FLOPs at
  // eps (a table's plans balance the servers' seconds, but can move more
  // bytes, which shows where the transfers outlast the compute that hides
  // them); and plans by FLOPs at `looser_tolerances` bounds, doubling from
  // 2 x max(eps, kLooserToleranceBase) (a looser bound moves fewer bytes).
  bool keep_faster_tick = false;
  int looser_tolerances = 0;
  // A wave's two ping-pong nano-batches balanced in tokens and attention
  // (SplitNanoBatches); off: its first and second halves in order, as
  // DistCA's artifact splits ping and pong (EXPERIMENT_D2_BALANCE_PING_PONG
  // defaults to 0).
  bool balanced_nano_batches = true;
  // DistCA's NVSHMEM buffer and its artifact's loop over it: the buffer also
  // stages the rows a rank keeps for itself (PlanOptions::
  // budget_counts_local). With one stage each tick's nano-batches are
  // planned together at the artifact's tolerances in order
  // (kDistcaArtifactTolerances) until all fit; when none does, the last plans
  // are kept and the buffer is enlarged to their need, rounded up to whole
  // GiB plus 0.5 GiB per device, for the rest of the batch and, through
  // BatchCarry, the batches after it. With stages each nano-batch on its own
  // (kDistcaArtifactPipelineTolerances); where one finds none the artifact
  // stops, and the simulation returns FailedPrecondition. Memory counts the
  // (largest) buffer kDistcaArtifactBufferCopies times (with a comm budget;
  // without one, the largest per-layer send + receive once). Otherwise
  // the planner raises eps in steps of 0.05 (PlanOptions::comm_budget), a
  // plan that cannot fit is an error, and memory counts the buffers the
  // runtime here allocates for its plans, not the budget.
  bool artifact_buffer = false;
  // The bytes each all-to-all carries per row (PlanModel::wire): the
  // strategy's StrategyWire.
  PlanWire wire = PlanWire::kDistca;
};
// Waves of G / c_min chunks, L / c_min tokens per rank (with micro_batches
// = m: m waves, B L / (m G) tokens per rank).
Status SimulateCad(const SimContext& ctx, const std::vector<int64_t>& batch, int c_min, const CadVariant& variant,
                   BatchOutcome* out, BatchCarry* carry = nullptr);
// The tolerances DistCA's artifact tries, in order, until a tick's plans fit
// its buffer, those not below the requested one (MIN_TOLERANCE_FACTOR): with
// one stage (tests/test_e2e_combined.py) 0-0.09 by 0.01, then 0.1-1.0 by
// 0.1; with pipeline stages (d2/utils/test_util.py,
// create_qkv_dispatch_pipeline_tick) its own list, the requested one added.
inline constexpr std::array<double, 20> kDistcaArtifactTolerances = {
    0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0};
inline constexpr std::array<double, 17> kDistcaArtifactPipelineTolerances = {
    0.05, 0.1, 0.15, 0.2, 0.22, 0.25, 0.28, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0};
// DistCA's artifact allocates its buffer four times per device: two
// dispatchers (one per nano-batch), each with a send and a receive buffer
// of the configured size (csrc/core/fastalltoall.h, ops.py).
inline constexpr int kDistcaArtifactBufferCopies = 4;
// The buffer the artifact allocates when no tolerance fits, per device:
// the plans' need rounded up to whole GiB, plus 0.5 GiB.
double DistcaArtifactEnlargedBuffer(double need_bytes);

// A rank's busy seconds in one step of CAD's per-rank clocks: its useful
// compute runs from the step's start for `compute` seconds, and its own
// transfer, if any, from `lead` seconds later (when the exchange's last
// rank is ready) for `transfer` seconds. Busy is the time either runs (the
// union of the two); waiting for a slower peer's transfer is idle.
inline double StepBusySeconds(double compute, double transfer, double lead) {
  return std::max(compute, std::min(lead, compute) + transfer);
}

// --- packing (packing.cc) ---

// Cuts documents, in order, into consecutive groups of exactly `tokens` tokens
// (a document crossing a boundary is cut; its pieces become documents).
// REQUIRES: the total is a multiple of tokens.
std::vector<std::vector<int64_t>> CutIntoChunks(const std::vector<int64_t>& docs, int64_t tokens);

// Whole documents, in order, into `waves` groups of about `tokens` tokens: a
// document joins the group its middle token falls in. When no document is
// longer than `tokens` every group is non-empty and within tokens / 2 of the
// target at each boundary.
std::vector<std::vector<int64_t>> SplitIntoWaves(const std::vector<int64_t>& docs, int waves, int64_t tokens);

// Whole documents into `waves` groups of as equal token counts as the
// documents allow: longest first, each into the group with the fewest tokens
// (the lowest index among equals); each group keeps the batch's order.
std::vector<std::vector<int64_t>> BalanceWaves(const std::vector<int64_t>& docs, int waves);

// WLB-LLM's variable-length packing: documents longest first (by cost
// (l/b)^2 + l/b, b the breakpoint as for WlbBalance), each into the bin with
// the smallest cost sum among those with room for it under `cap` tokens (the
// bin with the fewest tokens when none has room). Returns `bins` lists of
// lengths.
std::vector<std::vector<int64_t>> WlbPack(const std::vector<int64_t>& docs, int bins, double breakpoint, int64_t cap);

// The DistCA artifact's WLB-LLM balancer (d2/planner/wlb_planner.py,
// balance_data_for_wlbllm, run with alpha_factor 1): documents by length,
// longest first, each into the bin of least workload sum((l/bp)^2 + l/bp)
// if it fits under `cap` tokens, else into the bin with the fewest tokens if
// it fits there, else set aside; the set-aside documents then go to the bin
// of least workload regardless of the cap. Ties: the lowest bin index.
// `breakpoint` is the length at which a document's attention costs as much
// as its linear layers (WLB-LLM's cost model).
std::vector<std::vector<int64_t>> WlbBalance(const std::vector<int64_t>& docs, int bins, int64_t cap,
                                             double breakpoint);

// Longest-processing-time-first with equal counts: items by time descending,
// each to the replica with the smallest total so far among those holding
// fewer than ceil(n / replicas) items (every data-parallel replica runs the
// same number of micro-batches). Returns item indices per replica, each list
// in assignment order.
std::vector<std::vector<int>> AssignLpt(const std::vector<double>& times, int replicas);

}  // namespace distca::sim
