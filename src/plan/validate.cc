// ValidatePlan: a plan is executable and its statistics are true.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "distca/plan.h"
#include "plan/planner_internal.h"

namespace distca {
namespace {

// Pieces partition every document and lie on existing ranks; with `even`,
// ranks also hold equal token counts within one block.
Status ValidateLayout(const Plan& plan, bool even) {
  if (plan.ranks <= 0) return Status::InvalidArgument(fmt::format("plan has {} ranks", plan.ranks));
  if (plan.dedicated_servers < 0)
    return Status::InvalidArgument(fmt::format("plan has {} dedicated servers", plan.dedicated_servers));
  if (plan.block <= 0) return Status::InvalidArgument(fmt::format("plan block is {}", plan.block));
  std::vector<int64_t> tokens(plan.ranks, 0);
  for (size_t d = 0; d < plan.documents.size(); ++d) {
    const PlanDocument& doc = plan.documents[d];
    if (doc.length <= 0) return Status::InvalidArgument(fmt::format("document {} has length {}", d, doc.length));
    if (doc.length > kMaxDocumentLength)
      return Status::InvalidArgument(
          fmt::format("document {} has length {}, more than the supported {}", d, doc.length, kMaxDocumentLength));
    int64_t pos = 0;
    for (const PlanPiece& p : doc.pieces) {
      if (p.rank < 0 || p.rank >= plan.ranks)
        return Status::InvalidArgument(
            fmt::format("document {} has a piece on rank {}, which does not exist", d, p.rank));
      if (p.begin != pos || p.end <= p.begin)
        return Status::InvalidArgument(
            fmt::format("document {}: pieces do not partition [0, {}) (piece [{}, {}) "
                        "where position {} was expected)",
                        d, doc.length, p.begin, p.end, pos));
      tokens[p.rank] += p.end - p.begin;
      pos = p.end;
    }
    if (pos != doc.length)
      return Status::InvalidArgument(fmt::format("document {}: pieces cover [0, {}) of [0, {})", d, pos, doc.length));
  }
  const auto [lo, hi] = std::minmax_element(tokens.begin(), tokens.end());
  if (even && *hi - *lo > plan.block)
    return Status::InvalidArgument(
        fmt::format("ranks hold between {} and {} tokens: more than one block ({}) apart", *lo, *hi, plan.block));
  return Status::Ok();
}

// A task boundary is a block multiple, a document end or a piece boundary.
// The pieces partition the document in order (ValidateLayout ran first).
bool AllowedCut(const PlanDocument& doc, int64_t pos, int64_t block) {
  if (pos == 0 || pos == doc.length || pos % block == 0) return true;
  bool boundary = false;  // pos is inside (0, length): the piece holding pos - 1 ends at pos or later
  ForEachPieceOverlapping(doc, pos - 1, pos,
                          [&](size_t, const PlanPiece& p, int64_t, int64_t) { boundary = p.end == pos; });
  return boundary;
}

Status ValidateTasks(const Plan& plan) {
  std::vector<std::vector<const PlanTask*>> by_doc(plan.documents.size());
  for (size_t i = 0; i < plan.tasks.size(); ++i) {
    const PlanTask& t = plan.tasks[i];
    if (t.doc < 0 || t.doc >= static_cast<int32_t>(plan.documents.size()))
      return Status::InvalidArgument(fmt::format("task {} names document {}, which does not exist", i, t.doc));
    if (t.server < 0 || t.server >= plan.servers())
      return Status::InvalidArgument(fmt::format("task {} names server {}, which does not exist", i, t.server));
    if (t.q_begin >= t.q_end)
      return Status::InvalidArgument(fmt::format("task {} has an empty query range [{}, {})", i, t.q_begin, t.q_end));
    by_doc[t.doc].push_back(&t);
  }
  for (size_t d = 0; d < by_doc.size(); ++d) {
    const PlanDocument& doc = plan.documents[d];
    auto& tasks = by_doc[d];
    std::sort(tasks.begin(), tasks.end(), [](const PlanTask* a, const PlanTask* b) { return a->q_begin < b->q_begin; });
    // Query ranges partition [0, L): every row, and so every causal (query,
    // key) pair of the document, is computed exactly once.
    int64_t pos = 0;
    for (const PlanTask* t : tasks) {
      if (t->q_begin != pos)
        return Status::InvalidArgument(fmt::format("document {}: query rows [{}, {}) are {}", d,
                                                   std::min(pos, t->q_begin), std::max(pos, t->q_begin),
                                                   t->q_begin > pos ? "computed by no task" : "computed twice"));
      if (t->q_end > doc.length)
        return Status::InvalidArgument(fmt::format("document {}: a task's query rows [{}, {}) run past its length {}",
                                                   d, t->q_begin, t->q_end, doc.length));
      for (int64_t cut : {t->q_begin, t->q_end}) {
        if (!AllowedCut(doc, cut, plan.block))
          return Status::InvalidArgument(
              fmt::format("document {}: a task is cut at {}, which is not a multiple of the "
                          "block ({}), a piece boundary or a document end",
                          d, cut, plan.block));
      }
      pos = t->q_end;
    }
    if (pos != doc.length)
      return Status::InvalidArgument(
          fmt::format("document {}: query rows [{}, {}) are computed by no task", d, pos, doc.length));
  }
  return Status::Ok();
}

bool SameLoad(double a, double b) { return std::abs(a - b) <= 1e-9 * std::max({1.0, std::abs(a), std::abs(b)}); }

Status ValidateWithLayout(const Plan& plan, const CostModel& cost, bool even) {
  // The shape's bounds first: the layout check allocates per rank.
  DISTCA_RETURN_IF_ERROR(plan::CheckPlanShape(plan.ranks, plan.dedicated_servers, plan.model));
  DISTCA_RETURN_IF_ERROR(ValidateLayout(plan, even));
  DISTCA_RETURN_IF_ERROR(ValidateTasks(plan));
  // Every task's KV prefix [0, q_end) is accounted for by ComputePlanStats,
  // which charges each (document, server) for the K/V rows of [0, max q_end)
  // that the server does not hold. The plan's own statistics must agree.
  PlanStats fresh;
  DISTCA_RETURN_IF_ERROR(ComputePlanStats(plan, cost, &fresh));
  const PlanStats& own = plan.stats;
  if (own.load.size() != fresh.load.size())
    return Status::InvalidArgument(
        fmt::format("plan stats have {} server loads for {} servers", own.load.size(), fresh.load.size()));
  for (size_t s = 0; s < fresh.load.size(); ++s) {
    if (!SameLoad(own.load[s], fresh.load[s]))
      return Status::InvalidArgument(
          fmt::format("server {}: plan says load {}, recomputed {}", s, own.load[s], fresh.load[s]));
  }
  if (own.tasks != fresh.tasks)
    return Status::InvalidArgument(fmt::format("plan says {} tasks, has {}", own.tasks, fresh.tasks));
  const PlanTraffic& a = own.traffic;
  const PlanTraffic& b = fresh.traffic;
  if (a.forward_bytes != b.forward_bytes || a.backward_bytes != b.backward_bytes || a.sent != b.sent ||
      a.received != b.received || a.exchange_sent != b.exchange_sent || a.exchange_received != b.exchange_received ||
      a.exchange_local != b.exchange_local)
    return Status::InvalidArgument(fmt::format("plan traffic ({} + {} bytes) differs from the recomputed ({} + {})",
                                               a.forward_bytes, a.backward_bytes, b.forward_bytes, b.backward_bytes));
  if (!SameLoad(own.load_max, fresh.load_max) || !SameLoad(own.load_min, fresh.load_min) ||
      !SameLoad(own.load_mean, fresh.load_mean))
    return Status::InvalidArgument("plan load summary (max, min, mean) differs from the recomputed one");
  // (bound_met is the planner's report and is not checked: a plan built by
  // hand leaves it at its default.)
  if (!std::isfinite(plan.tolerance_used) || plan.tolerance_used < 0)
    return Status::InvalidArgument(
        fmt::format("plan tolerance_used is {}: it must be a finite number >= 0", plan.tolerance_used));
  return Status::Ok();
}

}  // namespace

Status ValidatePlan(const Plan& plan, const CostModel& cost) { return ValidateWithLayout(plan, cost, /*even=*/true); }

Status ValidatePlanForLayout(const Plan& plan, const CostModel& cost) {
  return ValidateWithLayout(plan, cost, /*even=*/false);
}

Status ValidatePlanStructure(const Plan& plan) {
  DISTCA_RETURN_IF_ERROR(plan::CheckPlanShape(plan.ranks, plan.dedicated_servers, plan.model));
  DISTCA_RETURN_IF_ERROR(ValidateLayout(plan, /*even=*/false));
  return ValidateTasks(plan);
}

namespace plan {

Status CheckLayout(const Plan& plan) { return ValidateLayout(plan, /*even=*/false); }

}  // namespace plan

}  // namespace distca
