// text:DIR sources: which files are documents, in what order, and their bytes.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>

#include "data/data_testing.h"
#include "distca/dataset.h"

namespace distca {
namespace {

using testing::Contains;
using testing::ScratchDir;

std::vector<int32_t> ReadAll(const DocumentSource& source, int64_t index) {
  std::vector<int32_t> tokens;
  EXPECT_TRUE(source.ReadTokens(index, 0, source.DocumentLength(index), &tokens).ok());
  return tokens;
}

std::vector<int32_t> Bytes(std::string_view s) {
  std::vector<int32_t> out;
  for (char c : s) out.push_back(static_cast<unsigned char>(c));
  return out;
}

TEST(TextSourceTest, WalksNestedDirectoriesInPathOrderSkippingEmptyFiles) {
  ScratchDir dir;
  dir.Write("b.txt", "bee");
  dir.Write("a/z.h", "zed");
  dir.Write("a/c.cc", "sea");
  dir.Write("a/deep/d.h", std::string("\x00\xff\x80q", 4));  // every byte value is a token
  dir.Write("empty.h", "");
  std::unique_ptr<DocumentSource> source;
  ASSERT_TRUE(OpenTextDirectory(dir.path().string(), "", &source).ok());
  ASSERT_EQ(source->num_documents(), 4);  // empty.h skipped
  EXPECT_EQ(source->vocab_size(), 256);
  // Sorted by relative path: a/c.cc, a/deep/d.h, a/z.h, b.txt.
  EXPECT_EQ(ReadAll(*source, 0), Bytes("sea"));
  EXPECT_EQ(ReadAll(*source, 1), (std::vector<int32_t>{0, 255, 128, 'q'}));
  EXPECT_EQ(ReadAll(*source, 2), Bytes("zed"));
  EXPECT_EQ(ReadAll(*source, 3), Bytes("bee"));
  EXPECT_EQ(source->DocumentLength(1), 4);

  std::vector<int32_t> part{7};  // ReadTokens appends
  ASSERT_TRUE(source->ReadTokens(1, 1, 3, &part).ok());
  EXPECT_EQ(part, (std::vector<int32_t>{7, 255, 128}));
  EXPECT_TRUE(Contains(source->ReadTokens(1, 2, 5, &part), "out of range"));
  EXPECT_TRUE(Contains(source->ReadTokens(4, 0, 1, &part), "out of range"));
}

TEST(TextSourceTest, GlobMatchesRelativePathsAcrossDirectories) {
  ScratchDir dir;
  dir.Write("top.h", "t");
  dir.Write("x/inner.h", "i");
  dir.Write("x/inner.cc", "c");
  dir.Write("x/empty.h", "");
  std::unique_ptr<DocumentSource> source;
  ASSERT_TRUE(OpenTextDirectory(dir.path().string(), "*.h", &source).ok());  // '*' crosses '/'
  ASSERT_EQ(source->num_documents(), 2);
  EXPECT_EQ(ReadAll(*source, 0), Bytes("t"));
  EXPECT_EQ(ReadAll(*source, 1), Bytes("i"));
  ASSERT_TRUE(OpenTextDirectory(dir.path().string(), "x/*.cc", &source).ok());
  ASSERT_EQ(source->num_documents(), 1);
  EXPECT_EQ(ReadAll(*source, 0), Bytes("c"));
  EXPECT_NE(source->Describe().find("1 files"), std::string::npos) << source->Describe();
}

TEST(TextSourceTest, SkipsDirectorySymlinksDanglingOrLoopingLinksAndFifos) {
  ScratchDir dir;
  dir.Write("real/a.txt", "a");
  std::filesystem::create_directory_symlink(dir.path() / "real", dir.path() / "loop");
  std::filesystem::create_symlink(dir.path() / "missing", dir.path() / "dangling");
  // A link to a file (outside the directory, with its own text): followed.
  ScratchDir outside;
  outside.Write("b.txt", "b");
  std::filesystem::create_symlink(outside.path() / "b.txt", dir.path() / "link.txt");
  // Two links that point at each other, and a FIFO: skipped too.
  std::filesystem::create_symlink(dir.path() / "ping", dir.path() / "pong");
  std::filesystem::create_symlink(dir.path() / "pong", dir.path() / "ping");
  ASSERT_EQ(::mkfifo((dir.path() / "fifo").c_str(), 0600), 0);
  std::unique_ptr<DocumentSource> source;
  const Status opened = OpenTextDirectory(dir.path().string(), "", &source);
  ASSERT_TRUE(opened.ok()) << opened.ToString();
  ASSERT_EQ(source->num_documents(), 2);  // link.txt (a link to a file) and real/a.txt; not loop/a.txt
  EXPECT_EQ(ReadAll(*source, 0), Bytes("b"));
  EXPECT_EQ(ReadAll(*source, 1), Bytes("a"));
}

TEST(TextSourceTest, RejectsMissingOrEmptyInputsNamingThePath) {
  ScratchDir dir;
  std::unique_ptr<DocumentSource> source;
  const std::string missing = dir / "nope";
  EXPECT_TRUE(Contains(OpenTextDirectory(missing, "", &source), missing + "' does not exist"));
  dir.Write("file.txt", "x");
  EXPECT_TRUE(Contains(OpenTextDirectory(dir / "file.txt", "", &source), "is not a directory"));
  EXPECT_TRUE(Contains(OpenTextDirectory(dir.path().string(), "*.md", &source), "no non-empty regular file matching"));
  dir.Write("sub/empty", "");
  EXPECT_TRUE(Contains(OpenTextDirectory(dir / "sub", "", &source), "holds no non-empty regular file"));
}

}  // namespace
}  // namespace distca
