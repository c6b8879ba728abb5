// Randomized robustness of every JSON input path (plan files, batch files,
// length files): any byte string gives a Status, never a crash or a hang.
// Inputs are mutations of valid documents (so the parser gets deep) plus
// random bytes; run under ASan/UBSan this is a poor man's fuzzer.
#include <gtest/gtest.h>

#include <random>

#include "distca/plan.h"
#include "distca/workload.h"

namespace distca {
namespace {

std::string Mutate(std::string s, std::mt19937_64& rng) {
  static const std::string kAlphabet = "{}[]\",:0123456789-+.eE truefalsn\\\n\x01\xff";
  const int edits = 1 + int(rng() % 8);
  for (int e = 0; e < edits && !s.empty(); ++e) {
    const size_t at = rng() % s.size();
    switch (rng() % 4) {
      case 0:
        s[at] = kAlphabet[rng() % kAlphabet.size()];
        break;  // replace
      case 1:
        s.erase(at, 1 + rng() % 4);
        break;  // delete
      case 2:
        s.insert(at, 1, kAlphabet[rng() % kAlphabet.size()]);
        break;
      default:
        s.insert(at, s.substr(rng() % s.size(), rng() % 16));
        break;  // duplicate a slice
    }
  }
  return s;
}

TEST(JsonFuzzTest, NoInputCrashes) {
  PlanOptions o;
  o.ranks = 3;
  Plan plan;
  ASSERT_TRUE(BuildPlan({900, 40, 2000, 77}, o, CostModel::Flops(o.model), &plan).ok());
  const std::string seeds[] = {PlanToJson(plan), R"({"batches": [[1, 2, 3], [40000, 5]]})", "[3227, 124913, 1, 2]",
                               R"({"ranks": 2, "documents": [], "tasks": []})"};
  std::mt19937_64 rng(7);
  int accepted = 0;
  for (int n = 0; n < 20000; ++n) {
    std::string input;
    if (n % 10 == 0) {
      input.resize(rng() % 64);
      for (char& c : input) c = static_cast<char>(rng());
    } else {
      input = Mutate(seeds[n % 4], rng);
    }
    Plan p;
    std::vector<std::vector<int64_t>> batches;
    std::vector<int64_t> lengths;
    const Status a = PlanFromJson(input, &p);
    const Status b = ParseBatchesJson(input, &batches);
    const Status c = ParseLengthsJson(input, &lengths);
    // Whatever parses must also survive the checks downstream.
    if (a.ok()) {
      const CostModel cost = CostModel::Flops(p.model);
      if (ComputePlanStats(p, cost, &p.stats).ok()) (void)ValidatePlan(p, cost);
    }
    accepted += a.ok() + b.ok() + c.ok();
  }
  EXPECT_GT(accepted, 0);  // some mutations stay valid: the parsers were reached
}

}  // namespace
}  // namespace distca
