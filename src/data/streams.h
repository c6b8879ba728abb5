// The BatchStream implementations behind BatchStream::Open, and the two
// deterministic rules they follow (docs/data_formats.md), exposed for tests.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "distca/dataset.h"

namespace distca::data {

// SplitMix64's output function (Steele, Lea, Flood 2014): a 64-bit mix.
uint64_t SplitMix64(uint64_t x);

// Epoch `epoch`'s order of documents 0..n-1: a Fisher-Yates shuffle driven by
// std::mt19937_64 seeded with SplitMix64(seed ^ SplitMix64(epoch)), with
// unbiased rejection sampling instead of std::uniform_int_distribution, so the
// order is the same with every standard library.
std::vector<int64_t> ShuffledOrder(int64_t n, uint64_t seed, int64_t epoch);

// Appends the `length` synthetic token ids of document `doc` of batch `step`:
// t[0] = SplitMix64(SplitMix64(SplitMix64(seed) ^ step) ^ doc) mod V and
// t[p] = (7 t[p-1] + 1 + p mod 5) mod V.
// REQUIRES: vocab_size >= 1, length >= 0.
void AppendSyntheticTokens(uint64_t seed, int64_t step, int64_t doc, int64_t length, int vocab_size,
                           std::vector<int32_t>* tokens);

// A corpus (text, indexed) cut into batches in a per-epoch shuffled order.
// REQUIRES: options validated by BatchStream::Open; the source holds a token.
std::unique_ptr<BatchStream> NewCorpusStream(std::unique_ptr<DocumentSource> source, const DataOptions& options);

// The largest step or epoch a position may name: counting on from it stays
// far from overflow.
inline constexpr int64_t kMaxPositionCount = int64_t{1} << 62;

// The recipe that only packs (no upsampling, filter or elongation): what a
// sampled stream applies to the recipe's documents at every step.
inline WorkloadRecipe PackingOnly(const WorkloadRecipe& recipe, uint64_t seed) {
  WorkloadRecipe packing;
  packing.tokens_per_batch = recipe.tokens_per_batch;
  packing.seed = seed;
  return packing;
}

// Synthetic batches: step i packs its lengths from `docs`, the recipe's
// documents (RecipeDocuments of the file's `pool_size` lengths), with
// PackingOnly(recipe, recipe.seed + i).
// REQUIRES: SampleBatches accepts docs and that recipe.
std::unique_ptr<BatchStream> NewSampledStream(std::string file, size_t pool_size, std::vector<int64_t> docs,
                                              const WorkloadRecipe& recipe, const DataOptions& options);

// Synthetic batches whose lengths are batches[step mod batches.size()].
// REQUIRES: batches non-empty, every length positive.
std::unique_ptr<BatchStream> NewFixedLengthsStream(std::string file, std::vector<std::vector<int64_t>> batches,
                                                   const DataOptions& options);

}  // namespace distca::data
