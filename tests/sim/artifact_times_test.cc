// Iteration times against real runs: the DistCA artifact measured its WLB
// baseline at several CP degrees and DistCA on the same batches, CodeLlama-34B
// on 8 and 32 H200 nodes (bench/data/artifact-measured-times.csv, read the
// way bench/sim_memory_check.py and bench/sim_measured_check.py describe)
// and Llama-3-8B's shape cut to 4 layers on 8 nodes (artifact-8b-256k-*).
// The model must pick the CP degree the measurements found fastest (34B),
// predict DistCA's measured gain over it, and predict the iteration times
// themselves within the band it had when the data was added.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "artifact_runs.h"

namespace distca {
namespace {

using sim_test::ArtifactRun;

struct Measured {
  ArtifactRun run;
  int samples = 0;
  double seconds = 0;  // mean over the run's sampled batches
};

// The Pretrain runs (dataset `wlbllm`) of the two systems the paper compares.
std::vector<Measured> ReadMeasured() {
  std::vector<Measured> out;
  for (const sim_test::ArtifactRow& row : sim_test::ReadArtifactCsv(
           "artifact-measured-times.csv",
           "source,index,model_size,nodes,bs,mb,num_tokens,mode,cp,pp,dataset,num_samples,mean_ms,min_ms,max_ms")) {
    const std::string& mode = row.at("mode");
    if (row.at("dataset") != "wlbllm" || (mode != "wlbllm" && mode != "d2")) continue;
    EXPECT_EQ(row.at("model_size"), "34b");
    Measured m;
    m.run = sim_test::ParseArtifactRun(row, "num_tokens");
    m.run.buffer_gb = 2;  // the sweep's EXPERIMENT_NVSHMEM_BUFFER_SIZE_GB
    m.samples = std::stoi(row.at("num_samples"));
    m.seconds = std::stod(row.at("mean_ms")) / 1000;
    out.push_back(m);
  }
  return out;
}

TEST(ArtifactTimesTest, FastestDegreeAndDistcasGainAsMeasured) {
  const sim_test::ArtifactInputs in = sim_test::LoadArtifactInputs();
  const std::vector<Measured> runs = ReadMeasured();
  ASSERT_EQ(runs.size(), 13u);
  using Key = std::tuple<int, int64_t, int, int>;  // nodes, t, bs, mb
  struct Group {
    std::map<int, std::pair<double, double>> wlb;  // cp -> measured, predicted seconds
    const Measured* distca = nullptr;
    double distca_predicted = 0;
  };
  std::map<Key, Group> groups;
  for (const Measured& m : runs) {
    const SimResult p = sim_test::SimulateArtifactRun(m.run, in, /*recompute_mlp=*/true, 30);
    ASSERT_GT(p.iteration_s, 0);
    // Absolute time, where the run's mean is over the whole sample (30
    // batches; the simulator's batches are its own draws of the recipe, so a
    // mean over a few batches compares poorly): measured over predicted was
    // 0.96-1.05 (mean 1.00) when the 34B table was set to the kernel's
    // measured speed (2026-12-01; 1.13-1.25 at the 8B fit's 0.74), and is
    // 0.96-1.04 (mean 1.00) with the rings at 45 GB/s.
    if (m.samples >= 30) {
      const double ratio = m.seconds / p.iteration_s;
      EXPECT_GT(ratio, 0.92) << m.run.mode << " cp " << m.run.cp << " t " << m.run.t;
      EXPECT_LT(ratio, 1.08) << m.run.mode << " cp " << m.run.cp << " t " << m.run.t;
    }
    Group& g = groups[{m.run.nodes, m.run.t, m.run.bs, m.run.mb}];
    if (m.run.mode == "wlbllm") {
      g.wlb[m.run.cp] = {m.seconds, p.iteration_s};
    } else {
      g.distca = &m;
      g.distca_predicted = p.iteration_s;
    }
  }
  int degree_checks = 0, gain_checks = 0;
  for (const auto& [key, g] : groups) {
    if (g.wlb.size() < 2) continue;
    const auto fastest = [&](bool predicted) {
      return std::min_element(g.wlb.begin(), g.wlb.end(),
                              [&](const auto& a, const auto& b) {
                                return predicted ? a.second.second < b.second.second : a.second.first < b.second.first;
                              })
          ->first;
    };
    // 128K: CP 8 (CP 4 1.4% slower measured, 2.7% predicted), 256K and
    // 512K: CP 16.
    EXPECT_EQ(fastest(true), fastest(false)) << "t " << std::get<1>(key);
    ++degree_checks;
    // DistCA over the fastest degree, where DistCA ran the whole sample
    // (30 batches; one run stopped after 7): measured 1.063 at 256K,
    // predicted 1.063 (1.056 with the rings at the NIC's nominal 50 GB/s:
    // this gain and the 8B one below are what the profile's 45 GB/s is
    // fitted to).
    if (g.distca != nullptr && g.distca->samples >= 30) {
      const auto& best = g.wlb.at(fastest(false));
      EXPECT_NEAR(best.second / g.distca_predicted, best.first / g.distca->seconds, 0.02) << "t " << std::get<1>(key);
      ++gain_checks;
    }
  }
  EXPECT_EQ(degree_checks, 3);
  EXPECT_EQ(gain_checks, 1);
}

// An earlier set, of Llama-3-8B's shape (DeepSeek-R1-Distill-Llama-8B cut to
// 4 layers) on 8 nodes at tp 8: 20 listed batches of 4 x 256K tokens
// (bench/data/artifact-8b-256k-batches.json), each timed by the WLB baseline
// at CP 1, 2, 4 and 8 (DP 8 / CP) and by DistCA, forward, backward and the
// optimizer step without gradient reduction (artifact-8b-256k-times.csv;
// bench/sim_measured_check.py reads them the same way). As the 3D grid: the
// whole batch as one micro-batch, one balanced bin per replica (what the
// artifact's balancer was called with; `--micro-batches 1`).
TEST(ArtifactTimesTest, Llama8bRunsAsMeasured) {
  std::vector<std::vector<int64_t>> batches;
  ASSERT_TRUE(
      ReadBatchesFile(std::string(DISTCA_SOURCE_DIR) + "/bench/data/artifact-8b-256k-batches.json", &batches).ok());
  const std::vector<sim_test::ArtifactRow> rows = sim_test::ReadArtifactCsv(
      "artifact-8b-256k-times.csv", "sample_id,d2_ms,wlbllm_cp1_ms,wlbllm_cp2_ms,wlbllm_cp4_ms,wlbllm_cp8_ms");
  ASSERT_EQ(rows.size(), batches.size());
  const auto measured_s = [&](size_t batch, const std::string& column) {
    return std::stod(rows[batch].at(column)) / 1000;
  };
  const auto measured = [&](const std::string& column) {
    double sum = 0;
    for (size_t i = 0; i < rows.size(); ++i) sum += measured_s(i, column);
    return sum / double(rows.size());
  };
  SimOptions o;
  ASSERT_TRUE(ModelPreset("llama3-8b", &o.model).ok());
  o.model.num_layers = 4;
  o.hardware = sim_test::LoadArtifactInputs().hw;
  o.gpus = 64;
  o.tp = 8;
  o.grad_sync = false;
  ASSERT_TRUE(ShapeFromBatches(batches, &o).ok());
  o.micro_batches = 1;
  std::map<std::string, std::pair<double, double>> runs;  // column -> measured, predicted seconds
  double sum_sq_log = 0;                                  // over every (system, batch)
  const auto add_batches = [&](const std::string& column, const SimResult& r) {
    ASSERT_EQ(r.iteration_per_batch.size(), rows.size());
    for (size_t i = 0; i < rows.size(); ++i)
      sum_sq_log += std::pow(std::log(measured_s(i, column) / r.iteration_per_batch[i]), 2);
  };
  for (int cp : {1, 2, 4, 8}) {
    o.cp = cp;
    // distca-paper does not use the CP degree: simulated once, with the first.
    std::vector<SimStrategy> strategies = {SimStrategy::kWlbIdeal};
    if (cp == 1) strategies.push_back(SimStrategy::kDistcaPaper);
    std::vector<SimResult> r;
    const Status s = Simulate(o, batches, strategies, &r);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(r.size(), strategies.size());
    const std::string wlb = "wlbllm_cp" + std::to_string(cp) + "_ms";
    runs[wlb] = {measured(wlb), r[0].iteration_s};
    add_batches(wlb, r[0]);
    if (cp == 1) {
      runs["d2_ms"] = {measured("d2_ms"), r[1].iteration_s};
      add_batches("d2_ms", r[1]);
    }
  }
  // Measured over predicted, each system's mean: 0.99-1.05 at the kernel's
  // measured speed and the rings at 45 GB/s (2026-12-01; 1.16-1.33 at the
  // 0.74 the 8B table had been fitted to; 0.94-1.06 with eight chunk
  // micro-batches instead of one bin per replica).
  for (const auto& [column, times] : runs) {
    EXPECT_GT(times.first / times.second, 0.95) << column;
    EXPECT_LT(times.first / times.second, 1.10) << column;
  }
  // Batch by batch: the root mean square of log(measured / predicted) over
  // the 100 times is 0.057 (0.060 at 50 GB/s, 0.073 with chunk
  // micro-batches).
  EXPECT_LT(std::sqrt(sum_sq_log / double(runs.size() * rows.size())), 0.07);
  // DistCA over the fastest WLB degree: measured 1.066 (CP 4, 1.4% ahead of
  // CP 8), predicted 1.067 (CP 8, 0.6% ahead of CP 4; 1.059 at 50 GB/s).
  const auto fastest = [&](bool predicted) {
    double best = 1e300;
    for (const auto& [column, times] : runs)
      if (column != "d2_ms") best = std::min(best, predicted ? times.second : times.first);
    return best;
  };
  EXPECT_NEAR(fastest(true) / runs["d2_ms"].second, fastest(false) / runs["d2_ms"].first, 0.02);
}

}  // namespace
}  // namespace distca
