// colocated: what `distca-train --attention colocated` runs. Every wave of G
// chunks (one micro-batch per rank, CP 1) is laid out over the G ranks with
// the planner's linear layout and planned with the colocated policy: each
// rank serves the attention of its own tokens, and a document cut between
// ranks makes the later rank fetch the K/V prefix it lacks (that traffic is
// in the plan's stats, exposed: no ping-pong).
#include "sim/strategy.h"

namespace distca::sim {

Status SimulateColocated(const SimContext& ctx, const std::vector<int64_t>& batch, int cp, BatchOutcome* out,
                         BatchCarry* /*carry*/) {
  CadVariant v;
  v.policy = PlanPolicy::kColocated;
  v.wire = *StrategyWire(SimStrategy::kColocated, ctx.options);
  return SimulateCad(ctx, batch, cp, v, out);
}

}  // namespace distca::sim
