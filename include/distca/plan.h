// The CA-task planner: from one iteration's documents, decide which rank runs
// the context-independent layers for which tokens (the linear layout), cut core
// attention into CA-tasks, and place the tasks on attention servers so that
// every server does the same attention work while few bytes move.
//
// Pure computation: no communication, no kernels. A plan is data that the
// runtime executes and the simulator costs.
//
// Vocabulary:
//   document  a packed sequence of `length` tokens; positions 0..length-1.
//   piece     document positions [begin, end) held by one rank in the linear
//             layout (Q/K/V/O of those tokens live there).
//   task      query rows [q_begin, q_end) of one document with their causal KV
//             prefix [0, q_end), run on one attention server.
//   server    0..ranks-1 are the ranks themselves ("in-place"); ranks..ranks+
//             dedicated_servers-1 are dedicated servers, which hold no tokens.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "distca/status.h"

namespace distca {

// What the four all-to-alls carry per row (see PlanExchange):
//   kDistca          this project's runtime: the backward dispatch sends Q,
//                    dO, LSE and delta (O stays with its owner), partial
//                    dK/dV return in fp32.
//   kDistcaArtifact  the published DistCA's (its resend-QKV mode, which its
//                    pipeline schedule requires and its later sweeps run
//                    throughout): the backward dispatch sends Q, O, dO and
//                    LSE, dK/dV return in the model's dtype. The simulator
//                    costs distca-paper with it; the runtime sends kDistca.
//   kDistcaArtifactNoResend  the published DistCA without the resend (its
//                    earlier sweeps' default): the forward returns O
//                    without LSE, the backward dispatch sends dO alone (the
//                    server keeps Q, K/V, O and LSE from the forward pass),
//                    dQ and dK/dV return in the model's dtype.
enum class PlanWire { kDistca, kDistcaArtifact, kDistcaArtifactNoResend };
const char* PlanWireName(PlanWire wire);
Status ParsePlanWire(std::string_view name, PlanWire* wire);

// Model shape and wire format, for FLOP and byte counts.
struct PlanModel {
  int q_heads = 32;     // Hq. Default: Llama-3-8B
  int kv_heads = 8;     // Hkv
  int head_dim = 128;   // D
  int dtype_bytes = 2;  // bytes per Q/K/V/O element: 2 for bf16 (GPU), 4 for fp32 (CPU)
  PlanWire wire = PlanWire::kDistca;
};

// Causal (query, key) pairs of query rows [q_begin, q_end) with KV [0, q_end):
// q * q_end - q * (q - 1) / 2 for q = q_end - q_begin.
inline int64_t CausalPairs(int64_t q_begin, int64_t q_end) {
  const int64_t q = q_end - q_begin;
  return q <= 0 ? 0 : q * q_end - q * (q - 1) / 2;
}
// The same for the last q_len rows of a kv_len-long context, in real numbers
// (a measured table's grid coordinates).
inline double CausalPairsReal(double q_len, double kv_len) { return q_len * kv_len - q_len * (q_len - 1) / 2; }

// What a task costs a server. Balancing happens in these units.
class CostModel {
 public:
  // Forward FLOPs, 4 * pairs * D * Hq (DESIGN.md section 3). Default.
  static CostModel Flops(const PlanModel& model);
  // Measured seconds per task from a CSV table with header q_len,kv_len,seconds
  // whose rows form a full grid; costs are interpolated bilinearly and, outside
  // the grid, scaled from the nearest grid point by the ratio of causal pairs.
  // At most kMaxTableRows data rows (measured tables hold about a hundred).
  static Status FromTableCsv(std::string_view csv_text, CostModel* model);
  static constexpr int64_t kMaxTableRows = int64_t{1} << 16;

  // Cost of query rows [q_begin, q_end) of a document with KV prefix [0, q_end).
  // Inline: the planners' searches call it millions of times per plan.
  double TaskCost(int64_t q_begin, int64_t q_end) const {
    if (q_end <= q_begin) return 0.0;
    if (!measured()) return flops_per_pair_ * double(CausalPairs(q_begin, q_end));
    return TableSeconds(double(q_end - q_begin), double(q_end));
  }
  bool measured() const { return !q_grid_.empty(); }
  const char* unit() const { return measured() ? "s" : "FLOP"; }
  // A measured table's grid coordinates, increasing, and its seconds at each
  // grid cell, [q index][kv index] row-major (cells with kv < q copy the
  // (kv, kv) point); all empty for Flops.
  const std::vector<double>& q_grid() const { return q_grid_; }
  const std::vector<double>& kv_grid() const { return kv_grid_; }
  const std::vector<double>& grid_seconds() const { return seconds_; }

 private:
  // A grid axis's lookup: for each binary exponent e from the first
  // point's, start[e - base] is the last index i <= size - 2 with grid[i]
  // <= 2^e (0 if none), so that finding x's cell reads x's exponent and
  // searches only the points within its octave (none beyond one
  // comparison on the measured tables' power-of-two grids) instead of the
  // whole axis: the planners' searches look costs up millions of times per
  // plan.
  struct Octaves {
    int base = 0;
    std::vector<uint32_t> start;
  };
  static Octaves OctavesOf(const std::vector<double>& grid);
  double flops_per_pair_ = 0.0;
  std::vector<double> q_grid_, kv_grid_;  // sorted grid coordinates
  Octaves q_octaves_, kv_octaves_;
  std::vector<double> seconds_;  // [q index][kv index]
  double TableSeconds(double q_len, double kv_len) const;
};

// Longest document the planner accepts: its causal pair count, ~L^2 / 2, must
// fit in int64.
inline constexpr int64_t kMaxDocumentLength = int64_t{1} << 31;
// The most ranks plus dedicated servers one plan may span.
inline constexpr int kMaxPlanServers = 1 << 20;
// The widest q_heads x head_dim a plan's model may have (ModelConfig's width
// limit), so that a batch's bytes stay within 64 bits.
inline constexpr int64_t kMaxPlanWidth = int64_t{1} << 24;

enum class PlanPolicy {
  kColocated,  // every rank serves its own tokens: the baseline
  kPaper,      // DistCA's published greedy, for side-by-side comparison
  kDistca,     // this project's planner (default): bounded max load, exact bytes
};

const char* PlanPolicyName(PlanPolicy policy);
Status ParsePlanPolicy(std::string_view name, PlanPolicy* policy);

struct PlanOptions {
  int ranks = 0;                            // R >= 1
  int dedicated_servers = 0;                // S >= 0. Default: 0 (attention runs in place)
  PlanPolicy policy = PlanPolicy::kDistca;  // Default: kDistca
  double tolerance = 0.05;                  // eps: target max load <= (1 + eps) * mean
  int64_t block = 128;                      // tasks are cut in whole blocks except at pieces' ends
  // Largest bytes (forward + backward) any rank or server may send or receive;
  // 0 = unlimited. When a plan exceeds it, eps is raised in steps of 0.05:
  // one at a time for the first 60 (the first step that fits), then by
  // galloping and bisection to a step that fits whose step below does not
  // (docs/planner.md). Default: 0
  int64_t comm_budget = 0;
  // With budget_per_exchange, comm_budget bounds what a rank sends or
  // receives in each of the four all-to-alls instead (a buffer that holds
  // one exchange at a time, as DistCA's). Default: false
  bool budget_per_exchange = false;
  // With budget_per_exchange, the rows a rank keeps for itself count against
  // the budget too (DistCA's NVSHMEM all-to-all stages them in its buffer:
  // its overflow check sums whole rows of the send-size matrix, the rank's
  // own entry included). Default: false (distca's runtime copies them
  // directly)
  bool budget_counts_local = false;
  // When even the colocated plan (nothing moved) exceeds comm_budget, plan
  // against what that plan needs instead of failing. The plan's own need is
  // stats.traffic.max_exchange_bytes(budget_counts_local) (or max_rank_bytes).
  // Default: false
  bool budget_grows = false;
  PlanModel model;
};

struct PlanPiece {
  int rank = 0;
  int64_t begin = 0;
  int64_t end = 0;
};

struct PlanDocument {
  int64_t length = 0;
  std::vector<PlanPiece> pieces;  // in position order; partition [0, length)
};

// Calls fn(index, piece, lo, hi) for each piece of `doc` that shares
// positions [lo, hi) (not empty) with [a, b), in position order. The pieces
// must be in order and disjoint, as a plan's are (ValidatePlanStructure
// checks it): the first is found by binary search, so a document cut into
// many pieces costs log(pieces) per call.
// The index of the first piece of `doc` that ends after `pos` (pieces.size()
// when none does), by binary search over pieces in order.
inline size_t FirstPieceEndingAfter(const PlanDocument& doc, int64_t pos) {
  const auto& pieces = doc.pieces;
  return size_t(
      std::upper_bound(pieces.begin(), pieces.end(), pos, [](int64_t x, const PlanPiece& p) { return x < p.end; }) -
      pieces.begin());
}

template <class Fn>
void ForEachPieceOverlapping(const PlanDocument& doc, int64_t a, int64_t b, Fn&& fn) {
  const auto& pieces = doc.pieces;
  for (auto it = pieces.begin() + FirstPieceEndingAfter(doc, a); it != pieces.end() && it->begin < b; ++it) {
    const int64_t lo = std::max(a, it->begin), hi = std::min(b, it->end);
    if (lo < hi) fn(size_t(it - pieces.begin()), *it, lo, hi);
  }
}

struct PlanTask {
  int32_t doc = 0;
  int64_t q_begin = 0;
  int64_t q_end = 0;
  int32_t server = 0;
};

// Bytes a plan moves, as the runtime sends them (docs/planner.md):
//   forward   owner -> server: Q rows, and once per (document, server) the K/V
//                              rows of [0, max q_end) the server does not hold
//             server -> owner: O rows and their LSE (fp32)
//   backward  owner -> server: Q, dO, LSE and delta (fp32) rows; K/V as forward
//             server -> owner: dQ rows; partial dK/dV rows in fp32
// (with PlanWire::kDistcaArtifact the backward dispatch carries Q, O, dO and
// LSE rows, and dK/dV return in the model's dtype). Nothing moves for rows
// the server holds itself.
//
// A layer runs four all-to-alls, in this order: the forward dispatch (Q, K/V
// to the servers) and return (O, LSE), the backward dispatch (Q, dO, LSE,
// delta, K/V) and return (dQ, dK/dV).
enum class PlanExchange { kForwardDispatch, kForwardReturn, kBackwardDispatch, kBackwardReturn };
inline constexpr int kPlanExchanges = 4;

struct PlanTraffic {
  std::vector<int64_t> sent;      // per server (index = server id), forward + backward
  std::vector<int64_t> received;  // per server
  // The same bytes by exchange (index: PlanExchange), per server.
  std::array<std::vector<int64_t>, kPlanExchanges> exchange_sent, exchange_received;
  // Per exchange and server, the bytes of the rows that stay on the server
  // (it holds them itself): they never move, but a buffer that stages them
  // too, as DistCA's all-to-all does, must hold them.
  std::array<std::vector<int64_t>, kPlanExchanges> exchange_local;
  int64_t forward_bytes = 0;
  int64_t backward_bytes = 0;
  int64_t total_bytes() const { return forward_bytes + backward_bytes; }
  int64_t max_rank_bytes() const;  // max over servers of max(sent, received)
  // Max over exchanges and servers of max(exchange_sent, exchange_received),
  // with with_local each plus the server's exchange_local.
  int64_t max_exchange_bytes(bool with_local = false) const;
};

struct PlanStats {
  std::vector<double> load;  // per server, in the cost model's unit
  double load_mean = 0.0;    // over all servers
  double load_max = 0.0;
  double load_min = 0.0;
  PlanTraffic traffic;
  int64_t tasks = 0;
  double max_over_mean() const { return load_mean > 0 ? load_max / load_mean : 1.0; }
  double min_over_mean() const { return load_mean > 0 ? load_min / load_mean : 1.0; }
};

struct Plan {
  int ranks = 0;
  int dedicated_servers = 0;
  int64_t block = 128;
  PlanPolicy policy = PlanPolicy::kDistca;
  PlanModel model;
  // eps the plan is held to: the requested one after any comm-budget raises
  // (a distca plan that missed it may come from a retry at another eps;
  // docs/planner.md, step 5).
  double tolerance_used = 0.0;
  // Whether max load <= (1 + tolerance_used) * mean was reached. Only kDistca
  // aims at it; there false says the bound is not achievable at block
  // granularity as far as the planner could establish (docs/planner.md).
  bool bound_met = true;
  std::vector<PlanDocument> documents;
  std::vector<PlanTask> tasks;
  PlanStats stats;  // filled by BuildPlan

  int servers() const { return ranks + dedicated_servers; }
};

// The checks BuildPlan makes of its options (ranks, servers, model shape,
// tolerance, block, budget), for a caller that checks them before reading
// its input.
Status ValidatePlanOptions(const PlanOptions& options);
// Builds the linear layout of `doc_lengths` over options.ranks and plans the
// CA-tasks with options.policy. The result satisfies ValidatePlan.
Status BuildPlan(const std::vector<int64_t>& doc_lengths, const PlanOptions& options, const CostModel& cost,
                 Plan* plan);

// Plans the CA-tasks of documents already laid out over options.ranks: each
// document's pieces partition it, and ranks may hold different numbers of
// tokens, or none (the simulator's pipeline stages, each holding its own
// micro-batch, share one plan's attention servers). BuildPlan is
// LinearLayout followed by this. The result satisfies
// ValidatePlanForLayout (and ValidatePlan when the layout is even).
Status BuildPlanForLayout(std::vector<PlanDocument> documents, const PlanOptions& options, const CostModel& cost,
                          Plan* plan);

// The linear layout alone: documents in order, cut into pieces so that rank r
// holds global tokens [r * T / R, (r + 1) * T / R) (counts differ by at most 1).
Status LinearLayout(const std::vector<int64_t>& doc_lengths, int ranks, std::vector<PlanDocument>* documents);

// Tasks of one document on one server whose query ranges touch, merged into
// one ([a, b) and [b, c) become [a, c): the same causal pairs, and a varlen
// kernel runs them as one range). Returned sorted by document, then q_begin.
std::vector<PlanTask> MergeTouchingTasks(std::vector<PlanTask> tasks);

// Loads and traffic of a plan, recomputed from its documents and tasks.
Status ComputePlanStats(const Plan& plan, const CostModel& cost, PlanStats* stats);

// Checks that a plan is executable and that its statistics are true: pieces
// partition every document and give every rank the same token count within
// one block; the tasks of every document partition [0, length) (so every
// causal pair is computed exactly once) and are cut at block multiples, piece
// boundaries or the document's ends; servers exist; and plan.stats equals
// ComputePlanStats. Returns the first violation found.
Status ValidatePlan(const Plan& plan, const CostModel& cost);
// ValidatePlan without the rule that ranks hold equal token counts: for
// plans of a given layout (BuildPlanForLayout).
Status ValidatePlanForLayout(const Plan& plan, const CostModel& cost);
// What an executor needs of a plan, its statistics aside: the planner's
// limits (ranks, servers, model sizes), pieces that partition every document
// on existing ranks, and tasks that partition every document on existing
// servers at allowed cuts. (ValidatePlanForLayout adds the statistics.)
Status ValidatePlanStructure(const Plan& plan);

// Splits a batch into `count` nano-batches for ping-pong. Documents stay whole
// (a split document's later part would need the earlier part's K/V from the
// other nano-batch); longest first, each goes to the nano-batch where the
// larger of its token share and its attention-work share stays smallest, so
// both tokens and work come out near equal. nano_docs[n] lists the batch
// indices of nano-batch n in batch order. Fails when there are fewer
// documents than nano-batches.
Status SplitNanoBatches(const std::vector<int64_t>& doc_lengths, int count, std::vector<std::vector<int>>* nano_docs);

// The plan file (docs/plan_format.md).
std::string PlanToJson(const Plan& plan);
Status PlanFromJson(std::string_view json, Plan* plan);

}  // namespace distca
