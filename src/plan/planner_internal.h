// Internals shared by the planner's files: byte rates and the policies.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <vector>

#include "distca/plan.h"

namespace distca::plan {

// Bytes per query row and per K/V row that each exchange (index:
// PlanExchange) moves for a row its server does not hold, in the model's
// wire format (docs/planner.md).
struct ByteRates {
  std::array<int64_t, kPlanExchanges> q{};   // per query row
  std::array<int64_t, kPlanExchanges> kv{};  // per K/V row (K and V), once per (document, server)

  // Forward + backward bytes for one query row a server does not hold.
  int64_t QueryRowRoundTrip() const { return q[0] + q[1] + q[2] + q[3]; }
  // Forward + backward bytes for one K/V row a server does not hold.
  int64_t KvRowRoundTrip() const { return kv[0] + kv[1] + kv[2] + kv[3]; }
};

ByteRates ByteRatesFor(const PlanModel& model);

// The limits every plan keeps, however it was made (planned or read from a
// file): ranks >= 1, dedicated servers >= 0, at most kMaxPlanServers in
// all; positive model sizes, q_heads a multiple of kv_heads, q_heads x
// head_dim at most kMaxPlanWidth and elements of at most 8 bytes (so that
// a row range's bytes fit in 64 bits).
Status CheckPlanShape(int ranks, int dedicated_servers, const PlanModel& model);

// The layout part of ValidatePlanForLayout: every document's pieces
// partition it and lie on ranks of the plan.
Status CheckLayout(const Plan& plan);

// Each server's load under `cost`: its tasks' costs summed in task order.
std::vector<double> TaskLoads(const Plan& plan, const CostModel& cost);

// A policy fills plan->tasks for the documents already in plan->documents,
// keeping its own running load per server in *loads (cross-checked against a
// from-scratch recomputation by BuildPlan). eps is the tolerance to plan for.
Status PlanColocated(const CostModel& cost, Plan* plan, std::vector<double>* loads);
Status PlanPaper(const CostModel& cost, double eps, Plan* plan, std::vector<double>* loads);
// How the paper policy finds each step's best item; every way gives the same
// plan. kFull reads every item at every step, as published (time quadratic
// in the items; the reference for tests); kIndexed reads each donor's items
// by the least score each can have, up to the first that cannot win; kAuto
// (PlanPaper's) the full scan for few items, else the index.
enum class PaperScan { kAuto, kFull, kIndexed };
Status PlanPaper(const CostModel& cost, double eps, PaperScan scan, Plan* plan, std::vector<double>* loads);
Status PlanDistca(const CostModel& cost, double eps, Plan* plan, std::vector<double>* loads);
// How the distca policy's relocation pass reads the servers that run tasks
// of a chunk's document; both ways give the same plan. kScan reads every one
// for every chunk (time quadratic in servers for a document spread over
// many; the reference for tests); kAuto (PlanDistca's) reads them while
// there are few, else an index of them (by room and K/V reach) that reads
// only those that can be the best.
enum class DistcaRead { kAuto, kScan };
Status PlanDistca(const CostModel& cost, double eps, DistcaRead read, Plan* plan, std::vector<double>* loads);
// PlanDistca without its fallback: the greedy's own plan, bound_met saying
// whether the greedy alone met the bound (for tests of the greedy).
Status PlanDistcaGreedyOnly(const CostModel& cost, double eps, Plan* plan, std::vector<double>* loads);

// The distca greedy's choice among a donor's candidate moves: of the items
// whose score (bytes per unit of cost moved) is within `slack` (relative) of
// the lowest, the one of largest size (cost moved), the first of equals; null
// when there are none. The slack is measured from the lowest score, not from
// the item chosen so far, so that a chain of near-equals cannot drift from it.
template <class T, class ScoreFn, class SizeFn>
const T* LargestNearCheapest(const std::vector<T>& items, double slack, ScoreFn score, SizeFn size) {
  double least = std::numeric_limits<double>::infinity();
  for (const T& item : items) least = std::min(least, score(item));
  const T* best = nullptr;
  for (const T& item : items)
    if (score(item) <= least * (1 + slack) && (best == nullptr || size(item) > size(*best))) best = &item;
  return best;
}

}  // namespace distca::plan
