// The `paper` policy: DistCA's published greedy balancer
// (hao-ai-lab/DistCA, distca/planner/planner.py, Planner.plan_items), kept for
// side-by-side comparison. docs/planner.md lists its known flaws. Faithful in:
//   - items: each linear-layout piece starts as one item on its rank;
//   - mean over all servers; recipients are servers strictly below the mean,
//     taken once, largest deficit first; donors are the servers strictly above
//     the mean, recomputed at every step;
//   - candidates: every item on a donor, scored by the published estimate
//     volume / F with F = min(donor surplus, need, item FLOPs) in causal
//     pairs, volume = (F / (L + 1)) * hidden + 2 * (L + 1) * Hkv * D
//     (whole-document KV; element counts); lowest score wins, ties to the
//     earliest item;
//   - an item whose FLOPs fit in F moves whole, else the innermost m mirrored
//     pairs around the item's middle move (head/tail split), m = F / pair cost,
//     so the moved FLOPs never exceed F;
//   - a recipient stops when its deficit is within eps * mean, when no donor or
//     candidate is left, or when the best candidate would move nothing.
// Adapted to this project: cuts fall on block multiples (m is rounded down to
// whole blocks and the middle is a block multiple), FLOPs include the
// 4 * D * Hq factor (the ordering is unchanged), and costs may come from a
// measured table.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <tuple>

#include "plan/planner_internal.h"

namespace distca::plan {
namespace {

// An item: one or two query ranges (head, tail) of one document on one server.
// A single range is stored as head = [b, c), tail = [c, e) around its middle c.
struct Item {
  int32_t doc;
  int64_t head_begin, head_end;  // head [head_begin, head_end)
  int64_t tail_begin, tail_end;  // tail [tail_begin, tail_end)
  int server;
  bool moved_out = false;  // moved to a recipient: never a candidate again
  // Cached from the ranges by Refresh: the candidate scan reads every item
  // at every step, and recomputing these there was most of its time.
  double flops = 0;  // cost of head + tail, in the cost model's unit
  double pairs = 0;  // causal pairs of head + tail
  double floor = 0;  // its score when it moves whole, the least it can score
};

class PaperPlanner {
 public:
  PaperPlanner(const CostModel& cost, double eps, PaperScan scan, Plan* plan)
      : cost_(cost), eps_(eps), scan_(scan), plan_(*plan) {}
  void Run(std::vector<double>* loads);

 private:
  // Sets it.flops and it.pairs from its ranges; call after changing them.
  void Refresh(Item& it) const {
    it.flops = cost_.TaskCost(it.head_begin, it.head_end) + cost_.TaskCost(it.tail_begin, it.tail_end);
    it.pairs = double(CausalPairs(it.head_begin, it.head_end) + CausalPairs(it.tail_begin, it.tail_end));
  }
  // The published score of moving f (cost units, 0 < f <= it.flops) of the
  // item: bytes per causal pair moved, estimated in causal pairs as query
  // tokens F / (L + 1) and whole-document K/V. It falls as f grows, so
  // it.floor = Score(it, it.flops) bounds every score the item can have;
  // rounding can take a score below that bound by a few units in the last
  // place (its four operations), never by kFloorSlack.
  double Score(const Item& it, double f) const {
    const double length = double(plan_.documents[it.doc].length);
    const double f_pairs = f * it.pairs / it.flops;
    const double volume = f_pairs / (length + 1) * hidden_ + (length + 1) * kv_width_;
    return volume / f_pairs;
  }
  static constexpr double kFloorSlack = 1e-12;
  // kAuto: the steps read in full before the index is built. A full read
  // costs a step little where items are few, and most plans take few steps
  // (the simulator's 4D grid's distca-paper runs took a fifth less time so
  // than with the index from the start); a plan taking many steps gets the index early.
  static constexpr int64_t kFullScanSteps = 64;
  // Builds the index of every item not moved out, and the donors' keys
  // (surplus: per server, its load less the mean; a donor while above 0);
  // full_scan_ false after.
  void Index(const std::vector<double>& surplus);
  // Keeps server s's place among the donors: call after its items or its
  // surplus change (a donor while the surplus is above 0).
  void KeyDonor(int s, double surplus);
  // Moves up to f of item i to `recipient`; returns the cost moved.
  double Split(size_t i, double f, int recipient);
  // Keeps item i's entry in its server's candidate index; call Unlist
  // before changing it and List after.
  void List(size_t i);
  void Unlist(size_t i);

  const CostModel& cost_;
  const double eps_;
  const PaperScan scan_;
  bool full_scan_ = true;  // this step reads every item (no index yet)
  Plan& plan_;
  const double hidden_ = double(plan_.model.q_heads) * plan_.model.head_dim;
  const double kv_width_ = 2.0 * plan_.model.kv_heads * plan_.model.head_dim;
  std::vector<Item> items_;
  // Per server, its items still candidates (not moved out) with work left,
  // ordered by (floor, index).
  std::vector<std::set<std::pair<double, size_t>>> listed_;
  std::vector<std::multiset<double>> listed_flops_;  // their costs
  // The donors with listed items, keyed so that a step need not read every
  // one (which made a plan quadratic in servers). A donor whose largest item
  // fits in its surplus is "loose": at a step whose need that item fits too,
  // all its items move whole and each scores exactly its floor, so its best
  // is its first listed item and the best of all such donors is the one with
  // the least first (floor, index). The others are "tight" (an item beyond
  // the surplus) and are read by their least floor, as are the loose ones
  // whose largest item exceeds the step's need.
  struct DonorKey {
    bool listed = false, tight = false;
    double floor = 0, largest = 0;  // its first item's floor, its largest item's cost
    size_t item = 0;                // its first item
  };
  std::vector<DonorKey> keys_;
  std::set<std::tuple<double, size_t, int>> loose_by_first_;  // (floor, item, server)
  std::set<std::pair<double, int>> loose_by_largest_;         // (largest, server)
  std::set<std::pair<double, int>> tight_by_floor_;           // (floor, server)
};

void PaperPlanner::Index(const std::vector<double>& surplus) {
  const int servers = static_cast<int>(surplus.size());
  full_scan_ = false;
  listed_.assign(servers, {});
  listed_flops_.assign(servers, {});
  for (size_t i = 0; i < items_.size(); ++i) List(i);
  keys_.assign(servers, {});
  loose_by_first_.clear();
  loose_by_largest_.clear();
  tight_by_floor_.clear();
  for (int s = 0; s < servers; ++s) KeyDonor(s, surplus[s]);
}

void PaperPlanner::KeyDonor(int s, double surplus) {
  if (full_scan_) return;
  DonorKey& k = keys_[s];
  if (k.listed && k.tight) {
    tight_by_floor_.erase({k.floor, s});
  } else if (k.listed) {
    loose_by_first_.erase({k.floor, k.item, s});
    loose_by_largest_.erase({k.largest, s});
  }
  k.listed = surplus > 0 && !listed_[s].empty();
  if (!k.listed) return;
  std::tie(k.floor, k.item) = *listed_[s].begin();
  k.largest = *listed_flops_[s].rbegin();
  k.tight = !(k.largest <= surplus);
  if (k.tight) {
    tight_by_floor_.insert({k.floor, s});
  } else {
    loose_by_first_.insert({k.floor, k.item, s});
    loose_by_largest_.insert({k.largest, s});
  }
}

void PaperPlanner::List(size_t i) {
  Item& it = items_[i];
  if (full_scan_ || it.moved_out || it.flops <= 0) return;
  it.floor = Score(it, it.flops);
  listed_[it.server].insert({it.floor, i});
  listed_flops_[it.server].insert(it.flops);
}

void PaperPlanner::Unlist(size_t i) {
  const Item& it = items_[i];
  if (full_scan_ || it.moved_out || it.flops <= 0) return;
  listed_[it.server].erase({it.floor, i});
  std::multiset<double>& costs = listed_flops_[it.server];
  costs.erase(costs.find(it.flops));
}

double PaperPlanner::Split(size_t i, double f, int recipient) {
  Item& it = items_[i];
  const double total = it.flops;
  if (f >= total) {  // move whole
    Unlist(i);
    it.server = recipient;
    it.moved_out = true;
    return total;
  }
  // Innermost mirrored pairs (head_end - 1 - j, tail_begin + j) each cost the
  // same (head_end + tail_begin + 1 causal pairs), so m pairs move m of them.
  const int64_t block = plan_.block;
  const double pair_cost =
      cost_.TaskCost(it.head_end - 1, it.head_end) + cost_.TaskCost(it.tail_begin, it.tail_begin + 1);
  int64_t m = pair_cost > 0 ? static_cast<int64_t>(std::floor(f / pair_cost)) : 0;
  m = std::min({m, it.head_end - it.head_begin, it.tail_end - it.tail_begin});
  m = m / block * block;  // cuts stay on block multiples (head_end, tail_begin are)
  if (m <= 0) return 0.0;
  Unlist(i);
  Item moved = it;
  moved.head_begin = it.head_end - m;
  moved.tail_end = it.tail_begin + m;
  moved.server = recipient;
  moved.moved_out = true;
  it.head_end -= m;
  it.tail_begin += m;
  Refresh(it);
  Refresh(moved);
  List(i);
  items_.push_back(moved);
  return moved.flops;
}

void PaperPlanner::Run(std::vector<double>* loads) {
  const int servers = plan_.servers();
  const int64_t block = plan_.block;
  items_.clear();
  std::vector<double> load(servers, 0.0);
  for (size_t d = 0; d < plan_.documents.size(); ++d) {
    for (const PlanPiece& p : plan_.documents[d].pieces) {
      // The middle, on a block multiple inside the piece when there is one.
      int64_t mid = (p.begin + (p.end - p.begin + 1) / 2) / block * block;
      if (mid <= p.begin) mid = std::min(p.end, (p.begin / block + 1) * block);
      items_.push_back({static_cast<int32_t>(d), p.begin, mid, mid, p.end, p.rank});
      Refresh(items_.back());
      load[p.rank] += items_.back().flops;
    }
  }
  const double mean = std::accumulate(load.begin(), load.end(), 0.0) / servers;
  const double threshold = eps_ * mean;
  full_scan_ = true;
  int64_t steps = 0;
  // Donors are the servers strictly above the mean.
  const auto surplus_of = [&] {
    std::vector<double> surplus(servers);
    for (int s = 0; s < servers; ++s) surplus[s] = load[s] - mean;
    return surplus;
  };
  if (scan_ == PaperScan::kIndexed) Index(surplus_of());

  std::vector<int> recipients;
  for (int s = 0; s < servers; ++s)
    if (load[s] < mean) recipients.push_back(s);
  std::stable_sort(recipients.begin(), recipients.end(), [&](int a, int b) { return load[a] < load[b]; });

  for (int r : recipients) {
    double need = mean - load[r];
    while (need > threshold) {
      // Candidates: items on donors (strictly above the mean) with work
      // left; the lowest score wins, ties to the earliest item. Read in
      // full (as published) for the first steps, then from the index: a
      // donor's items by their floor, the least each can score, up to the
      // first that cannot beat the best so far, without reading the many
      // that cannot win (a batch of thousands of short documents made the
      // full read quadratic). Where every item of the donor moves whole
      // (its cost within surplus and need), each scores exactly its floor,
      // so an item at the best score after the best one ends the read too.
      if (full_scan_ && scan_ == PaperScan::kAuto && steps == kFullScanSteps) Index(surplus_of());
      ++steps;
      size_t best = items_.size();
      double best_score = 0, best_f = 0;
      // Item i of a donor with this surplus as a candidate.
      const auto consider = [&](size_t i, double surplus) {
        const double f = std::min({surplus, need, items_[i].flops});
        const double score = Score(items_[i], f);
        if (best == items_.size() || score < best_score || (score == best_score && i < best)) {
          best = i;
          best_score = score;
          best_f = f;
        }
      };
      if (full_scan_) {
        for (size_t i = 0; i < items_.size(); ++i) {
          const Item& it = items_[i];
          const double surplus = load[it.server] - mean;
          if (it.moved_out || surplus <= 0 || it.flops <= 0) continue;
          consider(i, surplus);
        }
      } else {
        // A donor's items by floor, up to the first that cannot beat the
        // best so far.
        const auto read = [&](int s, bool whole) {
          const double surplus = load[s] - mean;
          for (const auto& [floor, i] : listed_[s]) {
            if (best < items_.size() && (whole ? floor > best_score || (floor == best_score && i > best)
                                               : floor * (1 - kFloorSlack) > best_score))
              break;
            consider(i, surplus);
          }
        };
        // The best donor whose items all move whole at this step: the first
        // loose one (by its first item) whose largest item fits the need.
        // The loose ones passed over, and the tight ones, are read by their
        // least floor: none clearly above the best score can beat it. (The
        // best is the least (score, index) in whatever order the donors are
        // read, and each read stops only at items that cannot beat the best
        // so far, hence not the last.)
        // (When the smallest largest item exceeds the need, none does.)
        if (!loose_by_largest_.empty() && loose_by_largest_.begin()->first <= need)
          for (const auto& [floor, i, s] : loose_by_first_)
            if (keys_[s].largest <= need) {
              read(s, true);
              break;
            }
        const auto can_win = [&](int s) {
          return best == items_.size() || !(keys_[s].floor * (1 - kFloorSlack) > best_score);
        };
        for (auto it = loose_by_largest_.rbegin(); it != loose_by_largest_.rend() && !(it->first <= need); ++it)
          if (can_win(it->second)) read(it->second, false);
        for (const auto& [floor, s] : tight_by_floor_) {
          if (!can_win(s)) break;
          read(s, false);
        }
      }
      // (As published, no donor with an item left also ends the recipient;
      // then there is no candidate either.)
      if (best == items_.size()) break;
      const int donor = items_[best].server;
      const double moved = Split(best, best_f, r);
      if (moved <= 0) break;  // as published: give up on this recipient
      load[donor] -= moved;
      load[r] += moved;
      need -= moved;
      for (int s : {donor, r}) KeyDonor(s, load[s] - mean);
    }
  }

  // An item whose head and tail touch (one range, stored split at its
  // middle) is one task: the kernel runs it as one range.
  plan_.tasks.clear();
  for (const Item& it : items_) {
    if (it.head_end == it.tail_begin && it.head_begin < it.tail_end) {
      plan_.tasks.push_back({it.doc, it.head_begin, it.tail_end, it.server});
      continue;
    }
    if (it.head_begin < it.head_end) plan_.tasks.push_back({it.doc, it.head_begin, it.head_end, it.server});
    if (it.tail_begin < it.tail_end) plan_.tasks.push_back({it.doc, it.tail_begin, it.tail_end, it.server});
  }
  *loads = TaskLoads(plan_, cost_);
}

}  // namespace

Status PlanPaper(const CostModel& cost, double eps, Plan* plan, std::vector<double>* loads) {
  return PlanPaper(cost, eps, PaperScan::kAuto, plan, loads);
}

Status PlanPaper(const CostModel& cost, double eps, PaperScan scan, Plan* plan, std::vector<double>* loads) {
  PaperPlanner planner(cost, eps, scan, plan);
  planner.Run(loads);
  return Status::Ok();
}

}  // namespace distca::plan
