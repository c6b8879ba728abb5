// Megatron indexed datasets: write/read round trips, hand-built indexes with
// several sequences per document, and corrupted files.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>

#include "common/file_size_limit.h"
#include "common/file_util.h"
#include "data/data_testing.h"
#include "distca/dataset.h"

namespace distca {
namespace {

using testing::Contains;
using testing::ScratchDir;

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// An .idx as Megatron's _IndexWriter lays it out (docs/data_formats.md).
struct IdxSpec {
  uint8_t dtype = 8;
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers;
  std::vector<int64_t> document_index;
  std::string magic = std::string("MMIDIDX\0\0", 9);
  uint64_t version = 1;
  std::string Bytes() const {
    std::string s = magic;
    Put(&s, version);
    Put(&s, dtype);
    Put(&s, uint64_t{lengths.size()});
    Put(&s, uint64_t{document_index.size()});
    for (int32_t v : lengths) Put(&s, v);
    for (int64_t v : pointers) Put(&s, v);
    for (int64_t v : document_index) Put(&s, v);
    return s;
  }
};

std::vector<int32_t> ReadAll(const DocumentSource& source, int64_t index) {
  std::vector<int32_t> tokens;
  const Status s = source.ReadTokens(index, 0, source.DocumentLength(index), &tokens);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return tokens;
}

std::string ReadFile(const std::string& path) {
  std::string s;
  EXPECT_TRUE(ReadTextFile(path, &s).ok());
  return s;
}

// Staging files (NAME.tmp-PID-N) left in `dir`.
int StagingFiles(const std::filesystem::path& dir) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    n += e.path().filename().string().find(".tmp") != std::string::npos;
  return n;
}

TEST(IndexedDatasetTest, RoundTripsUint16AndInt32) {
  ScratchDir dir;
  const std::vector<std::vector<int32_t>> small{{1, 2, 3}, {65535}, {}, {0, 0, 40000, 7}};
  const std::vector<std::vector<int32_t>> wide{{70000, 1}, {2147483646, 0, 5}};
  for (const auto& [name, docs, dtype, vocab] :
       {std::tuple{"small", small, 8, 65536}, std::tuple{"wide", wide, 4, 2147483647}}) {
    SCOPED_TRACE(name);
    const std::string prefix = dir / name;
    ASSERT_TRUE(WriteIndexedDataset(prefix, docs).ok());
    EXPECT_EQ(StagingFiles(dir.path()), 0);
    const std::string idx = ReadFile(prefix + ".idx");
    ASSERT_GE(idx.size(), 34u);
    EXPECT_EQ(idx.substr(0, 9), std::string("MMIDIDX\0\0", 9));
    EXPECT_EQ(idx[17], dtype);
    EXPECT_EQ(idx.size(), 34 + 12 * docs.size() + 8 * (docs.size() + 1));
    size_t tokens = 0;
    for (const auto& d : docs) tokens += d.size();
    EXPECT_EQ(ReadFile(prefix + ".bin").size(), tokens * (dtype == 8 ? 2 : 4));

    std::unique_ptr<DocumentSource> source;
    const Status s = OpenIndexedDataset(prefix, vocab, &source);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(source->num_documents(), static_cast<int64_t>(docs.size()));
    for (size_t d = 0; d < docs.size(); ++d) {
      EXPECT_EQ(source->DocumentLength(static_cast<int64_t>(d)), static_cast<int64_t>(docs[d].size()));
      EXPECT_EQ(ReadAll(*source, static_cast<int64_t>(d)), docs[d]);
    }
  }
}

TEST(IndexedDatasetTest, DocumentsConcatenateTheirSequences) {
  ScratchDir dir;
  // int32 tokens 0..9 in the .bin; document 0 = sequences 0 and 1, document 1
  // = no sequence, document 2 = sequence 2 (which reuses bytes of sequence 0).
  std::string bin;
  for (int32_t t = 0; t < 10; ++t) Put(&bin, t);
  IdxSpec idx{.dtype = 4, .lengths = {3, 4, 2}, .pointers = {0, 24, 4}, .document_index = {0, 2, 2, 3}};
  ASSERT_TRUE(WriteTextFile(dir / "m.bin", bin).ok());
  ASSERT_TRUE(WriteTextFile(dir / "m.idx", idx.Bytes()).ok());
  std::unique_ptr<DocumentSource> source;
  const Status s = OpenIndexedDataset(dir / "m", 10, &source);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(source->num_documents(), 3);
  EXPECT_EQ(ReadAll(*source, 0), (std::vector<int32_t>{0, 1, 2, 6, 7, 8, 9}));
  EXPECT_EQ(source->DocumentLength(1), 0);
  EXPECT_EQ(ReadAll(*source, 2), (std::vector<int32_t>{1, 2}));
  std::vector<int32_t> span;  // a range across the sequence boundary
  ASSERT_TRUE(source->ReadTokens(0, 2, 5, &span).ok());
  EXPECT_EQ(span, (std::vector<int32_t>{2, 6, 7}));
  // Token ids are checked against the vocabulary as they are read.
  ASSERT_TRUE(OpenIndexedDataset(dir / "m", 8, &source).ok());
  span.clear();
  EXPECT_TRUE(Contains(source->ReadTokens(0, 0, 7, &span), "document 0 token 5 has id 8, outside [0, vocab size 8)"));
  EXPECT_TRUE(source->ReadTokens(0, 0, 5, &span).ok());
}

// One document of ids {1, 2, bad} in dtype `code`: the good ids read back,
// and the bad one is named with its value.
template <typename T>
void CheckDtype(uint8_t code, T bad, const std::string& bad_text) {
  ScratchDir dir;
  std::string bin;
  for (T t : {T(1), T(2), bad}) Put(&bin, t);
  const IdxSpec idx{.dtype = code, .lengths = {3}, .pointers = {0}, .document_index = {0, 1}};
  ASSERT_TRUE(WriteTextFile(dir / "m.bin", bin).ok());
  ASSERT_TRUE(WriteTextFile(dir / "m.idx", idx.Bytes()).ok());
  std::unique_ptr<DocumentSource> source;
  const Status s = OpenIndexedDataset(dir / "m", 200, &source);
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::vector<int32_t> ids;
  ASSERT_TRUE(source->ReadTokens(0, 0, 2, &ids).ok());
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2})) << int{code};
  ids.clear();
  EXPECT_TRUE(Contains(source->ReadTokens(0, 0, 3, &ids),
                       "document 0 token 2 has id " + bad_text + ", outside [0, vocab size 200)"))
      << int{code};
}

// Every integer dtype Megatron writes: ids past the vocabulary, negative ids
// of the signed types, and int64 ids past 2^31 (caught before narrowing).
TEST(IndexedDatasetTest, EveryIntegerDtype) {
  CheckDtype<uint8_t>(1, 255, "255");
  CheckDtype<int8_t>(2, -1, "-1");
  CheckDtype<int16_t>(3, -300, "-300");
  CheckDtype<int32_t>(4, -7, "-7");
  CheckDtype<int64_t>(5, (int64_t{1} << 31) + 5, "2147483653");
  CheckDtype<int64_t>(5, -1, "-1");
  CheckDtype<uint16_t>(8, 60000, "60000");
}

TEST(IndexedDatasetTest, RejectsCorruptedFilesWithReasons) {
  ScratchDir dir;
  std::string bin;
  for (uint16_t t = 0; t < 6; ++t) Put(&bin, t);
  const IdxSpec good{.dtype = 8, .lengths = {2, 4}, .pointers = {0, 4}, .document_index = {0, 1, 2}};
  struct Case {
    const char* name;
    std::string idx;
    const char* error;
  };
  std::vector<Case> cases;
  auto with = [&](auto edit) {
    IdxSpec s = good;
    edit(s);
    return s.Bytes();
  };
  cases.push_back({"magic", with([](IdxSpec& s) { s.magic = std::string("MMIDIDY\0\0", 9); }), "does not start with"});
  cases.push_back({"version", with([](IdxSpec& s) { s.version = 2; }), "version 2, only version 1"});
  cases.push_back({"float", with([](IdxSpec& s) { s.dtype = 7; }), "dtype code 7 (float32) does not hold token ids"});
  cases.push_back({"unknown_dtype", with([](IdxSpec& s) { s.dtype = 9; }), "dtype code 9 (unknown)"});
  cases.push_back({"short_header", good.Bytes().substr(0, 20), "does not start with"});
  cases.push_back({"truncated", good.Bytes().substr(0, good.Bytes().size() - 1), "is truncated"});
  cases.push_back({"trailing", good.Bytes() + "xyz", "3 bytes after the arrays"});
  cases.push_back({"modes", good.Bytes() + std::string(2, '\0'), "per-sequence modes (a multimodal dataset)"});
  cases.push_back({"beyond_bin", with([](IdxSpec& s) { s.pointers[1] = 6; }),
                   "sequence 1 (4 tokens of 2 bytes at byte "
                   "6) lies beyond the end of the .bin"});
  cases.push_back({"negative_pointer", with([](IdxSpec& s) { s.pointers[0] = -2; }), "lies beyond the end"});
  cases.push_back({"negative_length", with([](IdxSpec& s) { s.lengths[0] = -1; }), "negative length -1"});
  cases.push_back({"index_start", with([](IdxSpec& s) { s.document_index[0] = 1; }), "starts at 1, expected 0"});
  cases.push_back({"index_order", with([](IdxSpec& s) { s.document_index = {0, 2, 1, 2}; }), "entry 2 = 1"});
  cases.push_back({"index_end", with([](IdxSpec& s) { s.document_index = {0, 1}; }), "ends at 1, but there are 2"});
  cases.push_back({"no_index", with([](IdxSpec& s) { s.document_index.clear(); }), "document count 0"});
  // Counts so large that 34 + 12 S + 8 D overflows 64 bits.
  std::string huge = good.Bytes();
  const uint64_t big = ~uint64_t{0} / 4;
  std::memcpy(huge.data() + 18, &big, 8);
  cases.push_back({"huge_counts", huge, "is truncated"});

  ASSERT_TRUE(WriteTextFile(dir / "d.bin", bin).ok());
  std::unique_ptr<DocumentSource> source;
  ASSERT_TRUE(WriteTextFile(dir / "d.idx", good.Bytes()).ok());
  ASSERT_TRUE(OpenIndexedDataset(dir / "d", 6, &source).ok());
  EXPECT_TRUE(Contains(OpenIndexedDataset(dir / "d", 0, &source), "vocab size must be positive"));
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_TRUE(WriteTextFile(dir / "d.idx", c.idx).ok());
    const Status s = OpenIndexedDataset(dir / "d", 6, &source);
    EXPECT_TRUE(Contains(s, c.error)) << s.ToString();
    EXPECT_TRUE(Contains(s, dir / "d.idx")) << s.ToString();
  }
  EXPECT_TRUE(Contains(OpenIndexedDataset(dir / "missing", 6, &source), dir / "missing.idx"));
  // A FIFO in place of either file is refused at once (a plain open of a
  // FIFO with no writer blocks forever).
  ASSERT_TRUE(WriteTextFile(dir / "d.idx", good.Bytes()).ok());
  if (::mkfifo((dir / "f.idx").c_str(), 0600) == 0 && ::mkfifo((dir / "f2.bin").c_str(), 0600) == 0) {
    ASSERT_TRUE(WriteTextFile(dir / "f.bin", bin).ok());
    EXPECT_TRUE(Contains(OpenIndexedDataset(dir / "f", 6, &source), dir / "f.idx' is not a regular file"));
    ASSERT_TRUE(WriteTextFile(dir / "f2.idx", good.Bytes()).ok());
    EXPECT_TRUE(Contains(OpenIndexedDataset(dir / "f2", 6, &source), dir / "f2.bin' is not a regular file"));
  } else {
    ADD_FAILURE() << "cannot make a FIFO in " << dir.path() << ": the FIFO cases did not run";
  }
  std::filesystem::remove(dir / "d.bin");
  ASSERT_TRUE(WriteTextFile(dir / "d.idx", good.Bytes()).ok());
  EXPECT_TRUE(Contains(OpenIndexedDataset(dir / "d", 6, &source), dir / "d.bin"));
}

TEST(IndexedDatasetTest, WriterRejectsNegativeIdsAndMissingDirectories) {
  ScratchDir dir;
  EXPECT_TRUE(Contains(WriteIndexedDataset(dir / "x", {{1}, {2, -3}}), "document 1 token 1 has negative id -3"));
  EXPECT_TRUE(Contains(WriteIndexedDataset(dir / "no/such/dir/x", {{1}}), "no/such/dir/x.bin"));
}

// Rewriting a dataset: a failure before the new pair is complete leaves the
// old pair as it was (here the .idx cannot be written: the process may not
// write files past 40 bytes, which the new .bin's 16 fit), and a rewrite that
// succeeds leaves only the new pair. A file of the user's at a name a fixed
// staging scheme would take (ds.bin.tmp) is left alone.
TEST(IndexedDatasetTest, AFailedRewriteLeavesTheOldPair) {
  ScratchDir dir;
  const std::string prefix = dir / "ds";
  const std::vector<std::vector<int32_t>> old_docs{{1, 2, 3, 4}, {5, 6, 7, 8}}, new_docs{{9, 9, 9, 9, 9, 9, 9, 9}};
  ASSERT_TRUE(WriteIndexedDataset(prefix, old_docs).ok());
  const Status failed = testing::WithFileSizeLimit(40, [&] { return WriteIndexedDataset(prefix, new_docs); });
  EXPECT_TRUE(Contains(failed, "ds.idx.tmp-")) << failed.ToString();
  EXPECT_TRUE(Contains(failed, "File too large")) << failed.ToString();
  EXPECT_EQ(StagingFiles(dir.path()), 0);
  std::unique_ptr<DocumentSource> source;
  ASSERT_TRUE(OpenIndexedDataset(prefix, 16, &source).ok());
  ASSERT_EQ(source->num_documents(), 2);
  EXPECT_EQ(ReadAll(*source, 1), old_docs[1]);

  ASSERT_TRUE(WriteTextFile(prefix + ".bin.tmp", "precious").ok());
  ASSERT_TRUE(WriteIndexedDataset(prefix, new_docs).ok());
  EXPECT_EQ(ReadFile(prefix + ".bin.tmp"), "precious");
  std::filesystem::remove(prefix + ".bin.tmp");
  EXPECT_EQ(StagingFiles(dir.path()), 0);
  ASSERT_TRUE(OpenIndexedDataset(prefix, 16, &source).ok());
  ASSERT_EQ(source->num_documents(), 1);
  EXPECT_EQ(ReadAll(*source, 0), new_docs[0]);
}

}  // namespace
}  // namespace distca
