// distca-paper: CAD as published (DistCA): its wire format, the `paper`
// planner policy over the pooled ranks, eps raised from 0.05 until the 2 GiB
// buffer (which also stages a rank's own rows; enlarged where nothing else
// fits) fits, ping-pong over a wave's halves in order, and pipeline bubbles
// that run dummy micro-batches (real linear work) while serving attention.
#include "sim/strategy.h"

namespace distca::sim {

Status SimulateDistcaPaper(const SimContext& ctx, const std::vector<int64_t>& batch, int cp, BatchOutcome* out,
                           BatchCarry* carry) {
  CadVariant v;
  v.policy = PlanPolicy::kPaper;
  v.dummy_bubble_work = true;
  v.artifact_buffer = true;
  v.wire = *StrategyWire(SimStrategy::kDistcaPaper, ctx.options);
  v.balanced_nano_batches = false;
  return SimulateCad(ctx, batch, cp, v, out, carry);
}

}  // namespace distca::sim
