// Sizing a job: every strategy at every tensor- and pipeline-parallel shape of
// the cluster, and the fastest one that fits in memory (docs/simulator.md,
// "Choosing tp and pp").
#include <fmt/format.h>

#include <algorithm>

#include "distca/sim.h"

namespace distca {

std::vector<std::pair<int, int>> ParallelShapes(const SimOptions& options) {
  std::vector<std::pair<int, int>> shapes;
  // tp x pp <= gpus keeps every product in range.
  for (int tp = 1; tp <= std::min(options.hardware.gpus_per_node, options.gpus); ++tp) {
    if (options.hardware.gpus_per_node % tp != 0) continue;
    for (int pp = 1; pp <= std::min(options.model.num_layers, options.gpus / tp); ++pp) {
      if (options.model.num_layers % pp != 0 || options.gpus % (tp * pp) != 0) continue;
      SimOptions o = options;
      o.tp = tp;
      o.pp = pp;
      if (ValidateSimOptions(o).ok()) shapes.emplace_back(tp, pp);
    }
  }
  return shapes;
}

Status SearchParallelism(const SimOptions& options, const std::vector<std::vector<int64_t>>& batches,
                         const std::vector<SimStrategy>& strategies, const std::vector<std::pair<int, int>>& shapes,
                         std::vector<ShapeChoice>* best, std::vector<ShapeTrial>* trials,
                         const std::function<void(const ShapeTrial&)>& on_shape) {
  if (best == nullptr || trials == nullptr) return Status::InvalidArgument("best and trials must not be null");
  best->assign(strategies.size(), ShapeChoice{});
  trials->clear();
  if (shapes.empty()) return Status::InvalidArgument("no (tp, pp) shape to search");
  // Per strategy: the chosen trial.
  std::vector<int> chosen(strategies.size(), -1);
  for (const auto& [tp, pp] : shapes) {
    ShapeTrial t;
    t.tp = tp;
    t.pp = pp;
    SimOptions o = options;
    o.tp = tp;
    o.pp = pp;
    for (size_t i = 0; i < strategies.size(); ++i) {
      // One strategy at a time, so that one failing leaves the others.
      std::vector<SimResult> one;
      t.status.push_back(Simulate(o, batches, {strategies[i]}, &one));
      t.results.push_back(t.status.back().ok() ? one.front() : SimResult{});
      if (!t.status.back().ok()) continue;
      const SimResult& r = t.results.back();
      if (chosen[i] >= 0) {
        const SimResult& c = (*trials)[chosen[i]].results[i];
        // Fitting beats not fitting; among fitting shapes the fastest wins,
        // among the others the one with the least memory.
        const bool better = r.memory_fits != c.memory_fits ? r.memory_fits
                            : r.memory_fits                ? r.iteration_s < c.iteration_s
                                                           : r.memory_max_bytes < c.memory_max_bytes;
        if (!better) continue;
      }
      chosen[i] = int(trials->size());
    }
    trials->push_back(std::move(t));
    if (on_shape) on_shape(trials->back());
  }
  // A strategy that runs nowhere keeps the reasons; the others their
  // choices (one such strategy used to end the whole search).
  double wlb_ideal_s = 0;
  Status first_failed;
  bool any_ran = false;
  for (size_t i = 0; i < strategies.size(); ++i) {
    if (chosen[i] < 0) {
      std::string why;
      for (const ShapeTrial& t : *trials) why += fmt::format("; tp {} pp {}: {}", t.tp, t.pp, t.status[i].message());
      (*best)[i].result.strategy = strategies[i];
      (*best)[i].status =
          Status::InvalidArgument(fmt::format("{} runs at no (tp, pp) shape{}", SimStrategyName(strategies[i]), why));
      if (first_failed.ok()) first_failed = (*best)[i].status;
      continue;
    }
    any_ran = true;
    const ShapeTrial& t = (*trials)[chosen[i]];
    (*best)[i] = ShapeChoice{t.tp, t.pp, t.results[i], Status::Ok()};
    if (strategies[i] == SimStrategy::kWlbIdeal) wlb_ideal_s = t.results[i].iteration_s;
  }
  if (!any_ran) return first_failed;
  for (ShapeChoice& c : *best)
    if (c.status.ok()) c.result.speedup = wlb_ideal_s > 0 ? wlb_ideal_s / c.result.iteration_s : 0.0;
  return Status::Ok();
}

}  // namespace distca
