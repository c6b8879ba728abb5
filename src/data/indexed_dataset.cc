// indexed:PREFIX — Megatron-LM's indexed dataset (PREFIX.idx + PREFIX.bin,
// "MMIDIDX" version 1), read through mmap. Byte layout and what is validated:
// docs/data_formats.md.
#include <fmt/format.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>

#include "common/file_util.h"
#include "data/posix_file.h"
#include "distca/dataset.h"

namespace distca {
namespace {

static_assert(std::endian::native == std::endian::little, "MMIDIDX files are little-endian; so is this reader");

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kVersion = 1;
constexpr int64_t kHeaderBytes = 34;  // magic 9, version 8, dtype 1, sequence count 8, document count 8

// Megatron's DType codes. Only the integer ones hold token ids.
enum DTypeCode : uint8_t {
  kUInt8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat64 = 6,
  kFloat32 = 7,
  kUInt16 = 8,
};

int ItemSize(uint8_t code) {
  switch (code) {
    case kUInt8:
    case kInt8:
      return 1;
    case kInt16:
    case kUInt16:
      return 2;
    case kInt32:
      return 4;
    case kInt64:
      return 8;
    default:
      return 0;
  }
}

const char* DTypeName(uint8_t code) {
  switch (code) {
    case kUInt8:
      return "uint8";
    case kInt8:
      return "int8";
    case kInt16:
      return "int16";
    case kInt32:
      return "int32";
    case kInt64:
      return "int64";
    case kFloat64:
      return "float64";
    case kFloat32:
      return "float32";
    case kUInt16:
      return "uint16";
    default:
      return "unknown";
  }
}

// Unaligned little-endian load (the arrays start at byte 34 of the .idx).
template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void AppendLe(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// Appends n ids of type T from src; returns the index of the first id outside
// [0, vocab), or n when all are valid (those before it are appended).
template <typename T>
int64_t DecodeIds(const uint8_t* src, int64_t n, int vocab, std::vector<int32_t>* out) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = static_cast<int64_t>(Load<T>(src + i * int64_t{sizeof(T)}));
    if (id < 0 || id >= vocab) return i;
    out->push_back(static_cast<int32_t>(id));
  }
  return n;
}

class IndexedDatasetSource final : public DocumentSource {
 public:
  IndexedDatasetSource(std::string prefix, data::MappedFile idx, data::MappedFile bin, uint8_t dtype, int64_t sequences,
                       int64_t documents, int vocab_size, int64_t total_tokens)
      : prefix_(std::move(prefix)),
        idx_(std::move(idx)),
        bin_(std::move(bin)),
        dtype_(dtype),
        item_size_(ItemSize(dtype)),
        sequences_(sequences),
        documents_(documents),
        vocab_size_(vocab_size),
        total_tokens_(total_tokens),
        lengths_(idx_.data() + kHeaderBytes),
        pointers_(lengths_ + 4 * sequences),
        document_index_(pointers_ + 8 * sequences) {}

  int64_t num_documents() const override { return documents_; }

  int64_t DocumentLength(int64_t index) const override {
    int64_t length = 0;
    for (int64_t s = FirstSequence(index); s < FirstSequence(index + 1); ++s) length += SequenceLength(s);
    return length;
  }

  // Token ids are checked against vocab_size here, as they are read (a full
  // scan at open would read the whole .bin).
  Status ReadTokens(int64_t index, int64_t begin, int64_t end, std::vector<int32_t>* tokens) const override {
    if (index < 0 || index >= documents_)
      return Status::InvalidArgument(fmt::format("document {} out of range [0, {})", index, documents_));
    const int64_t length = DocumentLength(index);
    if (begin < 0 || begin > end || end > length)
      return Status::InvalidArgument(
          fmt::format("token range [{}, {}) out of range for document {} of '{}.bin' ({} tokens)", begin, end, index,
                      prefix_, length));
    int64_t seq_start = 0;  // document position of the current sequence's first token
    for (int64_t s = FirstSequence(index); s < FirstSequence(index + 1) && seq_start < end; ++s) {
      const int64_t len = SequenceLength(s);
      const int64_t from = std::max(begin, seq_start) - seq_start, to = std::min(end, seq_start + len) - seq_start;
      if (from < to) {
        const uint8_t* src = bin_.data() + Load<int64_t>(pointers_ + 8 * s) + from * item_size_;
        const int64_t n = to - from;
        int64_t good = n;
        switch (dtype_) {
          case kUInt8:
            good = DecodeIds<uint8_t>(src, n, vocab_size_, tokens);
            break;
          case kInt8:
            good = DecodeIds<int8_t>(src, n, vocab_size_, tokens);
            break;
          case kInt16:
            good = DecodeIds<int16_t>(src, n, vocab_size_, tokens);
            break;
          case kUInt16:
            good = DecodeIds<uint16_t>(src, n, vocab_size_, tokens);
            break;
          case kInt32:
            good = DecodeIds<int32_t>(src, n, vocab_size_, tokens);
            break;
          case kInt64:
            good = DecodeIds<int64_t>(src, n, vocab_size_, tokens);
            break;
          default:
            return Status::Internal(fmt::format("dtype code {} passed validation", int{dtype_}));
        }
        if (good != n) {
          const int64_t bad_id = BadId(src + good * item_size_);
          return Status::OutOfRange(fmt::format("'{}.bin': document {} token {} has id {}, outside [0, vocab size {})",
                                                prefix_, index, seq_start + from + good, bad_id, vocab_size_));
        }
      }
      seq_start += len;
    }
    return Status::Ok();
  }

  int vocab_size() const override { return vocab_size_; }

  std::string Describe() const override {
    return fmt::format("indexed:{} ({} documents, {} sequences, {} {} tokens, vocab {})", prefix_, documents_,
                       sequences_, total_tokens_, DTypeName(dtype_), vocab_size_);
  }

 private:
  int64_t FirstSequence(int64_t document) const { return Load<int64_t>(document_index_ + 8 * document); }
  int64_t SequenceLength(int64_t s) const { return Load<int32_t>(lengths_ + 4 * s); }

  int64_t BadId(const uint8_t* p) const {
    switch (dtype_) {
      case kUInt8:
        return Load<uint8_t>(p);
      case kInt8:
        return Load<int8_t>(p);
      case kInt16:
        return Load<int16_t>(p);
      case kUInt16:
        return Load<uint16_t>(p);
      case kInt32:
        return Load<int32_t>(p);
      default:
        return Load<int64_t>(p);
    }
  }

  std::string prefix_;
  data::MappedFile idx_, bin_;
  uint8_t dtype_;
  int item_size_;
  int64_t sequences_, documents_;
  int vocab_size_;
  int64_t total_tokens_;
  const uint8_t* lengths_;         // int32[sequences]
  const uint8_t* pointers_;        // int64[sequences], byte offsets into the .bin
  const uint8_t* document_index_;  // int64[documents + 1], first sequence of each document
};

// Checks the whole .idx against itself and the .bin size; on success sets the
// dtype, counts and token total.
Status ValidateIndex(const std::string& idx_path, const data::MappedFile& idx, int64_t bin_size, uint8_t* dtype,
                     int64_t* sequences, int64_t* documents, int64_t* total_tokens) {
  const uint8_t* p = idx.data();
  const int64_t size = idx.size();
  if (size < kHeaderBytes || std::memcmp(p, kMagic, sizeof(kMagic)) != 0)
    return Status::InvalidArgument(
        fmt::format("'{}' is not a Megatron indexed dataset index: it does not start with \"MMIDIDX\\0\\0\" "
                    "followed by a {}-byte header",
                    idx_path, kHeaderBytes - 9));
  const uint64_t version = Load<uint64_t>(p + 9);
  if (version != kVersion)
    return Status::InvalidArgument(fmt::format("'{}': version {}, only version 1 is supported", idx_path, version));
  *dtype = p[17];
  if (ItemSize(*dtype) == 0)
    return Status::InvalidArgument(
        fmt::format("'{}': dtype code {} ({}) does not hold token ids; expected an integer "
                    "type: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64 or 8 uint16",
                    idx_path, int{*dtype}, DTypeName(*dtype)));
  const uint64_t seq_count = Load<uint64_t>(p + 18), doc_count = Load<uint64_t>(p + 26);
  // Exact size: 34 + 4 S (lengths) + 8 S (pointers) + 8 D (document index),
  // computed without overflow. S more bytes means per-sequence modes (multimodal).
  const uint64_t body = static_cast<uint64_t>(size - kHeaderBytes);
  const std::string declared =
      fmt::format("its header declares {} sequences and {} document indices", seq_count, doc_count);
  if (seq_count > body / 12 || doc_count > (body - 12 * seq_count) / 8)
    return Status::InvalidArgument(fmt::format("'{}' is truncated: {} bytes, but {}", idx_path, size, declared));
  const uint64_t extra = body - 12 * seq_count - 8 * doc_count;
  if (extra != 0 && extra == seq_count)
    return Status::InvalidArgument(fmt::format(
        "'{}' carries per-sequence modes (a multimodal dataset); only text datasets are supported", idx_path));
  if (extra != 0)
    return Status::InvalidArgument(
        fmt::format("'{}' has {} bytes after the arrays that {}", idx_path, extra, declared));
  if (doc_count == 0)
    return Status::InvalidArgument(
        fmt::format("'{}': document count 0; the document index must hold at least its leading 0", idx_path));

  const int64_t s_count = static_cast<int64_t>(seq_count), d_count = static_cast<int64_t>(doc_count);
  const uint8_t* lengths = p + kHeaderBytes;
  const uint8_t* pointers = lengths + 4 * s_count;
  const uint8_t* doc_index = pointers + 8 * s_count;
  const int64_t item = ItemSize(*dtype);
  int64_t total = 0;
  for (int64_t s = 0; s < s_count; ++s) {
    const int64_t len = Load<int32_t>(lengths + 4 * s), ptr = Load<int64_t>(pointers + 8 * s);
    if (len < 0)
      return Status::InvalidArgument(fmt::format("'{}': sequence {} has negative length {}", idx_path, s, len));
    if (ptr < 0 || ptr > bin_size || len > (bin_size - ptr) / item)
      return Status::InvalidArgument(
          fmt::format("'{}': sequence {} ({} tokens of {} bytes at byte {}) lies beyond the end of the .bin ({} bytes)",
                      idx_path, s, len, item, ptr, bin_size));
    if (total > std::numeric_limits<int64_t>::max() - len)
      return Status::OutOfRange(fmt::format("'{}': more than 2^63 tokens", idx_path));
    total += len;
  }
  int64_t prev = Load<int64_t>(doc_index);
  if (prev != 0)
    return Status::InvalidArgument(fmt::format("'{}': the document index starts at {}, expected 0", idx_path, prev));
  for (int64_t d = 1; d < d_count; ++d) {
    const int64_t next = Load<int64_t>(doc_index + 8 * d);
    if (next < prev || next > s_count)
      return Status::InvalidArgument(
          fmt::format("'{}': document index entry {} = {} is not in [{}, {}] (entries must rise to the sequence count)",
                      idx_path, d, next, prev, s_count));
    prev = next;
  }
  if (prev != s_count)
    return Status::InvalidArgument(
        fmt::format("'{}': the document index ends at {}, but there are {} sequences", idx_path, prev, s_count));
  *sequences = s_count;
  *documents = d_count - 1;
  *total_tokens = total;
  return Status::Ok();
}

}  // namespace

Status OpenIndexedDataset(const std::string& prefix, int vocab_size, std::unique_ptr<DocumentSource>* out) {
  if (vocab_size <= 0) return Status::InvalidArgument(fmt::format("vocab size must be positive, got {}", vocab_size));
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
  data::MappedFile idx, bin;
  DISTCA_RETURN_IF_ERROR(data::MappedFile::Open(idx_path, &idx));
  DISTCA_RETURN_IF_ERROR(data::MappedFile::Open(bin_path, &bin));
  uint8_t dtype = 0;
  int64_t sequences = 0, documents = 0, total_tokens = 0;
  DISTCA_RETURN_IF_ERROR(ValidateIndex(idx_path, idx, bin.size(), &dtype, &sequences, &documents, &total_tokens));
  *out = std::make_unique<IndexedDatasetSource>(prefix, std::move(idx), std::move(bin), dtype, sequences, documents,
                                                vocab_size, total_tokens);
  return Status::Ok();
}

Status WriteIndexedDataset(const std::string& prefix, const std::vector<std::vector<int32_t>>& docs) {
  int32_t max_id = 0;
  size_t total_tokens = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    if (docs[d].size() > size_t{std::numeric_limits<int32_t>::max()})
      return Status::OutOfRange(
          fmt::format("document {} has {} tokens; a sequence holds at most 2^31 - 1", d, docs[d].size()));
    for (size_t i = 0; i < docs[d].size(); ++i) {
      if (docs[d][i] < 0)
        return Status::InvalidArgument(fmt::format("document {} token {} has negative id {}", d, i, docs[d][i]));
      max_id = std::max(max_id, docs[d][i]);
    }
    total_tokens += docs[d].size();
  }
  const uint8_t dtype = max_id < 65536 ? kUInt16 : kInt32;
  const int64_t item = ItemSize(dtype);
  std::string bin;
  bin.reserve(total_tokens * static_cast<size_t>(item));
  std::string idx(kMagic, sizeof(kMagic));
  const uint64_t seq_count = docs.size(), doc_count = docs.size() + 1;
  AppendLe(&idx, kVersion);
  idx.push_back(static_cast<char>(dtype));
  AppendLe(&idx, seq_count);
  AppendLe(&idx, doc_count);
  for (const std::vector<int32_t>& doc : docs) AppendLe(&idx, static_cast<int32_t>(doc.size()));  // lengths
  int64_t pointer = 0;
  for (const std::vector<int32_t>& doc : docs) {  // byte pointers
    AppendLe(&idx, pointer);
    pointer += static_cast<int64_t>(doc.size()) * item;
  }
  for (uint64_t d = 0; d < doc_count; ++d) AppendLe(&idx, static_cast<int64_t>(d));  // one sequence per document
  std::vector<uint16_t> narrow;
  for (const std::vector<int32_t>& doc : docs) {
    if (dtype == kUInt16) {
      narrow.assign(doc.begin(), doc.end());  // every id < 65536
      bin.append(reinterpret_cast<const char*>(narrow.data()), narrow.size() * sizeof(uint16_t));
    } else {
      bin.append(reinterpret_cast<const char*>(doc.data()), doc.size() * sizeof(int32_t));
    }
  }
  // Both files are written in full before either replaces anything, so a
  // failure up to then leaves the old pair as it was. Then the old .idx goes
  // first: a new .bin never sits next to an index of other data (which may
  // well fit it and open), and a crash between the renames leaves no .idx,
  // which fails to open.
  const std::string bin_path = prefix + ".bin", idx_path = prefix + ".idx";
  // A directory at either name would fail the renames only after the old
  // index is gone.
  for (const std::string& path : {bin_path, idx_path}) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
      return Status::IoError(fmt::format("cannot write '{}': it is a directory", path));
  }
  std::string bin_tmp, idx_tmp;
  DISTCA_RETURN_IF_ERROR(WriteStagedSynced(bin_path, bin, &bin_tmp));
  if (Status s = WriteStagedSynced(idx_path, idx, &idx_tmp); !s.ok()) {
    std::remove(bin_tmp.c_str());
    return s;
  }
  if (std::remove(idx_path.c_str()) != 0 && errno != ENOENT) {
    const int err = errno;
    std::remove(bin_tmp.c_str());
    std::remove(idx_tmp.c_str());
    return Status::IoError(fmt::format("cannot remove the old '{}': {}", idx_path, std::strerror(err)));
  }
  const std::string dir = DirectoryOf(prefix);
  DISTCA_RETURN_IF_ERROR(SyncDirectory(dir));
  // From here a failure leaves no PREFIX.idx (the dataset does not open);
  // the message says so and where the new files are.
  for (const auto& [from, to] : {std::pair{bin_tmp, bin_path}, std::pair{idx_tmp, idx_path}}) {
    if (std::rename(from.c_str(), to.c_str()) != 0) {
      const int err = errno;
      return Status::IoError(
          fmt::format("cannot rename '{}' to '{}': {}; '{}' is gone and the dataset does not open until it is written "
                      "again (the new files are '{}' and '{}' where not yet renamed)",
                      from, to, std::strerror(err), idx_path, bin_tmp, idx_tmp));
    }
  }
  return SyncDirectory(dir);
}

}  // namespace distca
