// Workloads for planning and training: document-length files and the paper's
// sampling recipe (DESIGN.md section 6).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "distca/status.h"

namespace distca {

// A JSON array of positive document lengths, e.g. doc-lengths-pretrain.json.
// Read without building a JSON tree; at most kMaxSampledDocuments lengths
// (OutOfRange beyond).
Status ParseLengthsJson(std::string_view text, std::vector<int64_t>* lengths);

// {"batches": [[len, len, ...], ...]}: each batch a non-empty list of positive
// lengths; at most kMaxSampledDocuments lengths in all, as above, in at most
// kMaxSampledBatches batches (OutOfRange beyond).
Status ParseBatchesJson(std::string_view text, std::vector<std::vector<int64_t>>* batches);

// Read a file and parse it as above; errors name the path.
Status ReadLengthsFile(const std::string& path, std::vector<int64_t>* lengths);
Status ReadBatchesFile(const std::string& path, std::vector<std::vector<int64_t>>* batches);

// The "Pretrain" recipe of the DistCA evaluation: documents of at least
// upsample_threshold tokens appear `upsample` times, shorter ones are kept with
// probability filter_ratio, every length is multiplied by `elongate` (capped at
// max_doc_len), and the shuffled pool is packed greedily into batches of
// exactly tokens_per_batch tokens (a document that does not fit is cut to the
// room left; the rest of it is dropped). With chunk_tokens, the DistCA
// artifact's packing instead (`batch_documents` in its
// d2/simulator/optimizers/samples.py): the documents fill chunks of exactly
// chunk_tokens tokens, and one that does not fit is cut at the chunk's end,
// its rest starting the next chunk (of the next batch, at a batch's end), as
// a document of its own.
// The most tokens one sampled or streamed batch may hold (about a million
// documents of the Pretrain distribution): 256x the paper's largest batch
// (128 chunks of 128K).
inline constexpr int64_t kMaxTokensPerBatch = int64_t{1} << 32;
// The most documents the recipe's pool may hold after upsampling (about 0.5
// GB of lengths; the Pretrain file holds 99,519 documents).
inline constexpr int64_t kMaxSampledDocuments = int64_t{1} << 26;
// The most batches one call may sample (the paper uses 30 per configuration).
inline constexpr int kMaxSampledBatches = 100'000;

struct WorkloadRecipe {
  int64_t tokens_per_batch = 0;        // R * tokens per rank, at most kMaxTokensPerBatch; required
  int upsample = 1;                    // Default: 1 (no upsampling)
  int64_t upsample_threshold = 65536;  // Default: 64K tokens
  double filter_ratio = 1.0;           // in (0, 1]. Default: 1 (keep all)
  double elongate = 1.0;               // > 0. Default: 1
  int64_t max_doc_len = 0;             // 0 = no cap. Default: 0
  int64_t chunk_tokens = 0;            // 0 = whole documents; > 0: divides tokens_per_batch. Default: 0
  uint64_t seed = 0;                   // Default: 0
};

// Samples `count` batches from `pool` (document lengths) following `recipe`.
// Deterministic for a given seed and standard library: the filter draws with
// std::bernoulli_distribution and the pool is reshuffled with std::shuffle
// over std::mt19937_64, whose algorithms the C++ standard leaves to the
// library (the build uses GCC's libstdc++; WorkloadTest.SamplingIsPinned
// fails where another library samples differently). OutOfRange when upsampling makes the pool
// larger than kMaxSampledDocuments, when the batches together would hold
// more documents than that, or when count exceeds kMaxSampledBatches.
Status SampleBatches(const std::vector<int64_t>& pool, const WorkloadRecipe& recipe, int count,
                     std::vector<std::vector<int64_t>>* batches);

// The documents SampleBatches packs: `pool` upsampled, filtered (the draws
// seeded by recipe.seed, as SampleBatches's), elongated and capped, in pool
// order; recipe.tokens_per_batch is not used. InvalidArgument when the
// filter leaves none. A stream that samples every step from these (with the
// default recipe: packing only) filters once, as the recipe means, and can
// fail only here, not at a later step.
Status RecipeDocuments(const std::vector<int64_t>& pool, const WorkloadRecipe& recipe, std::vector<int64_t>* docs);

}  // namespace distca
