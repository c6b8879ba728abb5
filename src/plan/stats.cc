// Loads and traffic of a plan, computed from scratch.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <unordered_map>
#include <vector>

#include "plan/planner_internal.h"

namespace distca {

namespace plan {

ByteRates ByteRatesFor(const PlanModel& m) {
  const int64_t row = int64_t{m.q_heads} * m.head_dim * m.dtype_bytes;      // Q, O, dO or dQ
  const int64_t kv = 2 * int64_t{m.kv_heads} * m.head_dim * m.dtype_bytes;  // K and V
  const int64_t stat = int64_t{m.q_heads} * 4;                              // LSE or delta, fp32
  ByteRates r;
  switch (m.wire) {
    case PlanWire::kDistca:  // forward Q, K/V; O, LSE. Backward Q, dO, LSE, delta, K/V; dQ, fp32 dK/dV
      r.q = {row, row + stat, 2 * (row + stat), row};
      r.kv = {kv, 0, kv, 2 * int64_t{m.kv_heads} * m.head_dim * 4};
      break;
    case PlanWire::kDistcaArtifact:  // forward Q, K/V; O, LSE. Backward Q, O, dO, LSE, K/V; dQ, dK/dV
      r.q = {row, row + stat, 3 * row + stat, row};
      r.kv = {kv, 0, kv, kv};
      break;
    case PlanWire::kDistcaArtifactNoResend:  // forward Q, K/V; O. Backward dO; dQ, dK/dV
      r.q = {row, row, row, row};
      r.kv = {kv, 0, 0, kv};
      break;
  }
  return r;
}

}  // namespace plan

int64_t PlanTraffic::max_rank_bytes() const {
  int64_t m = 0;
  for (size_t i = 0; i < sent.size(); ++i) m = std::max({m, sent[i], received[i]});
  return m;
}

int64_t PlanTraffic::max_exchange_bytes(bool with_local) const {
  int64_t m = 0;
  for (int e = 0; e < kPlanExchanges; ++e)
    for (size_t i = 0; i < exchange_sent[e].size(); ++i) {
      const int64_t own = with_local && i < exchange_local[e].size() ? exchange_local[e][i] : 0;
      m = std::max({m, exchange_sent[e][i] + own, exchange_received[e][i] + own});
    }
  return m;
}

namespace {

// Rows of [a, b) of `doc` by owning rank: calls fn(owner, rows) for each
// piece overlapping [a, b). `ordered`: the pieces are in order and disjoint,
// so they are found by binary search (a plan read from a file may have them
// in any order, and is then scanned).
template <class Fn>
void RowsByOwner(const PlanDocument& doc, bool ordered, int64_t a, int64_t b, Fn&& fn) {
  if (ordered) {
    ForEachPieceOverlapping(doc, a, b,
                            [&](size_t, const PlanPiece& p, int64_t lo, int64_t hi) { fn(p.rank, hi - lo); });
    return;
  }
  for (const PlanPiece& p : doc.pieces) {
    const int64_t lo = std::max(a, p.begin), hi = std::min(b, p.end);
    if (lo < hi) fn(p.rank, hi - lo);
  }
}

// Every counter, and any two of them summed (sent + local, forward +
// backward), is at most the total of all bytes counted, moved or kept;
// below 2^62 nothing overflows. (A product rows x rate is below 2^31 x
// 2^30.)
constexpr double kMaxCountedBytes = 0x1p62;

// The two sides of a transfer in exchange e, and bytes a server keeps (rows
// it holds itself do not move). The totals by direction are counted on the
// receiving side, so each transfer once.
void Send(PlanTraffic* t, PlanExchange e, int from, int64_t bytes) {
  t->exchange_sent[static_cast<int>(e)][from] += bytes;
  t->sent[from] += bytes;
}
void Receive(PlanTraffic* t, PlanExchange e, int to, int64_t bytes) {
  const int i = static_cast<int>(e);
  t->exchange_received[i][to] += bytes;
  t->received[to] += bytes;
  (i < 2 ? t->forward_bytes : t->backward_bytes) += bytes;
}
void Keep(PlanTraffic* t, PlanExchange e, int server, int64_t bytes) {
  t->exchange_local[static_cast<int>(e)][server] += bytes;
}

// Documents with more pieces than this, in order, have their K/V traffic
// counted by AddPrefixTraffic.
constexpr size_t kManyPieces = 16;

// The K/V traffic of one document whose pieces are in order: each
// kv_needs entry (server, e) receives the rows of [0, e) it does not hold
// from their owners (and returns their gradients). Counted per owner and
// per server, not per pair: a document over R ranks needs K/V from up to R
// owners at each of R servers, and the pairs made one 16M-token document
// on 32,768 ranks take 10 s. The same sums as adding each pair.
void AddPrefixTraffic(const PlanDocument& doc, int ranks, const std::vector<std::pair<int, int64_t>>& kv_needs,
                      const plan::ByteRates& rates, double* counted, PlanTraffic* t) {
  const std::vector<PlanPiece>& pieces = doc.pieces;
  const size_t m = pieces.size();
  std::vector<int64_t> prefix(m + 1, 0);  // rows of pieces [0, k)
  for (size_t k = 0; k < m; ++k) prefix[k + 1] = prefix[k] + (pieces[k].end - pieces[k].begin);
  std::unordered_map<int, std::vector<size_t>> own;  // rank -> its pieces
  for (size_t k = 0; k < m; ++k) own[pieces[k].rank].push_back(k);
  // Per need: pieces [0, k) lie inside its prefix, and `cut` rows of piece k.
  // Per piece: needs covering it whole (as a difference array), rows of it
  // in partial prefixes, and rows of it its owner needs itself (kept).
  std::vector<std::pair<size_t, int64_t>> spans;
  spans.reserve(kv_needs.size());
  std::vector<int64_t> whole(m + 1, 0), partial(m, 0), self(m, 0);
  const int64_t kv_in = rates.kv[0] + rates.kv[2] + rates.kv[3];
  double bytes = 0;
  for (const auto& [server, e] : kv_needs) {
    const size_t k = FirstPieceEndingAfter(doc, e);
    const int64_t cut = k < m && pieces[k].begin < e ? e - pieces[k].begin : 0;
    spans.push_back({k, cut});
    ++whole[0];
    --whole[k];
    if (cut > 0) partial[k] += cut;
    bytes += double(prefix[k] + cut) * double(kv_in);
  }
  *counted += bytes;
  if (*counted > kMaxCountedBytes) return;  // ComputePlanStats refuses the plan
  for (size_t n = 0; n < kv_needs.size(); ++n) {
    const auto [server, e] = kv_needs[n];
    const auto [k, cut] = spans[n];
    int64_t local = 0;
    if (server < ranks) {
      if (const auto it = own.find(server); it != own.end())
        for (size_t j : it->second) {
          const int64_t rows = std::max<int64_t>(0, std::min(e, pieces[j].end) - pieces[j].begin);
          local += rows;
          self[j] += rows;
        }
    }
    const int64_t moved = prefix[k] + cut - local;
    Receive(t, PlanExchange::kForwardDispatch, server, moved * rates.kv[0]);
    Receive(t, PlanExchange::kBackwardDispatch, server, moved * rates.kv[2]);
    Send(t, PlanExchange::kBackwardReturn, server, moved * rates.kv[3]);
    Keep(t, PlanExchange::kForwardDispatch, server, local * rates.kv[0]);
    Keep(t, PlanExchange::kBackwardDispatch, server, local * rates.kv[2]);
    Keep(t, PlanExchange::kBackwardReturn, server, local * rates.kv[3]);
  }
  int64_t covering = 0;
  for (size_t j = 0; j < m; ++j) {
    covering += whole[j];
    const int64_t rows = covering * (pieces[j].end - pieces[j].begin) + partial[j] - self[j];
    const int owner = pieces[j].rank;
    Send(t, PlanExchange::kForwardDispatch, owner, rows * rates.kv[0]);
    Send(t, PlanExchange::kBackwardDispatch, owner, rows * rates.kv[2]);
    Receive(t, PlanExchange::kBackwardReturn, owner, rows * rates.kv[3]);
  }
}

}  // namespace

Status ComputePlanStats(const Plan& plan, const CostModel& cost, PlanStats* stats) {
  if (stats == nullptr) return Status::InvalidArgument("stats is null");
  // The shape first: the arrays below hold one entry per server.
  DISTCA_RETURN_IF_ERROR(plan::CheckPlanShape(plan.ranks, plan.dedicated_servers, plan.model));
  const int servers = plan.servers();
  // Pieces index the per-server arrays: check them even when the plan came
  // from a file and was never validated.
  std::vector<bool> ordered(plan.documents.size(), true);
  for (size_t d = 0; d < plan.documents.size(); ++d) {
    int64_t previous_end = 0;
    for (const PlanPiece& p : plan.documents[d].pieces) {
      if (p.rank < 0 || p.rank >= plan.ranks)
        return Status::InvalidArgument(
            fmt::format("document {} has a piece on rank {}, which does not exist", d, p.rank));
      if (p.begin < 0 || p.begin > p.end || p.end > plan.documents[d].length)
        return Status::InvalidArgument(fmt::format("document {} has a piece [{}, {}) outside [0, {})", d, p.begin,
                                                   p.end, plan.documents[d].length));
      if (p.begin < previous_end) ordered[d] = false;
      previous_end = p.end;
    }
  }
  PlanStats s;
  s.load.assign(servers, 0.0);
  s.traffic.sent.assign(servers, 0);
  s.traffic.received.assign(servers, 0);
  for (int e = 0; e < kPlanExchanges; ++e) {
    s.traffic.exchange_sent[e].assign(servers, 0);
    s.traffic.exchange_received[e].assign(servers, 0);
    s.traffic.exchange_local[e].assign(servers, 0);
  }
  s.tasks = static_cast<int64_t>(plan.tasks.size());
  const plan::ByteRates rates = plan::ByteRatesFor(plan.model);

  // Group tasks by (document, server): K/V moves once per group.
  std::vector<size_t> order(plan.tasks.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    const PlanTask& a = plan.tasks[x];
    const PlanTask& b = plan.tasks[y];
    return a.doc != b.doc ? a.doc < b.doc : (a.server != b.server ? a.server < b.server : a.q_begin < b.q_begin);
  });
  PlanTraffic& t = s.traffic;
  double counted = 0;  // bytes counted so far, moved or kept (kMaxCountedBytes)
  // `bytes` from `from` to `to` in exchange e; rows a server holds itself
  // do not move and are only counted as kept.
  auto add = [&t, &counted](PlanExchange e, int from, int to, int64_t bytes) {
    counted += double(bytes);
    if (counted > kMaxCountedBytes) return;
    if (from == to) {
      Keep(&t, e, from, bytes);
      return;
    }
    Send(&t, e, from, bytes);
    Receive(&t, e, to, bytes);
  };
  // Per (server, K/V end) of the document being counted, when it has many
  // pieces (see AddPrefixTraffic).
  std::vector<std::pair<int, int64_t>> kv_needs;
  for (size_t i = 0; i < order.size();) {
    const PlanTask& first = plan.tasks[order[i]];
    if (first.doc < 0 || first.doc >= static_cast<int32_t>(plan.documents.size()))
      return Status::InvalidArgument(
          fmt::format("task {} names document {}, which does not exist", order[i], first.doc));
    if (first.server < 0 || first.server >= servers)
      return Status::InvalidArgument(
          fmt::format("task {} names server {}, which does not exist", order[i], first.server));
    const PlanDocument& doc = plan.documents[first.doc];
    const bool doc_ordered = ordered[first.doc];
    const bool many = doc_ordered && doc.pieces.size() > kManyPieces;
    const int server = first.server;
    int64_t kv_end = 0;
    for (; i < order.size() && plan.tasks[order[i]].doc == first.doc && plan.tasks[order[i]].server == server; ++i) {
      const PlanTask& task = plan.tasks[order[i]];
      s.load[server] += cost.TaskCost(task.q_begin, task.q_end);
      kv_end = std::max(kv_end, task.q_end);
      RowsByOwner(doc, doc_ordered, task.q_begin, task.q_end, [&](int owner, int64_t rows) {
        add(PlanExchange::kForwardDispatch, owner, server, rows * rates.q[0]);
        add(PlanExchange::kForwardReturn, server, owner, rows * rates.q[1]);
        add(PlanExchange::kBackwardDispatch, owner, server, rows * rates.q[2]);
        add(PlanExchange::kBackwardReturn, server, owner, rows * rates.q[3]);
      });
    }
    if (!many) {
      RowsByOwner(doc, doc_ordered, 0, kv_end, [&](int owner, int64_t rows) {
        add(PlanExchange::kForwardDispatch, owner, server, rows * rates.kv[0]);
        add(PlanExchange::kBackwardDispatch, owner, server, rows * rates.kv[2]);
        add(PlanExchange::kBackwardReturn, server, owner, rows * rates.kv[3]);
      });
      continue;
    }
    kv_needs.push_back({server, kv_end});
    if (i < order.size() && plan.tasks[order[i]].doc == first.doc) continue;
    AddPrefixTraffic(doc, plan.ranks, kv_needs, rates, &counted, &t);
    kv_needs.clear();
  }
  if (counted > kMaxCountedBytes)
    return Status::OutOfRange(fmt::format(
        "the plan's exchanges carry {:.3g} bytes in all, more than 64-bit counters can hold (fewer or shorter "
        "documents, or a narrower model)",
        counted));
  s.load_mean = std::accumulate(s.load.begin(), s.load.end(), 0.0) / servers;
  s.load_max = *std::max_element(s.load.begin(), s.load.end());
  s.load_min = *std::min_element(s.load.begin(), s.load.end());
  *stats = std::move(s);
  return Status::Ok();
}

}  // namespace distca
