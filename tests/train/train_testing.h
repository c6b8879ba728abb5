// Shared by the trainer's tests (local ranks) and its mpirun check: CAD must
// train exactly what colocated attention trains.
#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "distca/train.h"

namespace distca::testing {

// A tiny model on fixed batches with documents that span ranks, so that
// RoPE positions, K/V prefixes and targets cross rank boundaries.
inline TrainOptions TinyTrainOptions(int ranks) {
  TrainOptions t;
  Status s = ModelPreset("tiny", &t.model);
  (void)s;
  t.steps = 3;
  t.tokens_per_rank = 512;
  t.lr = 1e-3f;
  t.min_lr = 1e-4f;
  t.threads = 1;
  const int64_t total = 512 * int64_t{ranks};
  // Three batches: a long document with short ones, many medium ones, and two halves.
  std::vector<int64_t> a = {total - 700, 300, 90, 182, 128}, b, c = {total / 2 + 77, total / 2 - 77};
  for (int64_t done = 0; done < total; done += 160) b.push_back(std::min<int64_t>(160, total - done));
  t.data.batches = {a, b, c};
  return t;
}

// A per-process scratch directory path (only rank 0 writes checkpoints, so
// only rank 0 may create or remove it).
inline std::string ScratchDir(const std::string& name) {
  return (std::filesystem::temp_directory_path() / fmt::format("distca-train-test-{}-{}", getpid(), name)).string();
}

struct TrainResult {
  std::vector<double> losses;  // rank 0
  std::vector<float> params;   // rank 0, after the last step
};

// Trains on `comm` (every rank calls it) and, on rank 0, collects the losses
// and the final weights (through the checkpoint the run writes).
inline Status TrainAndCollect(Comm& comm, TrainOptions t, const std::string& name, TrainResult* out) {
  t.save_dir = ScratchDir(name);
  std::error_code ec;
  if (comm.rank() == 0) std::filesystem::remove_all(t.save_dir, ec);
  out->losses.clear();
  DISTCA_RETURN_IF_ERROR(Train(comm, t, [&](const StepMetrics& m) { out->losses.push_back(m.loss); }));
  if (comm.rank() == 0) {
    SafetensorsFile f;
    DISTCA_RETURN_IF_ERROR(ReadSafetensors(t.save_dir + fmt::format("/step-{:08d}/model.safetensors", t.steps), &f));
    out->params.clear();
    for (const auto& [name_, e] : f.tensors) out->params.insert(out->params.end(), e.values.begin(), e.values.end());
  }
  if (comm.rank() == 0) std::filesystem::remove_all(t.save_dir, ec);
  return Status::Ok();
}

// Losses equal within 1e-5 relative at every step (the bar: the
// same sums in a different order differ by ~1e-7 relative). Parameters: the
// runs differ only in the order of fp32 sums, so gradients agree to ~1e-6
// relative; AdamW then moves each weight by about lr per step, and where a
// gradient is near zero its normalized update m / sqrt(v) amplifies that
// difference. Measured (tiny model, 3 steps at lr 1e-3, 2 ranks): largest
// difference 2e-6 to 1e-5, RMS 8e-9 to 3e-8. The bounds, 5% of lr x steps
// for the largest and 0.1% for the RMS, leave 15x and 100x of that for other
// machines' rounding; an error in the math moves whole tensors by ~lr per
// step (one 64-weight norm tensor off by that raises the RMS to about 1e-4).
inline Status CompareRuns(const TrainResult& ref, const TrainResult& got, const TrainOptions& t,
                          const std::string& what) {
  if (ref.losses.size() != got.losses.size())
    return Status::Internal(fmt::format("{}: {} vs {} steps", what, ref.losses.size(), got.losses.size()));
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    const double rel = std::abs(ref.losses[i] - got.losses[i]) / std::abs(ref.losses[i]);
    if (!(rel <= 1e-5))
      return Status::Internal(fmt::format("{}: step {} loss {} vs colocated {} (relative {:.3g})", what, i + 1,
                                          got.losses[i], ref.losses[i], rel));
  }
  if (ref.params.size() != got.params.size()) return Status::Internal(what + ": parameter counts differ");
  double max_diff = 0, sq = 0;
  for (size_t i = 0; i < ref.params.size(); ++i) {
    const double d = std::abs(double(ref.params[i]) - double(got.params[i]));
    max_diff = std::max(max_diff, d);
    sq += d * d;
  }
  const double rms = std::sqrt(sq / double(std::max<size_t>(1, ref.params.size())));
  const double bound = double(t.lr) * double(t.steps);
  if (!(max_diff <= 0.05 * bound) || !(rms <= 1e-3 * bound))
    return Status::Internal(
        fmt::format("{}: parameters differ from colocated: max {:.3g} (bound {:.3g}), rms {:.3g} "
                    "(bound {:.3g})",
                    what, max_diff, 0.05 * bound, rms, 1e-3 * bound));
  return Status::Ok();
}

// Colocated vs CAD for every policy (and both backward modes, ping-pong on
// and off, a dedicated server when there are ranks to spare).
inline Status CheckCadEqualsColocated(Comm& comm) {
  const int data_ranks = comm.size();
  TrainOptions base = TinyTrainOptions(data_ranks);
  TrainResult ref;
  base.attention = AttentionMode::kColocated;
  DISTCA_RETURN_IF_ERROR(TrainAndCollect(comm, base, "colocated", &ref));
  struct Variant {
    PlanPolicy policy;
    BackwardMode backward;
    bool ping_pong;
  };
  const Variant variants[] = {{PlanPolicy::kColocated, BackwardMode::kStateless, true},
                              {PlanPolicy::kPaper, BackwardMode::kStateless, true},
                              {PlanPolicy::kDistca, BackwardMode::kStateless, true},
                              {PlanPolicy::kDistca, BackwardMode::kCached, false}};
  for (const Variant& v : variants) {
    TrainOptions t = base;
    t.attention = AttentionMode::kCad;
    t.policy = v.policy;
    t.backward = v.backward;
    t.ping_pong = v.ping_pong;
    const std::string what =
        fmt::format("cad {} {} ping-pong {}", PlanPolicyName(v.policy),
                    v.backward == BackwardMode::kCached ? "cached" : "stateless", v.ping_pong ? "on" : "off");
    TrainResult got;
    DISTCA_RETURN_IF_ERROR(TrainAndCollect(comm, t, "cad", &got).WithContext(what));
    if (comm.rank() == 0) DISTCA_RETURN_IF_ERROR(CompareRuns(ref, got, t, what));
  }
  return Status::Ok();
}

}  // namespace distca::testing
