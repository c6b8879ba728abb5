// The linear layout: documents in order, an equal share of tokens per rank.
#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "distca/plan.h"

namespace distca {

Status LinearLayout(const std::vector<int64_t>& doc_lengths, int ranks, std::vector<PlanDocument>* documents) {
  if (documents == nullptr) return Status::InvalidArgument("documents is null");
  if (ranks <= 0) return Status::InvalidArgument(fmt::format("ranks must be positive, got {}", ranks));
  if (doc_lengths.empty()) return Status::InvalidArgument("the batch has no documents");
  int64_t total = 0;
  for (size_t i = 0; i < doc_lengths.size(); ++i) {
    if (doc_lengths[i] <= 0)
      return Status::InvalidArgument(
          fmt::format("document {} has length {}; lengths must be positive", i, doc_lengths[i]));
    if (doc_lengths[i] > kMaxDocumentLength)
      return Status::OutOfRange(
          fmt::format("document {} has length {}, more than the supported {}", i, doc_lengths[i], kMaxDocumentLength));
    if (doc_lengths[i] > std::numeric_limits<int64_t>::max() / 4 - total)
      return Status::OutOfRange("the batch's total token count overflows");
    total += doc_lengths[i];
  }
  if (total < ranks)
    return Status::InvalidArgument(fmt::format("{} tokens cannot give each of {} ranks a token", total, ranks));

  // Rank r holds global tokens [Boundary(r), Boundary(r + 1)).
  // floor(total * r / ranks), without overflow.
  auto boundary = [&](int64_t r) { return (total / ranks) * r + ((total % ranks) * r) / ranks; };
  documents->assign(doc_lengths.size(), PlanDocument{});
  int rank = 0;
  int64_t start = 0;  // global position of the current document's first token
  for (size_t d = 0; d < doc_lengths.size(); ++d) {
    PlanDocument& doc = (*documents)[d];
    doc.length = doc_lengths[d];
    int64_t pos = 0;
    while (pos < doc.length) {
      while (boundary(rank + 1) <= start + pos) ++rank;
      const int64_t end = std::min(doc.length, boundary(rank + 1) - start);
      doc.pieces.push_back({rank, pos, end});
      pos = end;
    }
    start += doc.length;
  }
  return Status::Ok();
}

}  // namespace distca
