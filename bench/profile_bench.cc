#include "bench/profile_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "bench/attention_bench.h"
#include "bench/bench_ranks.h"
#include "bench/gemm_rate.h"
#include "bench/median.h"
#include "bench/train_bench.h"
#include "common/excerpt.h"
#include "common/file_util.h"
#include "common/memory_info.h"
#include "common/timer.h"
#include "distca/comm.h"
#include "distca/plan.h"
#include "distca/sim.h"

namespace distca::bench {
namespace {

// Half the median round trip of `bytes` between ranks 0 and 1 (rank 0's
// clock); other ranks return at once.
Status HalfRoundTrip(Comm& comm, int64_t bytes, int reps, double* seconds) {
  std::vector<char> buf(size_t(bytes), 1);
  std::vector<double> times;
  for (int i = 0; i < reps + 1; ++i) {  // the first round trip warms up the path
    WallTimer t;
    if (comm.rank() == 0) {
      DISTCA_RETURN_IF_ERROR(comm.Send(buf.data(), bytes, 1, 7));
      DISTCA_RETURN_IF_ERROR(comm.Recv(buf.data(), bytes, 1, 7));
    } else if (comm.rank() == 1) {
      DISTCA_RETURN_IF_ERROR(comm.Recv(buf.data(), bytes, 0, 7));
      DISTCA_RETURN_IF_ERROR(comm.Send(buf.data(), bytes, 0, 7));
    }
    if (i > 0) times.push_back(t.Seconds() / 2);
  }
  *seconds = times.empty() ? 0.0 : Median(times);
  return Status::Ok();
}

// Rank 0 runs `measure` alone while the other ranks sleep (an MPI barrier
// would spin and take a core, or a hyperthread's share of one, from it). A
// failure on rank 0 is returned there and aborts the job (RunOnRanks), which
// also ends the others' wait, so the job reports rank 0's own error. Thread
// ranks wait in a barrier without the message timeout (a condition variable:
// no core taken), however long the measurement; MPI has no timeout.
Status AloneOnRankZero(Comm& comm, const std::function<Status()>& measure) {
  if (comm.rank() == 0) DISTCA_RETURN_IF_ERROR(measure());
  if (std::string_view(comm.backend()) == "local") return comm.BarrierAfterLongWork();
  int32_t done_flag = 1;
  if (comm.rank() == 0) {
    for (int r = 1; r < comm.size(); ++r) DISTCA_RETURN_IF_ERROR(comm.Send(&done_flag, sizeof done_flag, r, 8));
    return Status::Ok();
  }
  CommRequest done = comm.IRecv(&done_flag, sizeof done_flag, 0, 8);
  while (!done.Test()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return done.Wait();
}

struct MixResult {
  std::string name;
  double colocated_s = 0, cad_s = 0;                      // measured medians
  double colocated_predicted_s = 0, cad_predicted_s = 0;  // the fitted profile's
};

}  // namespace

bool RunProfileBench(const ProfileBenchOptions& o, std::string* error) {
  // Everything that can be checked before minutes of measurement.
  const std::filesystem::path out(o.out);
  if (o.out.empty() || !out.has_filename() || out.filename() == "." || out.filename() == "..") {
    *error = fmt::format("--out must name a JSON file, got '{}'", o.out);
    return false;
  }
  // The profile is read back when written, and its tables go beside it
  // under its stem's name: a device or a pipe cannot be (/dev/stdout into a
  // pipe hung, reading back its own output), and a name JSON cannot hold
  // would name tables that do not exist.
  std::error_code ec;
  if (const auto st = std::filesystem::status(out, ec);
      !ec && std::filesystem::exists(st) && !std::filesystem::is_regular_file(st)) {
    *error = fmt::format(
        "--out must be a regular file (the profile is read back, its tables written beside it): "
        "'{}' is not one",
        o.out);
    return false;
  }
  if (!IsWellFormedUtf8(out.filename().string())) {
    *error = fmt::format("--out: the file name '{}' is not UTF-8, which the profile (JSON) needs to name its tables",
                         Excerpt(out.filename().string()));
    return false;
  }
  // The local backend's ranks are known now (MPI's once started).
  if (ChosenBackend(CommOptions{}) == CommOptions::Backend::kLocal && o.local_ranks < 2) {
    *error = TooFewRanks(o.local_ranks);
    return false;
  }
  if (o.reps < 1 || o.reps > kMaxProfileReps) {
    *error = fmt::format("--reps must be in [1, {}], got {}", kMaxProfileReps, o.reps);
    return false;
  }
  ModelConfig model;
  if (const Status s = ModelPreset(o.short_mode ? "tiny" : o.model, &model); !s.ok()) {
    *error = s.ToString();
    return false;
  }
  const std::string stem = out.stem().string();
  const std::string table_file = stem + "-attention.csv";
  const std::filesystem::path table_path = out.parent_path() / table_file;
  const std::string forward_table_file = ForwardTablePath(table_file);
  const std::filesystem::path forward_table_path = out.parent_path() / forward_table_file;
  if (!out.parent_path().empty()) {
    std::filesystem::create_directories(out.parent_path(), ec);
    if (ec) {
      *error = fmt::format("cannot create '{}': {}", out.parent_path().string(), ec.message());
      return false;
    }
  }
  // The three files it writes, before minutes of measuring (a directory
  // there was found only at the end, the tables already written).
  for (const std::filesystem::path& path : {out, table_path, forward_table_path})
    if (const Status s = CheckOutputPath(path.string()); !s.ok()) {
      *error = s.ToString();
      return false;
    }
  const int reps = o.short_mode ? 1 : o.reps;
  const int64_t tokens_per_rank = o.short_mode ? 4096 : 8192;
  CommOptions co;
  co.local_ranks = o.local_ranks;
  Status s = RunOnRanks(co, [&](Comm& comm) -> Status {
    const bool root = comm.rank() == 0;
    if (comm.size() < 2) return Status::InvalidArgument(TooFewRanks(comm.size()));
    // The profile's devices are one core each.
    if (root) fmt::print(stderr, "{}", OversubscribedWarning(comm, "distca-bench profile"));
    TrainOptions base;
    base.model = model;
    base.steps = 3;  // the first of each run is a warm-up
    base.threads = 1;
    base.tokens_per_rank = tokens_per_rank;
    const ModelConfig& m = base.model;
    // A model or batch that cannot fit is refused now, not after minutes.
    DISTCA_RETURN_IF_ERROR(CheckTrainOptions(comm, base));

    // 1. Rank 0 alone: the GEMM peak and the CA engine's table, one thread.
    HardwareProfile p;
    AttentionTable table{table_file, m.q_heads, m.kv_heads, m.head_dim(), 1.0, "", forward_table_file, ""};
    DISTCA_RETURN_IF_ERROR(AloneOnRankZero(comm, [&]() -> Status {
      // The peak is the best of a measurement before the table and one
      // after: on a shared machine one of them can run slow, and a slow peak
      // makes the table's fast entries look faster than the device (the
      // short mode's 0.1 s measurement failed the profile so under a
      // parallel ctest).
      const auto measure_peak = [&]() -> Status {
        try {
          p.peak_flops =
              std::max(p.peak_flops, MeasureGemmGflops(o.short_mode ? 512 : 2048, 1, o.short_mode ? 0.1 : 1.0) * 1e9);
        } catch (const std::exception& e) {
          return Status::Internal(fmt::format("measuring the GEMM peak: {}", e.what()));
        }
        return Status::Ok();
      };
      p.peak_flops = 0;
      if (Status peak = measure_peak(); !peak.ok()) return peak;
      AttentionBenchOptions a;
      a.short_mode = o.short_mode;
      a.q_heads = m.q_heads;
      a.kv_heads = m.kv_heads;
      a.head_dim = m.head_dim();
      std::string table_error;
      if (!MeasureAttentionCostTable(a, &table.csv, &table.forward_csv, &table_error))
        return Status::Internal(table_error);
      if (Status peak = measure_peak(); !peak.ok()) return peak;
      // (Not DISTCA_RETURN_IF_ERROR: this lambda is inside one, whose
      // status variable it would shadow.)
      const Status written = WriteTextFile(table_path.string(), table.csv);
      return written.ok() ? WriteTextFile(forward_table_path.string(), table.forward_csv) : written;
    }));

    // 2. The link between ranks 0 and 1.
    double small_s = 0, large_s = 0;
    const int64_t large = o.short_mode ? (int64_t{1} << 20) : (int64_t{16} << 20);
    DISTCA_RETURN_IF_ERROR(HalfRoundTrip(comm, 8, 50, &small_s));
    DISTCA_RETURN_IF_ERROR(HalfRoundTrip(comm, large, o.short_mode ? 5 : 20, &large_s));

    // 3. Training steps of every mix, colocated and CAD.
    std::vector<MixResult> results;
    std::vector<MeasuredStep> colocated;
    for (const TrainMix& mix : TrainMixes(comm.size(), tokens_per_rank)) {
      ModeSteps steps;
      DISTCA_RETURN_IF_ERROR(TimeMix(comm, base, mix, reps, &steps));
      results.push_back({mix.name, MedianStepSeconds(steps[0]), MedianStepSeconds(steps[1])});
      colocated.push_back({mix.lengths, results.back().colocated_s});
    }
    if (!root) return Status::Ok();

    // 4. The profile: measured constants, then the fit.
    p.name = o.name.empty() ? stem : o.name;
    p.gpus_per_node = 1;
    p.linear_mfu = 0.5;  // a start; fitted below
    p.dtype_bytes = 4;   // fp32 training
    p.memory_bytes = PhysicalMemoryBytes() / comm.size();
    if (!(p.memory_bytes > 0)) return Status::Internal("the system does not tell its physical memory");
    if (!(large_s > small_s))
      return Status::Internal(fmt::format(
          "the link measurement is inconsistent: {} MiB took {:.3g} s, 8 B {:.3g} s; rerun on a quieter machine",
          large >> 20, large_s, small_s));
    const double bandwidth = double(large) / (large_s - small_s);
    p.intra_node = p.inter_node = {bandwidth, small_s};
    // The curve's backward pass, as the table measured it.
    double backward_median = 0;
    DISTCA_RETURN_IF_ERROR(
        MeasuredBackwardFactor(table, &p.attention_backward_factor, &backward_median).WithContext(table_path.string()));
    // A median outside the profile's range is recorded as measured, next to the value used.
    const std::string backward_text =
        backward_median == p.attention_backward_factor
            ? fmt::format("{:.2f}", backward_median)
            : fmt::format("median {:.2f}, clamped to {:.2f}", backward_median, p.attention_backward_factor);
    DISTCA_RETURN_IF_ERROR(EfficiencyCurveFromTable(table.csv, p.peak_flops, m.q_heads, m.head_dim(),
                                                    p.attention_backward_factor, &p.attention_efficiency)
                               .WithContext(table_path.string()));
    p.attention_tables.push_back(table);
    SimOptions so;
    so.model = m;
    so.hardware = p;
    so.gpus = comm.size();
    so.tp = 1;
    so.comm_budget = 0;  // distca-train allocates no fixed buffer
    so.threads = 1;
    ProfileFit fit;
    DISTCA_RETURN_IF_ERROR(FitColocatedSteps(colocated, &so, &fit).WithContext("fitting the colocated steps"));
    so.hardware.source = fmt::format(
        "Measured by `distca-bench profile{}{}{}` on this machine, {} ranks ({} backend), one thread per rank, fp32, "
        "for "
        "distca-train's `{}` model ({} x {} heads of {}). peak = oneDNN sgemm on one thread ({:.1f} GFLOP/s); "
        "core attention from {} (the CA engine's forward + backward seconds per task, one thread; the forward "
        "pass alone in {}), and the efficiency curve, for other head shapes, from its whole-document tasks (capped "
        "at 1), with attention_backward_factor their median backward / forward time ({}); network = half the "
        "median round trip between ranks 0 and 1: {:.1f} us for 8 B, {:.2f} GB/s for {} MiB; memory = physical RAM / "
        "ranks. linear_mfu ({:.3f}) and the attention level (table scale and curve, x {:.3f}) fitted to the "
        "colocated step times of the training benchmark's {} mixes ({} tokens per rank, median of {} run(s) x {} "
        "step(s)), largest error {:.1f}%{}.",
        o.short_mode ? " --short" : "", o.reps != ProfileBenchOptions{}.reps ? fmt::format(" --reps {}", o.reps) : "",
        o.model != ProfileBenchOptions{}.model ? " --model " + o.model : "", comm.size(), comm.backend(), m.name,
        m.q_heads, m.kv_heads, m.head_dim(), p.peak_flops * 1e-9, table_file, forward_table_file, backward_text,
        small_s * 1e6, bandwidth * 1e-9, large >> 20, fit.linear_mfu, fit.attention_factor, results.size(),
        tokens_per_rank, reps, base.steps - 1, fit.max_relative_error * 100,
        fit.attention_at_peak ? "; the attention level held at the fastest the measured peak allows (the "
                                "least-squares level lay just beyond it)"
                              : "");
    DISTCA_RETURN_IF_ERROR(WriteTextFile(o.out, HardwareProfileJson(so.hardware)));
    // What the simulator will read: the written files, loaded back.
    DISTCA_RETURN_IF_ERROR(LoadHardwareProfile(o.out, &so.hardware).WithContext("reading back"));

    // 5. The check: colocated in sample (the fit's own predictions), CAD
    // (distca-train's defaults, on the profile read back) out of sample.
    so.ping_pong = base.ping_pong;
    so.tolerance = base.tolerance;
    so.plan_by_flops = true;  // as distca-train plans (no --cost-table)
    for (size_t i = 0; i < results.size(); ++i) {
      const std::vector<int64_t>& lengths = colocated[i].lengths;
      SimOptions mo = so;
      DISTCA_RETURN_IF_ERROR(ShapeFromBatches({lengths}, &mo));
      std::vector<SimResult> sim;
      DISTCA_RETURN_IF_ERROR(Simulate(mo, {lengths}, {SimStrategy::kDistca}, &sim));
      results[i].colocated_predicted_s = fit.predicted_s[i];
      results[i].cad_predicted_s = sim[0].iteration_s;
    }
    auto err = [](double predicted, double measured) { return 100.0 * (predicted / measured - 1); };
    if (o.json) {
      nlohmann::ordered_json j = {{"profile", o.out},
                                  {"table", table_path.string()},
                                  {"backend", comm.backend()},
                                  {"ranks", comm.size()},
                                  {"model", m.name},
                                  {"peak_flops", p.peak_flops},
                                  {"latency_s", small_s},
                                  {"bandwidth", bandwidth},
                                  {"linear_mfu", fit.linear_mfu},
                                  {"attention_factor", fit.attention_factor},
                                  {"attention_at_peak", fit.attention_at_peak},
                                  {"mixes", nlohmann::ordered_json::array()}};
      for (const MixResult& r : results)
        j["mixes"].push_back({{"mix", r.name},
                              {"colocated_s", r.colocated_s},
                              {"colocated_predicted_s", r.colocated_predicted_s},
                              {"cad_s", r.cad_s},
                              {"cad_predicted_s", r.cad_predicted_s}});
      fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      return Status::Ok();
    }
    fmt::print(
        "distca-bench profile: wrote {} and {}\n  {} backend, {} ranks, model {}, {} tokens per rank, median of {} "
        "run(s) x {} step(s)\n  peak {:.1f} GFLOP/s (sgemm, 1 thread); link {:.1f} us + {:.2f} GB/s; fitted "
        "linear_mfu {:.3f}, attention x {:.3f}\n\n{:>11} {:>10} {:>10} {:>7} {:>10} {:>10} {:>7}\n",
        o.out, table_path.string(), comm.backend(), comm.size(), m.name, tokens_per_rank, reps, base.steps - 1,
        p.peak_flops * 1e-9, small_s * 1e6, bandwidth * 1e-9, fit.linear_mfu, fit.attention_factor, "mix", "colocated",
        "predicted", "error", "CAD", "predicted", "error");
    for (const MixResult& r : results)
      fmt::print("{:>11} {:>9.3f}s {:>9.3f}s {:>+6.1f}% {:>9.3f}s {:>9.3f}s {:>+6.1f}%\n", r.name, r.colocated_s,
                 r.colocated_predicted_s, err(r.colocated_predicted_s, r.colocated_s), r.cad_s, r.cad_predicted_s,
                 err(r.cad_predicted_s, r.cad_s));
    fmt::print(
        "\ncolocated: measured median step and the fitted profile's prediction (in sample: the fit's data); CAD "
        "(distca policy, ping-pong): out of sample.\n");
    return Status::Ok();
  });
  if (!s.ok()) *error = s.ToString();
  return s.ok();
}

}  // namespace distca::bench
