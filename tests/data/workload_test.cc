#include "distca/workload.h"

#include <gtest/gtest.h>

#include <numeric>

namespace distca {
namespace {

bool Contains(const Status& s, const std::string& needle) { return s.message().find(needle) != std::string::npos; }

TEST(WorkloadTest, ParsesLengthsAndBatches) {
  std::vector<int64_t> lengths;
  ASSERT_TRUE(ParseLengthsJson("[3, 1, 4]", &lengths).ok());
  EXPECT_EQ(lengths, (std::vector<int64_t>{3, 1, 4}));
  std::vector<std::vector<int64_t>> batches;
  ASSERT_TRUE(ParseBatchesJson(R"({"batches": [[5, 6], [7]]})", &batches).ok());
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[1], (std::vector<int64_t>{7}));
}

TEST(WorkloadTest, RejectsBadFiles) {
  std::vector<int64_t> lengths;
  std::vector<std::vector<int64_t>> batches;
  EXPECT_TRUE(Contains(ParseLengthsJson("[3, ", &lengths), "not valid JSON"));
  EXPECT_TRUE(Contains(ParseLengthsJson("[]", &lengths), "empty"));
  EXPECT_TRUE(Contains(ParseLengthsJson("[3, 0]", &lengths), "lengths[1] = 0"));
  EXPECT_TRUE(Contains(ParseLengthsJson("[3, -2]", &lengths), "must be positive"));
  EXPECT_TRUE(Contains(ParseLengthsJson("[3, 2.5]", &lengths), "not an integer"));
  EXPECT_TRUE(Contains(ParseBatchesJson("[[1]]", &batches), "\"batches\""));
  EXPECT_TRUE(Contains(ParseBatchesJson(R"({"batches": []})", &batches), "non-empty"));
  EXPECT_TRUE(Contains(ParseBatchesJson(R"({"batches": [[1]], "batch": [[2]]})", &batches),
                       "docs file: unknown key \"batch\""));
  EXPECT_TRUE(Contains(ParseBatchesJson(R"({"batches": [[1], []]})", &batches), "batches[1] is empty"));
  EXPECT_TRUE(Contains(ParseBatchesJson(R"({"batches": [[1, "x"]]})", &batches), "batches[0][1]"));
  EXPECT_TRUE(Contains(ParseLengthsJson("[3, 2147483649]", &lengths), "lengths[1] = 2147483649 is longer"));
  // Past uint64 the JSON reader has a float: still too long, not "not an integer".
  EXPECT_TRUE(Contains(ParseLengthsJson("[3, 99999999999999999999999]", &lengths),
                       "lengths[1] = 99999999999999999999999 is longer"));
  // Past a double the reader stops at the number: still valid JSON, too long.
  EXPECT_TRUE(Contains(ParseLengthsJson("[1" + std::string(309, '0') + "]", &lengths),
                       "lengths[0] = 1" + std::string(39, '0') + "... (310 bytes) is longer"));
  EXPECT_TRUE(Contains(ParseLengthsJson("[-1" + std::string(309, '0') + "]", &lengths), "must be positive"));
  EXPECT_TRUE(Contains(ParseLengthsJson("[1e400]", &lengths), "lengths[0] is not an integer length"));
  EXPECT_TRUE(Contains(ParseLengthsJson("[3, 1e30]", &lengths), "lengths[1] is not an integer length"));
  EXPECT_TRUE(Contains(ParseLengthsJson("[3, -99999999999999999999999]", &lengths),
                       "lengths[1] = -99999999999999999999999: lengths must be positive"));
  // A docs file holds at most kMaxSampledBatches batches (each costs a list
  // of its own, whatever its lengths).
  const auto docs_with = [](int n) {
    std::string text = R"({"batches": [)";
    for (int b = 0; b < n; ++b) text += b == 0 ? "[1]" : ",[1]";
    return text + "]}";
  };
  ASSERT_TRUE(ParseBatchesJson(docs_with(kMaxSampledBatches), &batches).ok());
  EXPECT_EQ(batches.size(), size_t(kMaxSampledBatches));
  const Status many = ParseBatchesJson(docs_with(kMaxSampledBatches + 1), &batches);
  EXPECT_EQ(many.code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(Contains(many, "holds more than 100000 batches")) << many.ToString();
  EXPECT_TRUE(batches.empty());
}

// The batches one seed gives, as this build's standard library samples them
// (std::bernoulli_distribution and std::shuffle are the library's own
// algorithms): recorded from a run of GCC's libstdc++. A resumed synthetic
// run, or an MPI rank, built against a library that samples differently
// would train on other batches; this fails there instead.
TEST(WorkloadTest, SamplingIsPinned) {
  std::vector<int64_t> pool(20);
  std::iota(pool.begin(), pool.end(), 1);
  WorkloadRecipe r;
  r.tokens_per_batch = 40;
  r.upsample = 2;
  r.upsample_threshold = 18;
  r.filter_ratio = 0.5;
  r.seed = 11;
  std::vector<std::vector<int64_t>> batches;
  ASSERT_TRUE(SampleBatches(pool, r, 3, &batches).ok());
  const std::vector<std::vector<int64_t>> recorded = {{20, 1, 19}, {5, 18, 17}, {6, 3, 18, 12, 1}};
  EXPECT_EQ(batches, recorded) << ::testing::PrintToString(batches);
}

TEST(WorkloadTest, SamplesExactBudgetsDeterministically) {
  std::vector<int64_t> pool(1000);
  std::iota(pool.begin(), pool.end(), 1);
  pool.push_back(100000);
  WorkloadRecipe r;
  r.tokens_per_batch = 1 << 16;
  r.upsample = 4;
  r.upsample_threshold = 50000;
  r.filter_ratio = 0.5;
  r.elongate = 2;
  r.max_doc_len = 150000;
  r.seed = 3;
  std::vector<std::vector<int64_t>> a, b;
  ASSERT_TRUE(SampleBatches(pool, r, 5, &a).ok());
  ASSERT_TRUE(SampleBatches(pool, r, 5, &b).ok());
  EXPECT_EQ(a, b);
  for (const auto& batch : a) {
    EXPECT_EQ(std::accumulate(batch.begin(), batch.end(), int64_t{0}), r.tokens_per_batch);
    for (int64_t len : batch) {
      EXPECT_GT(len, 0);
      EXPECT_LE(len, r.max_doc_len);
    }
  }
  r.seed = 4;
  ASSERT_TRUE(SampleBatches(pool, r, 5, &b).ok());
  EXPECT_NE(a, b);
}

// The DistCA artifact's packing (chunk_tokens): a document that does not fit
// is cut at the chunk's end and its rest opens the next chunk, across
// batches too. With one length in the pool the stream is 7, 7, 7, ...
// whatever the shuffle, so the batches can be written by hand.
TEST(WorkloadTest, ChunkedPackingCarriesTheRest) {
  WorkloadRecipe r;
  r.tokens_per_batch = 10;
  r.chunk_tokens = 5;
  std::vector<std::vector<int64_t>> batches;
  ASSERT_TRUE(SampleBatches({7}, r, 3, &batches).ok());
  // 7 = 5 | 2 ; 7 = 3 | 4 ; 7 = 1 | 5 + 1 ; 7 = 4 | 3 ; 7 = 2 ...
  const std::vector<std::vector<int64_t>> expected = {{5, 2, 3}, {4, 1, 5}, {1, 4, 3, 2}};
  EXPECT_EQ(batches, expected) << ::testing::PrintToString(batches);
  // Whole documents: the rest of a cut one is dropped.
  r.chunk_tokens = 0;
  ASSERT_TRUE(SampleBatches({7}, r, 2, &batches).ok());
  EXPECT_EQ(batches, (std::vector<std::vector<int64_t>>{{7, 3}, {7, 3}}));
}

TEST(WorkloadTest, ChunkedPackingFillsEveryChunkExactly) {
  std::vector<int64_t> pool(300);
  std::iota(pool.begin(), pool.end(), 1);
  pool.push_back(5000);  // longer than a chunk: split over chunks, not capped
  WorkloadRecipe r{.tokens_per_batch = 4 * 1024,
                   .upsample = 8,
                   .upsample_threshold = 5000,
                   .elongate = 1.5,
                   .chunk_tokens = 1024,
                   .seed = 5};
  std::vector<std::vector<int64_t>> batches;
  ASSERT_TRUE(SampleBatches(pool, r, 20, &batches).ok());
  int64_t full_chunk_pieces = 0;
  for (const auto& batch : batches) {
    int64_t at = 0;
    for (int64_t len : batch) {
      ASSERT_GT(len, 0);
      // No piece crosses a chunk boundary.
      ASSERT_LE(at % r.chunk_tokens + len, r.chunk_tokens);
      full_chunk_pieces += len == r.chunk_tokens;
      at += len;
    }
    EXPECT_EQ(at, r.tokens_per_batch);
  }
  EXPECT_GT(full_chunk_pieces, 0);  // the 7500-token documents fill whole chunks
  r.chunk_tokens = 1000;
  EXPECT_TRUE(Contains(SampleBatches(pool, r, 1, &batches), "chunk tokens must be 0 or divide the 4096 tokens"));
  r.chunk_tokens = -1;
  EXPECT_TRUE(Contains(SampleBatches(pool, r, 1, &batches), "chunk tokens"));
}

TEST(WorkloadTest, RecipeArguments) {
  std::vector<std::vector<int64_t>> out;
  WorkloadRecipe r;
  EXPECT_TRUE(Contains(SampleBatches({5}, r, 1, &out), "tokens per batch"));
  r.tokens_per_batch = kMaxTokensPerBatch + 1;  // a million documents' worth and more: refused, not sampled
  EXPECT_TRUE(Contains(SampleBatches({5}, r, 1, &out), "tokens per batch must be in [1, 4294967296]"));
  r.tokens_per_batch = 10;
  r.filter_ratio = 0;
  EXPECT_TRUE(Contains(SampleBatches({5}, r, 1, &out), "filter ratio"));
  r.filter_ratio = 1;
  r.elongate = 0;
  EXPECT_TRUE(Contains(SampleBatches({5}, r, 1, &out), "elongate"));
  r.elongate = 1;
  EXPECT_TRUE(Contains(SampleBatches({}, r, 1, &out), "empty"));
  // Limits that keep sampling finite: the upsampled pool and the batch count.
  r.upsample = 1 << 30;
  r.upsample_threshold = 100;
  EXPECT_TRUE(Contains(SampleBatches({5, 200}, r, 1, &out),
                       "upsampling 1 long documents x 1073741824 makes a pool above the limit of 67108864"));
  r.upsample = 1;
  EXPECT_TRUE(Contains(SampleBatches({5}, r, kMaxSampledBatches + 1, &out), "100001 batches is above the limit"));
  EXPECT_TRUE(SampleBatches({5}, r, 3, &out).ok());
  // ... and the documents the batches hold: one-token documents filling
  // 2^32-token batches would be billions of lengths.
  r.tokens_per_batch = kMaxTokensPerBatch;
  const Status many = SampleBatches({1}, r, 1, &out);
  EXPECT_EQ(many.code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(Contains(many, "would hold more than 67108864 documents in all")) << many.ToString();
}

}  // namespace
}  // namespace distca
