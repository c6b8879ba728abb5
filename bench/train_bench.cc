#include "bench/train_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "bench/bench_ranks.h"
#include "bench/median.h"
#include "distca/train.h"

namespace distca::bench {
namespace {

// Colocated attention work per rank, max / min (FLOPs of the colocated plan).
Status ColocatedWorkRatio(const std::vector<int64_t>& lengths, int ranks, const ModelConfig& m, double* ratio) {
  PlanOptions po;
  po.ranks = ranks;
  po.policy = PlanPolicy::kColocated;
  po.model = {m.q_heads, m.kv_heads, m.head_dim(), 4};
  Plan plan;
  DISTCA_RETURN_IF_ERROR(BuildPlan(lengths, po, CostModel::Flops(po.model), &plan));
  *ratio = plan.stats.load_min > 0 ? plan.stats.load_max / plan.stats.load_min : 1e9;
  return Status::Ok();
}

struct Run {
  std::vector<StepMetrics> steps;  // after each run's warm-up step, over all repetitions
  double MedianStep() const { return MedianStepSeconds(steps); }
  // Median over steps of the mean over ranks of busy time.
  double MedianBusy() const {
    std::vector<double> v;
    for (const auto& m : steps) {
      double s = 0;
      for (const auto& r : m.ranks) s += r.busy_s / double(m.ranks.size());
      v.push_back(s);
    }
    return Median(v);
  }
  double RssMaxOverMin() const {
    double worst = 1.0;
    for (const auto& m : steps) {
      int64_t lo = INT64_MAX, hi = 0;
      for (const auto& r : m.ranks) {
        lo = std::min(lo, r.peak_rss_bytes);
        hi = std::max(hi, r.peak_rss_bytes);
      }
      if (lo > 0) worst = std::max(worst, double(hi) / double(lo));
    }
    return worst;
  }
  int64_t MaxRss() const {
    int64_t hi = 0;
    for (const auto& m : steps)
      for (const auto& r : m.ranks) hi = std::max(hi, r.peak_rss_bytes);
    return hi;
  }
};

}  // namespace

std::vector<TrainMix> TrainMixes(int ranks, int64_t t) {
  auto repeat = [](std::vector<int64_t>* v, int64_t len, int64_t total) {
    for (int64_t done = 0; done < total; done += len) v->push_back(std::min(len, total - done));
  };
  // In the linear layout documents fill rank 0 first, so where the long
  // documents sit decides which rank is slow.
  std::vector<TrainMix> mixes;
  TrainMix head{"long-first", {t}};  // rank 0: one long document; the rest: short ones
  repeat(&head.lengths, 128, t * (ranks - 1));
  mixes.push_back(head);
  TrainMix tail{"long-last", {}};  // the last rank holds the long document
  repeat(&tail.lengths, 256, t * (ranks - 1));
  tail.lengths.push_back(t);
  mixes.push_back(tail);
  TrainMix graded{"graded", {}};  // rank r: documents of t / 2^(r+...) tokens, quadratic work falls with r
  for (int r = 0; r < ranks; ++r) {
    if (r == 0) {
      graded.lengths.push_back(t * 3 / 4);
      repeat(&graded.lengths, t / 16, t / 4);
    } else {
      // t / 2^(r + 2), shifted in 64 bits (an int's 8 << (r - 1) overflowed
      // at rank 29, from 30 ranks on, and divided by zero from 31).
      const int64_t len = r + 2 < 63 ? t >> (r + 2) : 0;
      repeat(&graded.lengths, std::max<int64_t>(128, len), t);
    }
  }
  mixes.push_back(graded);
  TrainMix uniform{"uniform", {}};
  repeat(&uniform.lengths, 512, t * ranks);
  mixes.push_back(uniform);
  return mixes;
}

Status TimeMix(Comm& comm, const TrainOptions& base, const TrainMix& mix, int reps, ModeSteps* steps) {
  // Alternating which mode runs first keeps either from always meeting a
  // cold or a warm machine; medians damp the noise of shared cores.
  for (int rep = 0; rep < reps; ++rep)
    for (int mode : {rep % 2, 1 - rep % 2}) {
      TrainOptions t = base;
      t.attention = mode == 0 ? AttentionMode::kColocated : AttentionMode::kCad;
      t.data.batches = {mix.lengths};
      DISTCA_RETURN_IF_ERROR(Train(comm, t, [&](const StepMetrics& m) {
                               if (m.step > 1) (*steps)[mode].push_back(m);
                             }).WithContext(fmt::format("mix {}, {}", mix.name, AttentionModeName(t.attention))));
    }
  return Status::Ok();
}

double MedianStepSeconds(const std::vector<StepMetrics>& steps) {
  std::vector<double> v;
  for (const auto& m : steps) v.push_back(m.step_s);
  return Median(v);
}

bool RunTrainBench(const TrainBenchOptions& o, std::string* error) {
  CommOptions co;
  co.local_ranks = o.local_ranks;
  const int64_t tokens_per_rank = o.short_mode ? 2048 : 8192;
  const int steps = o.short_mode ? 2 : 3;  // the first of each run is a warm-up, not counted
  const int reps = o.short_mode ? 1 : 3;
  Status s = RunOnRanks(co, [&](Comm& comm) -> Status {
    const bool root = comm.rank() == 0;
    // One rank has nothing to balance: every mix would be one rank's work.
    if (comm.size() < 2)
      return Status::InvalidArgument(
          fmt::format("compares colocated and CAD attention across ranks: needs at least 2, got {}", comm.size()));
    if (root) fmt::print(stderr, "{}", OversubscribedWarning(comm, "distca-bench train"));
    TrainOptions base;
    DISTCA_RETURN_IF_ERROR(ModelPreset(o.short_mode ? "tiny" : "small", &base.model));
    base.steps = steps;
    base.threads = 1;
    base.tokens_per_rank = tokens_per_rank;
    if (root && !o.json)
      fmt::print(
          "distca-bench train: {} backend, {} ranks, model {} ({} layers, hidden {}, heads {}x{}), {} tokens "
          "per rank, median of {} runs x {} steps after a warm-up step\n\n{:>11} {:>9} {:>10} {:>8} {:>8} {:>10} {:>9} "
          "{:>10} {:>10}\n",
          comm.backend(), comm.size(), base.model.name, base.model.num_layers, base.model.hidden, base.model.q_heads,
          base.model.kv_heads, tokens_per_rank, reps, steps - 1, "mix", "work x", "colocated", "CAD", "ideal",
          "CAD/ideal", "speedup", "RSS max/min", "peak RSS");
    for (const TrainMix& mix : TrainMixes(comm.size(), tokens_per_rank)) {
      double work_ratio = 1.0;
      DISTCA_RETURN_IF_ERROR(ColocatedWorkRatio(mix.lengths, comm.size(), base.model, &work_ratio));
      ModeSteps timed;
      DISTCA_RETURN_IF_ERROR(TimeMix(comm, base, mix, reps, &timed));
      const Run runs[2] = {{std::move(timed[0])}, {std::move(timed[1])}};
      if (!root) continue;
      const double colocated = runs[0].MedianStep(), cad = runs[1].MedianStep(), ideal = runs[0].MedianBusy();
      if (o.json) {
        const nlohmann::json j = {{"backend", comm.backend()},
                                  {"ranks", comm.size()},
                                  {"model", base.model.name},
                                  {"tokens_per_rank", tokens_per_rank},
                                  {"mix", mix.name},
                                  {"colocated_work_max_over_min", work_ratio},
                                  {"step_s_colocated", colocated},
                                  {"step_s_cad", cad},
                                  {"step_s_ideal", ideal},
                                  {"cad_over_ideal", cad / ideal},
                                  {"speedup", colocated / cad},
                                  {"cad_rss_max_over_min", runs[1].RssMaxOverMin()},
                                  {"cad_peak_rss_bytes", runs[1].MaxRss()},
                                  {"colocated_peak_rss_bytes", runs[0].MaxRss()}};
        fmt::print("{}\n", j.dump());
      } else {
        fmt::print("{:>11} {:>8.1f}x {:>9.3f}s {:>7.3f}s {:>7.3f}s {:>10.3f} {:>8.2f}x {:>10.3f} {:>8.0f}MB\n",
                   mix.name, work_ratio, colocated, cad, ideal, cad / ideal, colocated / cad, runs[1].RssMaxOverMin(),
                   double(runs[1].MaxRss()) / (1 << 20));
      }
      std::fflush(stdout);
    }
    if (root && !o.json)
      fmt::print(
          "\nwork x: colocated attention work, max rank / min rank. ideal: mean over ranks of colocated busy "
          "(thread CPU) time; times are medians.\nRSS: per-step process peaks; with the local backend all ranks share "
          "one "
          "process.\n");
    return Status::Ok();
  });
  if (!s.ok()) *error = s.ToString();
  return s.ok();
}

}  // namespace distca::bench
