// The `distca` policy: bounded max load, exact bytes, few long tasks.
//
// Start from the colocated plan (every rank serves its own pieces). Servers
// above cap = (1 + eps) * mean are donors; servers below cap are receivers
// with capacity cap - load. The largest donor first, repeatedly:
//   1. take its task with the latest q_end (the suffix rows of the longest
//      context carry the most FLOPs per query row shipped);
//   2. for each candidate receiver (the servers that already hold or were
//      already sent part of this document's KV, plus the two with the most
//      capacity), size the chunk [x, q_end) cut at a block boundary: the
//      smallest chunk that covers the donor's excess if the receiver can take
//      it, else the largest chunk the receiver can take;
//   3. score each candidate by the exact bytes the move adds (query rows the
//      receiver does not hold, plus the K/V rows of [0, q_end) it neither holds
//      nor was already sent) per unit of cost moved, and apply the best.
// Receivers never exceed cap and donors stop at or below it, so when every
// indivisible unit costs at most eps * mean the bound always holds: while a
// donor exceeds cap some server is below the mean and can take any unit. When
// a donor's suffix blocks fit nowhere, prefix chunks (its cheapest rows) are
// tried before giving up; then Plan::bound_met is false.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <queue>
#include <unordered_map>

#include "plan/planner_internal.h"

namespace distca::plan {
namespace {

// Cut positions allowed inside a task [b, e): b, e and the block multiples
// between them. Index k in [0, n] maps to a position, increasing with k.
struct Cuts {
  int64_t b, e, block;
  int64_t first;  // first block multiple > b
  int64_t n;      // number of positions strictly inside (b, e)
  Cuts(int64_t b_, int64_t e_, int64_t block_) : b(b_), e(e_), block(block_) {
    first = (b / block + 1) * block;
    n = first < e ? (e - 1 - first) / block + 1 : 0;
  }
  int64_t size() const { return n + 2; }  // b, inner cuts..., e
  int64_t at(int64_t k) const { return k == 0 ? b : (k > n ? e : first + (k - 1) * block); }
};

// Smallest k in [lo, hi] with pred(at(k)) true, for pred monotone false -> true; hi + 1 if none.
template <class Pred>
int64_t FirstTrue(const Cuts& c, int64_t lo, int64_t hi, Pred&& pred) {
  int64_t a = lo, z = hi + 1;
  while (a < z) {
    const int64_t m = a + (z - a) / 2;
    if (pred(c.at(m)))
      z = m;
    else
      a = m + 1;
  }
  return a;
}

// ---------------------------------------------------------------------------
// Fallback when the greedy misses the bound: pack all indivisible units (the
// segments between allowed cuts) by first-fit decreasing, the classic
// bin-packing heuristic. Tried first with each unit offered to its owner rank
// before the first fit (keeps more rows home), then as plain first-fit
// decreasing. Units of one document that land on one server are merged back
// into tasks.

// Leftmost server with room >= need, in O(log N): a max segment tree over rooms.
class FirstFit {
 public:
  explicit FirstFit(const std::vector<double>& room) : n_(1) {
    while (n_ < static_cast<int>(room.size())) n_ *= 2;
    tree_.assign(2 * n_, -1.0);
    for (size_t i = 0; i < room.size(); ++i) tree_[n_ + i] = room[i];
    for (int i = n_ - 1; i > 0; --i) tree_[i] = std::max(tree_[2 * i], tree_[2 * i + 1]);
  }
  int Find(double need) const {
    if (tree_[1] < need) return -1;
    int i = 1;
    while (i < n_) i = tree_[2 * i] >= need ? 2 * i : 2 * i + 1;
    return i - n_;
  }
  double Room(int s) const { return tree_[n_ + s]; }
  void Take(int s, double amount) {
    int i = n_ + s;
    tree_[i] -= amount;
    for (i /= 2; i > 0; i /= 2) tree_[i] = std::max(tree_[2 * i], tree_[2 * i + 1]);
  }

 private:
  int n_;
  std::vector<double> tree_;
};

struct Unit {
  double cost;
  int32_t doc;
  int64_t begin, end;
  int owner;
};

// Returns false when some unit fits nowhere.
bool PackUnits(const CostModel& cost, double cap, bool owner_first, Plan* plan) {
  std::vector<Unit> units;
  for (size_t d = 0; d < plan->documents.size(); ++d) {
    const PlanDocument& doc = plan->documents[d];
    for (const PlanPiece& p : doc.pieces) {
      for (int64_t a = p.begin; a < p.end;) {
        const int64_t b = std::min(p.end, (a / plan->block + 1) * plan->block);
        units.push_back({cost.TaskCost(a, b), static_cast<int32_t>(d), a, b, p.rank});
        a = b;
      }
    }
  }
  std::stable_sort(units.begin(), units.end(), [](const Unit& x, const Unit& y) { return x.cost > y.cost; });
  FirstFit bins(std::vector<double>(plan->servers(), cap));
  std::vector<PlanTask> tasks;
  tasks.reserve(units.size());
  for (const Unit& u : units) {
    int s = owner_first && bins.Room(u.owner) >= u.cost ? u.owner : bins.Find(u.cost);
    if (s < 0) return false;
    bins.Take(s, u.cost);
    tasks.push_back({u.doc, u.begin, u.end, s});
  }
  plan->tasks = std::move(tasks);
  return true;
}

struct Move {
  bool valid = false;
  int server = -1;  // receiver
  int64_t x = 0;    // cut: the receiver gets [x, e) (suffix) or [b, x) (prefix)
  bool prefix = false;
  double donor_drop = 0;    // donor's load decrease
  double receiver_add = 0;  // receiver's load increase
  int64_t bytes = 0;
  double score = 0;  // bytes per unit moved
};

class DistcaPlanner {
 public:
  DistcaPlanner(const CostModel& cost, double eps, Plan* plan)
      : cost_(cost), plan_(*plan), rates_(ByteRatesFor(plan->model)), servers_(plan->servers()) {
    (void)eps;
  }

  Status Run(double eps, std::vector<double>* loads);

 private:
  struct KvState {
    int server;
    int64_t sent_end;  // K/V rows [0, sent_end) are accounted for on the server
  };

  double Cost(int64_t a, int64_t b) const { return cost_.TaskCost(a, b); }
  int64_t HeldRows(int doc, int server, int64_t a, int64_t b) const;
  int64_t NewKvRows(int doc, int server, int64_t q_end) const;
  KvState* FindKv(int doc, int server);
  Move SizeMove(int task, int receiver, double need, bool prefix) const;
  bool ShedOne(int donor, double need);
  void Apply(int task, const Move& m);

  const CostModel& cost_;
  Plan& plan_;
  const ByteRates rates_;
  const int servers_;
  double cap_ = 0;
  std::vector<double> load_;
  std::vector<std::vector<int>> server_tasks_;  // tasks per server
  std::vector<std::vector<KvState>> kv_;        // per document: servers with K/V of it
  // Receivers by remaining capacity (lazy: entries are checked against load_).
  std::priority_queue<std::pair<double, int>> receivers_;
};

int64_t DistcaPlanner::HeldRows(int doc, int server, int64_t a, int64_t b) const {
  int64_t held = 0;
  if (server >= plan_.ranks) return 0;
  for (const PlanPiece& p : plan_.documents[doc].pieces)
    if (p.rank == server) held += std::max<int64_t>(0, std::min(b, p.end) - std::max(a, p.begin));
  return held;
}

DistcaPlanner::KvState* DistcaPlanner::FindKv(int doc, int server) {
  for (KvState& k : kv_[doc])
    if (k.server == server) return &k;
  return nullptr;
}

int64_t DistcaPlanner::NewKvRows(int doc, int server, int64_t q_end) const {
  int64_t sent_end = 0;
  for (const KvState& k : kv_[doc])
    if (k.server == server) sent_end = k.sent_end;
  if (q_end <= sent_end) return 0;
  return (q_end - sent_end) - HeldRows(doc, server, sent_end, q_end);
}

// The move of part of `task` to `receiver`: suffix [x, e) by default, or prefix
// [b, x). Covers `need` when the receiver can take that much, else moves as
// much as fits. Invalid when not even one block fits.
Move DistcaPlanner::SizeMove(int task, int receiver, double need, bool prefix) const {
  const PlanTask& t = plan_.tasks[task];
  const Cuts cuts(t.q_begin, t.q_end, plan_.block);
  const double whole = Cost(t.q_begin, t.q_end);
  const double room = cap_ - load_[receiver];
  // Moving at cut position x: the donor keeps [b, x) (suffix move) or [x, e).
  auto kept = [&](int64_t x) { return prefix ? Cost(x, t.q_end) : Cost(t.q_begin, x); };
  auto moved = [&](int64_t x) { return prefix ? Cost(t.q_begin, x) : Cost(x, t.q_end); };
  Move m;
  const int64_t last = cuts.size() - 1;
  // k = 0 .. last. Suffix: moved shrinks as k grows; prefix: moved grows.
  int64_t k;
  if (!prefix) {
    // Largest k whose move still covers the need, i.e. first k where it no longer does, minus one.
    const int64_t k_cover = FirstTrue(cuts, 0, last - 1, [&](int64_t x) { return whole - kept(x) < need; }) - 1;
    const int64_t k_fit = FirstTrue(cuts, 0, last - 1, [&](int64_t x) { return moved(x) <= room; });
    if (k_fit > last - 1) return m;  // even the last block does not fit
    k = std::max<int64_t>(std::max<int64_t>(k_cover, 0), k_fit);
  } else {
    const int64_t k_cover = FirstTrue(cuts, 1, last, [&](int64_t x) { return whole - kept(x) >= need; });
    const int64_t k_over = FirstTrue(cuts, 1, last, [&](int64_t x) { return moved(x) > room; });
    if (k_over == 1) return m;
    k = std::min(k_cover, k_over - 1);
    k = std::min(k, last);
  }
  m.valid = true;
  m.server = receiver;
  m.prefix = prefix;
  m.x = cuts.at(k);
  const int64_t a = prefix ? t.q_begin : m.x;
  const int64_t b = prefix ? m.x : t.q_end;
  m.donor_drop = whole - kept(m.x);
  m.receiver_add = moved(m.x);
  m.bytes = (b - a - HeldRows(t.doc, receiver, a, b)) * rates_.QueryRowRoundTrip() +
            NewKvRows(t.doc, receiver, b) * rates_.KvRowRoundTrip();
  m.score = m.receiver_add > 0 ? double(m.bytes) / m.receiver_add : 1e300;
  return m;
}

void DistcaPlanner::Apply(int task, const Move& m) {
  PlanTask t = plan_.tasks[task];
  const int donor = t.server;
  PlanTask moved = t;
  moved.server = m.server;
  if (m.prefix) {
    moved.q_end = m.x;
    plan_.tasks[task].q_begin = m.x;
  } else {
    moved.q_begin = m.x;
    plan_.tasks[task].q_end = m.x;
  }
  plan_.tasks.push_back(moved);
  server_tasks_[m.server].push_back(static_cast<int>(plan_.tasks.size()) - 1);
  load_[donor] -= m.donor_drop;
  load_[m.server] += m.receiver_add;
  KvState* kv = FindKv(t.doc, m.server);
  if (kv == nullptr) {
    kv_[t.doc].push_back({m.server, 0});
    kv = &kv_[t.doc].back();
  }
  kv->sent_end = std::max(kv->sent_end, moved.q_end);
  if (cap_ - load_[m.server] > 0) receivers_.push({cap_ - load_[m.server], m.server});
}

// Moves one chunk off `donor`; false when nothing it holds fits anywhere.
bool DistcaPlanner::ShedOne(int donor, double need) {
  // Candidate receivers with room: top two by capacity (dropping stale heap entries).
  std::vector<int> top;
  std::vector<std::pair<double, int>> kept;
  while (!receivers_.empty() && top.size() < 2) {
    auto [room, s] = receivers_.top();
    receivers_.pop();
    const double now = cap_ - load_[s];
    if (now <= 0 || now != room || s == donor) continue;  // stale or full
    top.push_back(s);
    kept.push_back({room, s});
  }
  for (auto& e : kept) receivers_.push(e);

  // The donor's tasks, latest q_end first.
  std::vector<int>& mine = server_tasks_[donor];
  mine.erase(
      std::remove_if(mine.begin(), mine.end(), [&](int i) { return plan_.tasks[i].q_begin >= plan_.tasks[i].q_end; }),
      mine.end());
  std::sort(mine.begin(), mine.end(), [&](int a, int b) { return plan_.tasks[a].q_end > plan_.tasks[b].q_end; });
  for (bool prefix : {false, true}) {
    for (int task : mine) {
      const PlanTask& t = plan_.tasks[task];
      std::vector<int> candidates = top;
      for (const KvState& k : kv_[t.doc])
        if (k.server != donor && cap_ - load_[k.server] > 0) candidates.push_back(k.server);
      Move best;
      for (int r : candidates) {
        const Move m = SizeMove(task, r, need, prefix);
        if (!m.valid) continue;
        // Among moves within 10% of the best bytes per unit, take the larger
        // one: fewer, longer tasks.
        if (!best.valid || m.score < 0.9 * best.score ||
            (m.score <= best.score * 1.1 && m.receiver_add > best.receiver_add))
          best = m;
      }
      if (best.valid) {
        Apply(task, best);
        return true;
      }
    }
  }
  return false;
}

Status DistcaPlanner::Run(double eps, std::vector<double>* loads) {
  // Colocated start: every piece is a task on its rank.
  plan_.tasks.clear();
  load_.assign(servers_, 0.0);
  server_tasks_.assign(servers_, {});
  kv_.assign(plan_.documents.size(), {});
  for (size_t d = 0; d < plan_.documents.size(); ++d) {
    for (const PlanPiece& p : plan_.documents[d].pieces) {
      plan_.tasks.push_back({static_cast<int32_t>(d), p.begin, p.end, p.rank});
      server_tasks_[p.rank].push_back(static_cast<int>(plan_.tasks.size()) - 1);
      load_[p.rank] += Cost(p.begin, p.end);
      kv_[d].push_back({p.rank, 0});
    }
  }
  const double mean = std::accumulate(load_.begin(), load_.end(), 0.0) / servers_;
  cap_ = (1.0 + eps) * mean;
  for (int s = 0; s < servers_; ++s)
    if (load_[s] < cap_) receivers_.push({cap_ - load_[s], s});

  std::priority_queue<std::pair<double, int>> donors;
  for (int s = 0; s < servers_; ++s)
    if (load_[s] > cap_) donors.push({load_[s] - cap_, s});
  plan_.bound_met = true;
  while (!donors.empty()) {
    const int s = donors.top().second;
    donors.pop();
    while (load_[s] > cap_) {
      if (!ShedOne(s, load_[s] - cap_)) {
        plan_.bound_met = false;
        break;
      }
    }
  }

  if (!plan_.bound_met) {
    // A relative slack of 1e-10 absorbs the rounding of summing costs in a
    // different order; bound_met allows 1e-9.
    const std::vector<PlanTask> greedy = plan_.tasks;
    for (bool owner_first : {true, false}) {
      if (PackUnits(cost_, cap_ * (1 + 1e-10), owner_first, &plan_)) {
        plan_.bound_met = true;
        break;
      }
    }
    if (!plan_.bound_met) plan_.tasks = greedy;
  }

  // Drop emptied tasks and merge adjacent tasks of one document on one server.
  std::vector<PlanTask>& tasks = plan_.tasks;
  tasks.erase(std::remove_if(tasks.begin(), tasks.end(), [](const PlanTask& t) { return t.q_begin >= t.q_end; }),
              tasks.end());
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
  tasks = std::move(merged);
  // Loads of the final tasks (a fallback packing replaced the greedy's, and
  // merged measured costs are not sums of their parts).
  load_.assign(servers_, 0.0);
  for (const PlanTask& t : tasks) load_[t.server] += Cost(t.q_begin, t.q_end);
  *loads = load_;
  return Status::Ok();
}

}  // namespace

Status PlanDistca(const CostModel& cost, double eps, Plan* plan, std::vector<double>* loads) {
  DistcaPlanner planner(cost, eps, plan);
  return planner.Run(eps, loads);
}

}  // namespace distca::plan
