#include "distca/workload.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "common/file_util.h"
#include "common/json_text.h"
#include "distca/plan.h"

namespace distca {
namespace {

// Reads the two formats of document lengths event by event (nlohmann's SAX
// interface) into `out`: a lengths file, [len, ...], as one list; a docs
// file, {"batches": [[len, ...], ...]}, as one list per batch. No document
// tree is built (a tree of a file near the input size limit would take tens
// of GB, and a failed allocation inside the tree's destructor ends the
// process): the lengths cost their 8 bytes each, at most
// kMaxSampledDocuments of them (in a docs file, in at most
// kMaxSampledBatches batches), and reading stops at the first problem.
class LengthsReader {
 public:
  enum class Shape { kLengths, kBatches };
  using Json = nlohmann::json;

  LengthsReader(Shape shape, std::vector<std::vector<int64_t>>* out) : shape_(shape), out_(out) { out_->clear(); }

  Status Read(std::string_view text) {
    const std::string what = FileName();
    DISTCA_RETURN_IF_ERROR(RefuseNulByte(text, what));
    try {
      if (!Json::sax_parse(text.begin(), text.end(), this) && error_.ok())
        error_ = Status::Internal(what + ": the JSON reader stopped without a reason");
    } catch (const std::bad_alloc&) {
      out_->clear();
      return Status::OutOfRange(fmt::format("{}: out of memory after {} lengths", what, values_));
    }
    if (error_.ok() && !done_) error_ = Status::Internal(what + ": the JSON reader ended inside the value");
    if (!error_.ok()) out_->clear();
    return error_;
  }

  // SAX events. Every one returns false, with error_ set, to stop.
  bool null() { return NotALength(); }
  bool boolean(bool) { return NotALength(); }
  // A whole number past the 64-bit integers reaches here as a float: too
  // long, or (negative) not positive, rather than "not an integer".
  bool number_float(double, const std::string& text) {
    const bool negative = !text.empty() && text[0] == '-';
    const auto digits = text.begin() + (negative ? 1 : 0);
    if (digits == text.end() || !std::all_of(digits, text.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return NotALength();
    return negative ? NotPositive(text) : TooLong(text);
  }
  bool string(std::string&) { return NotALength(); }
  bool binary(Json::binary_t&) { return NotALength(); }
  bool number_integer(int64_t v) {
    if (v > kMaxDocumentLength) return TooLong(std::to_string(v));
    return Length(v);
  }
  bool number_unsigned(uint64_t v) {
    if (v > uint64_t{kMaxDocumentLength}) return TooLong(std::to_string(v));
    return Length(static_cast<int64_t>(v));
  }
  bool start_object(size_t) {
    if (shape_ == Shape::kBatches && depth_ == 0) {
      depth_ = 1;
      return true;
    }
    return NotALength();
  }
  bool key(std::string& k) {
    // Only the docs file has an object, at depth 1.
    if (k != "batches")
      return Fail(fmt::format("docs file: unknown key \"{}\" (it holds \"batches\" only)", Excerpt(k)));
    if (seen_batches_) return Fail("docs file is not valid JSON: key \"batches\" appears twice in one object");
    seen_batches_ = true;
    return true;
  }
  bool end_object() {
    if (!seen_batches_) return Fail("docs file must be an object with a \"batches\" array");
    depth_ = 0;
    done_ = true;
    return true;
  }
  bool start_array(size_t) {
    if (depth_ == ListDepth() - 1 && (shape_ == Shape::kLengths || depth_ == 2)) {
      // Each batch costs a list of its own: at most as many as a run samples.
      if (shape_ == Shape::kBatches && int64_t(out_->size()) >= kMaxSampledBatches) {
        error_ = Status::OutOfRange(
            fmt::format("the docs file holds more than {} batches, the most a file may hold", kMaxSampledBatches));
        return false;
      }
      out_->emplace_back();
      depth_ = ListDepth();
      return true;
    }
    if (shape_ == Shape::kBatches && depth_ == 1) {
      depth_ = 2;
      return true;
    }
    return NotALength();
  }
  bool end_array() {
    if (depth_ == ListDepth()) {
      if (out_->back().empty()) return Fail(ListName() + " is empty");
      depth_ -= 1;
      done_ = shape_ == Shape::kLengths;
      return true;
    }
    // The docs file's "batches" array.
    if (out_->empty()) return Fail("\"batches\" must be a non-empty array");
    depth_ = 1;
    return true;
  }
  bool parse_error(size_t, const std::string& token, const nlohmann::detail::exception& e) {
    // A number past a double's range (hundreds of digits) is valid JSON,
    // which the reader cannot hold: judged as the numbers it can.
    if (e.id == 406) return number_float(0, token);
    return Fail(fmt::format("{} is not valid JSON: {}", FileName(), JsonExceptionWhy(e)));
  }

 private:
  // The file in messages.
  const char* FileName() const { return shape_ == Shape::kLengths ? "lengths file" : "docs file"; }
  // Depth of the arrays that hold lengths: the lengths file's one, a docs
  // file's batches (object 1, "batches" 2, a batch 3).
  int ListDepth() const { return shape_ == Shape::kLengths ? 1 : 3; }
  // The current list's name in messages: "lengths" or "batches[i]".
  std::string ListName() const {
    return shape_ == Shape::kLengths ? "lengths" : fmt::format("batches[{}]", out_->size() - 1);
  }
  bool Fail(std::string why) {
    error_ = Status::InvalidArgument(std::move(why));
    return false;
  }
  // A value other than a length: named by where it stands.
  bool NotALength() {
    if (depth_ == ListDepth()) return Fail(At() + " is not an integer length");
    if (shape_ == Shape::kLengths) return Fail("lengths must be an array of document lengths");
    if (depth_ == 0) return Fail("docs file must be an object with a \"batches\" array");
    if (depth_ == 1) return Fail("\"batches\" must be a non-empty array");
    return Fail(fmt::format("batches[{}] must be an array of document lengths", out_->size()));
  }
  // The place of the value being read, for messages: "lengths[3]".
  std::string At() const { return fmt::format("{}[{}]", ListName(), out_->back().size()); }
  // An integer above kMaxDocumentLength, as written.
  bool TooLong(const std::string& text) {
    if (depth_ != ListDepth()) return NotALength();
    return Fail(
        fmt::format("{} = {} is longer than the supported {} tokens", At(), Excerpt(text, 40), kMaxDocumentLength));
  }
  // A length below 1, as written.
  bool NotPositive(const std::string& text) {
    if (depth_ != ListDepth()) return NotALength();
    return Fail(fmt::format("{} = {}: lengths must be positive", At(), Excerpt(text, 40)));
  }
  // An integer where a length may stand, at most kMaxDocumentLength.
  bool Length(int64_t len) {
    if (depth_ != ListDepth()) return NotALength();
    if (len <= 0) return NotPositive(std::to_string(len));
    if (++values_ > kMaxSampledDocuments) {
      error_ = Status::OutOfRange(fmt::format("the {} holds more than {} document lengths, the most a file may hold",
                                              FileName(), kMaxSampledDocuments));
      return false;
    }
    out_->back().push_back(len);
    return true;
  }

  const Shape shape_;
  std::vector<std::vector<int64_t>>* out_;
  int depth_ = 0;
  bool seen_batches_ = false, done_ = false;
  int64_t values_ = 0;
  Status error_;
};

}  // namespace

Status ParseLengthsJson(std::string_view text, std::vector<int64_t>* lengths) {
  std::vector<std::vector<int64_t>> lists;
  DISTCA_RETURN_IF_ERROR(LengthsReader(LengthsReader::Shape::kLengths, &lists).Read(text));
  *lengths = std::move(lists.front());
  return Status::Ok();
}

Status ParseBatchesJson(std::string_view text, std::vector<std::vector<int64_t>>* batches) {
  return LengthsReader(LengthsReader::Shape::kBatches, batches).Read(text);
}

namespace {

// The recipe's checks, and its documents: the filter draws from `rng`.
Status TransformPool(const std::vector<int64_t>& pool, const WorkloadRecipe& r, std::mt19937_64* rng,
                     std::vector<int64_t>* docs) {
  if (r.upsample < 1) return Status::InvalidArgument(fmt::format("upsample must be >= 1, got {}", r.upsample));
  if (!(r.filter_ratio > 0 && r.filter_ratio <= 1))
    return Status::InvalidArgument(fmt::format("filter ratio must be in (0, 1], got {}", r.filter_ratio));
  if (!(r.elongate > 0) || !std::isfinite(r.elongate))
    return Status::InvalidArgument(fmt::format("elongate must be a positive number, got {}", r.elongate));
  if (r.max_doc_len < 0) return Status::InvalidArgument("max doc length must be >= 0");
  if (pool.empty()) return Status::InvalidArgument("the length pool is empty");
  if (int64_t(pool.size()) > kMaxSampledDocuments)
    return Status::OutOfRange(
        fmt::format("the length pool holds {} documents, above the limit of {}", pool.size(), kMaxSampledDocuments));
  const int64_t long_docs =
      std::count_if(pool.begin(), pool.end(), [&](int64_t l) { return l >= r.upsample_threshold; });
  if (long_docs * r.upsample + int64_t(pool.size()) - long_docs > kMaxSampledDocuments)
    return Status::OutOfRange(
        fmt::format("upsampling {} long documents x {} makes a pool above the limit of {} documents", long_docs,
                    r.upsample, kMaxSampledDocuments));
  std::bernoulli_distribution keep(r.filter_ratio);
  docs->clear();
  for (int64_t len : pool) {
    if (len <= 0) return Status::InvalidArgument(fmt::format("pool holds a non-positive length {}", len));
    const int copies = len >= r.upsample_threshold ? r.upsample : (keep(*rng) ? 1 : 0);
    int64_t scaled = std::max<int64_t>(1, std::llround(std::min(double(len) * r.elongate, double(kMaxDocumentLength))));
    if (r.max_doc_len > 0) scaled = std::min(scaled, r.max_doc_len);
    for (int c = 0; c < copies; ++c) docs->push_back(scaled);
  }
  if (docs->empty()) return Status::InvalidArgument("the recipe's filter left no documents");
  return Status::Ok();
}

}  // namespace

Status RecipeDocuments(const std::vector<int64_t>& pool, const WorkloadRecipe& recipe, std::vector<int64_t>* docs) {
  std::mt19937_64 rng(recipe.seed);
  return TransformPool(pool, recipe, &rng, docs);
}

Status SampleBatches(const std::vector<int64_t>& pool, const WorkloadRecipe& r, int count,
                     std::vector<std::vector<int64_t>>* batches) {
  if (r.tokens_per_batch <= 0 || r.tokens_per_batch > kMaxTokensPerBatch)
    return Status::OutOfRange(
        fmt::format("tokens per batch must be in [1, {}], got {}", kMaxTokensPerBatch, r.tokens_per_batch));
  if (count < 0) return Status::InvalidArgument("batch count must be >= 0");
  if (count > kMaxSampledBatches)
    return Status::OutOfRange(fmt::format("{} batches is above the limit of {}", count, kMaxSampledBatches));
  if (r.chunk_tokens < 0 || (r.chunk_tokens > 0 && r.tokens_per_batch % r.chunk_tokens != 0))
    return Status::InvalidArgument(fmt::format("chunk tokens must be 0 or divide the {} tokens per batch, got {}",
                                               r.tokens_per_batch, r.chunk_tokens));
  std::mt19937_64 rng(r.seed);
  std::vector<int64_t> docs;
  DISTCA_RETURN_IF_ERROR(TransformPool(pool, r, &rng, &docs));
  // The batches hold about count x tokens / (mean length) documents: refuse
  // a sample far past the limit before allocating it (the loop below
  // enforces the limit exactly).
  const double mean_len = double(std::accumulate(docs.begin(), docs.end(), int64_t{0})) / double(docs.size());
  const auto too_many = [&](int b) {
    return Status::OutOfRange(
        fmt::format("the batches would hold more than {} documents in all (batch {} of {}, {} tokens each): longer "
                    "documents, or fewer or smaller batches",
                    kMaxSampledDocuments, b, count, r.tokens_per_batch));
  };
  if (double(count) * double(r.tokens_per_batch) / mean_len > 2.0 * double(kMaxSampledDocuments)) return too_many(0);

  batches->clear();
  size_t next = docs.size();  // reshuffle on first use
  int64_t emitted = 0;        // documents in all batches so far: bounded like the pool
  int64_t rest = 0;           // chunked: what is left of a document cut at a chunk's end
  const int64_t chunk = r.chunk_tokens > 0 ? r.chunk_tokens : r.tokens_per_batch;
  for (int b = 0; b < count; ++b) {
    std::vector<int64_t> batch;
    for (int64_t filled = 0; filled < r.tokens_per_batch; filled += chunk) {
      int64_t room = chunk;
      while (room > 0) {
        if (++emitted > kMaxSampledDocuments) return too_many(b);
        if (rest == 0) {
          if (next == docs.size()) {
            std::shuffle(docs.begin(), docs.end(), rng);
            next = 0;
          }
          rest = docs[next++];
        }
        const int64_t len = std::min(rest, room);
        batch.push_back(len);
        room -= len;
        // Whole documents: the rest of a cut one is dropped.
        rest = r.chunk_tokens > 0 ? rest - len : 0;
      }
    }
    batches->push_back(std::move(batch));
  }
  return Status::Ok();
}

Status ReadLengthsFile(const std::string& path, std::vector<int64_t>* lengths) {
  std::string text;
  DISTCA_RETURN_IF_ERROR(ReadTextFile(path, &text));
  return ParseLengthsJson(text, lengths).WithContext(path);
}

Status ReadBatchesFile(const std::string& path, std::vector<std::vector<int64_t>>* batches) {
  std::string text;
  DISTCA_RETURN_IF_ERROR(ReadTextFile(path, &text));
  return ParseBatchesJson(text, batches).WithContext(path);
}

}  // namespace distca
