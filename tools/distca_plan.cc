// distca-plan: plan CA-tasks for batches of documents and report balance,
// traffic and planning time; optionally write the plan (docs/plan_format.md).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/cli_checks.h"
#include "common/file_util.h"
#include "common/timer.h"
#include "distca/plan.h"
#include "distca/workload.h"

namespace {

using distca::Status;

int Fail(const std::string& message) { return distca::cli::Fail("distca-plan", message); }

struct Args {
  std::string docs_file, lengths_file, emit_plan, cost_table, policy = "distca";
  std::optional<int> batch;
  int batches = 1;
  std::optional<int64_t> tokens_per_rank;
  distca::WorkloadRecipe recipe;
  distca::PlanOptions plan;
  bool json = false;
};

// The batches to plan, from --docs-file or sampled from --lengths, and each
// one's number (its index in the file: --batch I plans batch I alone).
Status LoadBatches(const Args& a, std::vector<std::vector<int64_t>>* batches, std::vector<size_t>* ids) {
  ids->clear();
  if (!a.docs_file.empty()) {
    DISTCA_RETURN_IF_ERROR(distca::ReadBatchesFile(a.docs_file, batches));
    if (a.batch) {
      if (*a.batch < 0 || *a.batch >= static_cast<int>(batches->size()))
        return Status::InvalidArgument(
            fmt::format("--batch {} is out of range: {} holds {} batches", *a.batch, a.docs_file, batches->size()));
      *batches = {(*batches)[*a.batch]};
      ids->push_back(static_cast<size_t>(*a.batch));
      return Status::Ok();
    }
  } else {
    std::vector<int64_t> pool;
    DISTCA_RETURN_IF_ERROR(distca::ReadLengthsFile(a.lengths_file, &pool));
    distca::WorkloadRecipe recipe = a.recipe;
    recipe.tokens_per_batch = int64_t{a.plan.ranks} * a.tokens_per_rank.value_or(128 * 1024);
    DISTCA_RETURN_IF_ERROR(distca::SampleBatches(pool, recipe, a.batches, batches));
  }
  for (size_t b = 0; b < batches->size(); ++b) ids->push_back(b);
  return Status::Ok();
}

// Bytes with a unit that keeps three significant digits visible.
std::string Bytes(double bytes) {
  if (bytes >= 1e9) return fmt::format("{:.3f}GB", bytes * 1e-9);
  if (bytes >= 1e6) return fmt::format("{:.3f}MB", bytes * 1e-6);
  if (bytes >= 1e3) return fmt::format("{:.3f}kB", bytes * 1e-3);
  return fmt::format("{:.0f}B", bytes);
}

// What the table prints of one batch's plan, kept until every batch is
// planned (the plans themselves are not: --emit-plan keeps its one).
struct Planned {
  distca::PlanStats stats;
  double tolerance_used = 0;
  bool bound_met = false;
  double ms = 0;
  int64_t tokens = 0;
};

Status CheckTokenBudget(const Args& a, const std::vector<int64_t>& batch, size_t index) {
  int64_t total = 0;
  for (int64_t len : batch) {
    if (len > distca::kMaxTokensPerBatch - total)
      return Status::OutOfRange(
          fmt::format("batch {} holds more than the limit of {} tokens per batch", index, distca::kMaxTokensPerBatch));
    total += len;
  }
  const int64_t per_rank = total / a.plan.ranks;
  if (a.tokens_per_rank && !a.docs_file.empty() && total != *a.tokens_per_rank * a.plan.ranks)
    return Status::InvalidArgument(fmt::format("batch {} holds {} tokens, not --tokens-per-rank {} x {} ranks", index,
                                               total, *a.tokens_per_rank, a.plan.ranks));
  if (per_rank < a.plan.block)
    return Status::InvalidArgument(
        fmt::format("batch {}: {} tokens per rank is smaller than a block ({})", index, per_rank, a.plan.block));
  return Status::Ok();
}

}  // namespace

int Run(int argc, char** argv) {
  CLI::App app{"distca-plan: plan core-attention tasks for batches of documents"};
  Args a;
  auto* input = app.add_option_group("input", "where the documents come from");
  input->add_option("--docs-file", a.docs_file, "JSON {\"batches\": [[len, ...], ...]}")->check(CLI::ExistingFile);
  input->add_option("--lengths", a.lengths_file, "JSON array of document lengths to sample batches from")
      ->check(CLI::ExistingFile);
  input->require_option(1);
  app.add_option("--batch", a.batch, "with --docs-file: plan only batch I (Default: all)");
  app.add_option("--batches", a.batches, "with --lengths: how many batches to sample (Default: 1)")
      ->check(distca::cli::kPositive);
  app.add_option("--tokens-per-rank", a.tokens_per_rank,
                 "tokens per rank (Default: 128K when sampling; the batch total / ranks with --docs-file)")
      ->check(distca::cli::kPositive);
  app.add_option("--max-doc-len", a.recipe.max_doc_len, "cap on sampled document lengths (Default: none)")
      ->check(distca::cli::kNonNegative);
  app.add_option("--upsample", a.recipe.upsample, "copies of each long document (Default: 1)")
      ->check(distca::cli::kPositive);
  app.add_option("--upsample-threshold", a.recipe.upsample_threshold,
                 "length from which a document is long (Default: 65536)")
      ->check(distca::cli::kPositive);
  app.add_option("--filter-ratio", a.recipe.filter_ratio, "fraction of short documents kept in (0, 1] (Default: 1)")
      ->check(distca::cli::kShare);
  app.add_option("--elongate", a.recipe.elongate, "length multiplier (Default: 1)")->check(distca::cli::kPositive);
  app.add_option("--seed", a.recipe.seed, "sampling seed (Default: 0)");
  app.add_option("--ranks", a.plan.ranks, "ranks R")->required()->check(distca::cli::kPositive);
  app.add_option("--servers", a.plan.dedicated_servers, "dedicated attention servers (Default: 0)")
      ->check(distca::cli::kNonNegative);
  app.add_option("--policy", a.policy, "colocated, paper or distca (Default: distca)");
  app.add_option("--tolerance", a.plan.tolerance, "eps: max load <= (1 + eps) * mean (Default: 0.05)")
      ->check(distca::cli::kNonNegative);
  app.add_option("--block", a.plan.block, "task granularity in tokens (Default: 128)")->check(distca::cli::kPositive);
  app.add_option("--q-heads", a.plan.model.q_heads, "query heads (Default: 32)")->check(distca::cli::kPositive);
  app.add_option("--kv-heads", a.plan.model.kv_heads, "KV heads (Default: 8)")->check(distca::cli::kPositive);
  app.add_option("--head-dim", a.plan.model.head_dim, "head dimension (Default: 128)")->check(distca::cli::kPositive);
  app.add_option("--dtype-bytes", a.plan.model.dtype_bytes, "bytes per element (Default: 2)")
      ->check(distca::cli::kPositive);
  app.add_option("--comm-budget", a.plan.comm_budget,
                 "max bytes (per attention layer, forward + backward) any rank or dedicated server sends or receives "
                 "(Default: unlimited)")
      ->check(distca::cli::kNonNegative);
  app.add_flag("--budget-per-exchange", a.plan.budget_per_exchange,
               "--comm-budget bounds each of the four all-to-alls, not their sum (a buffer that holds one at a time)");
  app.add_flag("--budget-counts-local", a.plan.budget_counts_local,
               "with --budget-per-exchange: the rows a rank keeps for itself count too (DistCA's buffer stages them)");
  app.add_option("--cost-table", a.cost_table, "CSV q_len,kv_len,seconds: balance measured time instead of FLOPs")
      ->check(CLI::ExistingFile);
  app.add_flag("--json", a.json, "one JSON object per batch per line");
  app.add_option("--emit-plan", a.emit_plan, "write the plan as JSON (needs a single batch)")
      ->check(distca::cli::kPath);
  if (int rc = 0; !distca::cli::Parse(app, argc, argv, &rc)) return rc;

  Status s = distca::ParsePlanPolicy(a.policy, &a.plan.policy);
  if (!s.ok()) return Fail(s.message());
  a.plan.tolerance += 0.0;  // "-0" prints as 0
  if (a.batch && a.docs_file.empty()) return Fail("--batch needs --docs-file");
  if (a.plan.budget_per_exchange && a.plan.comm_budget == 0)
    return Fail("--budget-per-exchange says what --comm-budget bounds: it needs a positive --comm-budget");
  if (a.plan.budget_counts_local && !a.plan.budget_per_exchange)
    return Fail("--budget-counts-local counts a rank's own rows in each exchange: it needs --budget-per-exchange");
  // A colocated plan keeps every document where the layout puts it.
  if (a.plan.policy == distca::PlanPolicy::kColocated) {
    if (app.count("--tolerance") > 0)
      return Fail("--tolerance bounds what a balancing policy moves: --policy colocated moves nothing");
    if (a.plan.dedicated_servers > 0)
      return Fail(
          fmt::format("--servers {}: a colocated plan gives dedicated servers no work", a.plan.dedicated_servers));
  }
  if (const std::string clash =
          distca::cli::OutputOverInput({{"--emit-plan", a.emit_plan}}, {{"the --docs-file", a.docs_file},
                                                                        {"the --lengths file", a.lengths_file},
                                                                        {"the --cost-table", a.cost_table}});
      !clash.empty())
    return Fail(clash);
  // The model's shape and the plan's options, before any input is read.
  if (s = distca::ValidatePlanOptions(a.plan); !s.ok()) return Fail(s.message());
  if (!a.docs_file.empty()) {
    const char* flag = distca::cli::FirstGiven(app, distca::cli::kSamplingFlags);
    if (flag == nullptr) flag = distca::cli::FirstGiven(app, {"--max-doc-len"});
    if (flag != nullptr) return Fail(distca::cli::SamplingWithDocsFile(flag));
  }
  if (a.tokens_per_rank && *a.tokens_per_rank < a.plan.block)
    return Fail(fmt::format("--tokens-per-rank {} is smaller than a block ({})", *a.tokens_per_rank, a.plan.block));
  // Checked once, so that tokens per rank x ranks cannot wrap below.
  if (a.tokens_per_rank && *a.tokens_per_rank > distca::kMaxTokensPerBatch / a.plan.ranks)
    return Fail(fmt::format("--tokens-per-rank {} x {} ranks is above the limit of {} tokens per batch",
                            *a.tokens_per_rank, a.plan.ranks, distca::kMaxTokensPerBatch));
  distca::CostModel cost = distca::CostModel::Flops(a.plan.model);
  if (!a.cost_table.empty()) {
    std::string csv;
    s = distca::ReadTextFile(a.cost_table, &csv);
    if (s.ok()) s = distca::CostModel::FromTableCsv(csv, &cost).WithContext(a.cost_table);
    if (!s.ok()) return Fail(s.message());
  }
  std::vector<std::vector<int64_t>> batches;
  std::vector<size_t> ids;
  s = LoadBatches(a, &batches, &ids);
  if (!s.ok()) return Fail(s.message());
  if (!a.emit_plan.empty() && batches.size() != 1)
    return Fail(fmt::format("--emit-plan writes one plan but there are {} batches; {}", batches.size(),
                            a.docs_file.empty() ? "sample one (--batches 1)" : "pick one with --batch"));
  // A plan file that cannot be written is found before the planning.
  if (!a.emit_plan.empty())
    if (s = distca::CheckOutputPath(a.emit_plan); !s.ok()) return Fail("--emit-plan: " + s.message());

  // Every batch is checked, then planned and validated, before any row is
  // printed: a bad one fails the run without a partial table.
  for (size_t b = 0; b < batches.size(); ++b)
    if (s = CheckTokenBudget(a, batches[b], ids[b]); !s.ok()) return Fail(s.message());
  std::vector<Planned> planned(batches.size());
  distca::Plan plan;
  for (size_t b = 0; b < batches.size(); ++b) {
    Planned& p = planned[b];
    distca::WallTimer timer;
    s = distca::BuildPlan(batches[b], a.plan, cost, &plan);
    p.ms = timer.Seconds() * 1e3;
    if (s.ok()) s = distca::ValidatePlan(plan, cost);
    if (!s.ok()) return Fail(fmt::format("batch {}: {}", ids[b], s.ToString()));
    p.stats = plan.stats;
    p.tolerance_used = plan.tolerance_used;
    p.bound_met = plan.bound_met;
    for (int64_t len : batches[b]) p.tokens += len;
  }
  // The exchange the budget bounds: with --budget-per-exchange the largest
  // single all-to-all (own rows included with --budget-counts-local), else a
  // rank's whole send or receive.
  const bool per_exchange = a.plan.budget_per_exchange;
  if (!a.json) {
    fmt::print("policy {}, {} ranks + {} dedicated servers, eps {}, block {}, cost in {}\n",
               distca::PlanPolicyName(a.plan.policy), a.plan.ranks, a.plan.dedicated_servers, a.plan.tolerance,
               a.plan.block, cost.unit());
    fmt::print(
        "bytes per attention layer, forward + backward; total: moved, each byte once; max rank: the most one rank or "
        "server sends or receives; max exch: the most one moves in a single all-to-all{}\n",
        a.plan.comm_budget > 0 ? fmt::format(" (the budget, {}, bounds the {})", Bytes(double(a.plan.comm_budget)),
                                             per_exchange ? "max exch" : "max rank")
                               : "");
    fmt::print("{:>5} {:>6} {:>10} {:>9} {:>9} {:>12} {:>12} {:>12} {:>7} {:>9} {:>6} {:>5}\n", "batch", "docs",
               "tokens", "max/mean", "min/mean", "bytes total", "max rank", "max exch", "tasks", "plan ms", "eps",
               "bound");
  }
  for (size_t b = 0; b < batches.size(); ++b) {
    const Planned& p = planned[b];
    const distca::PlanStats& st = p.stats;
    const int64_t exchange = st.traffic.max_exchange_bytes(per_exchange && a.plan.budget_counts_local);
    if (a.json) {
      const nlohmann::json j = {{"batch", ids[b]},
                                {"policy", distca::PlanPolicyName(a.plan.policy)},
                                {"ranks", a.plan.ranks},
                                {"servers", a.plan.dedicated_servers},
                                {"documents", batches[b].size()},
                                {"tokens", p.tokens},
                                {"tolerance_used", p.tolerance_used},
                                {"bound_met", p.bound_met},
                                {"load_max_over_mean", st.max_over_mean()},
                                {"load_min_over_mean", st.min_over_mean()},
                                {"comm_bytes_total", st.traffic.total_bytes()},
                                {"comm_bytes_forward", st.traffic.forward_bytes},
                                {"comm_bytes_backward", st.traffic.backward_bytes},
                                {"comm_bytes_max_rank", st.traffic.max_rank_bytes()},
                                {"comm_bytes_max_exchange", st.traffic.max_exchange_bytes()},
                                {"comm_bytes_max_exchange_with_local", st.traffic.max_exchange_bytes(true)},
                                {"tasks", st.tasks},
                                {"plan_ms", p.ms}};
      fmt::print("{}\n", j.dump());
    } else {
      fmt::print("{:>5} {:>6} {:>10} {:>9.4f} {:>9.4f} {:>12} {:>12} {:>12} {:>7} {:>9.3f} {:>6.3g} {:>5}\n", ids[b],
                 batches[b].size(), p.tokens, st.max_over_mean(), st.min_over_mean(),
                 Bytes(double(st.traffic.total_bytes())), Bytes(double(st.traffic.max_rank_bytes())),
                 Bytes(double(exchange)), st.tasks, p.ms, p.tolerance_used, p.bound_met ? "met" : "MISS");
    }
  }
  if (!a.emit_plan.empty()) {  // one batch: `plan` is its plan
    s = distca::WriteTextFile(a.emit_plan, distca::PlanToJson(plan));
    if (!s.ok()) return Fail(s.message());
  }
  return 0;
}

int main(int argc, char** argv) { return distca::cli::GuardedMain(argc, argv, Run, Fail); }
