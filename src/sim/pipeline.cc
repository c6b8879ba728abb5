#include "sim/pipeline.h"

#include <algorithm>
#include <cassert>

namespace distca::sim {

PipelineRun Simulate1F1B(const std::vector<MicroBatchTimes>& mbs) {
  PipelineRun run;
  if (mbs.empty()) return run;
  const int stages = static_cast<int>(mbs[0].forward.size());
  const int m = static_cast<int>(mbs.size());
  run.busy.assign(stages, 0.0);

  // Per stage, the 1F1B order: (is_backward, micro-batch).
  std::vector<std::vector<std::pair<bool, int>>> order(stages);
  for (int s = 0; s < stages; ++s) {
    const int warmup = std::min(stages - 1 - s, m);
    for (int i = 0; i < warmup; ++i) order[s].push_back({false, i});
    for (int i = 0; i < m - warmup; ++i) {
      order[s].push_back({false, warmup + i});
      order[s].push_back({true, i});
    }
    for (int i = m - warmup; i < m; ++i) order[s].push_back({true, i});
  }
  constexpr double kPending = -1.0;
  std::vector<std::vector<double>> f_end(stages, std::vector<double>(m, kPending));
  std::vector<std::vector<double>> b_end = f_end;
  std::vector<size_t> next(stages, 0);
  std::vector<double> free_at(stages, 0.0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < stages; ++s) {
      while (next[s] < order[s].size()) {
        const auto [backward, i] = order[s][next[s]];
        double ready = free_at[s];
        if (!backward && s > 0) {
          if (f_end[s - 1][i] == kPending) break;
          ready = std::max(ready, f_end[s - 1][i] + mbs[i].p2p);
        }
        if (backward && s < stages - 1) {
          if (b_end[s + 1][i] == kPending) break;
          ready = std::max(ready, b_end[s + 1][i] + mbs[i].p2p);
        }
        const double t = backward ? mbs[i].backward[s] : mbs[i].forward[s];
        free_at[s] = ready + t;
        run.busy[s] += t;
        (backward ? b_end : f_end)[s][i] = free_at[s];
        ++next[s];
        progress = true;
      }
    }
  }
  for (int s = 0; s < stages; ++s) {
    assert(next[s] == order[s].size() && "1F1B cannot deadlock");
    run.makespan = std::max(run.makespan, free_at[s]);
  }
  return run;
}

}  // namespace distca::sim
