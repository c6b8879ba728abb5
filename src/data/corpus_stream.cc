// Batches from a corpus: documents in a per-epoch shuffled order, cut at
// max_doc_len boundaries and at batch boundaries (docs/data_formats.md).
#include <fmt/format.h>

#include <algorithm>
#include <random>

#include "data/streams.h"

namespace distca::data {
namespace {

// Uniform in [0, n) from raw 64-bit draws: draws below 2^64 mod n are
// rejected so that every residue is equally likely. REQUIRES: n >= 1.
uint64_t UniformBelow(std::mt19937_64& rng, uint64_t n) {
  const uint64_t reject_below = (0 - n) % n;  // (2^64 - n) mod n = 2^64 mod n
  uint64_t x = rng();
  while (x < reject_below) x = rng();
  return x % n;
}

class CorpusStream final : public BatchStream {
 public:
  CorpusStream(std::unique_ptr<DocumentSource> source, const DataOptions& options)
      : source_(std::move(source)),
        tokens_per_batch_(options.tokens_per_batch),
        max_doc_len_(options.max_doc_len),
        seed_(options.seed),
        vocab_size_(options.vocab_size),
        order_(ShuffledOrder(source_->num_documents(), seed_, 0)) {
    SkipConsumed();
  }

  Status Next(Batch* batch) override {
    const DataPosition start = pos_;
    batch->docs.clear();
    int64_t room = tokens_per_batch_;
    while (room > 0) {
      const int64_t doc = order_[static_cast<size_t>(pos_.cursor)];
      int64_t end = std::min(source_->DocumentLength(doc), pos_.offset + room);
      if (max_doc_len_ > 0) end = std::min(end, (pos_.offset / max_doc_len_ + 1) * max_doc_len_);
      std::vector<int32_t>& tokens = batch->docs.emplace_back();
      tokens.reserve(static_cast<size_t>(end - pos_.offset));
      const Status s = source_->ReadTokens(doc, pos_.offset, end, &tokens);
      if (!s.ok()) {
        SetPosition(start);  // a retry sees the same batch
        return s.WithContext(fmt::format("batch {}", start.step));
      }
      room -= end - pos_.offset;
      pos_.offset = end;
      SkipConsumed();
    }
    ++pos_.step;
    return Status::Ok();
  }

  DataPosition position() const override { return pos_; }

  Status Seek(const DataPosition& p) override {
    const int64_t n = source_->num_documents();
    if (p.step < 0 || p.step > kMaxPositionCount || p.epoch < 0 || p.epoch > kMaxPositionCount || p.cursor < 0 ||
        p.cursor > n || p.offset < 0)
      return Status::InvalidArgument(
          fmt::format("data position (step {}, epoch {}, cursor {}, offset {}) out of range for {} documents", p.step,
                      p.epoch, p.cursor, p.offset, n));
    const std::vector<int64_t> order = p.epoch == pos_.epoch ? order_ : ShuffledOrder(n, seed_, p.epoch);
    const int64_t length = p.cursor < n ? source_->DocumentLength(order[static_cast<size_t>(p.cursor)]) : 0;
    if (p.offset > length)
      return Status::InvalidArgument(
          fmt::format("data position offset {} is beyond the {} tokens of document {} "
                      "(epoch {}, cursor {})",
                      p.offset, length, p.cursor < n ? order[size_t(p.cursor)] : -1, p.epoch, p.cursor));
    order_ = order;
    pos_ = p;
    SkipConsumed();
    return Status::Ok();
  }

  int vocab_size() const override { return vocab_size_; }
  int64_t tokens_per_batch() const override { return tokens_per_batch_; }

  std::string Describe() const override {
    return fmt::format("{}; {} tokens per batch, max doc len {}, shuffle seed {}", source_->Describe(),
                       tokens_per_batch_, max_doc_len_ > 0 ? fmt::format("{}", max_doc_len_) : "none", seed_);
  }

 private:
  // Moves past fully consumed (and empty) documents, reshuffling at the end
  // of an epoch, so that position() always names the next token to read.
  // Terminates because the corpus holds at least one token.
  void SkipConsumed() {
    const int64_t n = source_->num_documents();
    while (pos_.cursor == n || pos_.offset >= source_->DocumentLength(order_[static_cast<size_t>(pos_.cursor)])) {
      pos_.offset = 0;
      if (++pos_.cursor >= n) {
        ++pos_.epoch;
        pos_.cursor = 0;
        order_ = ShuffledOrder(n, seed_, pos_.epoch);
      }
    }
  }

  void SetPosition(const DataPosition& p) {
    if (p.epoch != pos_.epoch) order_ = ShuffledOrder(source_->num_documents(), seed_, p.epoch);
    pos_ = p;
  }

  std::unique_ptr<DocumentSource> source_;
  int64_t tokens_per_batch_, max_doc_len_;
  uint64_t seed_;
  int vocab_size_;
  std::vector<int64_t> order_;  // this epoch's document order
  DataPosition pos_;
};

}  // namespace

uint64_t SplitMix64(uint64_t x) {
  uint64_t z = x + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::vector<int64_t> ShuffledOrder(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  std::mt19937_64 rng(SplitMix64(seed ^ SplitMix64(static_cast<uint64_t>(epoch))));
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(UniformBelow(rng, static_cast<uint64_t>(i) + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

std::unique_ptr<BatchStream> NewCorpusStream(std::unique_ptr<DocumentSource> source, const DataOptions& options) {
  return std::make_unique<CorpusStream>(std::move(source), options);
}

}  // namespace distca::data
