// BatchStream::Open: validates DataOptions and picks the stream for the spec.
#include <fmt/format.h>

#include "data/streams.h"
#include "distca/dataset.h"

namespace distca {
namespace {

constexpr const char* kValidSpecs = "'text:DIR', 'indexed:PREFIX' or 'synthetic:FILE'";

// Splits "kind:rest"; false when spec has no known prefix.
bool SplitSpec(const std::string& spec, std::string* kind, std::string* rest) {
  for (const char* k : {"text", "indexed", "synthetic"}) {
    const std::string prefix = std::string(k) + ":";
    if (spec.rfind(prefix, 0) == 0) {
      *kind = k;
      *rest = spec.substr(prefix.size());
      return true;
    }
  }
  return false;
}

Status OpenDocsFile(const DataOptions& o, std::unique_ptr<BatchStream>* out) {
  if (o.tokens_per_batch < 0)
    return Status::InvalidArgument(fmt::format("tokens per batch must be >= 0, got {}", o.tokens_per_batch));
  std::vector<std::vector<int64_t>> batches = o.batches;
  const std::string source = !o.docs_file.empty() ? o.docs_file : "in-memory batches";
  if (batches.empty()) DISTCA_RETURN_IF_ERROR(ReadBatchesFile(o.docs_file, &batches));
  for (size_t b = 0; b < batches.size(); ++b) {
    if (batches[b].empty()) return Status::InvalidArgument(fmt::format("{}: batches[{}] is empty", source, b));
    int64_t total = 0;
    for (size_t d = 0; d < batches[b].size(); ++d) {
      const int64_t len = batches[b][d];
      if (len <= 0)
        return Status::InvalidArgument(fmt::format("{}: batches[{}][{}] = {} must be positive", source, b, d, len));
      if (o.max_doc_len > 0 && len > o.max_doc_len)
        return Status::InvalidArgument(
            fmt::format("{}: batches[{}][{}] = {} is longer than max doc len {}", source, b, d, len, o.max_doc_len));
      if (len > kMaxTokensPerBatch - total)
        return Status::OutOfRange(fmt::format("{}: batches[{}] holds more than the limit of {} tokens per batch",
                                              source, b, kMaxTokensPerBatch));
      total += len;
    }
    if (o.tokens_per_batch > 0 && total != o.tokens_per_batch)
      return Status::InvalidArgument(
          fmt::format("{}: batches[{}] holds {} tokens, not the {} tokens per batch asked for", source, b, total,
                      o.tokens_per_batch));
  }
  *out = data::NewFixedLengthsStream(source, std::move(batches), o);
  return Status::Ok();
}

Status OpenSampled(const std::string& file, const DataOptions& o, std::unique_ptr<BatchStream>* out) {
  std::vector<int64_t> pool = o.lengths;
  if (pool.empty()) DISTCA_RETURN_IF_ERROR(ReadLengthsFile(file, &pool));
  WorkloadRecipe recipe = o.recipe;
  recipe.tokens_per_batch = o.tokens_per_batch;
  recipe.seed = o.seed;
  if (o.max_doc_len > 0)
    recipe.max_doc_len = recipe.max_doc_len > 0 ? std::min(recipe.max_doc_len, o.max_doc_len) : o.max_doc_len;
  // The recipe's documents, once: its filter cannot empty a later step.
  std::vector<int64_t> docs;
  DISTCA_RETURN_IF_ERROR(RecipeDocuments(pool, recipe, &docs).WithContext(file));
  std::vector<std::vector<int64_t>> probe;  // surfaces a bad batch size now rather than at the first step
  DISTCA_RETURN_IF_ERROR(SampleBatches(docs, data::PackingOnly(recipe, recipe.seed), 1, &probe).WithContext(file));
  *out = data::NewSampledStream(file, pool.size(), std::move(docs), recipe, o);
  return Status::Ok();
}

Status OpenCorpus(const std::string& kind, const std::string& path, const DataOptions& o,
                  std::unique_ptr<BatchStream>* out) {
  std::unique_ptr<DocumentSource> source;
  if (kind == "text") {
    DISTCA_RETURN_IF_ERROR(OpenTextDirectory(path, o.glob, &source));
  } else {
    DISTCA_RETURN_IF_ERROR(OpenIndexedDataset(path, o.vocab_size, &source));
  }
  if (source->vocab_size() > o.vocab_size)
    return Status::InvalidArgument(fmt::format("{} has token ids up to {}, more than vocab size {}", source->Describe(),
                                               source->vocab_size() - 1, o.vocab_size));
  bool any_token = false;
  for (int64_t d = 0; d < source->num_documents() && !any_token; ++d) any_token = source->DocumentLength(d) > 0;
  if (!any_token) return Status::InvalidArgument(fmt::format("{} holds no tokens", source->Describe()));
  *out = data::NewCorpusStream(std::move(source), o);
  return Status::Ok();
}

}  // namespace

std::vector<int64_t> Batch::lengths() const {
  std::vector<int64_t> out;
  out.reserve(docs.size());
  for (const std::vector<int32_t>& d : docs) out.push_back(static_cast<int64_t>(d.size()));
  return out;
}

int64_t Batch::tokens() const {
  int64_t total = 0;
  for (const std::vector<int32_t>& d : docs) total += static_cast<int64_t>(d.size());
  return total;
}

Status BatchStream::ReadInputFilesOnce(DataOptions* o) {
  if (o == nullptr) return Status::InvalidArgument("options are null");
  std::string kind, path;
  if (!o->docs_file.empty()) {
    if (o->batches.empty()) DISTCA_RETURN_IF_ERROR(ReadBatchesFile(o->docs_file, &o->batches));
  } else if (SplitSpec(o->spec, &kind, &path) && kind == "synthetic" && !path.empty() && o->lengths.empty()) {
    DISTCA_RETURN_IF_ERROR(ReadLengthsFile(path, &o->lengths));
  }
  return Status::Ok();
}

Status BatchStream::Open(const DataOptions& o, std::unique_ptr<BatchStream>* out) {
  if (o.vocab_size <= 0)
    return Status::InvalidArgument(fmt::format("vocab size must be positive, got {}", o.vocab_size));
  if (o.max_doc_len < 0) return Status::InvalidArgument(fmt::format("max doc len must be >= 0, got {}", o.max_doc_len));
  if (!o.docs_file.empty() || !o.batches.empty()) {
    if (!o.glob.empty()) return Status::InvalidArgument("a glob applies to text:DIR data only, not to a docs file");
    return OpenDocsFile(o, out);
  }
  if (o.spec.empty())
    return Status::InvalidArgument(fmt::format("no data: give a spec ({}) or a docs file", kValidSpecs));
  std::string kind, path;
  if (!SplitSpec(o.spec, &kind, &path))
    return Status::InvalidArgument(fmt::format("unknown data spec '{}': expected {}", o.spec, kValidSpecs));
  if (path.empty()) return Status::InvalidArgument(fmt::format("data spec '{}' names no path", o.spec));
  if (kind != "text" && !o.glob.empty())
    return Status::InvalidArgument(fmt::format("a glob applies to text:DIR data only, not to '{}'", o.spec));
  if (o.tokens_per_batch <= 0 || o.tokens_per_batch > kMaxTokensPerBatch)
    return Status::OutOfRange(
        fmt::format("tokens per batch must be in [1, {}], got {}", kMaxTokensPerBatch, o.tokens_per_batch));
  if (kind == "synthetic") return OpenSampled(path, o, out);
  return OpenCorpus(kind, path, o, out);
}

}  // namespace distca
