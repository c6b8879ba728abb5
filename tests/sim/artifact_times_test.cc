// Iteration times against real runs: the DistCA artifact measured its WLB
// baseline at several CP degrees and DistCA on the same batches, CodeLlama-34B
// on 8 and 32 H200 nodes (bench/data/artifact-measured-times.csv, read the
// way bench/sim_memory_check.py and bench/sim_measured_check.py describe).
// The model must pick the CP degree the measurements found fastest, predict
// DistCA's measured gain over it, and predict the iteration times themselves
// within the band it had when the data was added.
#include <algorithm>
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
    // measured speed (2026-12-01; 1.13-1.25 at the 8B fit's 0.74).
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
    // 128K: CP 8 (CP 4 1.3% slower), 256K and 512K: CP 16.
    EXPECT_EQ(fastest(true), fastest(false)) << "t " << std::get<1>(key);
    ++degree_checks;
    // DistCA over the fastest degree, where DistCA ran the whole sample
    // (30 batches; one run stopped after 7): measured 1.063 at 256K,
    // predicted 1.039.
    if (g.distca != nullptr && g.distca->samples >= 30) {
      const auto& best = g.wlb.at(fastest(false));
      EXPECT_NEAR(best.second / g.distca_predicted, best.first / g.distca->seconds, 0.03) << "t " << std::get<1>(key);
      ++gain_checks;
    }
  }
  EXPECT_EQ(degree_checks, 3);
  EXPECT_EQ(gain_checks, 1);
}

}  // namespace
}  // namespace distca
