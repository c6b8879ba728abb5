// The `distca` policy: bounded max load, exact bytes, few long tasks.
//
// Start from the colocated plan (every rank serves its own pieces). Servers
// above cap = (1 + eps) * mean are donors; servers below cap are receivers
// with room cap - load. Then, repeatedly, apply the best move over all donors:
// a chunk [a, z) of one of a donor's tasks, cut at block boundaries, sent to a
// receiver, sized to cover the donor's excess when the receiver has room for
// it and to fill the receiver otherwise. Moves are scored by the exact bytes
// they add (query rows the receiver does not hold, plus the K/V rows of
// [0, z) it neither holds nor was already sent) per unit of cost moved. Each
// donor's best move sits in a heap and is re-evaluated when it reaches the top
// (receivers change under it), so no full rescans happen per move.
//
// Receivers never exceed cap and donors stop at or below it, so whenever every
// indivisible unit costs at most eps * mean the bound holds: while a donor
// exceeds cap some server is below the mean and can take any unit. When the
// greedy still gets stuck (large units and fragmented room), all units are
// repacked by first-fit decreasing. When that fails too, plans for other
// bounds are tried (PlanDistca) and the best kept; Plan::bound_met says
// whether it meets eps.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <queue>
#include <set>
#include <tuple>
#include <unordered_map>

#include "plan/planner_internal.h"

namespace distca::plan {
namespace {

// Cut positions allowed inside a task [b, e): b, e and the block multiples
// between them. Index k in [0, size) maps to a position, increasing with k.
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
// bin-packing heuristic, keeping as many rows home as a packing allows.
// Tried in this order, the first that packs kept:
//   kOwnersFirst: each owner keeps each of its own units that still fits
//     its room, largest first; the rest are placed by first fit, largest
//     first;
//   kDonorsOnly: ranks within the cap keep all their units, and only the
//     others' units are placed by first fit, largest first;
//   kOwnerFirstFit: one first-fit-decreasing pass, each unit offered to its
//     owner first;
//   kFirstFit: plain first-fit decreasing.
// In one pass (kOwnerFirstFit) units that overflow early ranks fill later
// ranks before those ranks' own units are offered, and the overflow
// cascades: 57 short documents on 8 ranks and a server, block 16, eps 0.01,
// had 355 rows served away from home, 28.2 MB a layer, where kOwnersFirst
// then relocation have 187, 14.5 MB.
enum class Packing { kOwnersFirst, kDonorsOnly, kOwnerFirstFit, kFirstFit };

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

// The most block units the first-fit-decreasing fallback packs: 300-450 MB
// of units, tasks and sort buffer, and a few seconds. A batch of more (2^31
// tokens in blocks of 256, or block 1 on 8M tokens) keeps the greedy's plan:
// units of one block each would cost memory and time in proportion to the
// tokens (150 GB at 2^31 tokens in blocks of 1).
constexpr int64_t kMaxPackedUnits = int64_t{1} << 22;

// An indivisible unit of work: one block of a piece, on its owner rank.
struct PackUnit {
  double cost;
  int32_t doc;
  int64_t begin, end;
  int owner;
};

// The plan's units, costliest first (ties in position order). False when
// there are more than kMaxPackedUnits.
bool PackingUnits(const CostModel& cost, const Plan& plan, std::vector<PackUnit>* units) {
  int64_t count = 0;
  for (const PlanDocument& d : plan.documents)
    for (const PlanPiece& p : d.pieces)
      if (p.end > p.begin) count += (p.end - 1) / plan.block - p.begin / plan.block + 1;
  if (count > kMaxPackedUnits) return false;
  units->clear();
  units->reserve(size_t(count));
  for (size_t d = 0; d < plan.documents.size(); ++d) {
    for (const PlanPiece& p : plan.documents[d].pieces) {
      for (int64_t a = p.begin; a < p.end;) {
        const int64_t b = std::min(p.end, (a / plan.block + 1) * plan.block);
        units->push_back({cost.TaskCost(a, b), static_cast<int32_t>(d), a, b, p.rank});
        a = b;
      }
    }
  }
  std::stable_sort(units->begin(), units->end(), [](const PackUnit& x, const PackUnit& y) { return x.cost > y.cost; });
  return true;
}

// Packs `units` (PackingUnits' order) into the servers within `cap`, in
// the given order, into plan->tasks. False when some unit fits nowhere.
bool PackUnits(const std::vector<PackUnit>& units, double cap, Packing packing, Plan* plan) {
  FirstFit bins(std::vector<double>(plan->servers(), cap));
  std::vector<PlanTask> tasks;
  tasks.reserve(units.size());
  std::vector<bool> placed(units.size(), false);
  if (packing == Packing::kOwnersFirst || packing == Packing::kDonorsOnly) {
    std::vector<double> own(plan->servers(), 0.0);
    for (const PackUnit& u : units) own[u.owner] += u.cost;
    for (size_t i = 0; i < units.size(); ++i) {
      const PackUnit& u = units[i];
      if (packing == Packing::kDonorsOnly ? own[u.owner] > cap : bins.Room(u.owner) < u.cost) continue;
      bins.Take(u.owner, u.cost);
      tasks.push_back({u.doc, u.begin, u.end, u.owner});
      placed[i] = true;
    }
  }
  for (size_t i = 0; i < units.size(); ++i) {
    if (placed[i]) continue;
    const PackUnit& u = units[i];
    const int s = packing == Packing::kOwnerFirstFit && bins.Room(u.owner) >= u.cost ? u.owner : bins.Find(u.cost);
    if (s < 0) return false;
    bins.Take(s, u.cost);
    tasks.push_back({u.doc, u.begin, u.end, s});
  }
  plan->tasks = std::move(tasks);
  return true;
}

// ---------------------------------------------------------------------------
// The greedy.

struct Move {
  bool valid = false;
  int task = -1;
  int server = -1;          // receiver
  int64_t a = 0, z = 0;     // the receiver gets query rows [a, z) of the task
  double donor_drop = 0;    // donor's load decrease
  double receiver_add = 0;  // receiver's load increase
  int64_t bytes = 0;        // forward + backward bytes the move adds
  double score = 0;         // bytes per unit of cost moved
};

// Lists of servers per document grow with the planner's moves; a list is
// scanned while it has at most kIndexFrom entries (cheaper for a few), and
// indexed by server once longer (a document spread over hundreds of idle
// servers made the scans the planner's hot loop).
constexpr size_t kIndexFrom = 16;

// Where each server sits in one such list, kept in arrival order.
// server_of(entry) names an entry's server.
class ServerPositions {
 public:
  // The server's position in `list`, or -1.
  template <class List, class ServerOf>
  int Find(const List& list, int server, ServerOf server_of) const {
    if (list.size() <= kIndexFrom) {
      for (size_t i = 0; i < list.size(); ++i)
        if (server_of(list[i]) == server) return static_cast<int>(i);
      return -1;
    }
    const auto it = at_->find(server);
    return it == at_->end() ? -1 : it->second;
  }
  // Call after each push_back onto `list`. on_indexed(server) is called for
  // each server the index takes in: every one when the list outgrows the
  // scan, each new one after.
  template <class List, class ServerOf, class OnIndexed>
  void Added(const List& list, ServerOf server_of, OnIndexed on_indexed) {
    if (list.size() <= kIndexFrom) return;
    const size_t from = list.size() == kIndexFrom + 1 ? 0 : list.size() - 1;
    if (at_ == nullptr) at_ = std::make_unique<std::unordered_map<int, int>>();
    for (size_t i = from; i < list.size(); ++i) {
      at_->emplace(server_of(list[i]), static_cast<int>(i));
      on_indexed(server_of(list[i]));
    }
  }

 private:
  // Made when the list outgrows the scan (a batch may hold millions of
  // short documents, each with a list of one or two).
  std::unique_ptr<std::unordered_map<int, int>> at_;
};

// The relocation pass's index of one document's servers (by position in its
// list): each entry's load and the end of its K/V need, m. Best(w, cap, qe,
// skip) is the entry with load + w <= cap that has the largest min(m, qe),
// the first in position order among equals (-1 if none): a depth-first
// search, left first, that skips subtrees with no room or no larger key (so
// it reads nothing more once a key reaches qe). An entry left out has load
// +inf and m -1.
class EndsTree {
 public:
  void Set(int pos, double load, int64_t m) {
    if (pos >= n_) Grow(pos + 1);
    int i = n_ + pos;
    min_load_[i] = load;
    max_m_[i] = m;
    for (i /= 2; i > 0; i /= 2) {
      min_load_[i] = std::min(min_load_[2 * i], min_load_[2 * i + 1]);
      max_m_[i] = std::max(max_m_[2 * i], max_m_[2 * i + 1]);
    }
  }
  int Best(double w, double cap, int64_t qe, int skip) const {
    int best = -1;
    int64_t key = -1;
    if (n_ > 0) Search(1, w, cap, qe, skip, &best, &key);
    return best;
  }

 private:
  void Grow(int size) {
    int n = std::max(n_, 1);
    while (n < size) n *= 2;
    std::vector<double> load(2 * n, std::numeric_limits<double>::infinity());
    std::vector<int64_t> m(2 * n, -1);
    for (int i = 0; i < n_; ++i) {
      load[n + i] = min_load_[n_ + i];
      m[n + i] = max_m_[n_ + i];
    }
    for (int i = n - 1; i > 0; --i) {
      load[i] = std::min(load[2 * i], load[2 * i + 1]);
      m[i] = std::max(m[2 * i], m[2 * i + 1]);
    }
    n_ = n;
    min_load_ = std::move(load);
    max_m_ = std::move(m);
  }
  void Search(int i, double w, double cap, int64_t qe, int skip, int* best, int64_t* key) const {
    // (A node's least load plus w is at most any of its entries' load plus
    // w, rounding included: none of them has room when it has none.)
    if (min_load_[i] + w > cap || max_m_[i] < 0) return;
    if (*best >= 0 && std::min(max_m_[i], qe) <= *key) return;
    if (i >= n_) {
      if (i - n_ == skip) return;
      *best = i - n_;
      *key = std::min(max_m_[i], qe);
      return;
    }
    Search(2 * i, w, cap, qe, skip, best, key);
    Search(2 * i + 1, w, cap, qe, skip, best, key);
  }

  int n_ = 0;
  std::vector<double> min_load_;
  std::vector<int64_t> max_m_;
};

class DistcaPlanner {
 public:
  // merge_aware: charge a chunk what it adds to the receiver's task it joins
  // (only with a measured table; with FLOPs it is the same).
  DistcaPlanner(const CostModel& cost, Plan* plan, bool merge_aware, DistcaRead read = DistcaRead::kAuto)
      : cost_(cost),
        plan_(*plan),
        rates_(ByteRatesFor(plan->model)),
        servers_(plan->servers()),
        merge_aware_(merge_aware && cost.measured()),
        read_(read) {}

  // With repack false, a greedy that misses the bound returns its own plan
  // (bound_met false) instead of trying first-fit decreasing.
  Status Run(double eps, bool repack, std::vector<double>* loads);

 private:
  struct KvState {
    int server;
    int64_t sent_end;  // K/V rows [0, sent_end) are accounted for on the server
  };

  double Cost(int64_t a, int64_t b) const { return cost_.TaskCost(a, b); }
  int64_t HeldRows(int doc, int server, int64_t a, int64_t b) const;
  int64_t NewKvRows(int doc, int server, int64_t q_end) const;
  int64_t FreeKvEnd(int doc, int server) const;
  // Fills `top` (cleared first).
  void TopReceivers(int count, std::vector<int>* top);
  Move BestMove(int task, int receiver, double need) const;
  Move DonorBest(int donor);
  void Apply(const Move& m);
  // Loads, task indexes and receivers from plan_.tasks as they stand (after
  // a packing replaced the greedy's tasks).
  void ResetFromTasks();
  void Relocate();

  const CostModel& cost_;
  Plan& plan_;
  const ByteRates rates_;
  const int servers_;
  // With a measured table a task costs less than its parts (every kernel
  // call has a floor), so a chunk [a, z) moved to a server that runs the
  // document's rows from z on is charged what it adds to that task, and
  // joins it: the greedy moves chunks leftwards from a task's end, so each
  // chunk of a document on a receiver usually continues the one before
  // (joins on the other side are left to the final merge, charged in full:
  // the receiver's tracked load can only exceed its real one). Tasks are
  // indexed by (document, server, first row), unique as rows are disjoint.
  // With FLOPs costs add up and none of this runs.
  const bool merge_aware_;
  const DistcaRead read_;
  std::map<std::tuple<int, int, int64_t>, int> starting_;
  // Index / Unindex keep both indexes (by first row, and the server's
  // tasks by q_end) in step with a task's rows and server: unindex before
  // changing them, index after.
  void Index(int task) {
    const PlanTask& t = plan_.tasks[task];
    if (t.q_begin >= t.q_end) return;
    server_tasks_[t.server].insert({-t.q_end, task});
    if (merge_aware_) starting_[{t.doc, t.server, t.q_begin}] = task;
  }
  void Unindex(int task) {
    const PlanTask& t = plan_.tasks[task];
    if (t.q_begin >= t.q_end) return;
    server_tasks_[t.server].erase({-t.q_end, task});
    if (merge_aware_) starting_.erase({t.doc, t.server, t.q_begin});
  }
  // The server's task of the document that starts at `row`, or -1.
  int TaskStartingAt(int doc, int server, int64_t row) const {
    if (!merge_aware_) return -1;
    const auto it = starting_.find({doc, server, row});
    return it == starting_.end() ? -1 : it->second;
  }
  double cap_ = 0;
  std::vector<double> load_;
  // Each server's non-empty tasks, latest q_end first (ties by index):
  // (-q_end, task). Kept ordered as moves change them, so a donor's turn
  // reads its first few instead of sorting them all (a donor holding
  // thousands of short documents made that sort quadratic overall).
  std::vector<std::set<std::pair<int64_t, int>>> server_tasks_;
  std::vector<std::vector<KvState>> kv_;  // per document: servers with K/V of it, in arrival order
  std::vector<ServerPositions> kv_at_;    // per document: where each server sits in kv_
  static int ServerOf(const KvState& k) { return k.server; }
  // The server's entry in kv_[doc], or -1.
  int KvIndex(int doc, int server) const { return kv_at_[doc].Find(kv_[doc], server, ServerOf); }
  // The server's K/V state for the document, or null.
  const KvState* KvOf(int doc, int server) const {
    const int i = KvIndex(doc, server);
    return i < 0 ? nullptr : &kv_[doc][i];
  }
  // The server's K/V state for the document, added (sent_end 0) if new.
  KvState& AddKv(int doc, int server) {
    std::vector<KvState>& v = kv_[doc];
    if (const int i = KvIndex(doc, server); i >= 0) return v[i];
    v.push_back({server, 0});
    kv_at_[doc].Added(v, ServerOf, [&](int s) {
      if (by_load_on_) ListHolder(doc, s);
    });
    return v.back();
  }
  // Per document with more than kIndexFrom servers in kv_, once the greedy
  // starts: those servers by (load, index), kept as loads change, so that a
  // donor's turn finds the few with the most room without reading all of
  // them (a document spread over thousands of servers made that a scan per
  // move). holder_docs_[s]: the documents whose sets list server s.
  bool by_load_on_ = false;
  std::unordered_map<int, std::set<std::pair<double, int>>> by_load_;  // only those documents
  std::vector<std::vector<int>> holder_docs_;
  void ListHolder(int doc, int server) {
    by_load_[doc].insert({load_[server], server});
    holder_docs_[server].push_back(doc);
  }
  // Sets server s's load, keeping the sets that list it in order.
  void SetLoad(int s, double load) {
    if (by_load_on_)
      for (int d : holder_docs_[s]) by_load_.at(d).erase({load_[s], s});
    load_[s] = load;
    if (by_load_on_)
      for (int d : holder_docs_[s]) by_load_.at(d).insert({load_[s], s});
  }
  // Per document with more than kIndexFrom pieces: rank -> its pieces, in
  // position order (a document over thousands of ranks made every lookup
  // of the rows a rank holds a scan of all of them).
  std::unordered_map<int, std::unordered_map<int, std::vector<int>>> pieces_at_;  // only those documents
  // Calls fn(piece) for each piece of the document on `rank`, in position order.
  template <class Fn>
  void ForEachPieceOn(int doc, int rank, Fn&& fn) const {
    const std::vector<PlanPiece>& pieces = plan_.documents[doc].pieces;
    if (pieces.size() <= kIndexFrom) {
      for (const PlanPiece& p : pieces)
        if (p.rank == rank) fn(p);
      return;
    }
    const std::unordered_map<int, std::vector<int>>& at = pieces_at_.at(doc);
    const auto it = at.find(rank);
    if (it == at.end()) return;
    for (int i : it->second) fn(pieces[i]);
  }
  // Receivers by remaining room (lazy: entries are checked against load_).
  std::priority_queue<std::pair<double, int>> receivers_;
  // Scratch space reused across calls of the hot loop (no allocation per move).
  std::vector<std::pair<double, int>> scratch_kept_;
  std::vector<int> scratch_top_, scratch_holders_, scratch_candidates_;
  std::vector<Move> scratch_moves_;
};

int64_t DistcaPlanner::HeldRows(int doc, int server, int64_t a, int64_t b) const {
  int64_t held = 0;
  if (server >= plan_.ranks) return 0;
  ForEachPieceOn(doc, server,
                 [&](const PlanPiece& p) { held += std::max<int64_t>(0, std::min(b, p.end) - std::max(a, p.begin)); });
  return held;
}

int64_t DistcaPlanner::NewKvRows(int doc, int server, int64_t q_end) const {
  const KvState* k = KvOf(doc, server);
  const int64_t sent_end = k != nullptr ? k->sent_end : 0;
  if (q_end <= sent_end) return 0;
  return (q_end - sent_end) - HeldRows(doc, server, sent_end, q_end);
}

// The end of the prefix [0, x) whose K/V the server already has for free
// (sent earlier, or held where its piece continues the free prefix).
int64_t DistcaPlanner::FreeKvEnd(int doc, int server) const {
  const KvState* k = KvOf(doc, server);
  int64_t end = k != nullptr ? k->sent_end : 0;
  if (server < plan_.ranks)
    ForEachPieceOn(doc, server, [&](const PlanPiece& p) {
      if (p.begin <= end) end = std::max(end, p.end);
    });
  return end;
}

// The `count` receivers with the most room, dropping stale heap entries.
void DistcaPlanner::TopReceivers(int count, std::vector<int>* top) {
  top->clear();
  std::vector<std::pair<double, int>>& kept = scratch_kept_;
  kept.clear();
  while (!receivers_.empty() && static_cast<int>(top->size()) < count) {
    const auto [room, s] = receivers_.top();
    receivers_.pop();
    if (cap_ - load_[s] <= 0 || cap_ - load_[s] != room) continue;  // stale or full
    top->push_back(s);
    kept.push_back({room, s});
  }
  for (const auto& e : kept) receivers_.push(e);
}

// The cheapest move, in bytes per unit of cost, of a chunk [a, z) of `task`
// to `receiver`: it covers `need` when the receiver has room for that, else it
// fills the receiver's room. A chunk ending at z costs about F * Q / z query
// bytes plus z * KV bytes of prefix (for work F in causal pairs), which is
// smallest near z* = sqrt(F * Q / KV): for a long document the best chunk is
// often not its suffix. Candidates for z: the task's end, around z*, where the
// receiver's free K/V ends, the end of the shortest prefix of the task that
// covers the target, and the task's first cut (its cheapest rows).
// Invalid when not even one block fits in the receiver's room.
Move DistcaPlanner::BestMove(int task, int receiver, double need) const {
  const PlanTask& t = plan_.tasks[task];
  const Cuts cuts(t.q_begin, t.q_end, plan_.block);
  const int64_t last = cuts.size() - 1;
  const double room = cap_ - load_[receiver];
  const double target = std::min(need, room);
  const double whole = Cost(t.q_begin, t.q_end);
  const double pairs_per_unit = whole > 0 ? double(CausalPairs(t.q_begin, t.q_end)) / whole : 0.0;
  const double q_bytes = double(rates_.QueryRowRoundTrip());
  const double kv_bytes = double(rates_.KvRowRoundTrip());

  // Cut index at or below position x, clamped to [1, last].
  auto index_of = [&](double x) {
    if (x <= double(cuts.first)) return int64_t{1};
    return std::clamp<int64_t>(int64_t((x - double(cuts.first)) / double(cuts.block)) + 1, 1, last);
  };
  const int64_t k_star = index_of(std::sqrt(std::max(0.0, target * pairs_per_unit) * q_bytes / kv_bytes));
  const int64_t k_free = index_of(double(FreeKvEnd(t.doc, receiver)));
  // The prefix chunk [b, z) that just covers the target: the shortest K/V
  // prefix that moves enough work out of this task.
  const int64_t k_prefix =
      FirstTrue(cuts, 1, last, [&](int64_t z) { return whole - Cost(z, t.q_end) >= std::min(target, whole); });
  int64_t candidates[] = {last, k_star, k_star + 1, k_free, k_free + 1, k_prefix, 1};
  for (int64_t& kz : candidates) kz = std::clamp<int64_t>(kz, 1, last);

  Move best;
  for (size_t i = 0; i < std::size(candidates); ++i) {
    const int64_t kz = candidates[i];
    // A repeated end gives the same move, which never replaces the first.
    if (std::find(candidates, candidates + i, kz) != candidates + i) continue;
    const int64_t z = cuts.at(kz);
    // a: the smallest chunk [a, z) that covers the target, or [b, z) when even
    // that does not; then shrunk until it fits the receiver's room.
    int64_t ka = std::max<int64_t>(0, FirstTrue(cuts, 0, kz - 1, [&](int64_t x) { return Cost(x, z) < target; }) - 1);
    // What the receiver's load grows by when it takes [x, z): joined to its
    // task [z, hi) of the document, if it has one.
    const int joins = TaskStartingAt(t.doc, receiver, z);
    const int64_t hi = joins >= 0 ? plan_.tasks[joins].q_end : z;
    const double joined = joins >= 0 ? Cost(z, hi) : 0.0;
    const auto added = [&](int64_t x) { return joins >= 0 ? std::max(0.0, Cost(x, hi) - joined) : Cost(x, z); };
    if (added(cuts.at(ka)) > room) ka = FirstTrue(cuts, ka, kz - 1, [&](int64_t x) { return added(x) <= room; });
    if (ka >= kz) continue;  // not one block fits
    Move m;
    m.valid = true;
    m.task = task;
    m.server = receiver;
    m.a = cuts.at(ka);
    m.z = z;
    m.receiver_add = added(m.a);
    // (Merge-aware, the room search's predicate need not be monotone: check.)
    if (m.receiver_add > room) continue;
    m.donor_drop = whole - Cost(t.q_begin, m.a) - Cost(m.z, t.q_end);
    m.bytes = (m.z - m.a - HeldRows(t.doc, receiver, m.a, m.z)) * rates_.QueryRowRoundTrip() +
              NewKvRows(t.doc, receiver, m.z) * rates_.KvRowRoundTrip();
    // Bytes per unit of work moved: the receiver's added load (with FLOPs
    // the same as the donor's drop; merge-aware, joining a task may add
    // less, even nothing, and the donor's drop measures the move).
    const double moved = merge_aware_ ? m.donor_drop : m.receiver_add;
    m.score = moved > 0 ? double(m.bytes) / moved : 1e300;
    if (!best.valid || m.score < best.score) best = m;
  }
  return best;
}

// The donor's best move now: over its tasks with the latest q_end (long
// contexts offer the most work per query row; further tasks are tried only
// when none of those fits anywhere) and, per task, the two receivers with the
// most room plus the (at most kHolders) servers with the most room that
// already have K/V of the task's document.
Move DistcaPlanner::DonorBest(int donor) {
  const double need = load_[donor] - cap_;
  std::vector<int>& top = scratch_top_;
  TopReceivers(2, &top);
  const std::set<std::pair<int64_t, int>>& mine = server_tasks_[donor];
  constexpr size_t kScored = 3;
  std::vector<Move>& moves = scratch_moves_;
  moves.clear();
  size_t n = 0;
  for (auto it = mine.begin(); it != mine.end() && (n < kScored || moves.empty()); ++it, ++n) {
    const int task = it->second;
    const PlanTask& t = plan_.tasks[task];
    // Servers that already have some of the document's K/V (moves there
    // save its prefix bytes): the kHolders with the most room. A document
    // spread over many idle servers (pipeline bubbles) would otherwise make
    // every donor scan all of them on every move.
    constexpr size_t kHolders = 8;
    std::vector<int>& holders = scratch_holders_;
    holders.clear();
    const auto eligible = [&](int s) {
      return s != donor && cap_ - load_[s] > 0 && std::find(top.begin(), top.end(), s) == top.end();
    };
    if (kv_[t.doc].size() <= kIndexFrom) {
      for (const KvState& k : kv_[t.doc])
        if (eligible(k.server)) holders.push_back(k.server);
      if (holders.size() > kHolders) {
        std::partial_sort(holders.begin(), holders.begin() + kHolders, holders.end(),
                          [&](int a, int b) { return load_[a] < load_[b] || (load_[a] == load_[b] && a < b); });
        holders.resize(kHolders);
      }
    } else {
      // The same choice from the set: the first kHolders eligible by (load,
      // index) when there are more, else all of them in arrival order.
      for (const auto& [load, s] : by_load_.at(t.doc)) {
        if (!(cap_ - load > 0) || holders.size() > kHolders) break;  // the rest have no room
        if (eligible(s)) holders.push_back(s);
      }
      if (holders.size() > kHolders)
        holders.resize(kHolders);
      else
        std::sort(holders.begin(), holders.end(), [&](int a, int b) { return KvIndex(t.doc, a) < KvIndex(t.doc, b); });
    }
    std::vector<int>& candidates = scratch_candidates_;
    candidates.assign(top.begin(), top.end());
    candidates.insert(candidates.end(), holders.begin(), holders.end());
    // Dedicated servers with none of the document's K/V and the same load
    // offer the same move (to a different server), which never replaces the
    // first one: evaluate one of them. Exact because only the two top
    // receivers can be such blanks (holders have K/V) and they come first,
    // one after the other, so nothing else changes `best` between them.
    double blank_load = std::numeric_limits<double>::quiet_NaN();
    for (int r : candidates) {
      if (r == donor) continue;
      if (r >= plan_.ranks && KvIndex(t.doc, r) < 0) {
        if (load_[r] == blank_load) continue;
        blank_load = load_[r];
      }
      const Move m = BestMove(task, r, need);
      if (m.valid) moves.push_back(m);
    }
  }
  // Among the moves within 2% of the fewest bytes per unit, the largest:
  // fewer, longer tasks.
  const Move* best = LargestNearCheapest(
      moves, 0.02, [](const Move& m) { return m.score; }, [](const Move& m) { return m.receiver_add; });
  return best != nullptr ? *best : Move{};
}

void DistcaPlanner::Apply(const Move& m) {
  const PlanTask t = plan_.tasks[m.task];
  const int donor = t.server;
  // The donor keeps [b, a) and [z, e); the receiver gets [a, z), joined to
  // its task of the document that starts at z (merge-aware).
  Unindex(m.task);
  plan_.tasks[m.task].q_end = m.a;
  Index(m.task);
  if (m.z < t.q_end) {
    plan_.tasks.push_back({t.doc, m.z, t.q_end, donor});
    Index(static_cast<int>(plan_.tasks.size()) - 1);
  }
  if (const int right = TaskStartingAt(t.doc, m.server, m.z); right >= 0) {
    Unindex(right);
    plan_.tasks[right].q_begin = m.a;
    Index(right);
  } else {
    plan_.tasks.push_back({t.doc, m.a, m.z, m.server});
    Index(static_cast<int>(plan_.tasks.size()) - 1);
  }
  SetLoad(donor, load_[donor] - m.donor_drop);
  SetLoad(m.server, load_[m.server] + m.receiver_add);
  KvState& kv = AddKv(t.doc, m.server);
  kv.sent_end = std::max(kv.sent_end, m.z);
  // Both ends' rooms changed: a donor whose move overshot the cap has room
  // now and receives like any server below the cap.
  for (int s : {m.server, donor})
    if (cap_ - load_[s] > 0) receivers_.push({cap_ - load_[s], s});
}

void DistcaPlanner::ResetFromTasks() {
  const std::vector<PlanTask>& tasks = plan_.tasks;
  load_.assign(servers_, 0.0);
  server_tasks_.assign(servers_, {});
  starting_.clear();
  for (size_t i = 0; i < tasks.size(); ++i) {
    Index(static_cast<int>(i));
    load_[tasks[i].server] += Cost(tasks[i].q_begin, tasks[i].q_end);
  }
  receivers_ = {};
  for (int s = 0; s < servers_; ++s)
    if (load_[s] < cap_) receivers_.push({cap_ - load_[s], s});
}

// Local improvement: move whole chunks that sit away from home to another
// server with room when that lowers the exact bytes (a chunk's query rows cost
// nothing on a server that holds them; its K/V prefix costs nothing where the
// server already needs the document's K/V that far). Loads stay within cap,
// so the bound is kept. A few passes, each over every chunk.
void DistcaPlanner::Relocate() {
  const int64_t q_bytes = rates_.QueryRowRoundTrip();
  const int64_t kv_bytes = rates_.KvRowRoundTrip();
  // The q_ends of every task of (document, server): its K/V need is [0, max).
  // Kept sorted: a greedy that moved one block at a time can leave tens of
  // thousands of tasks of one document on one server, and scanning them for
  // each task's maximum made this pass quadratic (9 s of a 9.2 s plan).
  using Ends = std::multiset<int64_t>;
  std::vector<std::vector<std::pair<int, Ends>>> ends(plan_.documents.size());
  std::vector<ServerPositions> ends_at(plan_.documents.size());  // where each server sits in ends
  const auto server_of = [](const std::pair<int, Ends>& e) { return e.first; };
  auto ends_index = [&](int doc, int server) { return ends_at[doc].Find(ends[doc], server, server_of); };
  // The largest q_end, one instance of `skip` left out (0 when none is left).
  auto max_of = [](const Ends& v, int64_t skip) -> int64_t {
    if (v.empty()) return 0;
    auto last = std::prev(v.end());
    if (*last != skip) return *last;
    return last == v.begin() ? 0 : *std::prev(last);
  };
  // A document whose list outgrew the scan is also indexed, so that a task
  // need not read every server of it (one document over 32,768 servers: 2.4
  // billion reads, 4.5 s): a server's bytes for a chunk [qb, qe) are
  //   rows q + max(0, qe - m) kv - held(qb, qe) q - [m < qe] held(m, qe) kv
  // with m the end of its K/V need and held(.) the document's rows it holds.
  // The last two terms are 0 but for ranks holding rows in [qb, qe) (the
  // pieces that overlap the chunk, read one by one) and ranks holding rows
  // beyond m ("tails", kept by load and read while they have room); every
  // other server's bytes fall as min(m, qe) grows, so one tree query finds
  // the best of them.
  struct EndsIndex {
    EndsTree tree;                              // the servers that are not tails
    std::set<std::pair<double, int>> tails;     // (load, position) of the tails
    std::vector<std::pair<double, bool>> seen;  // per position: (load, tail) as indexed
  };
  // (Made when a list outgrows the scan: most documents never need one,
  // and a batch may hold millions.)
  std::vector<std::unique_ptr<EndsIndex>> indexed(plan_.documents.size());
  std::vector<std::vector<int>> indexed_docs(servers_);  // server -> documents that index it
  auto refresh = [&](int doc, int at) {
    if (indexed[doc] == nullptr) indexed[doc] = std::make_unique<EndsIndex>();
    EndsIndex& x = *indexed[doc];
    const auto& [server, server_ends] = ends[doc][at];
    if (static_cast<int>(x.seen.size()) <= at) x.seen.resize(at + 1, {0.0, false});
    auto& [load, tail] = x.seen[at];
    if (tail) x.tails.erase({load, at});
    const int64_t m = max_of(server_ends, -1);
    load = load_[server];
    tail = HeldRows(doc, server, m, plan_.documents[doc].length) > 0;
    if (tail) {
      x.tails.insert({load, at});
      x.tree.Set(at, std::numeric_limits<double>::infinity(), -1);
    } else {
      x.tree.Set(at, load, m);
    }
  };
  auto ends_of = [&](int doc, int server) -> Ends& {
    if (const int i = ends_index(doc, server); i >= 0) return ends[doc][i].second;
    ends[doc].push_back({server, {}});
    ends_at[doc].Added(ends[doc], server_of, [&](int s) {
      indexed_docs[s].push_back(doc);
      refresh(doc, ends_index(doc, s));
    });
    return ends[doc].back().second;
  };
  // Loads and ends change together, at a move's two servers.
  auto add_load = [&](int s, double delta) {
    load_[s] += delta;
    for (int doc : indexed_docs[s]) refresh(doc, ends_index(doc, s));
  };
  for (const PlanTask& t : plan_.tasks)
    if (t.q_begin < t.q_end) ends_of(t.doc, t.server).insert(t.q_end);
  for (size_t d = 0; d < ends.size(); ++d)
    if (ends[d].size() > kIndexFrom)
      for (size_t i = 0; i < ends[d].size(); ++i) refresh(static_cast<int>(d), static_cast<int>(i));
  static const Ends kNone;
  auto find_ends = [&](int doc, int server) -> const Ends& {
    const int i = ends_index(doc, server);
    return i < 0 ? kNone : ends[doc][i].second;
  };
  // Bytes of (doc, server)'s K/V need when its largest q_end is `kv_end`.
  auto kv_cost = [&](int doc, int server, int64_t kv_end) {
    return (kv_end - HeldRows(doc, server, 0, kv_end)) * kv_bytes;
  };
  std::vector<int> candidates;
  for (int pass = 0; pass < 3; ++pass) {
    bool improved = false;
    for (size_t i = 0; i < plan_.tasks.size(); ++i) {
      const PlanTask t = plan_.tasks[i];
      if (t.q_begin >= t.q_end) continue;
      const int64_t rows = t.q_end - t.q_begin;
      if (HeldRows(t.doc, t.server, t.q_begin, t.q_end) == rows) continue;  // at home
      const double w = Cost(t.q_begin, t.q_end);
      // Bytes the chunk costs where it is: its foreign query rows plus the K/V
      // that only it makes this server need.
      const int64_t without = max_of(find_ends(t.doc, t.server), t.q_end);
      const int64_t stay = (rows - HeldRows(t.doc, t.server, t.q_begin, t.q_end)) * q_bytes +
                           kv_cost(t.doc, t.server, std::max(without, t.q_end)) - kv_cost(t.doc, t.server, without);
      // Candidates, in this order: the 3 receivers with the most room, the
      // servers with tasks of the document, the ranks holding its rows.
      int best = -1;
      int64_t best_cost = stay;
      // Bytes the chunk costs on r, whose tasks of the document end at r_ends.
      auto go = [&](int r, const Ends& r_ends) {
        const int64_t there_max = max_of(r_ends, -1);
        return (rows - HeldRows(t.doc, r, t.q_begin, t.q_end)) * q_bytes +
               kv_cost(t.doc, r, std::max(there_max, t.q_end)) - kv_cost(t.doc, r, there_max);
      };
      auto consider = [&](int r, const Ends& r_ends) {
        if (r == t.server || load_[r] + w > cap_) return;
        if (const int64_t bytes = go(r, r_ends); bytes < best_cost) {
          best_cost = bytes;
          best = r;
        }
      };
      TopReceivers(3, &candidates);
      for (int r : candidates) consider(r, find_ends(t.doc, r));
      const std::vector<std::pair<int, Ends>>& listed = ends[t.doc];
      if (listed.size() <= kIndexFrom || read_ == DistcaRead::kScan) {
        for (const auto& [r, r_ends] : listed) consider(r, r_ends);
      } else {
        // The same choice from the index: the least bytes below best_cost,
        // the first in list order among equals, from the best of the
        // servers that are neither tails nor hold rows of the chunk, the
        // tails with room, and the ranks that hold rows of the chunk.
        const EndsIndex& x = *indexed[t.doc];
        int first = -1;
        auto offer = [&](int at) {
          const auto& [r, r_ends] = listed[at];
          if (r == t.server || load_[r] + w > cap_) return;
          const int64_t bytes = go(r, r_ends);
          if (bytes < best_cost || (bytes == best_cost && first >= 0 && at < first)) {
            best_cost = bytes;
            first = at;
          }
        };
        const int here = ends_index(t.doc, t.server);
        if (const int at = x.tree.Best(w, cap_, t.q_end, here); at >= 0) offer(at);
        for (const auto& [load, at] : x.tails) {
          if (load + w > cap_) break;
          offer(at);
        }
        // (The shared read of these ranks below considers them again: in
        // list order here, as the full read does, for ties.)
        ForEachPieceOverlapping(plan_.documents[t.doc], t.q_begin, t.q_end,
                                [&](size_t, const PlanPiece& p, int64_t, int64_t) {
                                  if (const int at = ends_index(t.doc, p.rank); at >= 0) offer(at);
                                });
        if (first >= 0) best = listed[first].first;
      }
      ForEachPieceOverlapping(
          plan_.documents[t.doc], t.q_begin, t.q_end,
          [&](size_t, const PlanPiece& p, int64_t, int64_t) { consider(p.rank, find_ends(t.doc, p.rank)); });
      if (best < 0) continue;
      // Move it.
      ends_of(t.doc, best).insert(t.q_end);
      Ends& here = ends_of(t.doc, t.server);
      here.erase(here.find(t.q_end));
      add_load(t.server, -w);
      add_load(best, w);
      for (int s : {t.server, best})
        if (cap_ - load_[s] > 0) receivers_.push({cap_ - load_[s], s});
      Unindex(static_cast<int>(i));
      plan_.tasks[i].server = best;
      Index(static_cast<int>(i));
      improved = true;
    }
    if (!improved) break;
  }
}

Status DistcaPlanner::Run(double eps, bool repack, std::vector<double>* loads) {
  // Colocated start: every piece is a task on its rank.
  plan_.tasks.clear();
  load_.assign(servers_, 0.0);
  server_tasks_.assign(servers_, {});
  kv_.assign(plan_.documents.size(), {});
  kv_at_.clear();
  kv_at_.resize(plan_.documents.size());
  by_load_on_ = false;
  pieces_at_.clear();
  for (size_t d = 0; d < plan_.documents.size(); ++d) {
    const std::vector<PlanPiece>& pieces = plan_.documents[d].pieces;
    if (pieces.size() > kIndexFrom)
      for (size_t i = 0; i < pieces.size(); ++i) pieces_at_[d][pieces[i].rank].push_back(static_cast<int>(i));
  }
  starting_.clear();
  for (size_t d = 0; d < plan_.documents.size(); ++d) {
    for (const PlanPiece& p : plan_.documents[d].pieces) {
      plan_.tasks.push_back({static_cast<int32_t>(d), p.begin, p.end, p.rank});
      Index(static_cast<int>(plan_.tasks.size()) - 1);
      load_[p.rank] += Cost(p.begin, p.end);
      // The rank's own task already needs the K/V of [0, p.end): more rows
      // of this document cost it only what lies beyond.
      KvState& k = AddKv(static_cast<int>(d), p.rank);
      k.sent_end = std::max(k.sent_end, p.end);
    }
  }
  const double mean = std::accumulate(load_.begin(), load_.end(), 0.0) / servers_;
  cap_ = (1.0 + eps) * mean;
  for (int s = 0; s < servers_; ++s)
    if (load_[s] < cap_) receivers_.push({cap_ - load_[s], s});
  by_load_.clear();
  holder_docs_.assign(servers_, {});
  by_load_on_ = true;
  for (size_t d = 0; d < kv_.size(); ++d)
    if (kv_[d].size() > kIndexFrom)
      for (const KvState& k : kv_[d]) ListHolder(static_cast<int>(d), k.server);

  // Lazy greedy: pop the donor whose cached best move is cheapest, recompute
  // that move, and apply it if it is still no worse than the next cached one.
  using Entry = std::pair<double, int>;  // (score, donor), smallest first
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> moves;
  plan_.bound_met = true;
  for (int s = 0; s < servers_; ++s) {
    if (load_[s] <= cap_) continue;
    const Move m = DonorBest(s);
    if (m.valid)
      moves.push({m.score, s});
    else
      plan_.bound_met = false;
  }
  while (!moves.empty()) {
    const int donor = moves.top().second;
    moves.pop();
    if (load_[donor] <= cap_) continue;
    const Move m = DonorBest(donor);
    if (!m.valid) {
      plan_.bound_met = false;
      continue;
    }
    if (!moves.empty() && m.score > moves.top().first) {
      moves.push({m.score, donor});  // others may be cheaper now
      continue;
    }
    Apply(m);
    if (load_[donor] > cap_) moves.push({m.score, donor});
  }

  // The holder sets serve the greedy's moves only (Relocate moves loads
  // without them).
  by_load_on_ = false;
  if (plan_.bound_met) Relocate();
  if (!plan_.bound_met && repack) {
    // A relative slack of 1e-10 absorbs the rounding of summing costs in a
    // different order; bound_met allows 1e-9.
    const std::vector<PlanTask> greedy = plan_.tasks;
    std::vector<PackUnit> units;
    if (PackingUnits(cost_, plan_, &units)) {
      for (Packing packing :
           {Packing::kOwnersFirst, Packing::kDonorsOnly, Packing::kOwnerFirstFit, Packing::kFirstFit}) {
        if (PackUnits(units, cap_ * (1 + 1e-10), packing, &plan_)) {
          plan_.bound_met = true;
          break;
        }
      }
    }
    if (!plan_.bound_met) {
      plan_.tasks = greedy;
    } else {
      // The packing places units with no regard to bytes: the relocation
      // pass moves its chunks where they cost fewer, within the cap.
      ResetFromTasks();
      Relocate();
    }
  }

  // Drop emptied tasks and merge adjacent tasks of one document on one server.
  std::vector<PlanTask>& tasks = plan_.tasks;
  tasks.erase(std::remove_if(tasks.begin(), tasks.end(), [](const PlanTask& t) { return t.q_begin >= t.q_end; }),
              tasks.end());
  tasks = MergeTouchingTasks(std::move(tasks));
  // Loads of the final tasks (a fallback packing may have replaced the
  // greedy's, and merged measured costs are not sums of their parts).
  load_.assign(servers_, 0.0);
  for (const PlanTask& t : tasks) load_[t.server] += Cost(t.q_begin, t.q_end);
  // bound_met says whether these final loads meet the bound: with a
  // measured table, merging moves loads and mean off what cap_ was set
  // from. (With FLOPs nothing changes.)
  const double final_mean = std::accumulate(load_.begin(), load_.end(), 0.0) / servers_;
  plan_.bound_met = *std::max_element(load_.begin(), load_.end()) <= (1 + eps) * final_mean * (1 + 1e-9);
  *loads = load_;
  return Status::Ok();
}

// A missed bound: where the greedy's moves did not lower the maximum load
// (an indivisible block above every receiver's room sets it), they only
// added bytes, so the colocated plan, the same maximum for fewer bytes, is
// the better plan.
Status KeepColocatedUnlessLower(const CostModel& cost, Plan* plan, std::vector<double>* loads) {
  if (plan->bound_met) return Status::Ok();
  std::vector<double> colocated(plan->servers(), 0.0);
  for (const PlanDocument& d : plan->documents)
    for (const PlanPiece& p : d.pieces) colocated[p.rank] += cost.TaskCost(p.begin, p.end);
  if (*std::max_element(colocated.begin(), colocated.end()) > *std::max_element(loads->begin(), loads->end()))
    return Status::Ok();
  DISTCA_RETURN_IF_ERROR(PlanColocated(cost, plan, loads));
  plan->bound_met = false;
  return Status::Ok();
}

// One plan at eps: the merge-aware greedy (and, with a measured table on a
// miss, the plain one), with the colocated plan kept on a miss that does not
// lower the maximum.
Status PlanDistcaAt(const CostModel& cost, double eps, DistcaRead read, Plan* plan, std::vector<double>* loads) {
  // Only a measured table may need the second run, from the same input.
  Plan input;
  if (cost.measured()) {
    input = *plan;
    input.tasks.clear();
  }
  DistcaPlanner planner(cost, plan, /*merge_aware=*/true, read);
  DISTCA_RETURN_IF_ERROR(planner.Run(eps, /*repack=*/true, loads));
  if (plan->bound_met) return Status::Ok();
  if (!cost.measured()) return KeepColocatedUnlessLower(cost, plan, loads);
  // With a measured table, charging each chunk in full sometimes meets a
  // bound the merge-aware greedy misses (in a randomized comparison of the
  // two alone, 7 of 1,500 cases, against 3 the other way): on a miss the
  // plain greedy runs too, and the plan with the lower maximum load is kept.
  Plan other = input;
  std::vector<double> other_loads;
  DistcaPlanner plain(cost, &other, /*merge_aware=*/false, read);
  DISTCA_RETURN_IF_ERROR(plain.Run(eps, /*repack=*/true, &other_loads));
  if (other.bound_met ||
      *std::max_element(other_loads.begin(), other_loads.end()) < *std::max_element(loads->begin(), loads->end())) {
    *plan = std::move(other);
    *loads = std::move(other_loads);
  }
  return KeepColocatedUnlessLower(cost, plan, loads);
}

}  // namespace

Status PlanDistca(const CostModel& cost, double eps, Plan* plan, std::vector<double>* loads) {
  return PlanDistca(cost, eps, DistcaRead::kAuto, plan, loads);
}

Status PlanDistca(const CostModel& cost, double eps, DistcaRead read, Plan* plan, std::vector<double>* loads) {
  DISTCA_RETURN_IF_ERROR(PlanDistcaAt(cost, eps, read, plan, loads));
  if (plan->bound_met) return Status::Ok();
  // A missed bound: plans for other bounds are tried, and the best kept:
  // one that meets eps, else the lowest maximum load.
  Plan input = *plan;  // the planners change only the tasks
  input.tasks.clear();
  const auto max_of = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  const auto mean_of = [](const std::vector<double>& v) {
    return std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
  };
  const auto meets_eps = [&](const std::vector<double>& v) { return max_of(v) <= (1 + eps) * mean_of(v) * (1 + 1e-9); };
  // Keeps `trial` if it is better: it meets eps where the kept plan does
  // not, or, both or neither meeting it, has the lower maximum load.
  const auto consider = [&](Plan& trial, std::vector<double>& trial_loads) {
    const bool meets = meets_eps(trial_loads), kept_meets = meets_eps(*loads);
    if (meets != kept_meets ? meets : max_of(trial_loads) < max_of(*loads)) {
      *plan = std::move(trial);
      *loads = std::move(trial_loads);
    }
  };
  // Plans at `trial_eps` and keeps that plan if it is better; `met`: whether
  // it met its own bound.
  bool met = false;
  const auto try_at = [&](double trial_eps) -> Status {
    Plan trial = input;
    std::vector<double> trial_loads;
    DISTCA_RETURN_IF_ERROR(PlanDistcaAt(cost, trial_eps, read, &trial, &trial_loads));
    met = trial.bound_met;
    consider(trial, trial_loads);
    return Status::Ok();
  };
  // With a measured table, tighter bounds first (eps / 2, / 4, / 8). The
  // greedy's cap comes from the colocated mean, and cutting documents
  // moves the mean (a table's costs do not add up), so a plan within the
  // cap can end above (1 + eps) x its own mean, where a plan for a tighter
  // cap meets the bound: one 5,658-token document on 4 ranks and 3
  // servers, block 512, met eps 0.5 at 1.37 x the mean and missed eps 1 at
  // 2.02 x, its servers idle.
  if (cost.measured())
    for (double tighter = eps / 2; tighter >= eps / 8 && tighter > 0 && !meets_eps(*loads); tighter /= 2)
      DISTCA_RETURN_IF_ERROR(try_at(tighter));
  // Then, still missing, the plan for FLOPs, its loads costed by the
  // table: a table's costs do not add up (a task's cost is not its parts'),
  // and the greedy's cap, set from the colocated mean, can hold it from the
  // cut that balances, where FLOPs, which add up, find it (a 1,024-token
  // document and four of 256 on 2 ranks, block 128: 1.15 x the mean by the
  // table's plan, 1.01 x by the FLOPs plan, both costed by the table).
  // After the tighter bounds: tried first, a plan for FLOPs that just met
  // eps kept the simulator from tighter plans for the table that met it
  // better (its grids ran up to 0.4% slower).
  if (cost.measured() && !meets_eps(*loads)) {
    Plan trial = input;
    std::vector<double> flops_loads;
    DISTCA_RETURN_IF_ERROR(PlanDistcaAt(CostModel::Flops(input.model), eps, read, &trial, &flops_loads));
    std::vector<double> trial_loads = TaskLoads(trial, cost);
    consider(trial, trial_loads);
  }
  // Where eps is below what any plan reaches (eps 0, or the blocks'
  // granularity), the greedy stops as soon as its donors find no room, and
  // its maximum can be far above what a slightly looser bound gives (a
  // 256-rank batch: 5.96 x the mean at eps 0, 1.0001 x at 1e-4). Looser
  // bounds are tried, doubling from max(2 eps, 1%), while they could lower
  // the maximum, until one is met (a looser one allows a higher maximum). A
  // near miss, within the first looser bound, stays: retried from 1e-4, the
  // simulator's plans at eps 0 gained hundredths of a percent of balance for
  // up to twice the largest buffer.
  constexpr int kLooserTries = 10;
  double looser = std::max(2 * eps, 0.01);
  met = false;
  for (int i = 0; i < kLooserTries && !met && !meets_eps(*loads) && (1 + looser) * mean_of(*loads) < max_of(*loads);
       ++i, looser *= 2)
    DISTCA_RETURN_IF_ERROR(try_at(looser));
  plan->bound_met = meets_eps(*loads);
  return Status::Ok();
}

Status PlanDistcaGreedyOnly(const CostModel& cost, double eps, Plan* plan, std::vector<double>* loads) {
  DistcaPlanner planner(cost, plan, /*merge_aware=*/true);
  return planner.Run(eps, /*repack=*/false, loads);
}

}  // namespace distca::plan
