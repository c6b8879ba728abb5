// Training data: document sources and the stream of global batches.
//
// A source is a list of documents of token ids. A BatchStream turns a source
// into one global batch per step of exactly tokens_per_batch tokens (every
// rank builds the same stream and takes its own rows through the planner's
// linear layout). Formats: docs/data_formats.md.
//
//   text:DIR          every regular file under DIR (recursively, sorted by
//                     path; optionally only those whose path relative to DIR
//                     matches a glob) is one document; byte-level tokens (vocab 256)
//   indexed:PREFIX    Megatron-LM's indexed dataset PREFIX.bin / PREFIX.idx
//                     ("MMIDIDX"), read through mmap
//   synthetic:FILE    lengths from a lengths file (JSON array): the paper's
//                     recipe makes its documents once, each step packs a batch
//                     of them; deterministic learnable token ids
//   a docs file       {"batches": [[len, ...], ...]}: step i uses batch i's
//                     lengths exactly (cycling), synthetic token ids
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "distca/status.h"
#include "distca/workload.h"

namespace distca {

class DocumentSource {
 public:
  virtual ~DocumentSource() = default;
  virtual int64_t num_documents() const = 0;
  virtual int64_t DocumentLength(int64_t index) const = 0;  // REQUIRES: 0 <= index < num_documents()
  // Tokens [begin, end) of document `index`, appended to *tokens.
  virtual Status ReadTokens(int64_t index, int64_t begin, int64_t end, std::vector<int32_t>* tokens) const = 0;
  virtual int vocab_size() const = 0;  // every token id is < vocab_size
  virtual std::string Describe() const = 0;
};

// Fails when DIR is missing, not a directory, or holds no non-empty file
// matching `glob` (empty glob: every file).
Status OpenTextDirectory(const std::string& dir, const std::string& glob, std::unique_ptr<DocumentSource>* out);

// Fails on a missing or malformed .idx/.bin pair (bad magic, version, dtype,
// sizes or pointers beyond the .bin). Token ids >= vocab_size are caught as
// they are read: ReadTokens fails (a scan here would read the whole .bin).
Status OpenIndexedDataset(const std::string& prefix, int vocab_size, std::unique_ptr<DocumentSource>* out);

// Writes PREFIX.bin and PREFIX.idx (one sequence per document; dtype uint16
// when every id < 65536, else int32), each written to a temporary file,
// fsynced and renamed.
Status WriteIndexedDataset(const std::string& prefix, const std::vector<std::vector<int32_t>>& docs);

// Where a stream is; saved in checkpoints so that a resumed run sees the same batches.
struct DataPosition {
  int64_t step = 0;    // batches produced so far
  int64_t epoch = 0;   // passes over a corpus (text, indexed)
  int64_t cursor = 0;  // index into this epoch's shuffled document order
  int64_t offset = 0;  // tokens of document `cursor` already consumed
};

struct DataOptions {
  std::string spec;       // "text:DIR", "indexed:PREFIX" or "synthetic:FILE"
  std::string glob;       // text only. Default: "" (every file)
  std::string docs_file;  // when set, replaces spec: a batches file
  // When non-empty, replaces spec and the reading of docs_file: the batches'
  // lengths given in memory, used exactly as a docs file's (benchmarks and
  // tests; tools that read docs_file once, which then only names them).
  std::vector<std::vector<int64_t>> batches;
  // synthetic:FILE only: when non-empty, FILE's lengths, read already (FILE
  // then only names them), so that ranks and runs of one process read a
  // file once (a pipe can be read once only).
  std::vector<int64_t> lengths;
  int64_t tokens_per_batch = 0;  // global tokens per step; required unless docs_file or batches set it
  WorkloadRecipe recipe;         // synthetic only (tokens_per_batch and seed are filled in)
  int64_t max_doc_len = 0;       // corpus documents are cut into chunks of at most this. 0 = no cap
  uint64_t seed = 0;             // shuffling and synthetic tokens
  int vocab_size = 256;          // every token id is < this: indexed ids are checked against it, synthetic ids
                                 // are drawn below it, text needs >= 256. Default: 256 (bytes)
};

// One global batch: each document's token ids (lengths sum to tokens_per_batch,
// or to the docs file's batch total).
struct Batch {
  std::vector<std::vector<int32_t>> docs;
  std::vector<int64_t> lengths() const;
  int64_t tokens() const;
};

class BatchStream {
 public:
  static Status Open(const DataOptions& options, std::unique_ptr<BatchStream>* out);
  // Reads the files that Open would read as a whole (a docs file into
  // `batches`, a synthetic:FILE into `lengths`; nothing for a corpus), so
  // that the Opens of several ranks or runs of one process read each file
  // once: a pipe can be read once only, and a file that changes in between
  // cannot give the ranks different batches.
  static Status ReadInputFilesOnce(DataOptions* options);
  virtual ~BatchStream() = default;

  // The next global batch. Corpus sources take documents in a shuffled order
  // (reshuffled per epoch); a document that does not fit the room left is cut
  // and its rest starts the next batch as a document of its own.
  virtual Status Next(Batch* batch) = 0;
  virtual DataPosition position() const = 0;
  virtual Status Seek(const DataPosition& position) = 0;
  virtual int vocab_size() const = 0;
  virtual int64_t tokens_per_batch() const = 0;  // for a docs file: of the next batch
  // The most tokens any batch holds (for a docs file: its largest batch;
  // otherwise tokens_per_batch()): what a run must have memory for.
  virtual int64_t max_tokens_per_batch() const { return tokens_per_batch(); }
  virtual std::string Describe() const = 0;
};

}  // namespace distca
