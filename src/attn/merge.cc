// MergePartials: combine attention results over disjoint key sets.
#include <cmath>
#include <limits>
#include <string>

#include "distca/attention.h"

namespace distca {

Status MergePartials(int64_t rows, int heads, int head_dim, const float* out1, const float* lse1, const float* out2,
                     const float* lse2, float* out, float* lse) {
  if (rows < 0) return Status::InvalidArgument("rows is negative (" + std::to_string(rows) + ")");
  if (heads <= 0) return Status::InvalidArgument("heads must be positive, got " + std::to_string(heads));
  if (head_dim <= 0) return Status::InvalidArgument("head_dim must be positive, got " + std::to_string(head_dim));
  if (rows == 0) return Status::Ok();
  const std::pair<const void*, const char*> pointers[] = {{out1, "out1"}, {lse1, "lse1"}, {out2, "out2"},
                                                          {lse2, "lse2"}, {out, "out"},   {lse, "lse"}};
  for (const auto& [p, name] : pointers)
    if (p == nullptr) return Status::InvalidArgument(std::string(name) + " is null");

  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    for (int h = 0; h < heads; ++h) {
      const int64_t li = int64_t{h} * rows + r;
      const int64_t oi = (r * heads + h) * head_dim;
      const float l1 = lse1[li];
      const float l2 = lse2[li];
      // The larger LSE; a NaN on either side is the result's (std::fmax
      // would drop it, and with the other side at -inf lose it entirely).
      const float m = std::isnan(l1) || l1 > l2 ? l1 : l2;
      if (m == kNegInf) {  // neither side saw a key
        for (int d = 0; d < head_dim; ++d) out[oi + d] = 0.0f;
        lse[li] = kNegInf;
        continue;
      }
      // Weights relative to the larger LSE: one of them is exactly 1, and a
      // -inf side gets weight exp(-inf) = 0.
      const float w1 = std::exp(l1 - m);
      const float w2 = std::exp(l2 - m);
      const float total = w1 + w2;
      const float a1 = w1 / total;
      const float a2 = w2 / total;
      for (int d = 0; d < head_dim; ++d) {
        // A side that saw no key (LSE -inf) is skipped, so whatever its O row
        // holds cannot leak in; any other side's O, a NaN included, counts.
        const float x1 = l1 == kNegInf ? 0.0f : a1 * out1[oi + d];
        const float x2 = l2 == kNegInf ? 0.0f : a2 * out2[oi + d];
        out[oi + d] = x1 + x2;
      }
      lse[li] = m + std::log(total);
    }
  }
  return Status::Ok();
}

}  // namespace distca
