// Document packing for the baselines: fixed-length chunks, WLB-LLM's
// variable-length bins, and LPT assignment of micro-batches to replicas.
#include <algorithm>
#include <numeric>
#include <set>
#include <utility>
#include <vector>

#include "sim/strategy.h"

namespace distca::sim {
namespace {

// WLB-LLM's cost of a document: (l/b)^2 + l/b, attention plus linear work in
// units of a document of the breakpoint length b.
double WlbCost(int64_t len, double breakpoint) {
  const double x = double(len) / breakpoint;
  return x * x + x;
}

// The index whose value is least, the lowest index among equal values (as
// std::min_element over the values would pick), kept in O(log n) per change:
// the greedy packers below pick one per document, over as many bins as there
// are micro-batches (millions at the simulator's limits).
template <typename T>
class MinFirst {
 public:
  explicit MinFirst(int n) : values_(size_t(n), T{}) {
    for (int i = 0; i < n; ++i) order_.emplace_hint(order_.end(), T{}, i);  // in order: linear
  }
  int First() const { return order_.begin()->second; }
  // The first index in that order for which fits(i) holds, or -1.
  template <typename Fits>
  int FirstWhere(Fits fits) const {
    for (const auto& entry : order_)
      if (fits(entry.second)) return entry.second;
    return -1;
  }
  T value(int i) const { return values_[size_t(i)]; }
  void Add(int i, T delta) {
    order_.erase({values_[size_t(i)], i});
    values_[size_t(i)] += delta;
    order_.emplace(values_[size_t(i)], i);
  }
  // i is no longer a candidate (its value is still kept).
  void Remove(int i) { order_.erase({values_[size_t(i)], i}); }

 private:
  std::vector<T> values_;
  std::set<std::pair<T, int>> order_;
};

}  // namespace

std::vector<std::vector<int64_t>> CutIntoChunks(const std::vector<int64_t>& docs, int64_t tokens) {
  std::vector<std::vector<int64_t>> chunks(1);
  int64_t room = tokens;
  for (int64_t len : docs) {
    while (len > 0) {
      if (room == 0) {
        chunks.emplace_back();
        room = tokens;
      }
      const int64_t piece = std::min(len, room);
      chunks.back().push_back(piece);
      room -= piece;
      len -= piece;
    }
  }
  return chunks;
}

std::vector<std::vector<int64_t>> SplitIntoWaves(const std::vector<int64_t>& docs, int waves, int64_t tokens) {
  std::vector<std::vector<int64_t>> out(waves);
  int64_t offset = 0;
  for (int64_t len : docs) {
    const int64_t w = std::min<int64_t>(waves - 1, (offset + len / 2) / tokens);
    out[w].push_back(len);
    offset += len;
  }
  return out;
}

std::vector<std::vector<int64_t>> BalanceWaves(const std::vector<int64_t>& docs, int waves) {
  std::vector<int> order(docs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return docs[a] > docs[b]; });
  std::vector<int> wave_of(docs.size(), 0);
  MinFirst<int64_t> tokens(waves);
  for (int d : order) {
    const int w = tokens.First();
    wave_of[d] = w;
    tokens.Add(w, docs[d]);
  }
  std::vector<std::vector<int64_t>> out(waves);
  for (size_t d = 0; d < docs.size(); ++d) out[wave_of[d]].push_back(docs[d]);
  return out;
}

std::vector<std::vector<int64_t>> WlbPack(const std::vector<int64_t>& docs, int bins, double breakpoint, int64_t cap) {
  std::vector<int> order(docs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return docs[a] > docs[b]; });
  std::vector<std::vector<int64_t>> out(bins);
  MinFirst<double> load(bins);
  MinFirst<int64_t> tokens(bins);
  for (int d : order) {
    int best = load.FirstWhere([&](int b) { return tokens.value(b) + docs[d] <= cap; });
    if (best < 0) best = tokens.First();
    out[best].push_back(docs[d]);
    load.Add(best, WlbCost(docs[d], breakpoint));
    tokens.Add(best, docs[d]);
  }
  return out;
}

std::vector<std::vector<int64_t>> WlbBalance(const std::vector<int64_t>& docs, int bins, int64_t cap,
                                             double breakpoint) {
  std::vector<int64_t> sorted = docs;
  std::stable_sort(sorted.begin(), sorted.end(), std::greater<>());
  std::vector<std::vector<int64_t>> out(bins);
  MinFirst<double> load(bins);
  MinFirst<int64_t> tokens(bins);
  auto put = [&](int b, int64_t len) {
    out[b].push_back(len);
    load.Add(b, WlbCost(len, breakpoint));
    tokens.Add(b, len);
  };
  std::vector<int64_t> set_aside;
  for (int64_t len : sorted) {
    const int lightest = load.First();
    const int emptiest = tokens.First();
    if (tokens.value(lightest) + len <= cap)
      put(lightest, len);
    else if (tokens.value(emptiest) + len <= cap)
      put(emptiest, len);
    else
      set_aside.push_back(len);
  }
  for (int64_t len : set_aside) put(load.First(), len);
  return out;
}

std::vector<std::vector<int>> AssignLpt(const std::vector<double>& times, int replicas) {
  std::vector<int> order(times.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return times[a] > times[b]; });
  const size_t most = (times.size() + size_t(replicas) - 1) / size_t(replicas);
  std::vector<std::vector<int>> out(replicas);
  MinFirst<double> total(replicas);  // the replicas with room left
  for (int i : order) {
    const int best = total.First();
    out[best].push_back(i);
    total.Add(best, times[i]);
    if (out[best].size() == most) total.Remove(best);
  }
  return out;
}

}  // namespace distca::sim
