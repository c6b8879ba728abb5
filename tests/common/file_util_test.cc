// File helpers: reads report every failure, a directory included.
#include "common/file_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

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
  EXPECT_EQ(ReadTextFile((dir / "missing").string(), &got).code(), StatusCode::kIoError);
  // An endless stream stops at the limit instead of filling memory; a
  // regular file is not limited.
  const Status endless = ReadTextFile("/dev/zero", &got, 1 << 20);
  EXPECT_EQ(endless.code(), StatusCode::kOutOfRange) << endless.ToString();
  EXPECT_NE(endless.message().find("is not a regular file and gives more than 1048576 bytes"), std::string::npos);
  ASSERT_TRUE(ReadTextFile((dir / "a.txt").string(), &got, 16).ok());
  EXPECT_EQ(got.size(), text.size() + 3);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace distca
