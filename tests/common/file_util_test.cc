// File helpers: reads report every failure, a directory included.
#include "common/file_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>

#include <filesystem>
#include <string>
#include <thread>

#include "common/file_size_limit.h"

namespace distca {
namespace {

TEST(FileUtilTest, ReadTextFileReadsAndReportsFailures) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / ("distca_file_util_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string text(200000, 'x');  // more than one read's buffer
  ASSERT_TRUE(WriteTextFile((dir / "a.txt").string(), text + "end").ok());
  std::string got = "stale";
  ASSERT_TRUE(ReadTextFile((dir / "a.txt").string(), &got).ok());
  EXPECT_EQ(got, text + "end");
  ASSERT_TRUE(WriteTextFile((dir / "empty.txt").string(), "").ok());
  ASSERT_TRUE(ReadTextFile((dir / "empty.txt").string(), &got).ok());
  EXPECT_EQ(got, "");
  // A directory opens but cannot be read: an error, not an empty file.
  const Status s = ReadTextFile(dir.string(), &got);
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  EXPECT_NE(s.message().find("error while reading"), std::string::npos) << s.ToString();
  const std::string missing = (dir / "missing").string();
  const Status absent = ReadTextFile(missing, &got);
  EXPECT_EQ(absent.code(), StatusCode::kIoError);
  EXPECT_NE(absent.message().find("cannot open '" + missing + "': No such file or directory"), std::string::npos)
      << absent.ToString();
  // A stream of text stops at the limit instead of filling memory (a pipe
  // fed 2 MiB of 'x', read through its /dev/fd path); a stream giving a NUL
  // byte is refused at once; a regular file is not limited.
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const auto old_sigpipe = std::signal(SIGPIPE, SIG_IGN);  // the writer outlives the read
  std::thread writer([fd = fds[1]] {
    const std::string chunk(1 << 16, 'x');
    for (int i = 0; i < 32 && ::write(fd, chunk.data(), chunk.size()) > 0; ++i) {
    }
    ::close(fd);
  });
  const Status endless = ReadTextFile("/dev/fd/" + std::to_string(fds[0]), &got, 1 << 20);
  ::close(fds[0]);
  writer.join();
  std::signal(SIGPIPE, old_sigpipe);
  EXPECT_EQ(endless.code(), StatusCode::kOutOfRange) << endless.ToString();
  EXPECT_NE(endless.message().find("is not a regular file and gives more than 1048576 bytes"), std::string::npos)
      << endless.ToString();
  const Status zeros = ReadTextFile("/dev/zero", &got);
  EXPECT_EQ(zeros.code(), StatusCode::kInvalidArgument) << zeros.ToString();
  EXPECT_EQ(zeros.message(), "'/dev/zero' is not a regular file and gives a NUL byte: not a text file");
  ASSERT_TRUE(ReadTextFile((dir / "a.txt").string(), &got, 16).ok());
  EXPECT_EQ(got.size(), text.size() + 3);
  std::filesystem::remove_all(dir);
}

// A size limit that holds for regular files too, and path comparisons.
TEST(FileUtilTest, ReadAtMostAndPathsCompared) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / ("distca_file_paths_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "sub");
  const std::string a = (dir / "a.txt").string();
  ASSERT_TRUE(WriteTextFile(a, "0123456789").ok());
  std::string got;
  ASSERT_TRUE(ReadTextFileAtMost(a, &got, 10, "a test").ok());
  EXPECT_EQ(got, "0123456789");
  const Status big = ReadTextFileAtMost(a, &got, 9, "a test");
  EXPECT_EQ(big.message(), a + ": 10 bytes, more than the 9 bytes a test can take") << big.ToString();
  // A stream giving a NUL byte is no text; binary contents may hold NUL
  // bytes, and a stream stops at the limit only.
  EXPECT_EQ(ReadTextFileAtMost("/dev/zero", &got, 1 << 20, "a test").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadBinaryFileAtMost("/dev/zero", &got, 1 << 20, "a test").code(), StatusCode::kOutOfRange);
  // A relative name is the same file as its absolute form, existing or not.
  EXPECT_TRUE(SameFile("no-such-file.json", (std::filesystem::current_path() / "no-such-file.json").string()));
  EXPECT_TRUE(SameFile("./no-such-file.json", "no-such-file.json"));
  EXPECT_TRUE(SameFile(a, (dir / "sub" / ".." / "a.txt").string()));
  EXPECT_TRUE(SameFile((dir / "new.txt").string(), (dir / "." / "new.txt").string()));  // neither exists
  EXPECT_FALSE(SameFile(a, (dir / "new.txt").string()));
  EXPECT_TRUE(IsSameOrInside((dir / "sub" / "x" / "y").string(), dir.string()));
  EXPECT_TRUE(IsSameOrInside(dir.string(), (dir / "sub" / "..").string()));
  EXPECT_FALSE(IsSameOrInside(dir.string(), (dir / "sub").string()));
  EXPECT_FALSE(IsSameOrInside((dir.string() + "-other/x"), dir.string()));
  std::filesystem::remove_all(dir);
}

// A write that fails half way (here: past the file-size limit) leaves the
// old file whole and no temporary; a device is written in place.
TEST(FileUtilTest, AFailedWriteLeavesTheOldFile) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / ("distca_file_write_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "out.json").string();
  ASSERT_TRUE(WriteTextFile(path, "old").ok());
  const Status s = testing::WithFileSizeLimit(4096, [&] { return WriteTextFile(path, std::string(100000, 'x')); });
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  EXPECT_NE(s.message().find("error while writing '" + path + ".tmp-"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("File too large"), std::string::npos) << s.ToString();
  std::string got;
  ASSERT_TRUE(ReadTextFile(path, &got).ok());
  EXPECT_EQ(got, "old");
  // No temporary is left, and a file of the user's named like a staging
  // file is not touched.
  const std::string mine = path + ".tmp";
  ASSERT_TRUE(WriteTextFile(mine, "precious").ok());
  ASSERT_TRUE(WriteTextFile(path, "new").ok());
  ASSERT_TRUE(ReadTextFile(mine, &got).ok());
  EXPECT_EQ(got, "precious");
  std::filesystem::remove(mine);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()), 1);
  EXPECT_TRUE(WriteTextFile("/dev/null", "anything").ok());
  // A link is written through, not replaced (/dev/stdout is a link).
  const std::string target = (dir / "target.json").string(), link = (dir / "link.json").string();
  ASSERT_TRUE(WriteTextFile(target, "old").ok());
  std::filesystem::create_symlink(target, link);
  ASSERT_TRUE(WriteTextFile(link, "new").ok());
  EXPECT_TRUE(std::filesystem::is_symlink(link));
  ASSERT_TRUE(ReadTextFile(target, &got).ok());
  EXPECT_EQ(got, "new");
  // An output path is checked before a long run: a directory is refused, a
  // device or a new file in a writable directory accepted.
  EXPECT_NE(CheckOutputPath(dir.string()).message().find("it is a directory"), std::string::npos);
  EXPECT_TRUE(CheckOutputPath("/dev/null").ok());
  EXPECT_TRUE(CheckOutputPath((dir / "new.json").string()).ok());
  EXPECT_NE(CheckOutputPath((dir / "no" / "x.json").string()).message().find("is not a directory"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace distca
