// Synthetic batches: lengths packed per step from the recipe's documents (made
// once from a lengths file), or taken from a docs file; token ids from the
// deterministic rule of streams.h.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "data/streams.h"

namespace distca::data {
namespace {

int64_t Total(const std::vector<int64_t>& lengths) {
  return std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
}

class SyntheticStream final : public BatchStream {
 public:
  // Exactly one of `docs` (sampled) and `batches` (fixed) is non-empty.
  SyntheticStream(std::string description, std::vector<int64_t> docs, const WorkloadRecipe& recipe,
                  std::vector<std::vector<int64_t>> batches, const DataOptions& options)
      : description_(std::move(description)),
        docs_(std::move(docs)),
        recipe_(recipe),
        batches_(std::move(batches)),
        seed_(options.seed),
        vocab_size_(options.vocab_size) {}

  Status Next(Batch* batch) override {
    std::vector<int64_t> lengths;
    DISTCA_RETURN_IF_ERROR(LengthsOf(step_, &lengths));
    batch->docs.assign(lengths.size(), {});
    for (size_t d = 0; d < lengths.size(); ++d) {
      batch->docs[d].reserve(static_cast<size_t>(lengths[d]));
      AppendSyntheticTokens(seed_, step_, static_cast<int64_t>(d), lengths[d], vocab_size_, &batch->docs[d]);
    }
    ++step_;
    return Status::Ok();
  }

  DataPosition position() const override { return DataPosition{.step = step_}; }

  // Batch i depends on i alone, so a position is just a step.
  Status Seek(const DataPosition& p) override {
    if (p.step < 0 || p.step > kMaxPositionCount || p.epoch != 0 || p.cursor != 0 || p.offset != 0)
      return Status::InvalidArgument(
          fmt::format("synthetic data position must be (step in [0, 2^62], epoch 0, cursor 0, offset 0), got ({}, {}, "
                      "{}, {})",
                      p.step, p.epoch, p.cursor, p.offset));
    step_ = p.step;
    return Status::Ok();
  }

  int vocab_size() const override { return vocab_size_; }

  int64_t tokens_per_batch() const override {
    if (batches_.empty()) return recipe_.tokens_per_batch;
    return Total(batches_[static_cast<size_t>(step_ % static_cast<int64_t>(batches_.size()))]);
  }

  int64_t max_tokens_per_batch() const override {
    if (batches_.empty()) return recipe_.tokens_per_batch;
    int64_t most = 0;
    for (const std::vector<int64_t>& b : batches_) most = std::max(most, Total(b));
    return most;
  }

  std::string Describe() const override { return description_; }

 private:
  Status LengthsOf(int64_t step, std::vector<int64_t>* lengths) const {
    if (!batches_.empty()) {
      *lengths = batches_[static_cast<size_t>(step % static_cast<int64_t>(batches_.size()))];
      return Status::Ok();
    }
    std::vector<std::vector<int64_t>> sampled;
    DISTCA_RETURN_IF_ERROR(
        SampleBatches(docs_, PackingOnly(recipe_, recipe_.seed + static_cast<uint64_t>(step)), 1, &sampled)
            .WithContext(fmt::format("batch {}", step)));
    *lengths = std::move(sampled[0]);
    return Status::Ok();
  }

  std::string description_;
  std::vector<int64_t> docs_;  // the recipe's documents
  WorkloadRecipe recipe_;      // seed = options.seed; step i packs with seed + i
  std::vector<std::vector<int64_t>> batches_;
  uint64_t seed_;
  int vocab_size_;
  int64_t step_ = 0;
};

}  // namespace

void AppendSyntheticTokens(uint64_t seed, int64_t step, int64_t doc, int64_t length, int vocab_size,
                           std::vector<int32_t>* tokens) {
  if (length <= 0) return;
  const auto v = static_cast<uint64_t>(vocab_size);
  uint64_t t = SplitMix64(SplitMix64(SplitMix64(seed) ^ static_cast<uint64_t>(step)) ^ static_cast<uint64_t>(doc)) % v;
  tokens->push_back(static_cast<int32_t>(t));
  for (int64_t p = 1; p < length; ++p) {
    t = (7 * t + 1 + static_cast<uint64_t>(p % 5)) % v;
    tokens->push_back(static_cast<int32_t>(t));
  }
}

std::unique_ptr<BatchStream> NewSampledStream(std::string file, size_t pool_size, std::vector<int64_t> docs,
                                              const WorkloadRecipe& recipe, const DataOptions& options) {
  std::string description = fmt::format(
      "synthetic:{} ({} lengths; {} tokens per batch, upsample {} from {}, filter ratio {}, elongate {}, max doc len "
      "{}; "
      "vocab {}, seed {})",
      file, pool_size, recipe.tokens_per_batch, recipe.upsample, recipe.upsample_threshold, recipe.filter_ratio,
      recipe.elongate, recipe.max_doc_len > 0 ? fmt::format("{}", recipe.max_doc_len) : "none", options.vocab_size,
      options.seed);
  return std::make_unique<SyntheticStream>(std::move(description), std::move(docs), recipe,
                                           std::vector<std::vector<int64_t>>{}, options);
}

std::unique_ptr<BatchStream> NewFixedLengthsStream(std::string file, std::vector<std::vector<int64_t>> batches,
                                                   const DataOptions& options) {
  std::string description = fmt::format("docs file {} ({} batches, cycled; synthetic tokens, vocab {}, seed {})", file,
                                        batches.size(), options.vocab_size, options.seed);
  return std::make_unique<SyntheticStream>(std::move(description), std::vector<int64_t>{}, WorkloadRecipe{},
                                           std::move(batches), options);
}

}  // namespace distca::data
