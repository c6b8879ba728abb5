// ParseJsonText: strict parsing of input files, with errors that say why.
#include "common/json_text.h"

#include <gtest/gtest.h>

#include <string>

namespace distca {
namespace {

std::string Why(std::string_view text) {
  nlohmann::json j;
  const Status s = ParseJsonText(text, "the file", &j);
  return s.ok() ? "ok" : s.message();
}

TEST(JsonTextTest, ParsesValidTextWhole) {
  nlohmann::json j;
  ASSERT_TRUE(ParseJsonText(R"({"batches": [[1, 2], [3]], "x": {"a": 1, "b": {"a": 2}}})", "f", &j).ok());
  EXPECT_EQ(j["batches"][1][0], 3);
  EXPECT_EQ(j["x"]["b"]["a"], 2);  // the same key in different objects is fine
}

TEST(JsonTextTest, RefusesWhatTheDefaultParserAccepts) {
  // nlohmann stops at a NUL byte and keeps the last of duplicate keys.
  EXPECT_EQ(Why(std::string("[100]\0garbage", 13)), "the file is not valid JSON: a NUL byte at offset 5");
  EXPECT_EQ(Why(R"({"batches": [[9]], "batches": [[1, 1]]})"),
            "the file is not valid JSON: key \"batches\" appears twice in one object");
  EXPECT_EQ(Why(R"([{"a": {"k": 1, "k": 2}}])"), "the file is not valid JSON: key \"k\" appears twice in one object");
  std::string deep(kMaxJsonDepth, '[');
  deep += std::string(kMaxJsonDepth, ']');
  EXPECT_EQ(Why(deep), "ok");
  EXPECT_EQ(Why("[" + deep + "]"), "the file is not valid JSON: nested more than 64 levels deep");
}

TEST(JsonTextTest, SyntaxErrorsSayWhereAndWhy) {
  EXPECT_NE(Why("[1,\n 2,]").find("the file is not valid JSON: parse error at line 2, column 4"), std::string::npos)
      << Why("[1,\n 2,]");
  EXPECT_NE(Why("[1e400]").find("number overflow"), std::string::npos) << Why("[1e400]");
  EXPECT_NE(Why("[NaN]").find("invalid literal"), std::string::npos) << Why("[NaN]");
  EXPECT_NE(Why("").find("unexpected end of input"), std::string::npos) << Why("");
  EXPECT_NE(Why("[1] 2").find("expected end of input"), std::string::npos) << Why("[1] 2");
}

// The parser quotes an offending token whole; a message quotes at most a
// few hundred characters of it (a 10 MB number made a 10 MB message).
TEST(JsonTextTest, MessagesQuoteLongInputInPart) {
  std::string huge = "[";
  huge.append(100000, '1').append("]");
  const std::string why = Why(huge);
  EXPECT_NE(why.find("number overflow"), std::string::npos) << why.substr(0, 200);
  EXPECT_LT(why.size(), 400u);
  EXPECT_NE(why.find("bytes)"), std::string::npos) << why;
  const std::string key(5000, 'k');
  std::string twice = "{\"";
  twice.append(key).append("\": 1, \"").append(key).append("\": 2}");
  std::string expected = "the file is not valid JSON: key \"";
  expected.append(key, 0, 80).append("... (5000 bytes)\" appears twice in one object");
  EXPECT_EQ(Why(twice), expected);
  EXPECT_EQ(Excerpt("short"), "short");
  EXPECT_EQ(Excerpt("abcdef", 3), "abc... (6 bytes)");
  EXPECT_EQ(Excerpt("abc", 3), "abc");
  EXPECT_EQ(Excerpt(R"(a"b\c)"), R"(a\"b\\c)");
  EXPECT_EQ(Excerpt(std::string_view("a\0b\n", 4)), "a\\x00b\\x0a");
  // Well-formed UTF-8 is kept; other bytes above 0x7f are escaped, and a
  // character the limit would cut is left out.
  EXPECT_EQ(Excerpt("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(Excerpt("100, \xff"), "100, \\xff");
  EXPECT_EQ(Excerpt("\xc3(\xe0\x80\x80\xed\xa0\x80"), "\\xc3(\\xe0\\x80\\x80\\xed\\xa0\\x80");
  EXPECT_EQ(Excerpt("\xf4\x90\x80\x80\xc3"), "\\xf4\\x90\\x80\\x80\\xc3");
  EXPECT_EQ(Excerpt("ab\xc3\xa9", 3), "ab... (4 bytes)");
  EXPECT_TRUE(IsWellFormedUtf8("caf\xc3\xa9"));
  EXPECT_FALSE(IsWellFormedUtf8("caf\xc3"));
  EXPECT_FALSE(IsWellFormedUtf8("\xff.json"));
  // A tool's message: each word past the limit cut to its head and tail,
  // spaces kept, no UTF-8 character cut in two.
  EXPECT_EQ(ShortenLongWords("unknown '/a/b/cdefg.json'  x ", 8), "unknown '/a/... (17 bytes) ...son'  x ");
  EXPECT_EQ(ShortenLongWords("\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9", 6), "\xc3\xa9... (8 bytes) ...\xc3\xa9");
  EXPECT_EQ(ShortenLongWords("short words stay", 5), "short words stay");
  // A key with an escaped NUL is quoted whole.
  EXPECT_EQ(Why(R"({"k\u0000": 1, "k\u0000": 2})"),
            "the file is not valid JSON: key \"k\\x00\" appears twice in one object");
}

}  // namespace
}  // namespace distca
