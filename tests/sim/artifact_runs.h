// The DistCA artifact's recorded runs of CodeLlama-34B on H200s, read from
// bench/data/*.csv and simulated the way bench/sim_memory_check.py and
// bench/sim_measured_check.py describe: 2 bs mb sequences of t tokens in mb
// micro-batches, the Pretrain recipe elongated t / 64K and packed as the
// artifact packs it, no gradient sync and no optimizer step (its benchmark
// times neither); `wlbllm` runs wlb-ideal at CP `cp` with its per-document
// CP's K/V prefixes kept, `d2` runs distca-paper with its NVSHMEM buffer as
// the comm budget.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "distca/sim.h"
#include "distca/workload.h"

namespace distca::sim_test {

// One row of a bench/data CSV, by column name.
using ArtifactRow = std::map<std::string, std::string>;

// The rows of bench/data/NAME, whose header must be `header`, split at
// commas (the files quote nothing).
inline std::vector<ArtifactRow> ReadArtifactCsv(const std::string& name, const std::string& header) {
  std::string text;
  EXPECT_TRUE(ReadTextFile(std::string(DISTCA_SOURCE_DIR) + "/bench/data/" + name, &text).ok()) << name;
  std::istringstream in(text);
  const auto split = [](const std::string& line) {
    std::vector<std::string> f;
    std::istringstream fields(line);
    for (std::string x; std::getline(fields, x, ',');) f.push_back(x);
    return f;
  };
  const std::vector<std::string> columns = split(header);
  std::vector<ArtifactRow> rows;
  std::string line;
  bool first = true;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();  // either line ending
    if (first) {
      EXPECT_EQ(line, header) << name;
      first = false;
      continue;
    }
    const std::vector<std::string> f = split(line);
    if (f.size() != columns.size()) {
      ADD_FAILURE() << name << ": malformed row: " << line;
      continue;
    }
    ArtifactRow row;
    for (size_t i = 0; i < f.size(); ++i) row[columns[i]] = f[i];
    rows.push_back(std::move(row));
  }
  return rows;
}

struct ArtifactRun {
  int nodes = 0, bs = 0, mb = 0, cp = 0, pp = 1, tp = 8, layers = 48;
  int64_t t = 0;
  std::string mode;  // wlbllm or d2
  double buffer_gb = 0;
};

// The run's shape from the columns both files have (nodes, bs, mb, mode,
// cp, pp) and its sequence length from `tokens_column`; tp, layers and the
// buffer keep their defaults.
inline ArtifactRun ParseArtifactRun(const ArtifactRow& row, const std::string& tokens_column) {
  ArtifactRun r;
  r.nodes = std::stoi(row.at("nodes"));
  r.bs = std::stoi(row.at("bs"));
  r.mb = std::stoi(row.at("mb"));
  r.t = std::stoll(row.at(tokens_column));
  r.mode = row.at("mode");
  r.cp = std::stoi(row.at("cp"));
  r.pp = std::stoi(row.at("pp"));
  return r;
}

struct ArtifactInputs {
  HardwareProfile hw;
  std::vector<int64_t> pool;  // the Pretrain lengths
};

inline ArtifactInputs LoadArtifactInputs() {
  ArtifactInputs in;
  EXPECT_TRUE(LoadHardwareProfile(std::string(DISTCA_SOURCE_DIR) + "/configs/hardware/h200-dgx.json", &in.hw).ok());
  std::string text;
  EXPECT_TRUE(ReadTextFile(std::string(DISTCA_SOURCE_DIR) + "/data/doc-lengths-pretrain.json", &text).ok());
  EXPECT_TRUE(ParseLengthsJson(text, &in.pool).ok());
  return in;
}

inline SimResult SimulateArtifactRun(const ArtifactRun& r, const ArtifactInputs& in, bool recompute_mlp, int batches) {
  SimOptions o;
  EXPECT_TRUE(ModelPreset("llama-34b", &o.model).ok());
  o.model.num_layers = r.layers;
  o.hardware = in.hw;
  o.gpus = 8 * r.nodes;
  o.tp = r.tp;
  o.pp = r.pp;
  o.max_doc_len = r.t;
  o.batch_size = 2 * r.bs * r.mb;
  o.micro_batches = r.mb;
  o.recompute_mlp = recompute_mlp;
  o.grad_sync = false;
  o.optimizer_moments = false;
  o.wlb_artifact_kv = true;
  std::vector<SimStrategy> strategies;
  if (r.mode == "wlbllm") {
    o.cp = r.cp;
    strategies = {SimStrategy::kWlbIdeal};
  } else {
    EXPECT_EQ(r.mode, "d2");
    o.comm_budget = int64_t(r.buffer_gb * double(int64_t{1} << 30));
    strategies = {SimStrategy::kDistcaPaper};
  }
  WorkloadRecipe recipe;
  recipe.tokens_per_batch = int64_t{o.batch_size} * r.t;
  recipe.chunk_tokens = r.t;
  recipe.upsample = 4;
  recipe.filter_ratio = 0.5;
  recipe.elongate = double(r.t) / 65536;
  std::vector<std::vector<int64_t>> sampled;
  EXPECT_TRUE(SampleBatches(in.pool, recipe, batches, &sampled).ok());
  std::vector<SimResult> results;
  const Status s = Simulate(o, sampled, strategies, &results);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return results.empty() ? SimResult{} : results.front();
}

}  // namespace distca::sim_test
