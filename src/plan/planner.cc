// BuildPlan: layout, policy, statistics, and the comm-budget loop.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "common/enum_names.h"
#include "plan/planner_internal.h"

namespace distca {

namespace {
constexpr std::pair<PlanPolicy, const char*> kPolicies[] = {
    {PlanPolicy::kColocated, "colocated"}, {PlanPolicy::kPaper, "paper"}, {PlanPolicy::kDistca, "distca"}};
constexpr std::pair<PlanWire, const char*> kWires[] = {
    {PlanWire::kDistca, "distca"},
    {PlanWire::kDistcaArtifact, "distca-artifact"},
    {PlanWire::kDistcaArtifactNoResend, "distca-artifact-no-resend"}};
}  // namespace

const char* PlanPolicyName(PlanPolicy policy) { return EnumName(kPolicies, policy); }

Status ParsePlanPolicy(std::string_view name, PlanPolicy* policy) {
  return ParseEnumName(kPolicies, name, "policy", policy);
}

const char* PlanWireName(PlanWire wire) { return EnumName(kWires, wire); }

Status ParsePlanWire(std::string_view name, PlanWire* wire) { return ParseEnumName(kWires, name, "wire format", wire); }

namespace plan {

std::vector<double> TaskLoads(const Plan& plan, const CostModel& cost) {
  std::vector<double> load(plan.servers(), 0.0);
  for (const PlanTask& t : plan.tasks) load[t.server] += cost.TaskCost(t.q_begin, t.q_end);
  return load;
}

Status PlanColocated(const CostModel& cost, Plan* plan, std::vector<double>* loads) {
  plan->tasks.clear();
  loads->assign(plan->servers(), 0.0);
  for (size_t d = 0; d < plan->documents.size(); ++d) {
    for (const PlanPiece& p : plan->documents[d].pieces) {
      plan->tasks.push_back({static_cast<int32_t>(d), p.begin, p.end, p.rank});
      (*loads)[p.rank] += cost.TaskCost(p.begin, p.end);
    }
  }
  return Status::Ok();
}

Status CheckPlanShape(int ranks, int dedicated_servers, const PlanModel& m) {
  if (ranks <= 0) return Status::InvalidArgument(fmt::format("ranks must be positive, got {}", ranks));
  if (dedicated_servers < 0)
    return Status::InvalidArgument(fmt::format("dedicated servers must be >= 0, got {}", dedicated_servers));
  if (int64_t{ranks} + dedicated_servers > kMaxPlanServers)
    return Status::OutOfRange(fmt::format("{} ranks and {} dedicated servers are above the limit of {} in all", ranks,
                                          dedicated_servers, kMaxPlanServers));
  if (m.q_heads <= 0 || m.kv_heads <= 0 || m.head_dim <= 0 || m.dtype_bytes <= 0)
    return Status::InvalidArgument(
        fmt::format("model sizes must be positive (q_heads {}, kv_heads {}, head_dim {}, "
                    "dtype_bytes {})",
                    m.q_heads, m.kv_heads, m.head_dim, m.dtype_bytes));
  if (m.q_heads % m.kv_heads != 0)
    return Status::InvalidArgument(
        fmt::format("q_heads ({}) is not a multiple of kv_heads ({})", m.q_heads, m.kv_heads));
  // Bounds that keep a batch's bytes (rows x heads x head_dim x dtype) within
  // 64 bits.
  if (int64_t{m.q_heads} * m.head_dim > kMaxPlanWidth || m.dtype_bytes > 8)
    return Status::OutOfRange(
        fmt::format("q_heads x head_dim ({} x {}) must be at most {} and dtype_bytes ({}) at most 8", m.q_heads,
                    m.head_dim, kMaxPlanWidth, m.dtype_bytes));
  return Status::Ok();
}

}  // namespace plan

Status ValidatePlanOptions(const PlanOptions& o) {
  DISTCA_RETURN_IF_ERROR(plan::CheckPlanShape(o.ranks, o.dedicated_servers, o.model));
  if (!(o.tolerance >= 0) || !std::isfinite(o.tolerance))
    return Status::InvalidArgument(fmt::format("tolerance must be a finite number >= 0, got {}", o.tolerance));
  if (o.block <= 0) return Status::InvalidArgument(fmt::format("block must be positive, got {}", o.block));
  if (o.comm_budget < 0) return Status::InvalidArgument(fmt::format("comm budget must be >= 0, got {}", o.comm_budget));
  if (o.budget_counts_local && !o.budget_per_exchange)
    return Status::InvalidArgument("budget_counts_local bounds single exchanges: it needs budget_per_exchange");
  return Status::Ok();
}

namespace {

// Runs the policy at tolerance eps and fills plan->stats, cross-checking the
// policy's own loads against a from-scratch recomputation.
Status PlanOnce(const PlanOptions& o, const CostModel& cost, double eps, Plan* plan) {
  std::vector<double> loads;
  switch (o.policy) {
    case PlanPolicy::kColocated:
      DISTCA_RETURN_IF_ERROR(plan::PlanColocated(cost, plan, &loads));
      break;
    case PlanPolicy::kPaper:
      DISTCA_RETURN_IF_ERROR(plan::PlanPaper(cost, eps, plan, &loads));
      break;
    case PlanPolicy::kDistca:
      DISTCA_RETURN_IF_ERROR(plan::PlanDistca(cost, eps, plan, &loads));
      break;
  }
  plan->tolerance_used = eps + 0.0;  // -0 (a tolerance given as "-0") as 0
  DISTCA_RETURN_IF_ERROR(ComputePlanStats(*plan, cost, &plan->stats));
  // The distca policy says from its own loads; the others aim at no bound,
  // so the plan's stats say whether they happen to meet it.
  if (o.policy != PlanPolicy::kDistca)
    plan->bound_met = plan->stats.load_max <= (1 + eps) * plan->stats.load_mean * (1 + 1e-9);
  for (size_t s = 0; s < loads.size(); ++s) {
    const double a = loads[s], b = plan->stats.load[s];
    if (std::abs(a - b) > 1e-6 * std::max({1.0, std::abs(a), std::abs(b)}))
      return Status::Internal(fmt::format("{} policy: server {} load {} disagrees with the recomputed {}",
                                          PlanPolicyName(o.policy), s, a, b));
  }
  return Status::Ok();
}

// A plan with o's shape and no documents yet.
Plan EmptyPlan(const PlanOptions& o) {
  Plan p;
  p.ranks = o.ranks;
  p.dedicated_servers = o.dedicated_servers;
  p.block = o.block;
  p.policy = o.policy;
  p.model = o.model;
  return p;
}

// Checks a given layout's documents: lengths within the supported range,
// their total within int64 (LinearLayout checks its own), pieces that
// partition them on existing ranks.
Status CheckGivenLayout(const Plan& p) {
  if (p.documents.empty()) return Status::InvalidArgument("the batch has no documents");
  int64_t total = 0;
  for (size_t d = 0; d < p.documents.size(); ++d) {
    const int64_t len = p.documents[d].length;
    if (len > kMaxDocumentLength)
      return Status::OutOfRange(
          fmt::format("document {} has length {}, more than the supported {}", d, len, kMaxDocumentLength));
    if (len > 0 && len > std::numeric_limits<int64_t>::max() / 4 - total)
      return Status::OutOfRange("the batch's total token count overflows");
    total += std::max<int64_t>(len, 0);
  }
  return plan::CheckLayout(p);
}

// Plans p.documents (already laid out and checked) with options o.
Status PlanLayout(const PlanOptions& o, const CostModel& cost, Plan p, Plan* plan) {
  // The bytes the budget bounds: a rank's whole traffic, or its largest
  // single exchange.
  auto busiest = [&](const Plan& q) {
    return o.budget_per_exchange ? q.stats.traffic.max_exchange_bytes(o.budget_counts_local)
                                 : q.stats.traffic.max_rank_bytes();
  };
  double eps = o.tolerance;
  DISTCA_RETURN_IF_ERROR(PlanOnce(o, cost, eps, &p));
  if (o.comm_budget > 0 && busiest(p) > o.comm_budget) {
    // Raise eps until the busiest rank's traffic fits. Once eps covers the
    // colocated plan's own imbalance on both sides, no policy moves anything
    // (distca caps the maximum at (1 + eps) mean; the paper's recipients pull
    // only while their deficit exceeds eps * mean), so the search ends there.
    // A colocated plan moves what the layout needs whatever eps is: it is
    // refused, or kept under a budget that grows, before any search.
    Plan colocated = p;
    if (o.policy != PlanPolicy::kColocated) {
      PlanOptions co = o;
      co.policy = PlanPolicy::kColocated;
      DISTCA_RETURN_IF_ERROR(PlanOnce(co, cost, 0.0, &colocated));
    }
    double eps_max = std::max(colocated.stats.max_over_mean() - 1.0, 1.0 - colocated.stats.min_over_mean());
    // The paper policy loads a piece as its head and tail halves, which a
    // measured table does not cost as the whole piece; from eps 1 on no
    // recipient's deficit (at most the mean) exceeds eps * mean.
    if (o.policy == PlanPolicy::kPaper) eps_max = std::max(eps_max, 1.0);
    // A step within rounding of eps_max may still move a block ((1 + eps)
    // mean can round below the busiest load): only a step clearly beyond it
    // is expected to move nothing.
    eps_max += 1e-9 * (1.0 + eps_max);
    // What the layout alone needs; with budget_grows, the budget rises to it.
    // Below it a plan may still fit (moving work can shorten a rank's
    // exchanges: a tail piece served where its prefix lives, or, counting
    // own rows, rows moved off a busy rank), so the search runs, except for
    // colocated plans, which move what the layout needs whatever eps is.
    const int64_t layout_need = busiest(colocated);
    const int64_t budget = o.budget_grows ? std::max(o.comm_budget, layout_need) : o.comm_budget;
    const bool layout_fits = layout_need <= budget;
    auto below_layout = [&](double searched_to) {
      const char* scope = !o.budget_per_exchange  ? ""
                          : o.budget_counts_local ? " in one exchange, its own rows included"
                                                  : " in one exchange";
      return Status::InvalidArgument(fmt::format(
          "comm budget {} bytes is below what the linear layout alone moves ({} bytes on the busiest "
          "rank{}){}",
          o.comm_budget, layout_need, scope,
          searched_to > 0 ? fmt::format(", and no tolerance tried up to {:.3g} brought it under", searched_to)
                          : std::string()));
    };
    if (!layout_fits && o.policy == PlanPolicy::kColocated) return below_layout(0);
    // eps runs over tolerance + 0.05 k. Of the first kStepByStep steps (eps
    // up to the tolerance + 3, loads up to 4x the mean) each is tried while
    // the last plan's busiest rank needs at most kNear times the budget, and
    // every one when the layout alone needs more than the budget (the steps
    // where nothing moves then fail too, so a gallop that reached them could
    // not bisect back to one that fits): there the first step that fits is
    // found whatever the shape of traffic in eps. Otherwise, and past
    // kStepByStep in every case, k doubles (galloping) to a step that fits,
    // then bisection between it and the last one that did not finds a step
    // that fits whose step below does not: the first one where traffic falls
    // as eps grows (the tests compare it with a step-by-step search), in
    // O(log k) plans instead of k. Where traffic is not monotone it may be a
    // later step than the first that fits (a higher eps, never a plan over
    // the budget), and past kStepByStep a budget below the layout's need may
    // be refused although a skipped step fits it. Large k happen where a few
    // busy ranks' documents spread over many idle servers (pipeline
    // bubbles): eps in the tens, hundreds of steps, the first tens of them
    // at several times the budget. In the 10,567 plans of one such run (256
    // GPUs, tp 1, 32 stages, one batch) traffic rose by at most 14% from one
    // step to the next, and no step up to kStepByStep fitted within a
    // gallop from one needing twice the budget unless the gallop's end
    // fitted too; on random small cases the galloping search finds the
    // first fit (docs/planner.md).
    constexpr int64_t kStepByStep = 60;
    constexpr double kNear = 2.0;
    auto fits = [&](const Plan& q) { return busiest(q) <= budget; };
    // A budget raised to the layout's need may hold the plan at the
    // requested tolerance already.
    if (fits(p)) {
      *plan = std::move(p);
      return Status::Ok();
    }
    auto at_step = [&](int64_t k) { return o.tolerance + 0.05 * double(k); };
    int64_t fail = 0, fit = 1;
    for (;;) {
      eps = at_step(fit);
      DISTCA_RETURN_IF_ERROR(PlanOnce(o, cost, eps, &p));
      const int64_t need = busiest(p);
      if (need <= budget) break;
      if (eps > eps_max && !layout_fits) return below_layout(eps);
      if (eps > eps_max)
        return Status::Internal(fmt::format("{} policy moves work at eps {} beyond the colocated imbalance {}",
                                            PlanPolicyName(o.policy), eps, eps_max));
      fail = fit;
      const bool near = !layout_fits || double(need) <= kNear * double(budget);
      fit = fit < kStepByStep && near ? fit + 1 : 2 * fit;
    }
    while (fit - fail > 1) {
      const int64_t mid = fail + (fit - fail) / 2;
      Plan q = p;
      DISTCA_RETURN_IF_ERROR(PlanOnce(o, cost, at_step(mid), &q));
      if (fits(q)) {
        fit = mid;
        p = std::move(q);
      } else {
        fail = mid;
      }
    }
  }
  *plan = std::move(p);
  return Status::Ok();
}

}  // namespace

Status BuildPlan(const std::vector<int64_t>& doc_lengths, const PlanOptions& o, const CostModel& cost, Plan* plan) {
  if (plan == nullptr) return Status::InvalidArgument("plan is null");
  DISTCA_RETURN_IF_ERROR(ValidatePlanOptions(o));
  Plan p = EmptyPlan(o);
  DISTCA_RETURN_IF_ERROR(LinearLayout(doc_lengths, o.ranks, &p.documents));
  return PlanLayout(o, cost, std::move(p), plan);
}

Status BuildPlanForLayout(std::vector<PlanDocument> documents, const PlanOptions& o, const CostModel& cost,
                          Plan* plan) {
  if (plan == nullptr) return Status::InvalidArgument("plan is null");
  DISTCA_RETURN_IF_ERROR(ValidatePlanOptions(o));
  Plan p = EmptyPlan(o);
  p.documents = std::move(documents);
  DISTCA_RETURN_IF_ERROR(CheckGivenLayout(p));
  return PlanLayout(o, cost, std::move(p), plan);
}

std::vector<PlanTask> MergeTouchingTasks(std::vector<PlanTask> tasks) {
  std::sort(tasks.begin(), tasks.end(), [](const PlanTask& a, const PlanTask& b) {
    return a.doc != b.doc ? a.doc < b.doc : a.q_begin < b.q_begin;
  });
  std::vector<PlanTask> merged;
  for (const PlanTask& t : tasks) {
    if (!merged.empty() && merged.back().doc == t.doc && merged.back().server == t.server &&
        merged.back().q_end == t.q_begin)
      merged.back().q_end = t.q_end;
    else
      merged.push_back(t);
  }
  return merged;
}

}  // namespace distca
