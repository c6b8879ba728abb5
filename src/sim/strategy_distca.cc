// distca: this project's CAD: the `distca` planner policy (bounded max load,
// exact bytes), ranks in pipeline bubbles serve attention without dummy
// linear work, and optional dedicated attention servers.
#include "sim/strategy.h"

namespace distca::sim {

Status SimulateDistca(const SimContext& ctx, const std::vector<int64_t>& batch, int cp, BatchOutcome* out) {
  CadVariant v;
  v.policy = PlanPolicy::kDistca;
  v.dummy_bubble_work = false;
  v.extra_servers = ctx.options.dedicated_servers;
  return SimulateCad(ctx, batch, cp, v, out);
}

}  // namespace distca::sim
