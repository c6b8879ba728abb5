// Sizing a job: every strategy at every tensor- and pipeline-parallel shape of
// the cluster, and the fastest one that fits in memory (docs/simulator.md,
// "Choosing tp and pp").
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

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

namespace {

// Fitting beats not fitting; among fitting results the faster wins, among
// the others the one with the least memory.
bool Better(const SimResult& r, const SimResult& than) {
  if (r.memory_fits != than.memory_fits) return r.memory_fits;
  return r.memory_fits ? r.iteration_s < than.iteration_s : r.memory_max_bytes < than.memory_max_bytes;
}

// The trial (index into trials) with strategy i's best result; -1 if it ran
// at none.
int Chosen(const std::vector<ShapeTrial>& trials, size_t i) {
  int chosen = -1;
  for (size_t k = 0; k < trials.size(); ++k)
    if (trials[k].status[i].ok() && (chosen < 0 || Better(trials[k].results[i], trials[chosen].results[i])))
      chosen = int(k);
  return chosen;
}

}  // namespace

Status SearchParallelism(const SimOptions& options, const std::vector<std::vector<int64_t>>& batches,
                         const std::vector<SimStrategy>& strategies, const std::vector<std::pair<int, int>>& shapes,
                         std::vector<ShapeChoice>* best, std::vector<ShapeTrial>* trials,
                         const std::function<void(const ShapeTrial&)>& on_shape) {
  if (best == nullptr || trials == nullptr) return Status::InvalidArgument("best and trials must not be null");
  best->assign(strategies.size(), ShapeChoice{});
  trials->clear();
  if (shapes.empty()) return Status::InvalidArgument("no (tp, pp) shape to search");
  if (std::isnan(options.search_screen_margin)) return Status::InvalidArgument("the search's screen margin is NaN");
  // distca, whose planning by the table costs several times its planning
  // by FLOPs, is screened: every shape planned as by default but without
  // the table first (SimOptions::screen_planning), then in full where the
  // screen could be the fastest. The full run's plans for a tick are the
  // screen's and the table's, so it is at most the screen's and the margin
  // bounds what the table's plans can gain. Not with a profile that has no
  // table for the model, nor with one planning alone (plan_by_flops,
  // plan_by_table), which can be slower than the screen.
  const bool has_table = std::any_of(options.hardware.attention_tables.begin(), options.hardware.attention_tables.end(),
                                     [&](const AttentionTable& t) { return t.Serves(options.model.head_dim()); });
  std::vector<bool> screen(strategies.size(), false);
  for (size_t i = 0; i < strategies.size(); ++i)
    screen[i] = strategies[i] == SimStrategy::kDistca && has_table && !options.plan_by_flops &&
                !options.plan_by_table && std::isfinite(options.search_screen_margin);
  // Simulates strategy i at trial t's shape, without the table if `screened`.
  const auto simulate = [&](ShapeTrial& t, size_t i, bool screened) {
    SimOptions o = options;
    o.tp = t.tp;
    o.pp = t.pp;
    o.screen_planning = screened;
    std::vector<SimResult> one;  // one strategy at a time, so that one failing leaves the others
    t.status[i] = Simulate(o, batches, {strategies[i]}, &one);
    t.results[i] = t.status[i].ok() ? one.front() : SimResult{};
    t.screened[i] = screened && t.status[i].ok();
  };
  const bool any_screen = std::find(screen.begin(), screen.end(), true) != screen.end();
  for (const auto& [tp, pp] : shapes) {
    ShapeTrial t;
    t.tp = tp;
    t.pp = pp;
    t.status.assign(strategies.size(), Status::Ok());
    t.results.assign(strategies.size(), SimResult{});
    t.screened.assign(strategies.size(), false);
    for (size_t i = 0; i < strategies.size(); ++i) simulate(t, i, screen[i]);
    trials->push_back(std::move(t));
    if (on_shape && !any_screen) on_shape(trials->back());
  }
  if (any_screen) {
    // Per screened strategy, the fastest fitting screen; with none fitting,
    // every shape is simulated in full.
    std::vector<double> bar(strategies.size(), 0.0);
    for (size_t i = 0; i < strategies.size(); ++i) {
      if (!screen[i]) continue;
      const int c = Chosen(*trials, i);
      bar[i] = c >= 0 && (*trials)[c].results[i].memory_fits
                   ? (1 + options.search_screen_margin) * (*trials)[c].results[i].iteration_s
                   : std::numeric_limits<double>::infinity();
    }
    for (ShapeTrial& t : *trials) {
      for (size_t i = 0; i < strategies.size(); ++i)
        if (t.screened[i] && t.results[i].iteration_s <= bar[i]) simulate(t, i, false);
      if (on_shape) on_shape(t);
    }
    // A screen kept can still be the best (the full simulation slower than
    // the screen's by more than the margin): then that shape is simulated
    // in full too, and reported again.
    for (size_t i = 0; i < strategies.size(); ++i) {
      for (int c = Chosen(*trials, i); c >= 0 && (*trials)[c].screened[i]; c = Chosen(*trials, i)) {
        simulate((*trials)[c], i, false);
        if (on_shape) on_shape((*trials)[c]);
      }
    }
  }
  std::vector<int> chosen(strategies.size(), -1);
  for (size_t i = 0; i < strategies.size(); ++i) chosen[i] = Chosen(*trials, i);
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
