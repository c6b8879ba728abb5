// CA composes: cutting a document into query shards, each run as its own task
// with its causal KV prefix, gives the same result as the whole document; and
// shards sharing one KV prefix buffer equal shards with private KV copies.
#include <random>

#include "attn/attention_testing.h"

namespace distca::testing {
namespace {

constexpr int kHq = 8, kHkv = 2, kDim = 64;

// Random cut points of [0, length) into `pieces` non-empty query ranges.
std::vector<std::pair<int64_t, int64_t>> RandomRanges(int64_t length, int pieces, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> cuts = {0, length};
  std::uniform_int_distribution<int64_t> pick(1, length - 1);
  while (static_cast<int>(cuts.size()) < pieces + 1) {
    const int64_t c = pick(rng);
    if (std::find(cuts.begin(), cuts.end(), c) == cuts.end()) cuts.push_back(c);
  }
  std::sort(cuts.begin(), cuts.end());
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) ranges.push_back({cuts[i], cuts[i + 1]});
  std::shuffle(ranges.begin(), ranges.end(), rng);  // task order must not matter
  return ranges;
}

// The whole document as one task, and the same Q/K/V as shards that share the
// document's K/V rows: shard [b, e) reads keys [0, e).
struct Split {
  Batch whole;
  Batch shards;
};

Split MakeSplit(int64_t length, int pieces, uint64_t seed) {
  Split s;
  s.whole = PackedBatch({{length, length}}, kHq, kHkv, kDim, true, seed);
  s.shards = s.whole;
  s.shards.tasks.clear();
  for (auto [b, e] : RandomRanges(length, pieces, seed)) s.shards.tasks.push_back({b, e - b, 0, e});
  return s;
}

TEST(CompositionTest, ReferenceShardsEqualWholeExactly) {
  // The oracle computes each row independently, so splitting changes nothing.
  const Split s = MakeSplit(300, 7, 1);
  const ForwardResult whole = RunForward(s.whole, AttentionKernel::kReference);
  const ForwardResult shards = RunForward(s.shards, AttentionKernel::kReference);
  EXPECT_EQ(whole.out, shards.out);
  EXPECT_EQ(whole.lse, shards.lse);
  const BackwardResult gw = RunBackward(s.whole, whole, AttentionKernel::kReference);
  const BackwardResult gs = RunBackward(s.shards, shards, AttentionKernel::kReference);
  EXPECT_EQ(gw.dq, gs.dq);
  // dK/dV sum in a different task order: equal to double rounding, then cast to float.
  EXPECT_LE(MaxAbsDiff(gw.dk, gs.dk), 2 * std::numeric_limits<float>::epsilon() * MaxAbsFinite(gw.dk));
  EXPECT_LE(MaxAbsDiff(gw.dv, gs.dv), 2 * std::numeric_limits<float>::epsilon() * MaxAbsFinite(gw.dv));
}

TEST(CompositionTest, TiledShardsEqualWhole) {
  for (auto [length, pieces] : {std::pair{1000, 5}, std::pair{777, 13}, std::pair{1300, 3}}) {
    const Split s = MakeSplit(length, pieces, uint64_t(length));
    const Oracles x = OraclesFor(s.whole);
    for (AttentionKernel kernel : TiledKernels()) {
      SCOPED_TRACE(std::string(AttentionKernelName(kernel)) + " length " + std::to_string(length));
      const ForwardResult f = RunForward(s.shards, kernel, 3);
      ExpectWithinNaiveBound(f.out, x.naive_fwd.out, x.ref_fwd.out, "O");
      ExpectWithinNaiveBound(f.lse, x.naive_fwd.lse, x.ref_fwd.lse, "LSE");
      ExpectBackwardWithinNaiveBound(RunBackward(s.shards, x.ref_fwd, kernel, 3), x.naive_bwd, x.ref_bwd);
    }
  }
}

// Shards with private copies of their KV prefix (the cu_seqlens form, as a
// naive server would hold them) against shards sharing one prefix buffer.
TEST(CompositionTest, SharedKvEqualsDuplicatedKv) {
  const Split s = MakeSplit(900, 6, 3);
  const int64_t row = kHkv * kDim;
  Batch dup = s.shards;
  dup.k.clear();
  dup.v.clear();
  dup.tasks.clear();
  dup.shape.total_k = 0;
  std::vector<int32_t> cu_q = {0}, cu_k = {0};
  // Reorder Q by shard so the batch is in cu_seqlens form.
  std::vector<AttentionTask> order = s.shards.tasks;
  std::sort(order.begin(), order.end(), [](auto& a, auto& b) { return a.q_offset < b.q_offset; });
  for (const AttentionTask& t : order) {
    dup.tasks.push_back({t.q_offset, t.q_len, dup.shape.total_k, t.kv_len});
    dup.k.insert(dup.k.end(), s.shards.k.begin(), s.shards.k.begin() + t.kv_len * row);
    dup.v.insert(dup.v.end(), s.shards.v.begin(), s.shards.v.begin() + t.kv_len * row);
    dup.shape.total_k += t.kv_len;
    cu_q.push_back(static_cast<int32_t>(t.q_offset + t.q_len));
    cu_k.push_back(static_cast<int32_t>(dup.shape.total_k));
  }
  std::vector<AttentionTask> from_cu;
  ASSERT_TRUE(TasksFromCuSeqlens(cu_q, cu_k, &from_cu).ok());
  ASSERT_EQ(from_cu.size(), dup.tasks.size());
  for (size_t i = 0; i < from_cu.size(); ++i) {
    EXPECT_EQ(from_cu[i].q_offset, dup.tasks[i].q_offset) << i;
    EXPECT_EQ(from_cu[i].q_len, dup.tasks[i].q_len) << i;
    EXPECT_EQ(from_cu[i].k_offset, dup.tasks[i].k_offset) << i;
    EXPECT_EQ(from_cu[i].kv_len, dup.tasks[i].kv_len) << i;
  }

  for (AttentionKernel kernel : AvailableAttentionKernels()) {
    SCOPED_TRACE(AttentionKernelName(kernel));
    // Forward through the cu_seqlens entry point; identical tiles, identical bits.
    ForwardResult fd;
    fd.out.assign(dup.QSize(), 0.0f);
    fd.lse.assign(dup.LseSize(), 0.0f);
    ASSERT_TRUE(AttentionVarlenForward(dup.shape, cu_q, cu_k,
                                       {dup.q.data(), dup.k.data(), dup.v.data(), fd.out.data(), fd.lse.data()},
                                       {kernel, 2})
                    .ok());
    const ForwardResult fs = RunForward(s.shards, kernel);
    EXPECT_EQ(fd.out, fs.out);
    EXPECT_EQ(fd.lse, fs.lse);

    const BackwardResult gd = RunBackward(dup, fd, kernel);
    const BackwardResult gs = RunBackward(s.shards, fs, kernel);
    // The backward through the cu_seqlens entry point: on one thread, the
    // same bits as through its tasks.
    {
      const BackwardResult tasks = RunBackward(dup, fd, kernel, 1);
      BackwardResult cu;
      ASSERT_TRUE(AttentionVarlenBackward(dup.shape, cu_q, cu_k, BackwardArgs(dup, fd, &cu), {kernel, 1}).ok());
      EXPECT_EQ(cu.dq, tasks.dq);
      EXPECT_EQ(cu.dk, tasks.dk);
      EXPECT_EQ(cu.dv, tasks.dv);
    }
    // Sum the private copies' dK/dV back onto the document's rows.
    std::vector<float> dk(s.shards.KSize(), 0.0f), dv(s.shards.KSize(), 0.0f);
    for (const AttentionTask& t : dup.tasks) {
      for (int64_t i = 0; i < t.kv_len * row; ++i) {
        dk[i] += gd.dk[t.k_offset * row + i];
        dv[i] += gd.dv[t.k_offset * row + i];
      }
    }
    // The two sides add the same partial terms in different orders (dQ over
    // key groups, dK/dV over shards; with two threads also in scheduling
    // order): at most one rounding per term (<= 6 shards, <= 4 key groups)
    // of the largest partial sum; 16 ulps is ample.
    const double eps = std::numeric_limits<float>::epsilon();
    EXPECT_LE(MaxAbsDiff(gd.dq, gs.dq), 16 * eps * MaxAbsFinite(gs.dq));
    EXPECT_LE(MaxAbsDiff(dk, gs.dk), 16 * eps * MaxAbsFinite(gs.dk));
    EXPECT_LE(MaxAbsDiff(dv, gs.dv), 16 * eps * MaxAbsFinite(gs.dv));
  }
}

}  // namespace
}  // namespace distca::testing
