// MergePartials against whole-range attention, and its -inf edge cases.
#include "attn/attention_testing.h"

namespace distca::testing {
namespace {

// Attention of the last `q` tokens of an L-token document over all L keys equals
// the merge of (a) full attention over keys [0, a), which every query sees in
// full because a <= L - q, and (b) causal attention over keys [a, L).
TEST(MergeTest, SplitKeyRangeEqualsWhole) {
  constexpr int64_t kL = 600, kQ = 150, kSplit = 333;
  constexpr int kHq = 4, kHkv = 2, kDim = 64;
  Batch whole = PackedBatch({{kQ, kL}}, kHq, kHkv, kDim, true, 21);
  const int64_t kv_row = kHkv * kDim;

  Batch left = whole;  // keys [0, kSplit), no mask
  left.shape.causal = false;
  left.shape.total_k = kSplit;
  left.tasks = {{0, kQ, 0, kSplit}};
  left.k.resize(kSplit * kv_row);
  left.v.resize(kSplit * kv_row);

  Batch right = whole;  // keys [kSplit, L), bottom-right causal
  right.tasks = {{0, kQ, kSplit, kL - kSplit}};

  for (AttentionKernel kernel : AvailableAttentionKernels()) {
    SCOPED_TRACE(AttentionKernelName(kernel));
    const ForwardResult ref = RunForward(whole, AttentionKernel::kReference);
    const ForwardResult l = RunForward(left, kernel);
    const ForwardResult r = RunForward(right, kernel);
    ForwardResult merged;
    merged.out.resize(l.out.size());
    merged.lse.resize(l.lse.size());
    ASSERT_TRUE(MergePartials(kQ, kHq, kDim, l.out.data(), l.lse.data(), r.out.data(), r.lse.data(), merged.out.data(),
                              merged.lse.data())
                    .ok());
    // Merging adds a few roundings to each partial's error; 64 ulps of the
    // largest value bounds the sum comfortably (values are O(1) here).
    const double tol = 64 * std::numeric_limits<float>::epsilon() * std::max(1.0, MaxAbsFinite(ref.out));
    EXPECT_LE(MaxAbsDiff(merged.out, ref.out), tol);
    EXPECT_LE(MaxAbsDiff(merged.lse, ref.lse), 64 * std::numeric_limits<float>::epsilon() * MaxAbsFinite(ref.lse));
  }
}

TEST(MergeTest, NegativeInfinityEdges) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Two rows, one head, head_dim 2. Row 0: only side 1 saw keys (side 2's O is
  // garbage and must not leak). Row 1: neither side saw keys.
  const std::vector<float> o1 = {1.0f, 2.0f, 5.0f, 6.0f}, l1 = {0.5f, -inf};
  const std::vector<float> o2 = {nan, nan, 7.0f, 8.0f}, l2 = {-inf, -inf};
  std::vector<float> out(4), lse(2);
  ASSERT_TRUE(MergePartials(2, 1, 2, o1.data(), l1.data(), o2.data(), l2.data(), out.data(), lse.data()).ok());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 2.0f);
  EXPECT_EQ(lse[0], 0.5f);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_EQ(out[3], 0.0f);
  EXPECT_EQ(lse[1], -inf);
}

// A NaN in a side that saw keys reaches the result: in its LSE (even against
// a side at -inf), or in its O row (even when its weight underflows to 0).
TEST(MergeTest, NaNIsNotDropped) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Rows: (NaN LSE, -inf), (-inf, NaN LSE), (NaN LSE, 1), (NaN O at LSE -200, O 1 at LSE 0).
  const std::vector<float> o1 = {1.0f, 1.0f, 1.0f, nan}, l1 = {nan, -inf, nan, -200.0f};
  const std::vector<float> o2 = {2.0f, 2.0f, 2.0f, 1.0f}, l2 = {-inf, nan, 1.0f, 0.0f};
  std::vector<float> out(4), lse(4);
  ASSERT_TRUE(MergePartials(4, 1, 1, o1.data(), l1.data(), o2.data(), l2.data(), out.data(), lse.data()).ok());
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE(r);
    EXPECT_TRUE(std::isnan(out[r]));
    EXPECT_TRUE(std::isnan(lse[r]));
  }
  EXPECT_TRUE(std::isnan(out[3]));
  EXPECT_FLOAT_EQ(lse[3], 0.0f);
}

TEST(MergeTest, EqualHalvesAndInPlace) {
  // Equal LSEs weigh both sides 1/2 and add log(2); output may alias input 1.
  std::vector<float> o1 = {1.0f, 3.0f}, l1 = {2.0f};
  const std::vector<float> o2 = {3.0f, 5.0f}, l2 = {2.0f};
  ASSERT_TRUE(MergePartials(1, 1, 2, o1.data(), l1.data(), o2.data(), l2.data(), o1.data(), l1.data()).ok());
  EXPECT_FLOAT_EQ(o1[0], 2.0f);
  EXPECT_FLOAT_EQ(o1[1], 4.0f);
  EXPECT_FLOAT_EQ(l1[0], 2.0f + std::log(2.0f));
}

TEST(MergeTest, LargeLseDoesNotOverflow) {
  // exp(1000) overflows float; the stable form never evaluates it.
  const std::vector<float> o1 = {1.0f}, l1 = {1000.0f}, o2 = {3.0f}, l2 = {1000.0f};
  std::vector<float> out(1), lse(1);
  ASSERT_TRUE(MergePartials(1, 1, 1, o1.data(), l1.data(), o2.data(), l2.data(), out.data(), lse.data()).ok());
  EXPECT_FLOAT_EQ(out[0], 2.0f);
  EXPECT_FLOAT_EQ(lse[0], 1000.0f + std::log(2.0f));
}

}  // namespace
}  // namespace distca::testing
