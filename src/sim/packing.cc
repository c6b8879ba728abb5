// Document packing for the baselines: fixed-length chunks, WLB-LLM's
// variable-length bins, and LPT assignment of micro-batches to replicas.
#include <algorithm>
#include <numeric>

#include "sim/strategy.h"

namespace distca::sim {
namespace {

// WLB-LLM's cost of a document: (l/b)^2 + l/b, attention plus linear work in
// units of a document of the breakpoint length b.
double WlbCost(int64_t len, double breakpoint) {
  const double x = double(len) / breakpoint;
  return x * x + x;
}

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
  std::vector<int64_t> tokens(waves, 0);
  for (int d : order) {
    const int w = int(std::min_element(tokens.begin(), tokens.end()) - tokens.begin());
    wave_of[d] = w;
    tokens[w] += docs[d];
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
  std::vector<double> load(bins, 0.0);
  std::vector<int64_t> tokens(bins, 0);
  for (int d : order) {
    int best = -1;
    for (int b = 0; b < bins; ++b) {
      if (tokens[b] + docs[d] > cap) continue;
      if (best < 0 || load[b] < load[best]) best = b;
    }
    if (best < 0) best = int(std::min_element(tokens.begin(), tokens.end()) - tokens.begin());
    out[best].push_back(docs[d]);
    load[best] += WlbCost(docs[d], breakpoint);
    tokens[best] += docs[d];
  }
  return out;
}

std::vector<std::vector<int64_t>> WlbBalance(const std::vector<int64_t>& docs, int bins, int64_t cap,
                                             double breakpoint) {
  std::vector<int64_t> sorted = docs;
  std::stable_sort(sorted.begin(), sorted.end(), std::greater<>());
  std::vector<std::vector<int64_t>> out(bins);
  std::vector<double> load(bins, 0.0);
  std::vector<int64_t> tokens(bins, 0);
  auto put = [&](int b, int64_t len) {
    out[b].push_back(len);
    load[b] += WlbCost(len, breakpoint);
    tokens[b] += len;
  };
  std::vector<int64_t> set_aside;
  for (int64_t len : sorted) {
    const int lightest = int(std::min_element(load.begin(), load.end()) - load.begin());
    const int emptiest = int(std::min_element(tokens.begin(), tokens.end()) - tokens.begin());
    if (tokens[lightest] + len <= cap)
      put(lightest, len);
    else if (tokens[emptiest] + len <= cap)
      put(emptiest, len);
    else
      set_aside.push_back(len);
  }
  for (int64_t len : set_aside) put(int(std::min_element(load.begin(), load.end()) - load.begin()), len);
  return out;
}

std::vector<std::vector<int>> AssignLpt(const std::vector<double>& times, int replicas) {
  std::vector<int> order(times.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return times[a] > times[b]; });
  const size_t most = (times.size() + size_t(replicas) - 1) / size_t(replicas);
  std::vector<std::vector<int>> out(replicas);
  std::vector<double> total(replicas, 0.0);
  for (int i : order) {
    int best = -1;
    for (int r = 0; r < replicas; ++r)
      if (out[r].size() < most && (best < 0 || total[r] < total[best])) best = r;
    out[best].push_back(i);
    total[best] += times[i];
  }
  return out;
}

}  // namespace distca::sim
