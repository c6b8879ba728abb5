// distca-train: train a Llama-style model on packed documents, data-parallel
// over ranks, with core attention colocated or disaggregated (CAD).
//
//   distca-train --model small --ranks 2 --docs-file data/demo-skewed.json --steps 3 --compare
//   mpirun -np 2 distca-train --model tiny --data text:/usr/include --tokens-per-rank 4096
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/cli_checks.h"
#include "common/file_util.h"
#include "common/timer.h"
#include "distca/train.h"
#include "model_flags.h"

namespace {

using distca::Status;

int Fail(const std::string& message) { return distca::cli::Fail("distca-train", message); }

struct Args {
  distca::cli::ModelFlags model{"small"};
  std::string data, data_glob, docs_file, attention = "cad", policy = "distca";
  std::string backward = "stateless", ping_pong = "on", trace_file, json_log, cost_table;
  std::optional<int> ranks;
  std::optional<double> comm_timeout;
  bool compare = false;
  distca::TrainOptions train;
};

// Why the outputs (--trace, --json-log) would overwrite an input or each
// other ("" when they would not): the run read its inputs first and
// finished with exit 0, leaving a docs file replaced by a trace, or a
// checkpoint with log lines in its state.json.
std::string OutputClash(const Args& a, const distca::TrainOptions& t) {
  const std::vector<distca::cli::NamedPath> outputs = {{"--trace", a.trace_file}, {"--json-log", a.json_log}};
  std::vector<distca::cli::NamedPath> files = {{"the --docs-file", a.docs_file}};
  const auto spec = [&](const char* kind) {
    return a.data.rfind(kind, 0) == 0 ? a.data.substr(std::strlen(kind)) : std::string();
  };
  if (const std::string f = spec("synthetic:"); !f.empty()) files.push_back({"the --data file", f});
  if (const std::string f = spec("indexed:"); !f.empty()) {
    files.push_back({"the --data index", f + ".idx"});
    files.push_back({"the --data tokens", f + ".bin"});
  }
  if (std::string clash = distca::cli::OutputOverInput(outputs, files); !clash.empty()) return clash;
  const std::string corpus = spec("text:");
  // A checkpoint in the corpus: its files become documents, and a resumed
  // run trains on other data (its own weights among them).
  for (const auto& [flag, dir] : {std::pair{"--save", t.save_dir}, std::pair{"--load", t.load_dir}})
    if (!corpus.empty() && !dir.empty() && distca::IsSameOrInside(dir, corpus))
      return fmt::format("{} {} lies in the --data corpus ({}): the checkpoint's files would be documents", flag, dir,
                         corpus);
  for (const auto& [flag, out] : outputs) {
    if (out.empty()) continue;
    if (!corpus.empty() && distca::IsSameOrInside(out, corpus))
      return fmt::format("{} {} would write into the --data corpus ({})", flag, out, corpus);
    // A checkpoint's own files, in the directory resumed from or saved to.
    if (distca::IsCheckpointFile(out))
      for (const std::string& dir : {t.load_dir, t.save_dir})
        if (!dir.empty() && distca::IsSameOrInside(out, dir))
          return fmt::format("{} {} would overwrite a checkpoint file in {}", flag, out, dir);
  }
  return "";
}

std::string Duration(double s) {
  // An estimate past 10^6 hours (--steps near 2^63) prints as such rather
  // than overflow the conversion.
  if (!(s < 3.6e9)) return "over 10^6 h";
  const int64_t t = static_cast<int64_t>(s + 0.5);
  return t >= 3600 ? fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60)
                   : fmt::format("{}:{:02}", t / 60, t % 60);
}

std::string Rate(double x) { return x >= 1e3 ? fmt::format("{:.2f}K", x * 1e-3) : fmt::format("{:.0f}", x); }

nlohmann::json StepJson(const std::string& mode, const distca::StepMetrics& m) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : m.ranks)
    ranks.push_back({{"rank", r.rank},
                     {"tokens", r.tokens},
                     {"attn_s", r.attn_s},
                     {"linear_s", r.linear_s},
                     {"comm_s", r.comm_s},
                     {"wait_s", r.wait_s},
                     {"busy_s", r.busy_s},
                     {"peak_rss_bytes", r.peak_rss_bytes}});
  return {{"mode", mode},
          {"step", m.step},
          {"loss", m.loss},
          {"step_s", m.step_s},
          {"tokens_per_s", m.tokens_per_s},
          {"load_max_over_mean", m.load_max_over_mean},
          {"comm_bytes", m.comm_bytes},
          {"lr", m.lr},
          {"grad_norm", m.grad_norm},
          {"documents", m.documents},
          {"tokens", m.tokens},
          {"ranks", ranks}};
}

// Per-rank means over a run's steps, leaving out the first (warm-up: oneDNN
// JIT, first-touch page faults) when there are others.
struct RunSummary {
  std::string mode;
  std::vector<distca::StepMetrics> all_steps;
  // The steps averaged.
  std::span<const distca::StepMetrics> steps() const {
    return std::span<const distca::StepMetrics>(all_steps).subspan(all_steps.size() > 1 ? 1 : 0);
  }
  double MeanStep() const {
    double s = 0;
    for (const auto& m : steps()) s += m.step_s;
    return steps().empty() ? 0 : s / double(steps().size());
  }
  // Tokens over time of the steps averaged (batches may differ in size).
  double TokensPerSecond() const {
    double tokens = 0, seconds = 0;
    for (const auto& m : steps()) {
      tokens += double(m.tokens);
      seconds += m.step_s;
    }
    return seconds > 0 ? tokens / seconds : 0;
  }
  distca::RankStepMetrics MeanRank(size_t r) const {
    distca::RankStepMetrics out;
    out.rank = static_cast<int>(r);
    for (const auto& m : steps()) {
      const auto& x = m.ranks[r];
      out.tokens += x.tokens;
      out.attn_s += x.attn_s;
      out.linear_s += x.linear_s;
      out.comm_s += x.comm_s;
      out.wait_s += x.wait_s;
      out.busy_s += x.busy_s;
      out.peak_rss_bytes = std::max(out.peak_rss_bytes, x.peak_rss_bytes);
    }
    const double n = double(std::max<size_t>(1, steps().size()));
    out.tokens = static_cast<int64_t>(double(out.tokens) / n);
    out.attn_s /= n;
    out.linear_s /= n;
    out.comm_s /= n;
    out.wait_s /= n;
    out.busy_s /= n;
    return out;
  }
};

void PrintSummary(const RunSummary& run) {
  if (run.steps().empty()) return;
  fmt::print("\n{} summary over {} steps{}: mean step {:.3f} s, {} tok/s, final loss {:.4f}\n", run.mode,
             run.steps().size(), run.all_steps.size() > 1 ? " (after the warm-up step)" : "", run.MeanStep(),
             Rate(run.TokensPerSecond()), run.steps().back().loss);
  fmt::print("{:>5} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10}\n", "rank", "tokens", "attn s", "linear s", "comm s",
             "wait s", "busy s", "peak RSS");
  for (size_t r = 0; r < run.steps().back().ranks.size(); ++r) {
    const auto x = run.MeanRank(r);
    fmt::print("{:>5} {:>8} {:>9.3f} {:>9.3f} {:>9.3f} {:>9.3f} {:>9.3f} {:>8.0f}MB\n", r, x.tokens, x.attn_s,
               x.linear_s, x.comm_s, x.wait_s, x.busy_s, double(x.peak_rss_bytes) / (1 << 20));
  }
}

void PrintComparison(const RunSummary& colocated, const RunSummary& cad) {
  if (colocated.steps().empty() || cad.steps().empty()) return;
  const size_t ranks = colocated.steps().back().ranks.size();
  fmt::print("\ncolocated vs CAD, per-rank means over {} steps after the warm-up step (seconds)\n", cad.steps().size());
  fmt::print("{:>5} | {:>8} {:>8} {:>8} | {:>8} {:>8} {:>8}\n", "rank", "attn", "linear", "wait", "attn", "linear",
             "wait");
  double busy = 0;
  for (size_t r = 0; r < ranks; ++r) {
    const auto a = colocated.MeanRank(r);
    const auto b = r < cad.steps().back().ranks.size() ? cad.MeanRank(r) : distca::RankStepMetrics{};
    busy += a.busy_s;
    fmt::print("{:>5} | {:>8.3f} {:>8.3f} {:>8.3f} | {:>8.3f} {:>8.3f} {:>8.3f}\n", r, a.attn_s, a.linear_s, a.wait_s,
               b.attn_s, b.linear_s, b.wait_s);
  }
  const double ideal = busy / double(ranks);
  fmt::print("step time: colocated {:.3f} s, CAD {:.3f} s, ideal balanced {:.3f} s (mean colocated busy time)\n",
             colocated.MeanStep(), cad.MeanStep(), ideal);
  fmt::print("speedup of CAD over colocated: {:.2f}x (CAD at {:.2f}x the ideal)\n",
             colocated.MeanStep() / cad.MeanStep(), cad.MeanStep() / ideal);
}

}  // namespace

int Run(int argc, char** argv) {
  CLI::App app{"distca-train: train a Llama-style model with colocated or disaggregated core attention"};
  Args a;
  distca::TrainOptions& t = a.train;
  const auto pos = distca::cli::kPositive;
  const auto nonneg = distca::cli::kNonNegative;
  a.model.Add(app, "preset: tiny, small, llama3-8b, llama-34b (Default: small)",
              "override the vocabulary (Default: 256, bytes)");
  app.add_option("--data", a.data, "text:DIR, indexed:PREFIX or synthetic:LENGTHS.json");
  app.add_option("--data-glob", a.data_glob, "text: only files whose relative path matches (e.g. '*.h')");
  app.add_option("--docs-file", a.docs_file, "JSON {\"batches\": [[len, ...], ...]}: step i uses batch i's lengths")
      ->check(CLI::ExistingFile);
  app.add_option("--max-doc-len", t.data.max_doc_len, "cut longer documents (Default: no cap)")->check(nonneg);
  app.add_option("--upsample", t.data.recipe.upsample, "synthetic: copies of each long document (Default: 1)")
      ->check(pos);
  app.add_option("--filter-ratio", t.data.recipe.filter_ratio,
                 "synthetic: share of short documents kept in (0, 1] (Default: 1)")
      ->check(distca::cli::kShare);
  app.add_option("--elongate", t.data.recipe.elongate, "synthetic: length multiplier (Default: 1)")->check(pos);
  app.add_option("--tokens-per-rank", t.tokens_per_rank,
                 "tokens per rank per step (Default: with --docs-file the batch total / ranks)")
      ->check(pos);
  app.add_option("--steps", t.steps, "train until this step (Default: 10)")->check(pos);
  app.add_option("--lr", t.lr, "peak learning rate (Default: 3e-4)")->check(distca::cli::kPositiveFloat);
  app.add_option("--min-lr", t.min_lr, "learning rate at the end of the cosine (Default: 3e-5)")
      ->check(nonneg)
      ->check(distca::cli::kFitsFloat);
  app.add_option("--warmup-steps", t.warmup_steps, "linear warmup steps (Default: 0)")->check(nonneg);
  app.add_option("--lr-decay-steps", t.lr_decay_steps, "cosine length in steps (Default: --steps)")->check(nonneg);
  app.add_option("--clip-grad", t.grad_clip, "global gradient-norm clip, 0 = off (Default: 1)")
      ->check(nonneg)
      ->check(distca::cli::kFitsFloat);
  app.add_option("--weight-decay", t.adamw.weight_decay, "AdamW weight decay (Default: 0.1)")
      ->check(nonneg)
      ->check(distca::cli::kFitsFloat);
  app.add_option("--seed", t.seed, "weights and data (Default: 1234)");
  app.add_option("--attention", a.attention, "colocated or cad (Default: cad)");
  app.add_flag("--compare", a.compare, "run the steps colocated, then again with CAD, and compare");
  app.add_option("--policy", a.policy, "CAD planner policy: colocated, paper, distca (Default: distca)");
  app.add_option("--tolerance", t.tolerance, "CAD eps: max load <= (1 + eps) mean (Default: 0.05)")->check(nonneg);
  app.add_option("--servers", t.servers, "CAD dedicated attention servers among the ranks (Default: 0)")->check(nonneg);
  app.add_option("--backward-mode", a.backward, "stateless or cached (Default: stateless)")
      ->check(CLI::IsMember({"stateless", "cached"}));
  app.add_option("--ping-pong", a.ping_pong, "on or off (Default: on)")->check(CLI::IsMember({"on", "off"}));
  app.add_option("--block", t.block, "CA-task granularity in tokens (Default: 128)")->check(pos);
  app.add_option("--cost-table", a.cost_table,
                 "CAD: CSV q_len,kv_len,seconds (e.g. configs/hardware/cpu-attention.csv): the planner balances the "
                 "kernel's measured time instead of FLOPs")
      ->check(distca::cli::kPath);
  app.add_option("--ranks", a.ranks, "ranks as threads of this process (Default: 1; under mpirun: the MPI ranks)")
      ->check(pos);
  app.add_option("--comm-timeout", a.comm_timeout,
                 "seconds a rank waits for a message before the run fails (ranks as threads only; Default: 120)")
      ->check(pos);
  app.add_option("--threads", t.threads, "OpenMP threads per rank (Default: 1)")->check(pos);
  app.add_option("--save", t.save_dir, "checkpoint directory")->check(distca::cli::kPath);
  app.add_option("--save-every", t.save_every, "save every N steps (Default: only at the end)")->check(nonneg);
  app.add_option("--load", t.load_dir, "resume from a checkpoint directory")->check(distca::cli::kPath);
  app.add_option("--trace", a.trace_file, "write a Chrome trace (under MPI rank r > 0 writes FILE.rank<r>)")
      ->check(distca::cli::kPath);
  app.add_option("--json-log", a.json_log, "append one JSON object per step to this file")->check(distca::cli::kPath);
  if (int rc = 0; !distca::cli::Parse(app, argc, argv, &rc)) return rc;

  Status s = a.model.Resolve(&t.model);
  if (!s.ok()) return Fail(s.message());
  if (a.data.empty() == a.docs_file.empty()) return Fail("give exactly one of --data and --docs-file");
  t.data.spec = a.data;
  if (app.count("--data-glob") > 0 && a.data_glob.empty())
    return Fail("--data-glob: the pattern is empty (leave it out for every file)");
  t.data.glob = a.data_glob;
  t.data.docs_file = a.docs_file;
  // Read once, here: every rank (threads of this process) and both --compare
  // runs then use the same lengths, and a pipe (read once only) works.
  if (Status st = distca::BatchStream::ReadInputFilesOnce(&t.data); !st.ok()) return Fail(st.message());
  s = distca::ParseAttentionMode(a.attention, &t.attention);
  if (s.ok()) s = distca::ParsePlanPolicy(a.policy, &t.policy);
  if (!s.ok()) return Fail(s.message());
  t.backward = a.backward == "cached" ? distca::BackwardMode::kCached : distca::BackwardMode::kStateless;
  t.ping_pong = a.ping_pong == "on";
  // Flags that another choice makes meaningless are refused, not ignored.
  using distca::cli::FirstGiven;
  if (a.data.rfind("synthetic:", 0) != 0)
    if (const char* flag = FirstGiven(app, {"--upsample", "--filter-ratio", "--elongate"}))
      return Fail(fmt::format("{} shapes sampled lengths: it needs --data synthetic:FILE", flag));
  if (t.attention == distca::AttentionMode::kColocated && !a.compare)
    if (const char* flag =
            FirstGiven(app, {"--policy", "--tolerance", "--backward-mode", "--ping-pong", "--cost-table"}))
      return Fail(fmt::format("{} configures disaggregated attention: it needs --attention cad (or --compare)", flag));
  if (app.count("--save-every") > 0 && t.save_dir.empty()) return Fail("--save-every needs --save DIR");
  if (!a.cost_table.empty()) {
    std::string csv;
    distca::CostModel table;
    s = distca::ReadTextFile(a.cost_table, &csv);
    if (s.ok()) s = distca::CostModel::FromTableCsv(csv, &table);
    if (!s.ok()) return Fail(s.WithContext("--cost-table " + a.cost_table).message());
    t.cost_table = std::move(table);
  }
  if (distca::LaunchedByMpirun())
    if (const char* flag = FirstGiven(app, {"--ranks", "--comm-timeout"}))
      return Fail(
          fmt::format("{} configures ranks as threads of one process; under mpirun the ranks are its "
                      "processes (-np)",
                      flag));
  if (a.compare && app.count("--attention") > 0) return Fail("--compare runs both attention modes; drop --attention");
  if (!a.trace_file.empty())
    if (Status st = distca::CheckOutputPath(a.trace_file); !st.ok()) return Fail("--trace: " + st.message());
  if (const std::string clash = OutputClash(a, t); !clash.empty()) return Fail(clash);
  if (a.compare && !t.load_dir.empty()) return Fail("--compare starts both runs from scratch; drop --load");
  if (a.compare && !t.save_dir.empty()) return Fail("--compare does not save; drop --save");

  distca::CommOptions comm_options;
  if (distca::LaunchedByMpirun()) {
    comm_options.backend = distca::CommOptions::Backend::kMpi;
  } else {
    comm_options.backend = distca::CommOptions::Backend::kLocal;
    comm_options.local_ranks = a.ranks.value_or(1);
    if (a.comm_timeout) comm_options.timeout_seconds = *a.comm_timeout;
  }

  std::FILE* log = nullptr;
  std::string log_error;  // the first failed write to --json-log
  distca::Tracer tracer;
  if (!a.trace_file.empty()) t.tracer = &tracer;
  std::vector<RunSummary> runs;
  std::mutex print_mu;
  std::vector<distca::TrainOptions> variants;
  if (a.compare) {
    variants.push_back(t);
    variants.back().attention = distca::AttentionMode::kColocated;
    variants.back().servers = 0;
    variants.push_back(t);
    variants.back().attention = distca::AttentionMode::kCad;
  } else {
    variants.push_back(t);
  }

  // With thread ranks the log is opened before they start: an open that
  // blocks (a FIFO nobody reads yet) then holds the tool, as it would any
  // program, instead of one rank while the others time out waiting for it.
  // Under mpirun rank 0 opens it.
  const auto open_log = [&]() -> Status {
    if (a.json_log.empty() || log != nullptr) return Status::Ok();
    log = std::fopen(a.json_log.c_str(), "a");
    if (log == nullptr) return Status::IoError("cannot open --json-log " + a.json_log + ": " + std::strerror(errno));
    return Status::Ok();
  };
  if (comm_options.backend == distca::CommOptions::Backend::kLocal)
    if (Status st = open_log(); !st.ok()) return Fail(st.message());
  s = distca::RunOnRanks(comm_options, [&](distca::Comm& comm) -> Status {
    const bool root = comm.rank() == 0;
    if (root) DISTCA_RETURN_IF_ERROR(open_log());
    // --compare: CAD's options are refused before the colocated run, not after it.
    for (const distca::TrainOptions& v : variants) DISTCA_RETURN_IF_ERROR(distca::CheckTrainOptions(comm, v));
    for (distca::TrainOptions v : variants) {
      // --compare trains the same batches both ways: with dedicated servers
      // CAD's batch is tokens per rank x its R - S data ranks, which
      // colocated attention spreads over all R ranks.
      if (a.compare && v.attention == distca::AttentionMode::kColocated && t.servers > 0 && v.tokens_per_rank > 0 &&
          v.data.docs_file.empty() && v.data.batches.empty()) {
        const int64_t batch = v.tokens_per_rank * (comm.size() - t.servers);
        if (t.servers >= comm.size() || batch % comm.size() != 0)
          return Status::InvalidArgument(fmt::format(
              "--compare with --servers {}: CAD's batch of {} tokens ({} per rank on {} data ranks) does not split "
              "evenly over the {} ranks that colocated attention uses; pick --tokens-per-rank so that it does",
              t.servers, batch, v.tokens_per_rank, comm.size() - t.servers, comm.size()));
        v.tokens_per_rank = batch / comm.size();
      }
      const std::string mode = distca::AttentionModeName(v.attention);
      if (root) {
        runs.push_back({mode, {}});
        fmt::print("distca-train: {} model ({} layers, hidden {}, heads {}x{}, ffn {}), {} ranks ({} backend), {}",
                   v.model.name, v.model.num_layers, v.model.hidden, v.model.q_heads, v.model.kv_heads,
                   v.model.ffn_hidden, comm.size(), comm.backend(), mode);
        if (v.attention == distca::AttentionMode::kCad)
          fmt::print(" (policy {}, eps {}{}, {} backward, ping-pong {}{})", distca::PlanPolicyName(v.policy),
                     v.tolerance, v.cost_table ? " of the cost table's seconds" : "",
                     v.backward == distca::BackwardMode::kCached ? "cached" : "stateless", v.ping_pong ? "on" : "off",
                     v.servers > 0 ? fmt::format(", {} dedicated servers", v.servers) : "");
        fmt::print("\n");
        std::fflush(stdout);
      }
      distca::WallTimer elapsed;
      int64_t first_step = -1;
      DISTCA_RETURN_IF_ERROR(distca::Train(comm, v, [&](const distca::StepMetrics& m) {
        std::lock_guard<std::mutex> lock(print_mu);
        if (first_step < 0) first_step = m.step;
        runs.back().all_steps.push_back(m);
        const double done = double(m.step - first_step + 1), left = double(v.steps - m.step);
        fmt::print(
            "[{}] step {}/{}  loss {:.4f}  {} tok/s  step {:.2f} s  balance {:.3f}  comm {:.1f} MB  "
            "elapsed {}  remaining {}\n",
            mode, m.step, v.steps, m.loss, Rate(m.tokens_per_s), m.step_s, m.load_max_over_mean,
            double(m.comm_bytes) * 1e-6, Duration(elapsed.Seconds()), Duration(elapsed.Seconds() / done * left));
        std::fflush(stdout);
        if (log != nullptr && log_error.empty()) {
          if (std::fprintf(log, "%s\n", StepJson(mode, m).dump().c_str()) < 0 || std::fflush(log) != 0)
            log_error = std::strerror(errno);
        }
      }));
    }
    if (!a.trace_file.empty() && std::string(comm.backend()) == "mpi")
      DISTCA_RETURN_IF_ERROR(
          tracer.WriteChromeJson(root ? a.trace_file : fmt::format("{}.rank{}", a.trace_file, comm.rank())));
    return Status::Ok();
  });
  if (log != nullptr && std::fclose(log) != 0 && log_error.empty()) log_error = std::strerror(errno);
  if (!s.ok()) return Fail(s.message());
  if (!log_error.empty()) return Fail(fmt::format("cannot write --json-log {}: {}", a.json_log, log_error));
  if (!a.trace_file.empty() && !distca::LaunchedByMpirun()) {
    s = tracer.WriteChromeJson(a.trace_file);
    if (!s.ok()) return Fail(s.message());
  }
  for (const RunSummary& run : runs) PrintSummary(run);
  if (a.compare && runs.size() == 2) PrintComparison(runs[0], runs[1]);
  return 0;
}

int main(int argc, char** argv) { return distca::cli::GuardedMain(argc, argv, Run, Fail); }
