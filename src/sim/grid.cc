// The paper-style evaluation grid, its CSV rows and the gnuplot chart
// (docs/simulator.md, "Grid").
#include <fmt/format.h>

#include <algorithm>

#include "distca/sim.h"

namespace distca {
namespace {

constexpr int64_t kK = 1024;

std::string ShortModel(const std::string& preset) {
  if (preset == "llama3-8b") return "8B";
  if (preset == "llama-34b") return "34B";
  return preset;
}

}  // namespace

std::string GridPoint::Label() const { return fmt::format("{} {}K {}", ShortModel(model), max_doc_len / kK, gpus); }

Status PaperGrid(std::string_view dims, std::vector<GridPoint>* points, const GridRecipe& recipe) {
  if (dims != "3d" && dims != "4d")
    return Status::InvalidArgument(fmt::format("unknown paper grid '{}' (expected 3d or 4d)", dims));
  if (recipe.elongate_base <= 0 || recipe.tokens_per_rank < 0)
    return Status::InvalidArgument("grid recipe: elongate base must be positive and tokens per rank >= 0");
  const bool with_pp = dims == "4d";
  points->clear();
  struct ModelRow {
    const char* preset;
    int pp;
    std::vector<int64_t> lengths;
  };
  const ModelRow rows[] = {
      {"llama3-8b", with_pp ? 2 : 1, {128 * kK, 256 * kK, 512 * kK}},
      {"llama-34b", with_pp ? 4 : 1, {128 * kK, 256 * kK, with_pp ? 384 * kK : 512 * kK}},
  };
  for (const ModelRow& row : rows) {
    for (int64_t L : row.lengths) {
      for (int gpus : {64, 128, 256, 512}) {
        GridPoint p;
        p.model = row.preset;
        p.gpus = gpus;
        p.tp = 8;
        p.pp = row.pp;
        p.max_doc_len = L;
        const int64_t ranks = gpus / (p.tp * row.pp);
        // Two chunks per rank and pipeline stage (m = 2 pp), or a fixed
        // number of tokens per rank and stage.
        p.batch_size = recipe.tokens_per_rank == 0
                           ? int(2 * row.pp * ranks)
                           : int(std::max<int64_t>(1, row.pp * ranks * recipe.tokens_per_rank / L));
        p.elongate = double(L) / double(recipe.elongate_base);
        points->push_back(p);
      }
    }
  }
  return Status::Ok();
}

std::string GridCsvHeader() {
  return "config,model,gpus,tp,pp,max_doc_len,batch_size,strategy,iteration_s,tokens_per_s,speedup,"
         "idle_fraction,memory_max_gb,memory_mean_gb,memory_fits,bytes_moved_gb,max_buffer_gb,cp,tolerance_used\n";
}

std::string GridCsvRow(const GridPoint& p, const SimResult& r) {
  return fmt::format("{},{},{},{},{},{},{},{},{:.6f},{:.1f},{:.4f},{:.4f},{:.3f},{:.3f},{},{:.3f},{:.4f},{},{:.3f}\n",
                     p.Label(), p.model, p.gpus, p.tp, p.pp, p.max_doc_len, p.batch_size, SimStrategyName(r.strategy),
                     r.iteration_s, r.tokens_per_s, r.speedup, r.idle_fraction, r.memory_max_bytes * 1e-9,
                     r.memory_mean_bytes * 1e-9, r.memory_fits ? 1 : 0, r.bytes_moved * 1e-9, r.max_buffer_bytes * 1e-9,
                     r.cp, r.tolerance_used);
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
    plots += fmt::format("'{}' skip 1 every {}::{} using 11:xtic(1) title '{}'", csv_path, k, i,
                         SimStrategyName(strategies[i]));
  }
  return fmt::format(
      "set datafile separator ','\n"
      "set terminal png size 1600,640\n"
      "set output '{}'\n"
      "set title '{}'\n"
      "set style data histograms\n"
      "set style histogram cluster gap 1\n"
      "set style fill solid 0.85 border -1\n"
      "set boxwidth 0.9\n"
      "set ylabel 'speedup over wlb-ideal'\n"
      "set xtics rotate by -60 font ',9'\n"
      "set yrange [0.6:*]\n"
      "set grid ytics\n"
      "set key top left\n"
      "plot {}, \\\n     1 with lines dashtype 2 linecolor rgb 'black' notitle\n",
      png_path, title, plots);
}

}  // namespace distca
