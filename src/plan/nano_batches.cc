// SplitNanoBatches: two (or more) nano-batches with near-equal tokens and
// attention work, documents kept whole.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "distca/plan.h"

namespace distca {

Status SplitNanoBatches(const std::vector<int64_t>& lengths, int count, std::vector<std::vector<int>>* nano_docs) {
  if (nano_docs == nullptr) return Status::InvalidArgument("nano_docs is null");
  if (count < 1) return Status::InvalidArgument(fmt::format("nano-batch count must be >= 1, got {}", count));
  if (static_cast<int>(lengths.size()) < count)
    return Status::InvalidArgument(
        fmt::format("{} documents cannot fill {} nano-batches (documents are not split)", lengths.size(), count));
  double total_tokens = 0, total_work = 0;
  for (int64_t len : lengths) {
    if (len <= 0) return Status::InvalidArgument(fmt::format("document length {} is not positive", len));
    if (len > kMaxDocumentLength)
      return Status::OutOfRange(
          fmt::format("document length {} is more than the supported {}", len, kMaxDocumentLength));
    total_tokens += double(len);
    total_work += double(CausalPairs(0, len));
  }
  std::vector<int> order(lengths.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return lengths[a] > lengths[b]; });
  std::vector<double> tokens(count, 0.0), work(count, 0.0);
  nano_docs->assign(count, {});
  for (int d : order) {
    int best = 0;
    double best_score = 0;
    for (int n = 0; n < count; ++n) {
      const double t = (tokens[n] + double(lengths[d])) / total_tokens * count;
      const double w = (work[n] + double(CausalPairs(0, lengths[d]))) / total_work * count;
      const double score = std::max(t, w);
      if (n == 0 || score < best_score) {
        best = n;
        best_score = score;
      }
    }
    tokens[best] += double(lengths[d]);
    work[best] += double(CausalPairs(0, lengths[d]));
    (*nano_docs)[best].push_back(d);
  }
  for (auto& docs : *nano_docs) {
    if (docs.empty()) return Status::InvalidArgument("a nano-batch came out empty");
    std::sort(docs.begin(), docs.end());
  }
  return Status::Ok();
}

}  // namespace distca
