// distca-sim: predict iteration time, balance, memory and traffic of a
// cluster configuration under several strategies (docs/simulator.md).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common/cli_checks.h"
#include "common/excerpt.h"
#include "common/file_util.h"
#include "common/timer.h"
#include "distca/model.h"
#include "distca/sim.h"
#include "distca/workload.h"
#include "model_flags.h"

namespace {

using distca::SimOptions;
using distca::SimResult;
using distca::Status;

int Fail(const std::string& message) { return distca::cli::Fail("distca-sim", message); }

struct Args {
  distca::cli::ModelFlags model{"llama3-8b"};
  std::string hardware = "configs/hardware/h200-dgx.json";
  std::vector<std::string> hardware_set;  // FIELD=VALUE overrides of the profile
  std::string lengths, docs_file, strategies = "wlb-ideal,megatron,distca-paper,distca";
  std::string paper_grid, out_dir, wlb_scope = "whole-batch-artifact-cap", wire, packing = "chunks";
  distca::WorkloadRecipe recipe;
  distca::GridRecipe grid_recipe;
  SimOptions sim;
  int batches = 30;
  bool no_ping_pong = false, no_grad_sync = false, no_distributed_optimizer = false, no_optimizer_step = false,
       wlb_artifact_kv = false, json = false, tolerance_sweep = false, breakdown = false, search = false;
  std::vector<std::pair<int, int>> shapes;  // --search: the (tp, pp) shapes to try
};

// The profile path as given, else relative to the source tree (so that the
// default works from a build directory).
std::string FindHardware(const std::string& path) {
  std::error_code ec;  // a path the system cannot look at is loaded as given, and fails with the reason
  if (std::filesystem::exists(path, ec) || std::filesystem::path(path).is_absolute()) return path;
  const std::string in_tree = std::string(DISTCA_SOURCE_DIR) + "/" + path;
  return std::filesystem::exists(in_tree, ec) ? in_tree : path;
}

Status Sample(const std::vector<int64_t>& pool, const Args& a, const SimOptions& o, double elongate,
              std::vector<std::vector<int64_t>>* batches) {
  distca::WorkloadRecipe r = a.recipe;
  r.tokens_per_batch = int64_t{o.batch_size} * o.max_doc_len;
  if (a.packing == "chunks") {
    // The DistCA artifact's batches: L-token chunks, a document longer than
    // the room left continuing in the next chunk (so no cap is needed).
    r.chunk_tokens = o.max_doc_len;
  } else {
    r.max_doc_len = o.max_doc_len;
  }
  r.elongate = elongate;
  return distca::SampleBatches(pool, r, a.batches, batches);
}

using distca::IsCadStrategy;
using distca::RunsAsWaves;

nlohmann::json ToJson(const Args& a, const SimOptions& o, const SimResult& r) {
  const std::optional<distca::PlanWire> wire = distca::StrategyWire(r.strategy, o);
  const distca::SimBreakdown& b = r.breakdown;
  return {{"strategy", distca::SimStrategyName(r.strategy)},
          {"model", o.model.name},
          {"hardware", o.hardware.name},
          {"gpus", o.gpus},
          {"tp", o.tp},
          {"pp", o.pp},
          {"max_doc_len", o.max_doc_len},
          {"batch_size", o.batch_size},
          {"packing", a.docs_file.empty() ? a.packing : "docs-file"},
          {"ping_pong", o.ping_pong},
          {"grad_sync", o.grad_sync},
          {"distributed_optimizer", o.distributed_optimizer},
          {"optimizer_moments", o.optimizer_moments},
          {"micro_batches", o.micro_batches},
          {"cad_micro_batches", o.cad_micro_batches},
          {"recompute_mlp", o.recompute_mlp},
          {"wlb_scope", distca::WlbScopeName(o.wlb_scope)},
          {"wlb_artifact_kv", o.wlb_artifact_kv},
          {"wlb_breakpoint", o.wlb_breakpoint},
          {"wire", wire ? nlohmann::json(distca::PlanWireName(*wire)) : nlohmann::json(nullptr)},
          {"tolerance", o.tolerance},
          {"comm_budget", o.comm_budget},
          {"plan_by_flops", o.plan_by_flops},
          {"plan_by_table", o.plan_by_table},
          {"fixed_tolerance", o.fixed_tolerance},
          {"servers", o.dedicated_servers},
          {"iteration_s", r.iteration_s},
          {"tokens_per_s", r.tokens_per_s},
          {"speedup_over_wlb_ideal", r.speedup > 0 ? nlohmann::json(r.speedup) : nlohmann::json(nullptr)},
          {"idle_fraction", r.idle_fraction},
          {"bubble_work_fraction", r.bubble_work_fraction},
          {"memory_max_bytes", r.memory_max_bytes},
          {"memory_mean_bytes", r.memory_mean_bytes},
          {"memory_fits", r.memory_fits},
          {"bytes_moved", r.bytes_moved},
          {"max_buffer_bytes", r.max_buffer_bytes},
          {"cp", r.cp},
          {"tolerance_used", IsCadStrategy(r.strategy) ? nlohmann::json(r.tolerance_used) : nlohmann::json(nullptr)},
          {"load_max_over_mean",
           IsCadStrategy(r.strategy) ? nlohmann::json(r.load_max_over_mean) : nlohmann::json(nullptr)},
          {"grad_sync_s", r.grad_sync_s},
          {"breakdown_per_layer_s",
           {{"forward_linear", b.forward_linear_s},
            {"backward_linear", b.backward_linear_s},
            {"forward_attention", b.forward_attention_s},
            {"backward_attention", b.backward_attention_s},
            {"forward_comm", b.forward_comm_s},
            {"backward_comm", b.backward_comm_s}}},
          {"iteration_per_batch_s", r.iteration_per_batch},
          {"idle_per_batch", r.idle_per_batch}};
}

// A speedup for the tables: three decimals, or three digits where those
// would print 0.000x; "-" without wlb-ideal.
std::string SpeedupText(double speedup) {
  if (!(speedup > 0)) return "-";
  return speedup >= 0.01 ? fmt::format("{:.3f}x", speedup) : fmt::format("{:.3g}x", speedup);
}
// Bytes as GB for the tables: one decimal, or three digits below 0.1 GB
// (the tiny model's 43 MB printed as 0.0GB).
std::string GbText(double bytes) {
  const double gb = bytes * 1e-9;
  return gb >= 0.1 || gb == 0 ? fmt::format("{:.1f}GB", gb) : fmt::format("{:.3g}GB", gb);
}

void PrintTable(const std::vector<SimResult>& results, bool breakdown) {
  fmt::print("{:<13} {:>9} {:>11} {:>8} {:>6} {:>9} {:>9} {:>9} {:>9} {:>3} {:>5}\n", "strategy", "iter s", "tokens/s",
             "speedup", "idle", "mem max", "mem mean", "moved", "buffer", "cp", "eps");
  for (const SimResult& r : results) {
    fmt::print("{:<13} {:>9.4f} {:>11.4g} {:>8} {:>6.3f} {:>9}{} {:>9} {:>9} {:>7.3f}GB {:>3} {:>5}\n",
               distca::SimStrategyName(r.strategy), r.iteration_s, r.tokens_per_s, SpeedupText(r.speedup),
               r.idle_fraction, GbText(r.memory_max_bytes), r.memory_fits ? " " : "!", GbText(r.memory_mean_bytes),
               GbText(r.bytes_moved), r.max_buffer_bytes * 1e-9, r.cp,
               IsCadStrategy(r.strategy) ? fmt::format("{:.3g}", r.tolerance_used) : "-");
  }
  bool over = false;
  for (const SimResult& r : results) over |= !r.memory_fits;
  if (over) fmt::print("! over the device memory of the hardware profile at every CP degree tried (c_min for CAD)\n");
  if (!breakdown) return;
  fmt::print("\nper layer, summed over one iteration's micro-batches, mean over ranks (ms):\n");
  fmt::print("{:<13} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}\n", "strategy", "fwd lin", "bwd lin", "fwd CA", "bwd CA",
             "fwd comm", "bwd comm");
  for (const SimResult& r : results) {
    const distca::SimBreakdown& b = r.breakdown;
    fmt::print("{:<13} {:>9.2f} {:>9.2f} {:>9.2f} {:>9.2f} {:>9.2f} {:>9.2f}\n", distca::SimStrategyName(r.strategy),
               b.forward_linear_s * 1e3, b.backward_linear_s * 1e3, b.forward_attention_s * 1e3,
               b.backward_attention_s * 1e3, b.forward_comm_s * 1e3, b.backward_comm_s * 1e3);
  }
}

// Writes `csv` to base.csv and `script` to base.gp, then draws png with
// gnuplot; says so on stdout unless `quiet` (JSON output). 0 on success,
// else Fail's status.
int WriteChart(const std::string& base, const std::string& csv, const std::string& script, const std::string& png,
               bool quiet = false) {
  Status s = distca::WriteFileAtomic(base + ".csv", csv);
  if (s.ok()) s = distca::WriteTextFile(base + ".gp", script);
  if (!s.ok()) return Fail(s.message());
  if (!quiet) fmt::print("wrote {}.csv\n", base);
  // The script's path in single quotes, each quote in it closed, escaped and reopened.
  std::string quoted = "'";
  for (char c : base + ".gp") quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  const std::string command = "gnuplot " + quoted + "'";
  const int rc = std::system(command.c_str());
  if (rc != 0) {
    // The shell exits 127 when it finds no gnuplot.
    const bool exited = rc > 0 && WIFEXITED(rc);
    if (exited && WEXITSTATUS(rc) == 127)
      return Fail(fmt::format("'{}': gnuplot not found; scripts/install-deps installs it", command));
    return Fail(exited ? fmt::format("'{}' failed with exit status {}", command, WEXITSTATUS(rc))
                       : fmt::format("'{}' did not run to completion (status {})", command, rc));
  }
  if (!quiet) fmt::print("wrote {}\n", png);
  return 0;
}

// Creates --out's directory, before the run, and checks that nothing there
// blocks the files it will write (named in `files`).
int MakeOutDir(const std::string& dir, std::initializer_list<std::string> files) {
  // The chart's gnuplot script names the files: a line break (or another
  // control character) in the path would end its string.
  for (const char c : dir)
    if (distca::IsControlByte(c))
      return Fail(
          fmt::format("--out: the path holds a control character (0x{:02x}), which the chart's gnuplot "
                      "script cannot name",
                      static_cast<unsigned char>(c)));
  // Writable, tried now: /sys/kernel was found only when the results were
  // written, after the whole run.
  if (const Status s = distca::CheckOutputDirectory(dir, "output directory"); !s.ok()) return Fail(s.message());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Fail(fmt::format("cannot create '{}': {}", dir, ec.message()));
  for (const std::string& name : files) {
    const std::filesystem::path path = std::filesystem::path(dir) / name;
    if (std::filesystem::is_directory(path, ec))
      return Fail(fmt::format("cannot write '{}': a directory of that name is in the way", path.string()));
  }
  return 0;
}

// --paper-grid: every grid point, all strategies; CSV and a chart.
int RunGrid(const Args& a, const std::vector<int64_t>& pool, const std::vector<distca::SimStrategy>& strategies) {
  if (a.out_dir.empty()) return Fail("--paper-grid needs --out DIR");
  // The chart plots speedups over wlb-ideal: without it (or with it alone)
  // the grid writes its CSV only.
  const bool chart = strategies.size() >= 2 && std::find(strategies.begin(), strategies.end(),
                                                         distca::SimStrategy::kWlbIdeal) != strategies.end();
  std::vector<distca::GridPoint> points;
  Status s = distca::PaperGrid(a.paper_grid, &points, a.grid_recipe);
  if (!s.ok()) return Fail(s.message());
  const std::string grid = "grid_" + a.paper_grid;
  // With the names WriteFileAtomic stages the CSVs under.
  if (const int rc = MakeOutDir(
          a.out_dir, {grid + ".csv", distca::StagingPathOf(grid + ".csv"), grid + ".gp", grid + ".partial.csv",
                      distca::StagingPathOf(grid + ".partial.csv"), "speedup_" + a.paper_grid + ".png"});
      rc != 0)
    return rc;
  distca::WallTimer timer;
  fmt::print("{} grid on {}, {} batches per configuration ({} packing)\n", a.paper_grid, a.sim.hardware.name, a.batches,
             a.packing);
  std::fflush(stdout);  // the lines print as the points complete, even into a file
  const std::string base = a.out_dir + "/" + grid;
  std::string csv = distca::GridCsvHeader();
  bool any_over = false;  // some strategy at some point does not fit
  size_t done = 0;        // points simulated
  for (const distca::GridPoint& p : points) {
    SimOptions o = a.sim;
    s = distca::ModelPreset(p.model, &o.model);
    if (!s.ok()) return Fail(s.message());
    o.gpus = p.gpus;
    o.tp = p.tp;
    o.pp = p.pp;
    o.max_doc_len = p.max_doc_len;
    o.batch_size = p.batch_size;
    o.micro_batches = p.micro_batches;
    o.cad_micro_batches = p.cad_micro_batches;
    o.recompute_mlp = p.recompute_mlp;
    std::vector<std::vector<int64_t>> batches;
    std::vector<SimResult> results;
    s = Sample(pool, a, o, p.elongate, &batches);
    if (s.ok()) s = distca::Simulate(o, batches, strategies, &results);
    if (!s.ok()) {
      // The points before it took minutes, perhaps: their rows are kept.
      std::string kept;
      if (done > 0) {
        const std::string partial = base + ".partial.csv";
        const Status w = distca::WriteFileAtomic(partial, csv);
        kept = w.ok() ? fmt::format(" (the {} points before it are in {})", done, partial)
                      : fmt::format(" (the {} points before it could not be kept: {})", done, w.message());
      }
      return Fail(fmt::format("{}: {}{}", p.Label(), s.message(), kept));
    }
    ++done;
    std::string line = fmt::format("{:<14}", p.Label());
    for (const SimResult& r : results) {
      csv += distca::GridCsvRow(p, r, o, a.packing);
      // "!": the strategy needs more memory than a device has (the CSV's
      // memory_fits 0), as in the tables.
      line += fmt::format("  {} {:.3f}s{} {}", distca::SimStrategyName(r.strategy), r.iteration_s,
                          r.memory_fits ? "" : "!", SpeedupText(r.speedup));
      any_over |= !r.memory_fits;
    }
    fmt::print("{}\n", line);
    std::fflush(stdout);
  }
  fmt::print("grid: {} configurations x {} strategies in {:.1f} s\n", points.size(), strategies.size(),
             timer.Seconds());
  if (any_over) fmt::print("!: needs more memory than a device has (memory_fits 0 in the CSV)\n");
  const std::string png = a.out_dir + "/speedup_" + a.paper_grid + ".png";
  if (!chart) {
    s = distca::WriteFileAtomic(base + ".csv", csv);
    if (!s.ok()) return Fail(s.message());
    fmt::print(
        "wrote {}.csv (no chart: it plots speedups over wlb-ideal, which needs wlb-ideal and another "
        "strategy in --strategies)\n",
        base);
    return 0;
  }
  return WriteChart(
      base, csv,
      distca::SpeedupPlotScript(base + ".csv", png,
                                fmt::format("speedup over wlb-ideal, {} grid on {}, {} batches per configuration",
                                            a.paper_grid, a.sim.hardware.name, a.batches),
                                strategies),
      png);
}

// --tolerance-sweep: CAD strategies at eps in {0, 0.05, 0.1, 0.2, 0.4}, no
// comm budget; with --out, also a CSV and a chart (the paper's Figure 12).
int RunToleranceSweep(const Args& a, const std::vector<std::vector<int64_t>>& batches,
                      const std::vector<distca::SimStrategy>& strategies) {
  std::vector<distca::SimStrategy> cad;
  for (distca::SimStrategy st : strategies)
    if (IsCadStrategy(st)) cad.push_back(st);
  if (cad.empty()) return Fail("--tolerance-sweep needs distca or distca-paper among --strategies");
  if (!a.out_dir.empty())
    if (const int rc = MakeOutDir(a.out_dir, {"tolerance.csv", "tolerance.gp", "tolerance.png"}); rc != 0) return rc;
  std::string csv = distca::ToleranceCsvHeader();
  if (!a.json) {
    const SimOptions& o = a.sim;
    fmt::print("{} on {} ({} GPUs: tp {}, pp {}), L {}, B {}, {} batches, no CAD buffer\n", o.model.name,
               o.hardware.name, o.gpus, o.tp, o.pp, o.max_doc_len, o.batch_size, batches.size());
    fmt::print("{:>5} {:<13} {:>9} {:>10} {:>12}\n", "eps", "strategy", "iter s", "max buffer", "moved/iter");
  }
  for (double eps : {0.0, 0.05, 0.1, 0.2, 0.4}) {
    SimOptions o = a.sim;
    o.tolerance = eps;
    o.fixed_tolerance = true;  // the sweep's eps, not a looser one
    o.comm_budget = 0;
    std::vector<SimResult> results;
    const Status s = distca::Simulate(o, batches, cad, &results);
    if (!s.ok()) return Fail(s.message());
    for (const SimResult& r : results) {
      csv += distca::ToleranceCsvRow(eps, r);
      if (a.json)
        fmt::print("{}\n", ToJson(a, o, r).dump());
      else
        fmt::print("{:>5.2f} {:<13} {:>9.4f} {:>8.3f}GB {:>10.1f}GB\n", eps, distca::SimStrategyName(r.strategy),
                   r.iteration_s, r.max_buffer_bytes * 1e-9, r.bytes_moved * 1e-9);
    }
    std::fflush(stdout);
  }
  if (a.out_dir.empty()) return 0;
  const SimOptions& o = a.sim;
  const std::string base = a.out_dir + "/tolerance", png = base + ".png";
  return WriteChart(base, csv,
                    distca::TolerancePlotScript(
                        base + ".csv", png,
                        fmt::format("{} on {} GPUs of {} (tp {}, pp {}), L {}, B {}, {} batches", o.model.name, o.gpus,
                                    o.hardware.name, o.tp, o.pp, o.max_doc_len, o.batch_size, batches.size()),
                        cad),
                    png, a.json);
}

// --search: every strategy at every (tp, pp) shape; the fastest that fits.
int RunSearch(const Args& a, const std::vector<std::vector<int64_t>>& batches,
              const std::vector<distca::SimStrategy>& strategies) {
  distca::WallTimer timer;
  std::vector<distca::ShapeChoice> best;
  std::vector<distca::ShapeTrial> trials;
  const SimOptions& o = a.sim;
  // The table's rows print as the shapes are simulated (a search of
  // hundreds of GPUs takes minutes); the JSON lines come at the end.
  std::function<void(const distca::ShapeTrial&)> print_row;
  if (!a.json) {
    fmt::print("{} on {} ({} GPUs), L {}, B {}, {} batches: iteration s at each tp x pp ('!' over memory)\n",
               o.model.name, o.hardware.name, o.gpus, o.max_doc_len, o.batch_size, batches.size());
    std::string header = fmt::format("{:>4} {:>4}", "tp", "pp");
    for (distca::SimStrategy st : strategies) header += fmt::format(" {:>13}", distca::SimStrategyName(st));
    fmt::print("{}\n", header);
    std::fflush(stdout);
    print_row = [](const distca::ShapeTrial& t) {
      std::string line = fmt::format("{:>4} {:>4}", t.tp, t.pp), skipped;
      for (size_t i = 0; i < t.results.size(); ++i) {
        const SimResult& r = t.results[i];
        if (t.status[i].ok()) {
          line += fmt::format(" {:>11.4f}{}{}", r.iteration_s, t.screened[i] ? "~" : " ", r.memory_fits ? " " : "!");
        } else {
          line += fmt::format(" {:>13}", "-");
          skipped += fmt::format("\n{:>9}  {}", "", t.status[i].message());  // names the strategy
        }
      }
      fmt::print("{}{}\n", line, skipped);
      std::fflush(stdout);
    };
  }
  const Status s = distca::SearchParallelism(a.sim, batches, strategies, a.shapes, &best, &trials, print_row);
  if (!s.ok()) return Fail(s.message());
  if (a.json) {
    for (const distca::ShapeChoice& c : best) {
      if (!c.status.ok()) {
        const nlohmann::json j = {{"strategy", distca::SimStrategyName(c.result.strategy)},
                                  {"search", "none"},
                                  {"error", c.status.message()}};
        fmt::print("{}\n", j.dump());
        continue;
      }
      SimOptions at = a.sim;
      at.tp = c.tp;
      at.pp = c.pp;
      nlohmann::json j = ToJson(a, at, c.result);
      j["search"] = "best";
      fmt::print("{}\n", j.dump());
    }
    return 0;
  }
  const bool screened = std::any_of(trials.begin(), trials.end(), [](const distca::ShapeTrial& t) {
    return std::find(t.screened.begin(), t.screened.end(), true) != t.screened.end();
  });
  if (screened)
    fmt::print(
        "'~': distca screened (planned without the table), over {:g}% slower there than at its fastest shape so "
        "planned that fits "
        "(--search-exact simulates every shape in full)\n",
        100 * o.search_screen_margin);
  fmt::print("\nbest shape per strategy (speedup over wlb-ideal's best):\n");
  fmt::print("{:<13} {:>4} {:>4} {:>9} {:>11} {:>8} {:>6} {:>9} {:>3}\n", "strategy", "tp", "pp", "iter s", "tokens/s",
             "speedup", "idle", "mem max", "cp");
  for (const distca::ShapeChoice& c : best) {
    const SimResult& r = c.result;
    if (!c.status.ok()) {
      fmt::print("{:<13} runs at no shape (each shape's reason is in its row above)\n",
                 distca::SimStrategyName(r.strategy));
      continue;
    }
    fmt::print("{:<13} {:>4} {:>4} {:>9.4f} {:>11.4g} {:>8} {:>6.3f} {:>9}{} {:>3}\n",
               distca::SimStrategyName(r.strategy), c.tp, c.pp, r.iteration_s, r.tokens_per_s, SpeedupText(r.speedup),
               r.idle_fraction, GbText(r.memory_max_bytes), r.memory_fits ? " " : "!", r.cp);
  }
  fmt::print("searched {} shapes in {:.2f} s\n", trials.size(), timer.Seconds());
  return 0;
}

}  // namespace

int Run(int argc, char** argv) {
  CLI::App app{"distca-sim: simulate long-context training strategies on a cluster"};
  Args a;
  SimOptions& o = a.sim;
  const auto pos = distca::cli::kPositive;
  const auto nonneg = distca::cli::kNonNegative;
  a.model.Add(app, "preset: llama3-8b, llama-34b, small, tiny (Default: llama3-8b)", "override the vocabulary");
  app.add_option("--hardware", a.hardware, "hardware profile JSON (Default: configs/hardware/h200-dgx.json)");
  app.add_option("--hardware-set", a.hardware_set,
                 "FIELD=VALUE: change one field of the hardware profile, FIELD a dotted path into its JSON, array "
                 "elements by index, VALUE JSON (e.g. network.inter_node.bandwidth=25e9, attention_tables.0.scale=1); "
                 "repeatable")
      ->allow_extra_args(false);
  app.add_option("--gpus", o.gpus, "devices N (a multiple of tp x pp)")->check(pos);
  app.add_option("--tp", o.tp, "tensor parallelism: devices per rank (Default: 8)")->check(pos);
  app.add_option("--pp", o.pp, "pipeline stages (Default: 1)")->check(pos);
  app.add_option("--cp", o.cp, "baselines' CP degree (Default: best of a sweep over powers of two)")->check(pos);
  app.add_option("--max-doc-len", o.max_doc_len, "L: chunk length and longest document, tokens")->check(pos);
  app.add_option(
         "--batch-size", o.batch_size,
         "B: L-token chunks per iteration (without --micro-batches, a multiple of G / c for a power-of-two CP degree c "
         "dividing G = gpus / (tp x pp))")
      ->check(pos);
  app.add_option("--lengths", a.lengths, "JSON array of document lengths to sample from")->check(distca::cli::kPath);
  app.add_option("--docs-file", a.docs_file,
                 "JSON {\"batches\": [[len, ...], ...]}: each batch one iteration's global batch (all of equal "
                 "total, a multiple of gpus / (tp x pp)); sets L = total / G and B = G; replaces --lengths")
      ->check(distca::cli::kPath);
  app.add_option("--batches", a.batches, "sampled batches per configuration (Default: 30)")->check(pos);
  app.add_option("--upsample", a.recipe.upsample, "copies of each long document (Default: 1; grid: 4)")->check(pos);
  app.add_option("--upsample-threshold", a.recipe.upsample_threshold, "length from which a document is long (65536)")
      ->check(pos);
  app.add_option("--filter-ratio", a.recipe.filter_ratio,
                 "share of short documents kept, in (0, 1] (Default: 1; grid: 0.5)")
      ->check(distca::cli::kShare);
  app.add_option("--elongate", a.recipe.elongate, "length multiplier (Default: 1; grid: L / 64K)")->check(pos);
  app.add_option("--seed", a.recipe.seed, "sampling seed (Default: 0)");
  app.add_option("--packing", a.packing,
                 "how sampled documents fill a batch: chunks (the DistCA artifact's: B chunks of exactly L tokens, a "
                 "document cut at a chunk's end continuing in the next chunk as a document of its own) or whole "
                 "(documents capped at L and kept whole, the last one cut at the batch's end) (Default: chunks)")
      ->check(CLI::IsMember({"chunks", "whole"}));
  app.add_option("--strategies", a.strategies,
                 "comma-separated from wlb-ideal, megatron, distca-paper, distca, colocated (Default: "
                 "wlb-ideal,megatron,distca-paper,distca)");
  app.add_option("--micro-batches", o.micro_batches,
                 "micro-batches per data-parallel replica, every strategy running the batch's B L tokens as m "
                 "micro-batches (the DistCA artifact: 1 in 3D); Default: 0 = one L-token chunk per micro-batch")
      ->check(nonneg);
  app.add_option("--cad-micro-batches", o.cad_micro_batches,
                 "with --micro-batches: the waves per replica of distca-paper, distca and colocated instead (the "
                 "DistCA artifact's pipeline runs cut B chunks into at most B / 2: a ping and a pong of whole "
                 "chunks each); Default: 0 = --micro-batches")
      ->check(nonneg);
  app.add_option("--servers", o.dedicated_servers, "distca: dedicated attention servers per stage (Default: 0)")
      ->check(nonneg);
  app.add_flag("--no-ping-pong", a.no_ping_pong, "CAD without nano-batch overlap");
  app.add_option("--wire", a.wire,
                 "bytes per row of CAD's all-to-alls, for distca and distca-paper: distca (this runtime's), "
                 "distca-artifact (DistCA's) or distca-artifact-no-resend (DistCA's without resending Q/K/V in the "
                 "backward, pp 1 only); default: distca-paper DistCA's, the others this runtime's");
  app.add_flag("--wlb-artifact-kv", a.wlb_artifact_kv,
               "wlb-ideal keeps for the backward what the DistCA artifact's per-document CP keeps: also each "
               "document's K/V prefixes concatenated for its two query chunks (memory only)");
  app.add_option("--wlb-breakpoint", o.wlb_breakpoint,
                 "wlb-ideal's balancing breakpoint in tokens (its workload (l/b)^2 + l/b); Default: 0 = where a "
                 "document's attention FLOPs equal its linear FLOPs (the DistCA artifact sets 64000 for 8B, 131072 "
                 "for 34B)")
      ->check(nonneg);
  app.add_flag("--no-optimizer-step", a.no_optimizer_step,
               "the run never steps the optimizer, so Adam's moments are never allocated (memory only; the DistCA "
               "artifact's benchmark runs)");
  app.add_flag("--no-distributed-optimizer", a.no_distributed_optimizer,
               "replicate the fp32 master weights and Adam moments on every data-parallel rank (default: sharded, "
               "Megatron-LM's distributed optimizer)");
  app.add_flag("--no-grad-sync", a.no_grad_sync,
               "leave out the data-parallel gradient sync that closes each iteration (as if fully overlapped)");
  app.add_option("--wlb-scope", a.wlb_scope,
                 "with --micro-batches: what wlb-ideal balances at once: whole-batch-artifact-cap (Default: the "
                 "whole batch, the cap as the DistCA artifact's WLB benchmark computes it), whole-batch, "
                 "per-micro-batch");
  app.add_flag("--recompute-mlp", o.recompute_mlp,
               "recompute the MLP in the backward pass too (its 6 x ffn activation bytes per token and layer are "
               "not kept; the DistCA artifact's selective checkpointing)");
  app.add_option("--tolerance", o.tolerance,
                 "CAD planner's eps: distca's first (raised while the buffer binds), distca-paper's lowest of DistCA's "
                 "tolerance lists (Default: 0.05)")
      ->check(nonneg);
  app.add_flag("--plan-by-flops", o.plan_by_flops,
               "distca plans by FLOPs alone at --tolerance, as distca-train does without --cost-table (by default it "
               "plans each tick by the hardware profile's measured attention table and by FLOPs, at --tolerance and "
               "at looser bounds, and keeps the fastest)");
  app.add_flag("--fixed-tolerance", o.fixed_tolerance,
               "distca plans each tick at --tolerance only, not also at looser bounds (which move fewer bytes) "
               "where their tick is shorter");
  app.add_flag("--plan-by-table", o.plan_by_table,
               "distca plans by the hardware profile's measured attention table alone at --tolerance, as "
               "distca-train does with --cost-table");
  app.add_option("--comm-budget", o.comm_budget,
                 "CAD buffer: bytes a device may send or receive in one all-to-all, 0 = unlimited (Default: 2 GiB = "
                 "2147483648)")
      ->check(nonneg);
  app.add_option("--threads", o.threads, "OpenMP threads over batches (Default: OMP_NUM_THREADS)")->check(pos);
  app.add_flag("--json", a.json, "one JSON object per strategy per line");
  app.add_flag("--breakdown", a.breakdown, "also print per-layer linear / attention / comm times");
  app.add_option("--paper-grid", a.paper_grid, "3d or 4d: the paper-style grid, all strategies")
      ->check(CLI::IsMember({"3d", "4d"}));
  app.add_option("--out", a.out_dir,
                 "with --paper-grid: directory for grid_<d>.csv and speedup_<d>.png; with --tolerance-sweep: for "
                 "tolerance.csv and tolerance.png")
      ->check(distca::cli::kPath);
  app.add_option("--grid-elongate-base", a.grid_recipe.elongate_base,
                 "with --paper-grid: elongate = L / this (Default: 65536, the DistCA artifact's)")
      ->check(pos);
  app.add_option("--grid-micro-batches", a.grid_recipe.micro_batches,
                 "with --paper-grid: --micro-batches for every point and strategy (Default: 0 = the artifact's: 1 "
                 "in 3d, 8 in 4d, CAD at most B / 2)")
      ->check(nonneg);
  app.add_flag("--tolerance-sweep", a.tolerance_sweep, "CAD time and buffer at eps 0, 0.05, 0.1, 0.2, 0.4");
  app.add_flag("--search", a.search,
               "size the job: every strategy at every tp x pp of --gpus (tp within a node; with --tp or --pp, only "
               "that tp or pp), and per strategy the "
               "fastest that fits in memory");
  app.add_flag_callback(
      "--search-exact", [&o] { o.search_screen_margin = std::numeric_limits<double>::infinity(); },
      "with --search: simulate distca in full at every shape, not only where its screen "
      "(planned without the table) could be the fastest");
  if (int rc = 0; !distca::cli::Parse(app, argc, argv, &rc)) return rc;

  Status s = a.model.Resolve(&o.model);
  if (!s.ok()) return Fail(s.message());
  o.ping_pong = !a.no_ping_pong;
  o.tolerance += 0.0;  // -0 reads as 0
  o.grad_sync = !a.no_grad_sync;
  o.distributed_optimizer = !a.no_distributed_optimizer;
  o.optimizer_moments = !a.no_optimizer_step;
  o.wlb_artifact_kv = a.wlb_artifact_kv;
  s = distca::ParseWlbScope(a.wlb_scope, &o.wlb_scope);
  if (!s.ok()) return Fail(s.message());
  if (app.count("--wire") > 0) {
    distca::PlanWire wire;
    s = distca::ParsePlanWire(a.wire, &wire);
    if (!s.ok()) return Fail(s.message());
    o.cad_wire = wire;
  }
  if (app.count("--wlb-scope") > 0 && o.micro_batches == 0 && a.paper_grid.empty())
    return Fail("--wlb-scope applies with --micro-batches (or --paper-grid)");
  std::vector<distca::SimStrategy> strategies;
  s = distca::ParseSimStrategies(a.strategies, &strategies);
  if (!s.ok()) return Fail(s.message());
  if (a.hardware.empty()) return Fail("--hardware: the path is empty");
  s = distca::LoadHardwareProfile(FindHardware(a.hardware), &o.hardware, a.hardware_set);
  if (!s.ok()) return Fail(s.message());
  if (a.lengths.empty() == a.docs_file.empty()) return Fail("give exactly one of --lengths and --docs-file");
  if (!a.out_dir.empty() && a.paper_grid.empty() && !a.tolerance_sweep)
    return Fail("--out applies with --paper-grid or --tolerance-sweep");
  // Flags another mode would silently ignore.
  if (a.paper_grid.empty())
    for (const char* flag : {"--grid-elongate-base", "--grid-micro-batches"})
      if (app.count(flag) > 0) return Fail(fmt::format("{} applies with --paper-grid", flag));
  if (a.tolerance_sweep)
    for (const char* flag : {"--tolerance", "--comm-budget", "--breakdown"})
      if (app.count(flag) > 0)
        return Fail(
            fmt::format("--tolerance-sweep sets the tolerance itself, without a comm budget, and prints no "
                        "breakdown: drop {}",
                        flag));
  if (a.search && a.breakdown) return Fail("--search prints no breakdown: drop --breakdown");
  if (app.count("--search-exact") > 0 && !a.search)
    return Fail("--search-exact sets how --search simulates distca: it needs --search");
  // A grid holds both models, each with its own breakpoint.
  if (!a.paper_grid.empty() && app.count("--wlb-breakpoint") > 0)
    return Fail("--wlb-breakpoint is one model's: the grid runs two; drop it or run the grid's points one by one");
  if (a.json && a.breakdown) return Fail("--json carries the breakdown always: drop --breakdown");
  {  // Flags for strategies that --strategies does not list.
    auto listed = [&](std::initializer_list<distca::SimStrategy> any) {
      for (distca::SimStrategy st : strategies)
        for (distca::SimStrategy x : any)
          if (st == x) return true;
      return false;
    };
    using distca::SimStrategy;
    if (app.count("--servers") > 0 && !listed({SimStrategy::kDistca}))
      return Fail("--servers gives distca dedicated servers: it needs distca among --strategies");
    for (const char* flag : {"--plan-by-flops", "--plan-by-table", "--fixed-tolerance"})
      if (app.count(flag) > 0 && !listed({SimStrategy::kDistca}))
        return Fail(fmt::format("{} sets how distca plans: it needs distca among --strategies", flag));
    if (o.plan_by_flops && o.plan_by_table) return Fail("--plan-by-flops and --plan-by-table: give one of the two");
    if (!listed({SimStrategy::kDistca, SimStrategy::kDistcaPaper}))
      if (const char* flag = distca::cli::FirstGiven(app, {"--tolerance", "--comm-budget", "--wire", "--no-ping-pong"}))
        return Fail(fmt::format("{} configures CAD: it needs distca or distca-paper among --strategies", flag));
    if (app.count("--cad-micro-batches") > 0 && std::none_of(strategies.begin(), strategies.end(), RunsAsWaves))
      return Fail(
          "--cad-micro-batches sets the waves of distca-paper, distca and colocated: it needs one of them among "
          "--strategies");
    if (app.count("--cp") > 0 && !listed({SimStrategy::kWlbIdeal, SimStrategy::kMegatron}))
      return Fail("--cp fixes the baselines' CP degree: it needs wlb-ideal or megatron among --strategies");
    for (const char* flag : {"--wlb-scope", "--wlb-artifact-kv", "--wlb-breakpoint"})
      if (app.count(flag) > 0 && !listed({SimStrategy::kWlbIdeal}))
        return Fail(fmt::format("{} configures wlb-ideal: it needs wlb-ideal among --strategies", flag));
    if (a.tolerance_sweep && app.count("--strategies") > 0)
      for (SimStrategy st : strategies)
        if (!IsCadStrategy(st))
          return Fail(fmt::format("--tolerance-sweep runs CAD strategies only: drop {} from --strategies",
                                  distca::SimStrategyName(st)));
  }
  if (a.search) {
    if (!a.docs_file.empty() || !a.paper_grid.empty() || a.tolerance_sweep)
      return Fail(
          "--search samples from --lengths; it does not combine with --docs-file, --paper-grid or "
          "--tolerance-sweep");
    const bool fixed_tp = app.count("--tp") > 0, fixed_pp = app.count("--pp") > 0;
    if (fixed_tp && fixed_pp) return Fail("--search with both --tp and --pp has nothing to choose");
    // A strategy's own flag that rules shapes out would rule them out for
    // every strategy searched (--cp 16 left CAD one shape; the no-resend
    // wire, pp 1 only, left wlb-ideal pp 1: speedups over a baseline that
    // was not searched).
    const auto lists = [&](bool cad) {
      return std::any_of(strategies.begin(), strategies.end(), [&](auto st) { return IsCadStrategy(st) == cad; });
    };
    if (app.count("--cp") > 0 && lists(true))
      return Fail(
          "--search with --cp would hold distca and distca-paper to the shapes whose ranks per stage it "
          "divides: search without --cp, or with --strategies wlb-ideal,megatron");
    if (o.cad_wire == distca::PlanWire::kDistcaArtifactNoResend && lists(false) && !(fixed_pp && o.pp == 1))
      return Fail(
          fmt::format("--search with --wire {} (pp 1 only) would hold the baselines to pp 1 too: search "
                      "with --strategies distca-paper (or distca), or give --pp 1",
                      distca::PlanWireName(*o.cad_wire)));
    if (fixed_tp && o.hardware.gpus_per_node % o.tp != 0)
      return Fail(
          fmt::format("--search keeps a tensor-parallel group within a node: tp ({}) must divide the {} GPUs "
                      "per node",
                      o.tp, o.hardware.gpus_per_node));
    // Every shape, or those with the given tp (or pp). Validate (and
    // sample) at the first; the search tries them all.
    if (o.gpus == 0 || o.max_doc_len == 0 || o.batch_size == 0)
      return Fail("--gpus, --max-doc-len and --batch-size are required");
    // What holds at every shape first: the shapes' loop runs over the GPUs
    // and layers.
    s = distca::ValidateModelConfig(o.model);
    if (!s.ok()) return Fail(s.message());
    if (o.gpus > distca::kMaxSimGpus)
      return Fail(fmt::format("gpus ({}) is above the simulator's limit of {}", o.gpus, distca::kMaxSimGpus));
    for (const auto& [tp, pp] : distca::ParallelShapes(o))
      if ((!fixed_tp || tp == o.tp) && (!fixed_pp || pp == o.pp)) a.shapes.emplace_back(tp, pp);
    if (a.shapes.empty()) {
      // Why not, at the simplest shape the search would have tried.
      SimOptions first = o;
      if (!fixed_tp) first.tp = 1;
      if (!fixed_pp) first.pp = 1;
      const Status why = distca::ValidateSimOptions(first);
      return Fail(
          fmt::format("no (tp, pp) shape of {} GPUs to search: tp divides the {} GPUs per node and the heads, "
                      "pp the {} layers, tp x pp the GPUs, and the other options hold at it{}",
                      o.gpus, o.hardware.gpus_per_node, o.model.num_layers,
                      why.ok() ? "" : fmt::format(" (at tp {}, pp {}: {})", first.tp, first.pp, why.message())));
    }
    std::tie(o.tp, o.pp) = a.shapes.front();
  }
  std::vector<std::vector<int64_t>> batches;
  if (!a.docs_file.empty()) {
    if (!a.paper_grid.empty()) return Fail("--paper-grid samples from --lengths, not --docs-file");
    if (app.count("--max-doc-len") > 0 || app.count("--batch-size") > 0)
      return Fail(
          "--docs-file sets the chunk and batch sizes itself (tokens per rank = batch total / G); drop "
          "--max-doc-len and --batch-size");
    if (const char* flag = distca::cli::FirstGiven(app, distca::cli::kSamplingFlags))
      return Fail(distca::cli::SamplingWithDocsFile(flag));
    if (app.count("--packing") > 0) return Fail(distca::cli::SamplingWithDocsFile("--packing"));
    if (o.gpus == 0) return Fail("--gpus is required");
    SimOptions shape = o;  // the parallel shape alone, before the docs file sets L and B
    shape.max_doc_len = shape.batch_size = 1;
    shape.cp = shape.micro_batches = shape.cad_micro_batches = 0;
    s = distca::ValidateSimOptions(shape);
    if (!s.ok()) return Fail(s.message());
    s = distca::ReadBatchesFile(a.docs_file, &batches);
    if (!s.ok()) return Fail(s.message());
    s = distca::ShapeFromBatches(batches, &o);
    if (!s.ok()) return Fail(fmt::format("{}: {}", a.docs_file, s.message()));
    s = distca::ValidateSimOptions(o);
    if (!s.ok()) return Fail(s.message());
  } else {
    std::vector<int64_t> pool;
    s = distca::ReadLengthsFile(a.lengths, &pool);
    if (!s.ok()) return Fail(s.message());

    if (!a.paper_grid.empty()) {
      if (a.tolerance_sweep) return Fail("--paper-grid and --tolerance-sweep are separate runs");
      if (app.count("--micro-batches") > 0 || app.count("--cad-micro-batches") > 0 || app.count("--recompute-mlp") > 0)
        return Fail(
            "--paper-grid sets micro-batches and MLP recomputation per configuration (use --grid-micro-batches)");
      // The grid sets the shapes, the models and the workload sizes of its
      // configurations itself, and writes CSV and charts.
      if (const char* fixed = distca::cli::FirstGiven(
              app, {"--gpus", "--tp", "--pp", "--cp", "--max-doc-len", "--batch-size", "--elongate", "--model",
                    "--num-layers", "--hidden-size", "--num-attention-heads", "--num-query-groups", "--ffn-hidden-size",
                    "--vocab-size", "--json", "--breakdown"}))
        return Fail(fmt::format("{} does not apply with --paper-grid, which sets it per configuration", fixed));
      // The paper's Pretrain recipe unless overridden on the command line.
      if (app.count("--upsample") == 0) a.recipe.upsample = 4;
      if (app.count("--filter-ratio") == 0) a.recipe.filter_ratio = 0.5;
      return RunGrid(a, pool, strategies);
    }
    if (o.gpus == 0 || o.max_doc_len == 0 || o.batch_size == 0)
      return Fail("--gpus, --max-doc-len and --batch-size are required (or --paper-grid, or --docs-file)");
    s = distca::ValidateSimOptions(o);
    if (!s.ok()) return Fail(s.message());
    s = Sample(pool, a, o, a.recipe.elongate, &batches);
    if (!s.ok()) return Fail(s.message());
  }
  if (a.tolerance_sweep) return RunToleranceSweep(a, batches, strategies);
  if (a.search) return RunSearch(a, batches, strategies);

  distca::WallTimer timer;
  std::vector<SimResult> results;
  s = distca::Simulate(o, batches, strategies, &results);
  if (!s.ok()) return Fail(s.message());
  if (a.json) {
    for (const SimResult& r : results) fmt::print("{}\n", ToJson(a, o, r).dump());
    return 0;
  }
  const int ranks = o.gpus / (o.tp * o.pp);
  const std::string layout =
      o.micro_batches > 0
          ? fmt::format("{} micro-batch(es) per replica{}{}{}", o.micro_batches,
                        o.cad_micro_batches > 0 ? fmt::format(" ({} for CAD)", o.cad_micro_batches) : "",
                        o.recompute_mlp ? ", MLP recomputed" : "",
                        o.wlb_scope != distca::WlbScope::kWholeBatchArtifactCap
                            ? fmt::format(", wlb scope {}", distca::WlbScopeName(o.wlb_scope))
                            : "")
          : fmt::format("{:.3g} chunk(s) per rank", double(o.batch_size) / ranks);
  const bool cad = std::any_of(strategies.begin(), strategies.end(), IsCadStrategy);
  const std::string cad_setup =
      cad ? fmt::format(", CAD buffer {}{}",
                        o.comm_budget > 0 ? fmt::format("{:.3g} GiB per device", double(o.comm_budget) / (1 << 30))
                                          : std::string("unlimited"),
                        o.dedicated_servers > 0
                            ? fmt::format(", distca with {} dedicated server(s) per stage ({} GPUs)",
                                          o.dedicated_servers, o.gpus + o.dedicated_servers * o.tp * o.pp)
                            : std::string())
          : std::string();
  fmt::print(
      "{} on {} ({} GPUs: tp {}, pp {}, {} ranks per stage), L {}, B {} ({}), {} batches{}, ping-pong {}, gradient "
      "sync {}{}\n",
      o.model.name, o.hardware.name, o.gpus, o.tp, o.pp, ranks, o.max_doc_len, o.batch_size, layout, batches.size(),
      a.docs_file.empty() ? fmt::format(" ({} packing)", a.packing) : "", o.ping_pong ? "on" : "off",
      o.grad_sync && !results.empty() ? fmt::format("{:.1f} ms", results.front().grad_sync_s * 1e3) : "off", cad_setup);
  PrintTable(results, a.breakdown);
  fmt::print("simulated in {:.2f} s\n", timer.Seconds());
  return 0;
}

int main(int argc, char** argv) { return distca::cli::GuardedMain(argc, argv, Run, Fail); }
