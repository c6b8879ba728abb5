// distca: this project's CAD: the `distca` planner policy (bounded max load,
// exact bytes), ranks in pipeline bubbles serve attention without dummy
// linear work, waves balanced by tokens when there are pipeline stages, and
// optional dedicated attention servers.
#include "sim/strategy.h"

namespace distca::sim {

Status SimulateDistca(const SimContext& ctx, const std::vector<int64_t>& batch, int cp, BatchOutcome* out,
                      BatchCarry* /*carry*/) {
  CadVariant v;
  v.policy = PlanPolicy::kDistca;
  v.wire = *StrategyWire(SimStrategy::kDistca, ctx.options);
  v.dummy_bubble_work = false;
  v.extra_servers = ctx.options.dedicated_servers;
  // With pipeline stages a stage works on its own wave only, so unequal
  // waves leave stages idle: balance them by tokens. With one stage the
  // waves run one after another and their sum is what counts; the batch's
  // order is kept (it keeps more waves of several documents, which
  // ping-pong can split).
  v.balanced_waves = ctx.options.pp > 1;
  return SimulateCad(ctx, batch, cp, v, out);
}

}  // namespace distca::sim
