// Internals shared by the planner's files: byte rates and the policies.
#pragma once

#include <cstdint>
#include <vector>

#include "distca/plan.h"

namespace distca::plan {

// Bytes per row of each kind that the runtime moves (docs/planner.md).
struct ByteRates {
  int64_t q_row = 0;      // a Q, O, dO or dQ row: Hq * D * dtype
  int64_t kv_row = 0;     // a K+V row pair: 2 * Hkv * D * dtype
  int64_t stat_row = 0;   // an LSE or delta row: Hq * 4 (fp32)
  int64_t dkv32_row = 0;  // a partial dK+dV row pair in fp32: 2 * Hkv * D * 4

  // Forward + backward bytes for one query row a server does not hold:
  // Q there, O + LSE back; Q + dO + LSE + delta there, dQ back.
  int64_t QueryRowRoundTrip() const { return 5 * q_row + 3 * stat_row; }
  // Forward + backward bytes for one K/V row a server does not hold:
  // K/V there twice, partial dK/dV back.
  int64_t KvRowRoundTrip() const { return 2 * kv_row + dkv32_row; }
};

ByteRates ByteRatesFor(const PlanModel& model);

// The layout part of ValidatePlanForLayout: every document's pieces
// partition it and lie on ranks of the plan.
Status CheckLayout(const Plan& plan);

// A policy fills plan->tasks for the documents already in plan->documents,
// keeping its own running load per server in *loads (cross-checked against a
// from-scratch recomputation by BuildPlan). eps is the tolerance to plan for.
Status PlanColocated(const CostModel& cost, Plan* plan, std::vector<double>* loads);
Status PlanPaper(const CostModel& cost, double eps, Plan* plan, std::vector<double>* loads);
Status PlanDistca(const CostModel& cost, double eps, Plan* plan, std::vector<double>* loads);

}  // namespace distca::plan
