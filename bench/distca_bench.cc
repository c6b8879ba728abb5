// distca-bench: the project's benchmarks. Each subcommand prints a table, or
// JSON with --json; --short is the mode CI runs.
#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <functional>
#include <map>
#include <string>

#include "bench/attention_bench.h"
#include "bench/dispatch_bench.h"
#include "bench/plan_bench.h"
#include "bench/profile_bench.h"
#include "bench/train_bench.h"
#include "common/cli_checks.h"
#include "distca/comm.h"

namespace {

// "distca-bench SUBCOMMAND: MESSAGE" (or "distca-bench: MESSAGE"), status 2.
int Fail(const std::string& subcommand, const std::string& message) {
  return distca::cli::Fail(subcommand.empty() ? "distca-bench" : "distca-bench " + subcommand, message);
}

int Run(int argc, char** argv) {
  CLI::App app{"distca benchmarks"};
  app.require_subcommand(1);

  distca::bench::AttentionBenchOptions attn;
  std::string kernel = "auto";
  CLI::App* attention = app.add_subcommand("attention", "CA engine forward/backward GFLOP/s vs the GEMM rate");
  attention->add_flag("--short", attn.short_mode, "CI mode: fewer, smaller cases (under a minute)");
  attention->add_flag("--json", attn.json, "print one JSON array of records instead of a table");
  attention->add_option("--threads", attn.threads, "thread counts to measure (Default: 1 2)")
      ->check(distca::cli::kPositive)
      ->delimiter(',');
  attention->add_option("--kernel", kernel, "auto, scalar, avx2 or avx512 (Default: auto)")
      ->check(CLI::IsMember({"auto", "scalar", "avx2", "avx512"}));
  attention
      ->add_option("--table-out", attn.table_out,
                   "write the planner's cost table (CSV q_len,kv_len,seconds) instead of benchmarking")
      ->check(distca::cli::kPath);
  attention->add_option("--q-heads", attn.q_heads, "query heads in --table-out mode (Default: 8)")
      ->check(distca::cli::kPositive);
  attention->add_option("--kv-heads", attn.kv_heads, "KV heads in --table-out mode (Default: 2)")
      ->check(distca::cli::kPositive);
  attention->add_option("--head-dim", attn.head_dim, "head dimension in --table-out mode (Default: 128)")
      ->check(distca::cli::kPositive);
  attention
      ->add_option("--min-seconds", attn.min_seconds,
                   "minimum time per measurement, at most 3600 (Default, or 0: by mode: 0.3 s short, 1 s full; "
                   "--table-out 0.02 s and 0.2 s)")
      ->check(distca::cli::kNonNegative);

  distca::bench::PlanBenchOptions plan;
  plan.lengths_file = DISTCA_SOURCE_DIR "/data/doc-lengths-pretrain.json";
  CLI::App* planner = app.add_subcommand("plan", "planner policies side by side: plan time, balance, bytes");
  planner->add_flag("--short", plan.short_mode, "CI mode: fewer batches");
  planner->add_flag("--json", plan.json, "one JSON object per (ranks, policy) line");
  planner->add_option("--lengths", plan.lengths_file, "document-length pool (Default: data/doc-lengths-pretrain.json)")
      ->check(CLI::ExistingFile);
  planner->add_option("--seed", plan.seed,
                      "sampling seed; R ranks sample with seed + R (Default: 1000, the batches docs/performance.md "
                      "quotes)");

  distca::bench::DispatchBenchOptions dispatch;
  dispatch.lengths_file = plan.lengths_file;
  CLI::App* dispatcher = app.add_subcommand(
      "dispatch", "disaggregated attention over ranks: bytes vs plan, GB/s, exposed comm (run under mpirun for MPI)");
  dispatcher->add_flag("--short", dispatch.short_mode, "CI mode: one small batch, two layers");
  dispatcher->add_flag("--json", dispatch.json, "one JSON record per batch");
  dispatcher->add_option("--ranks", dispatch.local_ranks, "local ranks when not under mpirun (Default: 4)")
      ->check(distca::cli::kPositive);
  dispatcher->add_option("--lengths", dispatch.lengths_file, "document-length pool")->check(CLI::ExistingFile);
  dispatcher->add_option("--trace", dispatch.trace_file, "write the ping-pong run as Chrome trace JSON")
      ->check(distca::cli::kPath);

  distca::bench::TrainBenchOptions train;
  CLI::App* trainer = app.add_subcommand(
      "train", "colocated vs CAD training steps on skewed and uniform mixes (run under mpirun -np 2 for MPI)");
  trainer->add_flag("--short", train.short_mode, "CI mode: tiny model, 2048 tokens per rank");
  trainer->add_flag("--json", train.json, "one JSON record per mix");
  trainer->add_option("--ranks", train.local_ranks, "local ranks when not under mpirun (Default: 2)")
      ->check(distca::cli::kPositive);

  distca::bench::ProfileBenchOptions profile;
  CLI::App* profiler = app.add_subcommand(
      "profile",
      "measure this machine and write a hardware profile for distca-sim, checked against training steps (run "
      "under mpirun -np 2 for MPI)");
  profiler->add_option("--out", profile.out, "profile JSON to write (the attention table goes next to it)")
      ->required()
      ->check(distca::cli::kPath);
  profiler->add_option("--name", profile.name, "the profile's name (Default: the file's stem)");
  profiler->add_option("--model", profile.model, "distca-train model preset the steps train (Default: small)");
  profiler->add_option("--reps", profile.reps, "runs per mix and mode, at most 100 (Default: 3)")
      ->check(CLI::Range(1, distca::bench::kMaxProfileReps));
  profiler->add_flag("--short", profile.short_mode, "CI mode: tiny model, 4096 tokens per rank, one run");
  profiler->add_flag("--json", profile.json, "one JSON object instead of a table");
  profiler->add_option("--ranks", profile.local_ranks, "local ranks when not under mpirun (Default: 2)")
      ->check(distca::cli::kPositive);

  // A word that names no subcommand is named as such (CLI11 would only say
  // that a subcommand is required).
  bool known = false;
  std::string names;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    known |= argc > 1 && sub->get_name() == argv[1];
    names += (names.empty() ? "" : ", ") + sub->get_name();
  }
  if (argc > 1 && argv[1][0] != '-' && !known) {
    return Fail("", fmt::format("unknown subcommand '{}': use one of {}", argv[1], names));
  }
  if (int rc = 0; !distca::cli::Parse(app, argc, argv, &rc)) return rc;
  // Flags the chosen mode ignores are refused, as the tools do.
  if (attention->parsed()) {
    const bool table = attention->count("--table-out") > 0;
    const char* ignored = table ? distca::cli::FirstGiven(*attention, {"--threads", "--json"})
                                : distca::cli::FirstGiven(*attention, {"--q-heads", "--kv-heads", "--head-dim"});
    if (ignored != nullptr)
      return Fail("attention",
                  fmt::format("{} {}", ignored,
                              table ? "applies to the benchmark, not to --table-out (one thread, a CSV file)"
                                    : "applies to --table-out only (the benchmark runs its own head shapes)"));
  }

  if (dispatcher->parsed())
    if (const std::string clash = distca::cli::OutputOverInput({{"--trace", dispatch.trace_file}},
                                                               {{"the --lengths file", dispatch.lengths_file}});
        !clash.empty())
      return Fail("dispatch", clash);
  if (profiler->parsed() && profile.short_mode)
    if (const char* flag = distca::cli::FirstGiven(*profiler, {"--model", "--reps"}))
      return Fail("profile", fmt::format("--short fixes the model (tiny) and the runs (1); drop {}", flag));
  if (distca::LaunchedByMpirun()) {
    // The attention and planner benchmarks time one process: under mpirun
    // every process would run and print them, timed against each other.
    for (CLI::App* sub : {attention, planner})
      if (sub->parsed())
        return Fail(sub->get_name(), "runs in one process, not under mpirun (start it without mpirun)");
    for (CLI::App* sub : {dispatcher, trainer, profiler})
      if (sub->parsed() && sub->count("--ranks") > 0)
        return Fail(sub->get_name(),
                    "--ranks sets the local backend's ranks; under mpirun the ranks are its processes (-np)");
  }

  const std::map<std::string, distca::AttentionKernel> kernels = {{"auto", distca::AttentionKernel::kAuto},
                                                                  {"scalar", distca::AttentionKernel::kScalar},
                                                                  {"avx2", distca::AttentionKernel::kAvx2},
                                                                  {"avx512", distca::AttentionKernel::kAvx512}};
  attn.kernel = kernels.at(kernel);
  const std::pair<CLI::App*, std::function<bool(std::string*)>> runs[] = {
      {attention, [&](std::string* e) { return distca::bench::RunAttentionBench(attn, e); }},
      {dispatcher, [&](std::string* e) { return distca::bench::RunDispatchBench(dispatch, e); }},
      {trainer, [&](std::string* e) { return distca::bench::RunTrainBench(train, e); }},
      {profiler, [&](std::string* e) { return distca::bench::RunProfileBench(profile, e); }},
      {planner, [&](std::string* e) { return distca::bench::RunPlanBench(plan, e); }}};
  try {
    for (const auto& [sub, run] : runs) {
      std::string error;
      if (sub->parsed() && !run(&error)) return Fail(sub->get_name(), error);
    }
  } catch (const std::exception& e) {
    return Fail("", e.what());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return distca::cli::GuardedMain(argc, argv, Run, [](const std::string& m) { return Fail("", m); });
}
