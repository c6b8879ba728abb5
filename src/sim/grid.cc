// The paper-style evaluation grid, its CSV rows and the gnuplot chart
// (docs/simulator.md, "Grid").
#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "common/excerpt.h"
#include "distca/sim.h"

namespace distca {
namespace {

constexpr int64_t kK = 1024;

std::string ShortModel(const std::string& preset) {
  if (preset == "llama3-8b") return "8B";
  if (preset == "llama-34b") return "34B";
  return preset;
}

// A gnuplot string literal: single quotes (double quotes would run
// backquoted commands), each quote inside doubled. A single-quoted string
// cannot hold a line break: control characters become spaces (a title's;
// distca-sim refuses them in the paths it writes).
std::string Quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'')
      out += "''";
    else
      out += IsControlByte(c) ? ' ' : c;
  }
  return out + "'";
}

}  // namespace

std::string GridPoint::Label() const { return fmt::format("{} {}K {}", ShortModel(model), max_doc_len / kK, gpus); }

Status PaperGrid(std::string_view dims, std::vector<GridPoint>* points, const GridRecipe& recipe) {
  if (dims != "3d" && dims != "4d")
    return Status::InvalidArgument(fmt::format("unknown paper grid '{}' (expected 3d or 4d)", dims));
  if (recipe.elongate_base <= 0 || recipe.micro_batches < 0)
    return Status::InvalidArgument("grid recipe: elongate base must be positive and micro-batches >= 0");
  // Above it the grid's documents shrink towards one token each, millions a
  // batch (a base of 2^31 took a minute and a GB for one batch a point).
  if (recipe.elongate_base > kMaxGridElongateBase)
    return Status::OutOfRange(
        fmt::format("grid recipe: elongate base {} is above {} (elongate = L / base; at 128K that is at least 1/8)",
                    recipe.elongate_base, kMaxGridElongateBase));
  const bool with_pp = dims == "4d";
  // The paper's Table 3 (3D) and Table 4 (4D): per model and maximum
  // document length, the batch size (chunks of L tokens per iteration) at
  // each GPU count.
  struct Row {
    const char* preset;
    int64_t length;
    std::vector<std::pair<int, int>> gpus_batch;
  };
  // One row of the paper's table per line.
  // clang-format off
  const std::vector<Row> table3 = {
      {"llama3-8b", 128 * kK, {{64, 8}, {128, 16}, {256, 32}}},
      {"llama3-8b", 256 * kK, {{64, 4}, {128, 8}, {256, 16}}},
      {"llama3-8b", 512 * kK, {{64, 2}, {128, 4}, {256, 8}}},
      {"llama-34b", 128 * kK, {{64, 4}, {128, 8}, {256, 16}}},
      {"llama-34b", 256 * kK, {{64, 2}, {128, 4}, {256, 8}}},
      {"llama-34b", 512 * kK, {{64, 2}, {128, 4}, {256, 8}}},
  };
  // clang-format on
  const std::vector<Row> table4 = {
      {"llama3-8b", 128 * kK, {{64, 32}, {128, 64}, {256, 128}}},
      {"llama3-8b", 256 * kK, {{64, 16}, {128, 32}, {256, 32}}},
      {"llama3-8b", 512 * kK, {{64, 8}, {128, 8}, {256, 16}}},
      {"llama-34b", 128 * kK, {{128, 32}, {256, 64}, {512, 128}}},
      {"llama-34b", 256 * kK, {{128, 16}, {256, 32}, {512, 32}}},
      {"llama-34b", 384 * kK, {{128, 8}, {256, 8}, {512, 16}}},
  };
  points->clear();
  for (const Row& row : with_pp ? table4 : table3) {
    for (const auto& [gpus, batch] : row.gpus_batch) {
      GridPoint p;
      p.model = row.preset;
      p.gpus = gpus;
      p.tp = 8;
      // The artifact's 4D configurations use two stages (the paper grid-
      // searches PP to avoid running out of memory).
      p.pp = with_pp ? 2 : 1;
      p.max_doc_len = row.length;
      p.batch_size = batch;
      p.elongate = double(row.length) / double(recipe.elongate_base);
      p.micro_batches = recipe.micro_batches > 0 ? recipe.micro_batches : (with_pp ? 8 : 1);
      // As the artifact runs them, DistCA's pipeline fills each micro-batch's
      // ping and pong with whole sequences, a chunk at least each
      // (create_pp_microbatches, once per nano-batch): CAD cuts the batch
      // into at most B / 2 waves. A count given for the grid holds for all.
      if (recipe.micro_batches == 0 && p.micro_batches > batch / 2) p.cad_micro_batches = std::max(1, batch / 2);
      // The artifact recomputes the MLP from 256K on in its 3D sweeps, and
      // at every length in its 34B pipeline sweeps (their launcher,
      // salloc_srun.pp_34b.v2.sh, exports EXPERIMENT_ADD_SELECTIVE_CKPT=1).
      p.recompute_mlp = row.length >= 256 * kK || (with_pp && p.model == "llama-34b");
      points->push_back(p);
    }
  }
  return Status::Ok();
}

std::string GridCsvHeader() {
  return "config,model,gpus,tp,pp,max_doc_len,batch_size,strategy,iteration_s,tokens_per_s,speedup,"
         "idle_fraction,memory_max_gb,memory_mean_gb,memory_fits,bytes_moved_gb,max_buffer_gb,cp,tolerance_used,"
         "load_max_over_mean,micro_batches,recompute_mlp,wlb_scope,grad_sync_s,ping_pong,wire,comm_budget,tolerance,"
         "servers,grad_sync,distributed_optimizer,optimizer_moments,wlb_artifact_kv,packing,hardware\n";
}

namespace {

// A CSV field: quoted (inner quotes doubled) when it holds a comma, a quote
// or a line break, as a profile's name with its overrides can.
std::string CsvField(std::string_view text) {
  if (text.find_first_of(",\"\n\r") == std::string_view::npos) return std::string(text);
  std::string out = "\"";
  for (char ch : text) {
    if (ch == '"') out += '"';
    out += ch;
  }
  return out + "\"";
}

}  // namespace

std::string GridCsvRow(const GridPoint& p, const SimResult& r, const SimOptions& run, std::string_view packing) {
  // Empty where the strategy has none: the tolerance its CAD plans used, the
  // wire format its all-to-alls carry.
  const bool cad = IsCadStrategy(r.strategy);
  const std::optional<PlanWire> wire = StrategyWire(r.strategy, run);
  return fmt::format(
      "{},{},{},{},{},{},{},{},{:.6f},{:.1f},{},{:.4f},{:.3f},{:.3f},{},{:.3f},{:.4f},{},{},"
      "{},{},{},{},{:.6f},{},{},{},{},{},{},{},{},{},{},{}\n",
      p.Label(), p.model, p.gpus, p.tp, p.pp, p.max_doc_len, p.batch_size, SimStrategyName(r.strategy), r.iteration_s,
      r.tokens_per_s, r.speedup > 0 ? fmt::format("{:.4f}", r.speedup) : std::string(), r.idle_fraction,
      r.memory_max_bytes * 1e-9, r.memory_mean_bytes * 1e-9, r.memory_fits ? 1 : 0, r.bytes_moved * 1e-9,
      r.max_buffer_bytes * 1e-9, r.cp, cad ? fmt::format("{:.3f}", r.tolerance_used) : std::string(),
      cad ? fmt::format("{:.4f}", r.load_max_over_mean) : std::string(),
      RunsAsWaves(r.strategy) && p.cad_micro_batches > 0 ? p.cad_micro_batches : p.micro_batches,
      p.recompute_mlp ? 1 : 0, WlbScopeName(run.wlb_scope), r.grad_sync_s, run.ping_pong ? 1 : 0,
      wire ? PlanWireName(*wire) : "", run.comm_budget, run.tolerance, run.dedicated_servers, run.grad_sync ? 1 : 0,
      run.distributed_optimizer ? 1 : 0, run.optimizer_moments ? 1 : 0, run.wlb_artifact_kv ? 1 : 0, packing,
      CsvField(run.hardware.name));
}

std::string SpeedupPlotScript(const std::string& csv_path, const std::string& png_path, const std::string& title,
                              const std::vector<SimStrategy>& strategies) {
  // Rows come in groups of strategies.size() per configuration, in the order
  // given; `every K::i` picks strategy i of each group. Column 1 is the
  // configuration label, column 11 the speedup.
  const size_t k = strategies.size();
  std::string plots;
  for (size_t i = 0; i < k; ++i) {
    if (strategies[i] == SimStrategy::kWlbIdeal) continue;
    if (!plots.empty()) plots += ", \\\n     ";
    plots += fmt::format("{} skip 1 every {}::{} using 11:xtic(1) title '{}'", Quoted(csv_path), k, i,
                         SimStrategyName(strategies[i]));
  }
  return fmt::format(
      "set datafile separator ','\n"
      "set terminal pngcairo size 1600,640\n"
      "set output {}\n"
      "set title {}\n"
      "set style data histograms\n"
      "set style histogram cluster gap 1\n"
      "set style fill solid 0.85 border -1\n"
      "set boxwidth 0.9\n"
      "set ylabel 'speedup over wlb-ideal'\n"
      "set xtics rotate by -60 font ',9'\n"
      // From 0.6 (bars differ by a few percent), or lower when a bar is:
      // a bar below the range would not be drawn at all.
      "stats {} skip 1 using 11 nooutput\n"
      "set yrange [(STATS_min < 0.6 ? floor(STATS_min * 10) / 10.0 : 0.6):(STATS_max > 1.0 ? STATS_max * 1.02 : "
      "1.05)]\n"
      "set grid ytics\n"
      "set key above\n"
      "plot {}, \\\n     1 with lines dashtype 2 linecolor rgb 'black' notitle\n",
      Quoted(png_path), Quoted(title), Quoted(csv_path), plots);
}

std::string ToleranceCsvHeader() { return "eps,strategy,iteration_s,max_buffer_gb,bytes_moved_gb\n"; }

std::string ToleranceCsvRow(double eps, const SimResult& r) {
  return fmt::format("{:.3f},{},{:.6f},{:.4f},{:.3f}\n", eps, SimStrategyName(r.strategy), r.iteration_s,
                     r.max_buffer_bytes * 1e-9, r.bytes_moved * 1e-9);
}

std::string TolerancePlotScript(const std::string& csv_path, const std::string& png_path, const std::string& title,
                                const std::vector<SimStrategy>& strategies) {
  // Rows come in groups of strategies.size() per eps; `every K::i` picks
  // strategy i. Column 1 is eps, 3 the iteration time, 4 the buffer.
  const size_t k = strategies.size();
  auto lines = [&](int column) {
    std::string plots;
    for (size_t i = 0; i < k; ++i) {
      if (!plots.empty()) plots += ", \\\n     ";
      plots += fmt::format("{} skip 1 every {}::{} using 1:{} with linespoints title '{}'", Quoted(csv_path), k, i,
                           column, SimStrategyName(strategies[i]));
    }
    return plots;
  };
  return fmt::format(
      "set datafile separator ','\n"
      "set terminal pngcairo size 1400,560\n"
      "set output {}\n"
      "set multiplot layout 1,2 title {}\n"
      "set xlabel 'tolerance eps'\n"
      "set grid\n"
      "set key above\n"
      "set ylabel 'iteration (s)'\n"
      "plot {}\n"
      "set ylabel 'largest per-layer send + receive per device (GB)'\n"
      "set yrange [0:*]\n"
      "plot {}\n"
      "unset multiplot\n",
      Quoted(png_path), Quoted(title), lines(3), lines(4));
}

}  // namespace distca
