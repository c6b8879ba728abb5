// The memory model against real runs: the DistCA artifact's 34B sweeps
// recorded which configurations fit on its H200s and which ran out of memory
// (bench/data/artifact-memory-outcomes.csv, read the way
// bench/sim_memory_check.py describes; one sampled batch per configuration
// here). The model may miss some of those that ran out (it leaves out
// fragmentation and library buffers), but it must never call a
// configuration that fit too large, and it must keep the agreement it has.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "distca/sim.h"
#include "distca/workload.h"

namespace distca {
namespace {

struct Outcome {
  int nodes = 0, bs = 0, mb = 0, cp = 0, pp = 0, tp = 0, layers = 0, samples = 0;
  int64_t t = 0;
  std::string mode, outcome;
  bool selective_ckpt = true;
  double buffer_gb = 0;
};

std::vector<Outcome> ReadOutcomes() {
  std::string text;
  EXPECT_TRUE(ReadTextFile(std::string(DISTCA_SOURCE_DIR) + "/bench/data/artifact-memory-outcomes.csv", &text).ok());
  std::istringstream in(text);
  std::string line;
  const auto next = [&] {
    if (!std::getline(in, line)) return false;
    if (!line.empty() && line.back() == '\r') line.pop_back();  // either line ending
    return true;
  };
  next();
  EXPECT_EQ(line, "source,result_dir,nodes,bs,mb,t,mode,cp,pp,tp,layers,selective_ckpt,buffer_gb,samples,runs,outcome");
  std::vector<Outcome> out;
  while (next()) {
    std::vector<std::string> f;
    std::istringstream fields(line);
    for (std::string x; std::getline(fields, x, ',');) f.push_back(x);
    if (f.size() != 16) {
      ADD_FAILURE() << "malformed row: " << line;
      continue;
    }
    Outcome o;
    o.nodes = std::stoi(f[2]);
    o.bs = std::stoi(f[3]);
    o.mb = std::stoi(f[4]);
    o.t = std::stoll(f[5]);
    o.mode = f[6];
    o.cp = std::stoi(f[7]);
    o.pp = std::stoi(f[8]);
    o.tp = std::stoi(f[9]);
    o.layers = std::stoi(f[10]);
    o.selective_ckpt = f[11] == "1";
    o.buffer_gb = std::stod(f[12]);
    o.samples = std::stoi(f[13]);
    o.outcome = f[15];
    out.push_back(o);
  }
  return out;
}

// The predicted peak of one recorded run, one sampled batch (the model's
// peak holds for the whole run's batches in all but a few cases;
// bench/sim_memory_check.py samples as many as the run did).
SimResult Predict(const Outcome& r, const HardwareProfile& hw, const std::vector<int64_t>& pool, bool recompute_mlp) {
  SimOptions o;
  EXPECT_TRUE(ModelPreset("llama-34b", &o.model).ok());
  o.model.num_layers = r.layers;
  o.hardware = hw;
  o.gpus = 8 * r.nodes;
  o.tp = r.tp;
  o.pp = r.pp;
  o.max_doc_len = r.t;
  o.batch_size = 2 * r.bs * r.mb;
  o.micro_batches = r.mb;
  o.recompute_mlp = recompute_mlp;
  o.grad_sync = false;
  o.optimizer_moments = false;  // the artifact's benchmarks never step the optimizer
  o.wlb_artifact_kv = true;     // and its per-document CP keeps the K/V prefixes it concatenates
  std::vector<SimStrategy> strategies;
  if (r.mode == "wlbllm") {
    o.cp = r.cp;
    strategies = {SimStrategy::kWlbIdeal};
  } else {
    o.comm_budget = int64_t(r.buffer_gb * double(int64_t{1} << 30));
    strategies = {SimStrategy::kDistcaPaper};
  }
  WorkloadRecipe recipe;  // the Pretrain recipe, batches packed as the artifact packs them
  recipe.tokens_per_batch = int64_t{o.batch_size} * r.t;
  recipe.chunk_tokens = r.t;
  recipe.upsample = 4;
  recipe.filter_ratio = 0.5;
  recipe.elongate = double(r.t) / 65536;
  std::vector<std::vector<int64_t>> batches;
  EXPECT_TRUE(SampleBatches(pool, recipe, 1, &batches).ok());
  std::vector<SimResult> results;
  const Status s = Simulate(o, batches, strategies, &results);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return results.empty() ? SimResult{} : results.front();
}

TEST(ArtifactMemoryTest, RunsThatFitArePredictedToFit) {
  HardwareProfile hw;
  ASSERT_TRUE(LoadHardwareProfile(std::string(DISTCA_SOURCE_DIR) + "/configs/hardware/h200-dgx.json", &hw).ok());
  std::string text;
  ASSERT_TRUE(ReadTextFile(std::string(DISTCA_SOURCE_DIR) + "/data/doc-lengths-pretrain.json", &text).ok());
  std::vector<int64_t> pool;
  ASSERT_TRUE(ParseLengthsJson(text, &pool).ok());
  const std::vector<Outcome> outcomes = ReadOutcomes();
  ASSERT_GT(outcomes.size(), 100u);
  int right[2] = {0, 0}, total[2] = {0, 0}, oom_caught[2] = {0, 0};
  for (const Outcome& r : outcomes) {
    const int m = r.mode == "wlbllm" ? 0 : 1;
    ASSERT_TRUE(r.mode == "wlbllm" || r.mode == "d2") << r.mode;
    // The MLP recomputed, as selective checkpointing does (d2 is read the
    // same way: its record agrees with that reading, 43 of 49, and not with
    // the MLP kept, 35 of 49).
    const SimResult p = Predict(r, hw, pool, r.selective_ckpt);
    const bool fitted = r.outcome == "pass" || r.outcome == "partial";
    ASSERT_TRUE(fitted || r.outcome == "oom") << r.outcome;
    EXPECT_TRUE(!fitted || p.memory_fits)
        << r.mode << " n " << r.nodes << " bs " << r.bs << " mb " << r.mb << " t " << r.t << " cp " << r.cp << " pp "
        << r.pp << " fit on the H200s, predicted " << p.memory_max_bytes * 1e-9 << " GB";
    ++total[m];
    right[m] += fitted == p.memory_fits;
    oom_caught[m] += !fitted && !p.memory_fits;
  }
  // The agreement measured when the test was written (2026-12-01), over
  // distinct configurations: 60 of 68 WLB (56 with only the gathered K/V
  // kept) and 43 of 49 DistCA; a change to the memory model may raise it,
  // not lower it.
  EXPECT_EQ(total[0], 68);
  EXPECT_EQ(total[1], 49);
  EXPECT_GE(right[0], 60);
  EXPECT_GE(right[1], 43);
  EXPECT_GE(oom_caught[0], 26);
  EXPECT_GE(oom_caught[1], 13);
}

}  // namespace
}  // namespace distca
