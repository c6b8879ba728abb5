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
  // Balance what the servers spend: the kernel's time per FLOP varies with a
  // task's shape, and a plan even in FLOPs left its busiest server 1.07x
  // the mean in seconds where its FLOPs were 1.05x (docs/simulator.md). But
  // such plans can move more bytes, and where the transfers show, plans by
  // FLOPs, or at a looser bound (fewer bytes still), can make a shorter
  // tick: each tick keeps the shortest of them.
  const bool one_planning = ctx.options.plan_by_flops || ctx.options.plan_by_table;
  v.plan_by_measured_time = !ctx.options.plan_by_flops && !ctx.options.screen_planning;
  v.keep_faster_tick = !one_planning;
  v.looser_tolerances = one_planning || ctx.options.fixed_tolerance ? 0 : kDistcaLooserTolerances;
  return SimulateCad(ctx, batch, cp, v, out);
}

}  // namespace distca::sim
