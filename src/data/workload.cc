#include "distca/workload.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "common/file_util.h"
#include "common/json_text.h"
#include "distca/plan.h"

namespace distca {
namespace {

Status ParseLengthArray(const nlohmann::json& arr, const std::string& where, std::vector<int64_t>* out) {
  if (!arr.is_array()) return Status::InvalidArgument(where + " must be an array of document lengths");
  out->clear();
  out->reserve(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) {
    const nlohmann::json& v = arr[i];
    if (!v.is_number_integer())
      return Status::InvalidArgument(fmt::format("{}[{}] is not an integer length", where, i));
    if (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t{kMaxDocumentLength}
                               : v.get<int64_t>() > kMaxDocumentLength)
      return Status::InvalidArgument(
          fmt::format("{}[{}] = {} is longer than the supported {} tokens", where, i, v.dump(), kMaxDocumentLength));
    const int64_t len = v.get<int64_t>();
    if (len <= 0) return Status::InvalidArgument(fmt::format("{}[{}] = {}: lengths must be positive", where, i, len));
    out->push_back(len);
  }
  if (out->empty()) return Status::InvalidArgument(where + " is empty");
  return Status::Ok();
}

}  // namespace

Status ParseLengthsJson(std::string_view text, std::vector<int64_t>* lengths) {
  nlohmann::json j;
  DISTCA_RETURN_IF_ERROR(ParseJsonText(text, "lengths file", &j));
  return ParseLengthArray(j, "lengths", lengths);
}

Status ParseBatchesJson(std::string_view text, std::vector<std::vector<int64_t>>* batches) {
  nlohmann::json j;
  DISTCA_RETURN_IF_ERROR(ParseJsonText(text, "docs file", &j));
  if (!j.is_object() || !j.contains("batches"))
    return Status::InvalidArgument("docs file must be an object with a \"batches\" array");
  for (auto it = j.begin(); it != j.end(); ++it)  // a misspelt key would otherwise be ignored
    if (it.key() != "batches")
      return Status::InvalidArgument(
          fmt::format("docs file: unknown key \"{}\" (it holds \"batches\" only)", it.key()));
  const nlohmann::json& b = j["batches"];
  if (!b.is_array() || b.empty()) return Status::InvalidArgument("\"batches\" must be a non-empty array");
  batches->assign(b.size(), {});
  for (size_t i = 0; i < b.size(); ++i)
    DISTCA_RETURN_IF_ERROR(ParseLengthArray(b[i], fmt::format("batches[{}]", i), &(*batches)[i]));
  return Status::Ok();
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
