// Property tests: every policy's plan validates on >= 10,000 random batches
// (and on 1,000 staged layouts),
// and `distca` meets max load <= (1 + eps) * mean on every batch where that
// bound is achievable at block granularity.
//
// Achievability oracle. The work of a batch is a set of indivisible units: the
// segments of each document between allowed cuts (block multiples and piece
// boundaries). The bound is achievable iff the units can be packed into the
// servers with every server at most C = (1 + eps) * mean. The test decides:
//   - not achievable when some unit alone costs more than C (certificate);
//   - achievable when first-fit decreasing packs all units within C;
//   - otherwise undecided (counted and reported; the bound is not checked).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "common/file_util.h"
#include "distca/plan.h"
#include "distca/workload.h"

namespace distca {
namespace {

struct Case {
  std::string family;
  std::vector<int64_t> lengths;
  PlanOptions options;
  // When not empty: a given layout instead of the linear one (pipeline
  // stages, each holding its own documents on its own ranks), planned with
  // BuildPlanForLayout and checked with ValidatePlanForLayout.
  std::vector<PlanDocument> layout;
};

Status Build(const Case& c, const PlanOptions& o, const CostModel& cost, Plan* plan) {
  return c.layout.empty() ? BuildPlan(c.lengths, o, cost, plan) : BuildPlanForLayout(c.layout, o, cost, plan);
}

enum class Achievable { kYes, kNo, kUndecided };

Achievable Oracle(const Plan& colocated, const CostModel& cost, double eps) {
  const int servers = colocated.servers();
  double total = 0;
  std::vector<double> units;
  for (const PlanDocument& doc : colocated.documents) {
    std::vector<int64_t> cuts = {0, doc.length};
    for (int64_t x = colocated.block; x < doc.length; x += colocated.block) cuts.push_back(x);
    for (const PlanPiece& p : doc.pieces) cuts.push_back(p.begin);
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      units.push_back(cost.TaskCost(cuts[i], cuts[i + 1]));
      total += units.back();
    }
  }
  const double cap = (1 + eps) * total / servers;
  std::sort(units.begin(), units.end(), std::greater<>());
  if (units.front() > cap * (1 + 1e-12)) return Achievable::kNo;
  std::vector<double> bins(servers, 0.0);
  for (double u : units) {
    auto it = std::find_if(bins.begin(), bins.end(), [&](double b) { return b + u <= cap; });
    if (it == bins.end()) return Achievable::kUndecided;
    *it += u;
  }
  return Achievable::kYes;
}

struct Tally {
  int plans = 0, bound_checked = 0, not_achievable = 0, undecided = 0;
};

// Plans `c` with every policy, validates each plan, and checks the distca bound.
void CheckCase(const Case& c, std::map<std::string, Tally>* tallies) {
  const CostModel cost = CostModel::Flops(c.options.model);
  Plan colocated;
  {
    PlanOptions o = c.options;
    o.policy = PlanPolicy::kColocated;
    ASSERT_TRUE(Build(c, o, cost, &colocated).ok());
  }
  for (PlanPolicy policy : {PlanPolicy::kColocated, PlanPolicy::kPaper, PlanPolicy::kDistca}) {
    PlanOptions o = c.options;
    o.policy = policy;
    Plan plan;
    const Status built = Build(c, o, cost, &plan);
    ASSERT_TRUE(built.ok()) << c.family << " " << PlanPolicyName(policy) << ": " << built.ToString();
    const Status valid = c.layout.empty() ? ValidatePlan(plan, cost) : ValidatePlanForLayout(plan, cost);
    ASSERT_TRUE(valid.ok()) << c.family << " " << PlanPolicyName(policy) << ": " << valid.ToString();
    Tally& t = (*tallies)[PlanPolicyName(policy)];
    ++t.plans;
    const double cap = (1 + o.tolerance) * plan.stats.load_mean;
    const bool within = plan.stats.load_max <= cap * (1 + 1e-9);
    EXPECT_EQ(plan.bound_met, within) << c.family << " " << PlanPolicyName(policy)
                                      << ": bound_met must say whether max <= (1 + eps) * mean";
    if (policy != PlanPolicy::kDistca) continue;
    switch (Oracle(colocated, cost, o.tolerance)) {
      case Achievable::kYes:
        ++t.bound_checked;
        EXPECT_TRUE(within) << c.family << ": achievable bound missed, max/mean " << plan.stats.max_over_mean()
                            << " with eps " << o.tolerance << ", " << c.lengths.size() << " documents on " << o.ranks
                            << "+" << o.dedicated_servers << " servers";
        break;
      case Achievable::kNo:
        ++t.not_achievable;
        break;
      case Achievable::kUndecided:
        ++t.undecided;
        break;
    }
  }
}

void Report(const std::map<std::string, Tally>& tallies) {
  for (const auto& [name, t] : tallies) {
    std::printf("%-9s plans %d, bound checked %d, not achievable %d, undecided %d\n", name.c_str(), t.plans,
                t.bound_checked, t.not_achievable, t.undecided);
  }
}

const std::vector<int64_t>& PretrainLengths() {
  static const std::vector<int64_t> lengths = [] {
    std::string text;
    std::vector<int64_t> v;
    EXPECT_TRUE(ReadTextFile(DISTCA_SOURCE_DIR "/data/doc-lengths-pretrain.json", &text).ok());
    EXPECT_TRUE(ParseLengthsJson(text, &v).ok());
    return v;
  }();
  return lengths;
}

PlanOptions RandomOptions(std::mt19937_64& rng, int ranks) {
  PlanOptions o;
  o.ranks = ranks;
  o.dedicated_servers = rng() % 5 == 0 ? int(rng() % 4) + 1 : 0;
  const double eps[] = {0.02, 0.05, 0.05, 0.1, 0.2};
  o.tolerance = eps[rng() % 5];
  const int64_t blocks[] = {128, 128, 64, 16};
  o.block = blocks[rng() % 4];
  return o;
}

// 6,000 batches sampled from the pretraining distribution with the paper's
// recipe at several elongations, ranks and token budgets.
TEST(PlanPropertyTest, PretrainBatches) {
  std::mt19937_64 rng(1);
  std::map<std::string, Tally> tallies;
  const int ranks_choices[] = {1, 2, 3, 4, 8, 16, 32, 64};
  const int64_t tpr_choices[] = {512, 2048, 8192, 32768};
  const double elongate_choices[] = {1, 2, 4, 8};
  for (int n = 0; n < 6000; ++n) {
    Case c;
    c.family = "pretrain";
    const int ranks = ranks_choices[rng() % 8];
    c.options = RandomOptions(rng, ranks);
    WorkloadRecipe r;
    r.tokens_per_batch = int64_t{ranks} * tpr_choices[rng() % 4];
    r.elongate = elongate_choices[rng() % 4];
    r.upsample = rng() % 2 ? 4 : 1;
    r.filter_ratio = rng() % 2 ? 0.5 : 1.0;
    r.seed = rng();
    std::vector<std::vector<int64_t>> batches;
    ASSERT_TRUE(SampleBatches(PretrainLengths(), r, 1, &batches).ok());
    c.lengths = batches[0];
    ASSERT_NO_FATAL_FAILURE(CheckCase(c, &tallies));
  }
  Report(tallies);
  EXPECT_GT(tallies["distca"].bound_checked, 5000);
}

// distca plans with exact bytes, so on the benchmark's workload (distca-bench
// plan: Pretrain recipe, elongate 4, 128K tokens per rank, Llama-3-8B
// shapes) it moves no more than the paper policy, which estimates them: 350
// batches at 8 ranks (seeds 2000-8000 as `distca-bench plan --seed` draws
// them), none more than 1% above the paper policy's bytes. (Before a
// receiver's own piece counted as bringing the K/V prefix, 6 of 570 such
// batches moved up to 14% more.)
TEST(PlanPropertyTest, DistcaMovesNoMoreThanPaper) {
  const PlanModel model;
  const CostModel cost = CostModel::Flops(model);
  WorkloadRecipe r;
  r.upsample = 4;
  r.filter_ratio = 0.5;
  r.elongate = 4;
  r.tokens_per_batch = 8 * int64_t{128 * 1024};
  double worst = 0;
  int compared = 0;
  for (uint64_t seed = 2000; seed <= 8000; seed += 1000) {
    r.seed = seed + 8;
    std::vector<std::vector<int64_t>> batches;
    ASSERT_TRUE(SampleBatches(PretrainLengths(), r, 50, &batches).ok());
    for (const auto& batch : batches) {
      int64_t bytes[2] = {};
      for (PlanPolicy policy : {PlanPolicy::kPaper, PlanPolicy::kDistca}) {
        PlanOptions o;
        o.ranks = 8;
        o.policy = policy;
        o.model = model;
        Plan plan;
        ASSERT_TRUE(BuildPlan(batch, o, cost, &plan).ok());
        bytes[policy == PlanPolicy::kDistca] = plan.stats.traffic.total_bytes();
      }
      ASSERT_GT(bytes[0], 0);
      worst = std::max(worst, double(bytes[1]) / double(bytes[0]));
      ++compared;
    }
  }
  EXPECT_EQ(compared, 350);
  EXPECT_LE(worst, 1.01) << "distca's bytes over the paper policy's, worst batch";
}

// 4,000 adversarial batches.
TEST(PlanPropertyTest, AdversarialBatches) {
  std::mt19937_64 rng(2);
  std::map<std::string, Tally> tallies;
  for (int n = 0; n < 4000; ++n) {
    Case c;
    const int kind = n % 8;
    int ranks = 1 + int(rng() % 16);
    std::uniform_int_distribution<int64_t> small(1, 40), medium(1, 5000);
    switch (kind) {
      case 0:  // one giant document, perhaps with crumbs
        c.family = "giant";
        c.lengths = {int64_t(ranks) * (1000 + int64_t(rng() % 50000))};
        for (int i = int(rng() % 3); i > 0; --i) c.lengths.push_back(small(rng));
        break;
      case 1:  // thousands of tiny documents
        c.family = "tiny";
        for (int i = 0; i < 2000 + int(rng() % 2000); ++i) c.lengths.push_back(small(rng));
        break;
      case 2:  // all length 1
        c.family = "ones";
        c.lengths.assign(ranks * (1 + rng() % 300), 1);
        break;
      case 3:  // lengths that are not block multiples
        c.family = "unaligned";
        for (int i = 0; i < 5 + int(rng() % 60); ++i) c.lengths.push_back(medium(rng) * 2 + 1);
        break;
      case 4:  // R = 1
        c.family = "r1";
        ranks = 1;
        for (int i = 0; i < 1 + int(rng() % 20); ++i) c.lengths.push_back(medium(rng) * 4);
        break;
      case 5:  // more ranks than documents
        c.family = "few-docs";
        ranks = 8 + int(rng() % 56);
        for (int i = 0; i < 1 + int(rng() % 4); ++i) c.lengths.push_back(ranks * (200 + int64_t(rng() % 4000)));
        break;
      case 6:  // a few long documents among many short ones
        c.family = "mixed";
        for (int i = 0; i < 200; ++i) c.lengths.push_back(small(rng) * 10);
        for (int i = 0; i < 3; ++i) c.lengths.push_back(20000 + int64_t(rng() % 100000));
        std::shuffle(c.lengths.begin(), c.lengths.end(), rng);
        break;
      default:  // equal documents, one per rank
        c.family = "equal";
        c.lengths.assign(ranks, 128 * (1 + int64_t(rng() % 64)));
        break;
    }
    c.options = RandomOptions(rng, ranks);
    ASSERT_NO_FATAL_FAILURE(CheckCase(c, &tallies));
  }
  Report(tallies);
  EXPECT_GT(tallies["distca"].bound_checked, 3000);  // 3,987 today: the bound is checked, not skipped
}

// 1,000 staged layouts, as the simulator's pipeline ticks build them: 1-4
// stages of 1-16 ranks, each stage's own sampled documents on its own ranks
// (stages of different sizes, some with nothing in this nano-batch).
TEST(PlanPropertyTest, StagedLayouts) {
  std::mt19937_64 rng(3);
  std::map<std::string, Tally> tallies;
  for (int n = 0; n < 1000; ++n) {
    Case c;
    c.family = "staged";
    const int stages = 1 + int(rng() % 4), per_stage = 1 + int(rng() % 16);
    for (int s = 0; s < stages; ++s) {
      if (stages > 1 && rng() % 5 == 0) continue;  // this stage holds nothing
      WorkloadRecipe r;
      r.tokens_per_batch = int64_t{per_stage} * (256 << (rng() % 6));
      r.elongate = double(1 << (rng() % 4));
      r.upsample = 4;
      r.filter_ratio = 0.5;
      r.seed = rng();
      std::vector<std::vector<int64_t>> batch;
      ASSERT_TRUE(SampleBatches(PretrainLengths(), r, 1, &batch).ok());
      std::vector<PlanDocument> local;
      ASSERT_TRUE(LinearLayout(batch[0], per_stage, &local).ok());
      for (PlanDocument& d : local) {
        for (PlanPiece& p : d.pieces) p.rank += s * per_stage;
        c.layout.push_back(std::move(d));
      }
    }
    if (c.layout.empty()) continue;
    c.options = RandomOptions(rng, stages * per_stage);
    ASSERT_NO_FATAL_FAILURE(CheckCase(c, &tallies));
  }
  Report(tallies);
  EXPECT_GT(tallies["distca"].bound_checked, 500);
}

}  // namespace
}  // namespace distca
