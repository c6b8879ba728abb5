// The simulator's cost model against hand-computed values (test profile in
// sim_test_util.h: rank = 2 devices, linear rate 2 * 1e12 * 0.5 = 1e12 FLOP/s,
// attention peak 2e12 FLOP/s).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <utility>

#include "common/file_util.h"
#include "sim/costs.h"
#include "sim_test_util.h"

namespace distca {
namespace {

using sim::RankCosts;
using sim_test::TestModel;
using sim_test::TestProfile;

// Relative tolerance for values computed in double through a few products:
// far above rounding (~1e-16), far below any modeling difference.
constexpr double kRel = 1e-12;

using sim_test::Contains;

TEST(HardwareProfileTest, EfficiencyIsPiecewiseLinearInLog2AndClamped) {
  const HardwareProfile p = TestProfile();
  EXPECT_EQ(p.name, "test");
  EXPECT_DOUBLE_EQ(p.AttentionEfficiency(16), 0.5);  // clamped below
  EXPECT_DOUBLE_EQ(p.AttentionEfficiency(128), 0.5);
  EXPECT_NEAR(p.AttentionEfficiency(256), 0.5 + 0.5 / 3, kRel);      // log2 8 is 1/3 of the way 7 -> 10
  EXPECT_NEAR(p.AttentionEfficiency(512), 0.5 + 0.5 * 2 / 3, kRel);  // 2/3 of the way
  EXPECT_DOUBLE_EQ(p.AttentionEfficiency(1024), 1.0);
  EXPECT_DOUBLE_EQ(p.AttentionEfficiency(1 << 20), 1.0);  // clamped above
}

TEST(HardwareProfileTest, ShippedProfilesLoad) {
  // cpu and cpu-zen4: the two development machines, each measured by
  // `distca-bench profile`.
  for (const char* name : {"h200-dgx", "cpu", "cpu-zen4"}) {
    HardwareProfile p;
    const Status s = LoadHardwareProfile(std::string(DISTCA_SOURCE_DIR) + "/configs/hardware/" + name + ".json", &p);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(p.name, name);
    EXPECT_FALSE(p.source.empty());
    if (std::string(name).rfind("cpu", 0) == 0) {
      // The CA engine's measured table, for distca-train's `small` shape.
      ASSERT_EQ(p.attention_tables.size(), 1u);
      EXPECT_FALSE(p.attention_tables[0].csv.empty());
      ModelConfig small;
      ASSERT_TRUE(ModelPreset("small", &small).ok());
      EXPECT_TRUE(RankCosts(small, p, 1).measured_attention());
      EXPECT_FALSE(RankCosts(TestModel(), p, 1).measured_attention());  // another head shape: the curve
    } else {
      // FlashAttention-2 measured on an H200 for one TP-8 rank of each paper model.
      ASSERT_EQ(p.attention_tables.size(), 2u);
      for (const char* preset : {"llama3-8b", "llama-34b"}) {
        ModelConfig m;
        ASSERT_TRUE(ModelPreset(preset, &m).ok());
        // The table is one TP-8 rank's: a TP-4 rank runs twice the heads.
        const RankCosts tp8(m, p, 8), tp4(m, p, 4);
        ASSERT_TRUE(tp8.measured_attention()) << preset;
        ASSERT_TRUE(tp4.measured_attention()) << preset;
        EXPECT_NEAR(tp4.AttentionForward(0, 65536), 2 * tp8.AttentionForward(0, 65536), 1e-9) << preset;
        // Forward and backward were timed apart (the backward pass 2.3-2.9x
        // the forward on long tasks).
        ASSERT_TRUE(tp8.measured_attention_split()) << preset;
        const double ratio = tp8.AttentionBackward(0, 65536) / tp8.AttentionForward(0, 65536);
        EXPECT_GT(ratio, 2.3) << preset;
        EXPECT_LT(ratio, 2.9) << preset;
      }
    }
  }
}

// A 2 x 2 table for the test model's heads (4 x 2 of 16), fwd + bwd seconds.
constexpr const char* kTableCsv = "q_len,kv_len,seconds\n128,128,1e-3\n128,1024,4e-3\n1024,1024,2e-2\n";

TEST(HardwareProfileTest, AttentionTableReplacesTheCurveForItsShape) {
  HardwareProfile p = TestProfile();
  // Measured on a device running 4 x 2 heads; a tp-2 rank of the test model
  // runs 2 x 1 (the same 2 query heads per K/V head): half the seconds.
  p.attention_tables = {AttentionTable{"t.csv", 4, 2, 16, 1.5, kTableCsv}};
  const RankCosts k(TestModel(), p, 2);
  ASSERT_TRUE(k.measured_attention());
  // A whole 1024 document: the (1024, 1024) point, scaled, forward share
  // 1 / (1 + 2.5), times 2 / 4 query heads.
  EXPECT_NEAR(k.AttentionForward(0, 1024), 1.5 * 2e-2 / 3.5 / 2, kRel);
  // 128 rows with a 1024 prefix: the (128, 1024) point.
  EXPECT_NEAR(k.AttentionForward(896, 1024), 1.5 * 4e-3 / 3.5 / 2, kRel);
  // CP 2 on a 1024 document: shards [0,256) [256,512) [512,768) [768,1024),
  // two per rank: the shards' total over 2.
  double total = 0;
  for (int i = 0; i < 4; ++i) total += k.AttentionForward(256 * i, 256 * (i + 1));
  EXPECT_NEAR(k.AttentionForwardCp(1024, 2), total / 2, kRel);
  // By hand, with a table whose points are the shards themselves (256 rows
  // against prefixes of 256, 512, 768 and 1024: 1, 2, 3 and 4 ms), measured
  // for the rank's own 2 x 1 heads at scale 1: (1 + 2 + 3 + 4) ms forward +
  // backward, a 1 / 3.5 forward share, over 2 ranks.
  HardwareProfile shards = TestProfile();
  shards.attention_tables = {AttentionTable{
      "s.csv", 2, 1, 16, 1.0, "q_len,kv_len,seconds\n256,256,1e-3\n256,512,2e-3\n256,768,3e-3\n256,1024,4e-3\n"}};
  const RankCosts ks(TestModel(), shards, 2);
  ASSERT_TRUE(ks.measured_attention());
  EXPECT_NEAR(ks.AttentionForwardCp(1024, 2), 10e-3 / 3.5 / 2, kRel);
  // Another head dimension keeps the efficiency curve.
  ModelConfig other = TestModel();
  other.hidden = 128;  // 4 heads of 32
  EXPECT_FALSE(RankCosts(other, p, 2).measured_attention());
  // Another group size (8 x 2 heads, a tp-2 rank runs 4 x 1) uses the table
  // of the same head dimension, scaled by query heads: 4 / 4.
  other = TestModel();
  other.q_heads = 8;
  other.hidden = 128;
  ASSERT_EQ(other.head_dim(), 16);
  EXPECT_NEAR(RankCosts(other, p, 2).AttentionForward(0, 1024), 1.5 * 2e-2 / 3.5, kRel);

  // Of several tables, whatever their order: the rank's exact shape, else
  // the nearest group size, else the nearest number of query heads.
  const AttentionTable own{"own.csv", 2, 1, 16, 1.0, "q_len,kv_len,seconds\n1024,1024,7e-3\n"};
  const AttentionTable group8{"g8.csv", 8, 1, 16, 1.0, "q_len,kv_len,seconds\n1024,1024,5e-3\n"};
  const AttentionTable big{"big.csv", 8, 4, 16, 1.0, "q_len,kv_len,seconds\n1024,1024,3e-3\n"};
  const AttentionTable wide{"wide.csv", 2, 1, 32, 1.0, "q_len,kv_len,seconds\n1024,1024,1e-3\n"};
  auto forward = [&](std::vector<AttentionTable> tables, int tp, bool reversed) {
    if (reversed) std::reverse(tables.begin(), tables.end());
    p.attention_tables = tables;
    return RankCosts(TestModel(), p, tp).AttentionForward(0, 1024);
  };
  for (bool reversed : {false, true}) {
    // tp 2: the rank runs 2 x 1 heads.
    EXPECT_NEAR(forward({group8, own, big, wide}, 2, reversed), 7e-3 / 3.5, kRel) << reversed;
    // No exact shape: 8 x 4 has the rank's group size (2), 8 x 1 does not.
    EXPECT_NEAR(forward({group8, big, wide}, 2, reversed), 3e-3 * 2 / 8 / 3.5, kRel) << reversed;
    // Two of the same group size: the nearer in query heads (4 x 2 over 8 x 4).
    EXPECT_NEAR(forward({big, AttentionTable{"t.csv", 4, 2, 16, 1.5, kTableCsv}}, 2, reversed),
                1.5 * 2e-2 * 2 / 4 / 3.5, kRel)
        << reversed;
    // Fewer K/V heads than tp: K/V replicated, a tp-4 rank runs 1 x 1 heads;
    // of 8 x 1 and 8 x 4, 8 x 4 is nearer in group size (2 against 8).
    EXPECT_NEAR(forward({group8, big}, 4, reversed), 3e-3 / 8 / 3.5, kRel) << reversed;
  }
}

TEST(HardwareProfileTest, ForwardTableSplitsEachTaskAsMeasured) {
  // sim_test::SplitTableProfile: measured for a tp-2 rank's own 2 x 1 heads.
  HardwareProfile p = sim_test::SplitTableProfile();
  p.attention_backward_factor = 7;  // not used where the table splits
  p.attention_tables[0].scale = 1.5;
  const RankCosts k(TestModel(), p, 2);
  ASSERT_TRUE(k.measured_attention());
  ASSERT_TRUE(k.measured_attention_split());
  // The whole 1024 document: 5 ms forward, 20 - 5 backward, scaled.
  EXPECT_NEAR(k.AttentionForward(0, 1024), 1.5 * 5e-3, kRel);
  EXPECT_NEAR(k.AttentionBackward(0, 1024), 1.5 * 15e-3, kRel);
  // 256 rows after a 768 prefix: the (256, 1024) point; after 256: a third
  // of the way from (256, 256).
  EXPECT_NEAR(k.AttentionForward(768, 1024), 1.5 * 1.1e-3, kRel);
  EXPECT_NEAR(k.AttentionBackward(768, 1024), 1.5 * 2.9e-3, kRel);
  EXPECT_NEAR(k.AttentionBackward(256, 512), 1.5 * 1.5e-3, kRel);
  EXPECT_EQ(k.AttentionBackward(9, 9), 0.0);
  // CP 2: the four 256-row shards' total over 2 ranks, each pass its own:
  // forward (0.2 + 0.5 + 0.8 + 1.1) / 2 ms, backward (0.8 + 1.5 + 2.2 + 2.9) / 2.
  EXPECT_NEAR(k.AttentionForwardCp(1024, 2), 1.5 * 1.3e-3, kRel);
  EXPECT_NEAR(k.AttentionBackwardCp(1024, 2), 1.5 * 3.7e-3, kRel);
  EXPECT_NEAR(k.AttentionBackwardCp(1024, 1), 1.5 * 15e-3, kRel);
  // Without the forward table the same total splits by the factor:
  // forward 1 / 8 of it, backward 7 / 8.
  HardwareProfile whole = p;
  whole.attention_tables[0].forward_file.clear();
  whole.attention_tables[0].forward_csv.clear();
  const RankCosts kw(TestModel(), whole, 2);
  ASSERT_FALSE(kw.measured_attention_split());
  EXPECT_NEAR(kw.AttentionForward(0, 1024), 1.5 * 20e-3 / 8, kRel);
  EXPECT_NEAR(kw.AttentionBackward(0, 1024), 1.5 * 20e-3 * 7 / 8, kRel);
  EXPECT_NEAR(kw.AttentionBackwardCp(1024, 2), 7 * kw.AttentionForwardCp(1024, 2), kRel);
  // Either way forward + backward is the table's total.
  for (const RankCosts* c : {&k, &kw})
    EXPECT_NEAR(c->AttentionForwardCp(1024, 2) + c->AttentionBackwardCp(1024, 2), 1.5 * 10e-3 / 2, kRel);
  // Past the grid both tables scale by the causal-pair ratio: a 2048
  // document is the (1024, 1024) point times 2048 * 2049 / (1024 * 1025).
  const double pairs = 2048.0 * 2049 / (1024.0 * 1025);
  EXPECT_NEAR(k.AttentionForward(0, 2048), 1.5 * 5e-3 * pairs, kRel);
  EXPECT_NEAR(k.AttentionBackward(0, 2048), 1.5 * 15e-3 * pairs, kRel);
  // The efficiency curve (another head dimension) splits by the factor.
  ModelConfig other = TestModel();
  other.hidden = 128;
  const RankCosts kc(other, p, 2);
  ASSERT_FALSE(kc.measured_attention());
  EXPECT_NEAR(kc.AttentionBackward(256, 1024), 7 * kc.AttentionForward(256, 1024), kRel);
  EXPECT_NEAR(kc.AttentionBackwardCp(1024, 2), 7 * kc.AttentionForwardCp(1024, 2), kRel);
}

TEST(HardwareProfileTest, AttentionTableErrors) {
  std::string good = sim_test::kTestProfileJson;
  auto with_table = [&](const std::string& table) {
    std::string s = good;
    s.replace(s.find("\"dtype_bytes\""), 0, "\"attention_tables\": [" + table + "], ");
    return s;
  };
  HardwareProfile p;
  ASSERT_TRUE(ParseHardwareProfile(
                  with_table(R"({"file": "t.csv", "q_heads": 4, "kv_heads": 2, "head_dim": 16, "scale": 2})"), &p)
                  .ok());
  ASSERT_EQ(p.attention_tables.size(), 1u);
  EXPECT_EQ(p.attention_tables[0].file, "t.csv");
  EXPECT_DOUBLE_EQ(p.attention_tables[0].scale, 2.0);
  EXPECT_TRUE(p.attention_tables[0].csv.empty());  // only LoadHardwareProfile reads the file
  EXPECT_TRUE(Contains(ParseHardwareProfile(with_table(R"({"q_heads": 4})"), &p),
                       "attention_tables[0] must be an object with a \"file\""));
  EXPECT_TRUE(Contains(
      ParseHardwareProfile(with_table(R"({"file": "t.csv", "q_heads": 4, "kv_heads": 3, "head_dim": 16})"), &p),
      "q_heads (4) must be a multiple of kv_heads (3)"));
  const std::string one = R"({"file": "t.csv", "q_heads": 4, "kv_heads": 2, "head_dim": 16})";
  EXPECT_TRUE(Contains(ParseHardwareProfile(with_table(one + ", " + one), &p),
                       "attention_tables[1]: 4 x 2 heads of head_dim 16 are already measured by attention_tables[0]"));
  {
    std::string s = good;
    s.replace(s.find("\"dtype_bytes\""), 0, "\"attention_tables\": {\"file\": \"t.csv\"}, ");
    EXPECT_TRUE(Contains(ParseHardwareProfile(s, &p), "\"attention_tables\" must be an array"));
  }
  EXPECT_TRUE(
      Contains(ParseHardwareProfile(with_table(R"({"file": "t.csv", "q_heads": 4, "kv_heads": 2, "head_dim": 0})"), &p),
               "\"head_dim\" must be a positive integer"));
  EXPECT_TRUE(
      Contains(ParseHardwareProfile(
                   with_table(R"({"file": "t.csv", "q_heads": 4, "kv_heads": 2, "head_dim": 16, "scale": -1})"), &p),
               "\"scale\" must be positive"));

  // Loading reads the table next to the profile and checks it.
  const std::string dir = ::testing::TempDir() + "/distca_table_profile";
  std::filesystem::remove_all(dir);  // a previous run's table must not count
  std::filesystem::create_directories(dir);
  const std::string json = with_table(R"({"file": "t.csv", "q_heads": 4, "kv_heads": 2, "head_dim": 16})");
  ASSERT_TRUE(WriteTextFile(dir + "/p.json", json).ok());
  EXPECT_EQ(LoadHardwareProfile(dir + "/p.json", &p).code(), StatusCode::kIoError);  // no t.csv yet
  ASSERT_TRUE(WriteTextFile(dir + "/t.csv", "q_len,kv_len,seconds\n128,64,1\n").ok());
  EXPECT_TRUE(Contains(LoadHardwareProfile(dir + "/p.json", &p), "q_len <= kv_len"));
  ASSERT_TRUE(WriteTextFile(dir + "/t.csv", kTableCsv).ok());
  ASSERT_TRUE(LoadHardwareProfile(dir + "/p.json", &p).ok());
  EXPECT_EQ(p.attention_tables[0].csv, kTableCsv);
  // A table named but never read is refused by the simulator.
  SimOptions o = sim_test::TestOptions();
  ASSERT_TRUE(ParseHardwareProfile(json, &o.hardware).ok());
  EXPECT_TRUE(Contains(ValidateSimOptions(o), "hardware profile: the attention table 't.csv' was not read"));

  // A forward-only table: a file name, read next to the profile, on the
  // table's grid and below it at every point.
  for (const char* bad : {R"("forward_file": 3)", R"("forward_file": "")"})
    EXPECT_TRUE(Contains(ParseHardwareProfile(with_table(std::string(R"({"file": "t.csv", )") + bad +
                                                         R"(, "q_heads": 4, "kv_heads": 2, "head_dim": 16})"),
                                              &p),
                         "attention_tables[0]: \"forward_file\" must be a non-empty file name"))
        << bad;
  const std::string split =
      with_table(R"({"file": "t.csv", "forward_file": "f.csv", "q_heads": 4, "kv_heads": 2, "head_dim": 16})");
  ASSERT_TRUE(ParseHardwareProfile(split, &p).ok());
  EXPECT_EQ(p.attention_tables[0].forward_file, "f.csv");
  HardwareProfile back;  // the JSON writer keeps it
  ASSERT_TRUE(ParseHardwareProfile(HardwareProfileJson(p), &back).ok());
  EXPECT_EQ(back.attention_tables[0].forward_file, "f.csv");
  ASSERT_TRUE(WriteTextFile(dir + "/p.json", split).ok());
  EXPECT_EQ(LoadHardwareProfile(dir + "/p.json", &p).code(), StatusCode::kIoError);  // no f.csv yet
  ASSERT_TRUE(WriteTextFile(dir + "/f.csv", "").ok());
  EXPECT_TRUE(Contains(LoadHardwareProfile(dir + "/p.json", &p), "f.csv' is empty or not a file"));
  // kTableCsv's points are 1, 4 and 20 ms.
  const std::pair<const char*, const char*> refused[] = {
      {"q_len,kv_len,seconds\n128,128,1e-4\n128,1024,1e-3\n", "not on the same grid (1 q_len values against 2)"},
      {"q_len,kv_len,seconds\n128,128,1e-4\n128,1000,1e-3\n1000,1000,5e-3\n",
       "not on the same grid (q_len value 1: 1000 against 1024)"},
      {"q_len,kv_len,seconds\n128,128,1e-4\n128,1024,4e-3\n1024,1024,5e-3\n",
       "at q_len 128, kv_len 1024 the forward seconds (0.004) are not below the forward + backward seconds (0.004)"},
      {"q_len,kv_len\n", "forward table 'f.csv' of 't.csv'"},
  };
  for (const auto& [csv, message] : refused) {
    ASSERT_TRUE(WriteTextFile(dir + "/f.csv", csv).ok());
    const Status s = LoadHardwareProfile(dir + "/p.json", &p);
    EXPECT_TRUE(Contains(s, message)) << s.ToString();
  }
  const std::string forward = "q_len,kv_len,seconds\n128,128,1e-4\n128,1024,1e-3\n1024,1024,5e-3\n";
  ASSERT_TRUE(WriteTextFile(dir + "/f.csv", forward).ok());
  ASSERT_TRUE(LoadHardwareProfile(dir + "/p.json", &p).ok());
  EXPECT_EQ(p.attention_tables[0].forward_csv, forward);
  EXPECT_TRUE(RankCosts(TestModel(), p, 2).measured_attention_split());
  // Named but never read, or made by hand below nothing: refused.
  ASSERT_TRUE(ParseHardwareProfile(split, &o.hardware).ok());
  o.hardware.attention_tables[0].csv = kTableCsv;
  EXPECT_TRUE(Contains(ValidateSimOptions(o), "forward table 'f.csv' of 't.csv' was not read"));
  o.hardware.attention_tables[0].forward_csv = kTableCsv;
  EXPECT_TRUE(Contains(ValidateSimOptions(o), "are not below"));
  // A forward table's text with no file to name it would be lost on saving.
  o.hardware.attention_tables[0].forward_file.clear();
  EXPECT_TRUE(Contains(ValidateSimOptions(o), "has a forward table's text but no forward_file"));
}

TEST(HardwareProfileTest, ErrorsNameTheField) {
  HardwareProfile p;
  EXPECT_TRUE(Contains(ParseHardwareProfile("{", &p), "not valid JSON"));
  EXPECT_TRUE(Contains(ParseHardwareProfile("[1]", &p), "must be a JSON object"));
  std::string good = sim_test::kTestProfileJson;
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  EXPECT_TRUE(Contains(ParseHardwareProfile(replace("\"peak_flops\": 1e12", "\"peak_flops\": -1"), &p),
                       "\"peak_flops\" must be positive"));
  // A misspelt key is named, at every level, rather than ignored.
  EXPECT_TRUE(Contains(ParseHardwareProfile(replace("\"peak_flops\": 1e12", "\"peak\": 1e12"), &p),
                       "hardware profile: unknown key \"peak\""));
  // A long one is quoted in part.
  const std::string long_key(100000, 'k');
  const Status long_key_error = ParseHardwareProfile(replace("\"peak_flops\": 1e12", "\"" + long_key + "\": 1e12"), &p);
  EXPECT_TRUE(Contains(long_key_error, "unknown key \"" + long_key.substr(0, 80) + "... (100000 bytes)\""));
  EXPECT_LT(long_key_error.message().size(), 200u);
  EXPECT_TRUE(Contains(ParseHardwareProfile(replace("\"name\": \"test\"", "\"name\": \"\""), &p),
                       "\"name\" must not be empty"));
  EXPECT_TRUE(Contains(ParseHardwareProfile(replace("\"gpus_per_node\": 2", "\"gpus_per_node\": 1000000000"), &p),
                       "\"gpus_per_node\" must be a positive integer, at most 1048576, got 1000000000"));
  EXPECT_TRUE(Contains(ParseHardwareProfile(replace("\"intra_node\"", "\"intra\": {}, \"intra_node\""), &p),
                       "hardware profile: network: unknown key \"intra\""));
  EXPECT_TRUE(Contains(ParseHardwareProfile(replace("\"latency_s\": 1e-5", "\"latency_s\": 1e-5, \"lat\": 1"), &p),
                       "network.inter_node: unknown key \"lat\""));
  EXPECT_TRUE(
      Contains(ParseHardwareProfile(
                   replace("\"dtype_bytes\"",
                           R"("attention_tables": [{"file": "t.csv", "forward": "f.csv", "q_heads": 4, "kv_heads": 2, )"
                           R"("head_dim": 16}], "dtype_bytes")"),
                   &p),
               "attention_tables[0]: unknown key \"forward\""));
  EXPECT_TRUE(Contains(ParseHardwareProfile(replace("\"peak_flops\": 1e12, ", ""), &p), "missing \"peak_flops\""));
  EXPECT_TRUE(Contains(ParseHardwareProfile(replace("\"linear_mfu\": 0.5", "\"linear_mfu\": 1.5"), &p),
                       "\"linear_mfu\" must be in [1e-06, 1], got 1.5"));
  // Absurd magnitudes would make every simulated time infinite or zero.
  EXPECT_TRUE(Contains(ParseHardwareProfile(replace("\"peak_flops\": 1e12", "\"peak_flops\": 1e-300"), &p),
                       "\"peak_flops\" must be in [1e+06, 1e+18]"));
  EXPECT_TRUE(Contains(ParseHardwareProfile(replace("\"dtype_bytes\": 2", "\"dtype_bytes\": 16"), &p),
                       "\"dtype_bytes\" must be at most 8, got 16"));
  EXPECT_TRUE(Contains(ParseHardwareProfile(replace("\"memory_bytes\": 1e12", "\"memory_bytes\": 1e300"), &p),
                       "\"memory_bytes\" must be in [1e+06, 1e+15]"));
  EXPECT_TRUE(Contains(ParseHardwareProfile(replace("\"bandwidth\": 10e9", "\"bandwidth\": 1e-9"), &p),
                       "network.inter_node: \"bandwidth\" must be in [1000, 1e+15]"));
  EXPECT_TRUE(Contains(ParseHardwareProfile(replace("\"latency_s\": 1e-5", "\"latency_s\": 1e5"), &p),
                       "network.inter_node: \"latency_s\" must be in [1e-12, 10]"));
  EXPECT_TRUE(Contains(ParseHardwareProfile(replace("\"gpus_per_node\": 2", "\"gpus_per_node\": 2.5"), &p),
                       "\"gpus_per_node\" must be a positive integer"));
  EXPECT_TRUE(Contains(ParseHardwareProfile(replace("[[128, 0.5], [1024, 1.0]]", "[[128, 0.5], [64, 1.0]]"), &p),
                       "is not above the previous"));
  EXPECT_TRUE(Contains(ParseHardwareProfile(replace("[[128, 0.5], [1024, 1.0]]", "[[128, 1.5]]"), &p),
                       "fraction must be in [1e-06, 1]"));
  EXPECT_TRUE(Contains(ParseHardwareProfile(replace("[[128, 0.5], [1024, 1.0]]", "[[128, 1e-300]]"), &p),
                       "fraction must be in [1e-06, 1]"));
  EXPECT_TRUE(Contains(ParseHardwareProfile(replace("[[128, 0.5], [1024, 1.0]]", "[]"), &p), "non-empty array"));
  EXPECT_TRUE(Contains(ParseHardwareProfile(replace("\"latency_s\": 1e-5", "\"latency_s\": \"fast\""), &p),
                       "network.inter_node: \"latency_s\" must be a number"));
  EXPECT_TRUE(Contains(ParseHardwareProfile(replace("\"name\": \"test\"", "\"name\": 3"), &p), "\"name\""));
  // attention_backward_factor is optional (default 2.5, the FLOP ratio) and at least 1.
  ASSERT_TRUE(ParseHardwareProfile(good, &p).ok());
  EXPECT_DOUBLE_EQ(p.attention_backward_factor, 2.5);
  ASSERT_TRUE(
      ParseHardwareProfile(replace("\"dtype_bytes\": 2", "\"attention_backward_factor\": 3, \"dtype_bytes\": 2"), &p)
          .ok());
  EXPECT_DOUBLE_EQ(p.attention_backward_factor, 3.0);
  EXPECT_DOUBLE_EQ(RankCosts(TestModel(), p, 2).AttentionBackwardFactor(), 3.0);
  EXPECT_TRUE(Contains(
      ParseHardwareProfile(replace("\"dtype_bytes\": 2", "\"attention_backward_factor\": 0.5, \"dtype_bytes\": 2"), &p),
      "\"attention_backward_factor\" must be in [1, 100]"));
  EXPECT_EQ(LoadHardwareProfile("/nonexistent/profile.json", &p).code(), StatusCode::kIoError);
  // network.all_to_all is optional; when given, CAD's all-to-all across nodes uses it.
  const std::string a2a =
      replace("\"inter_node\": {", "\"all_to_all\": {\"bandwidth\": 5e9, \"latency_s\": 2e-5}, \"inter_node\": {");
  ASSERT_TRUE(ParseHardwareProfile(a2a, &p).ok());
  ASSERT_TRUE(p.all_to_all.has_value());
  const RankCosts k(TestModel(), p, 2);
  EXPECT_NEAR(k.AllToAll(2e6, 1e6, true), 2e-5 + 2e6 / 1e10, kRel);
  EXPECT_NEAR(k.AllToAll(2e6, 1e6, false), 1e-6 + 2e6 / 2e11, kRel);  // intra-node: the NVLink-like link
  EXPECT_NEAR(k.Ring(2, 1e6, true), 1e-5 + 1e6 / 2 / 2e10, kRel);     // rings keep the inter-node link
  EXPECT_TRUE(Contains(ParseHardwareProfile(replace("\"inter_node\": {", "\"all_to_all\": 3, \"inter_node\": {"), &p),
                       "network.all_to_all must be an object"));
}

TEST(HardwareProfileTest, OverridesChangeFieldsBeforeTheChecks) {
  const std::string dir = ::testing::TempDir() + "/distca_profile_overrides";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/p.json";
  ASSERT_TRUE(WriteTextFile(path, sim_test::kTestProfileJson).ok());
  HardwareProfile p;
  // Nested objects, array elements by index, and a key the file leaves out.
  ASSERT_TRUE(LoadHardwareProfile(path, &p,
                                  {"network.inter_node.bandwidth=2.5e9", "attention_efficiency.1.0=2048",
                                   "attention_backward_factor=4", "network.inter_node.bandwidth=5e9"})
                  .ok());
  EXPECT_DOUBLE_EQ(p.inter_node.bandwidth, 5e9);  // in order: the last one holds
  EXPECT_DOUBLE_EQ(p.inter_node.latency_s, 1e-5);
  EXPECT_DOUBLE_EQ(p.intra_node.bandwidth, 100e9);
  ASSERT_EQ(p.attention_efficiency.size(), 2u);
  EXPECT_DOUBLE_EQ(p.attention_efficiency[1].first, 2048);
  EXPECT_DOUBLE_EQ(p.attention_efficiency[1].second, 1.0);
  EXPECT_DOUBLE_EQ(p.attention_backward_factor, 4);
  EXPECT_EQ(p.name,
            "test (network.inter_node.bandwidth=2.5e9, attention_efficiency.1.0=2048, attention_backward_factor=4, "
            "network.inter_node.bandwidth=5e9)");
  // JSON allows white space, a newline included, in a value: the name that
  // labels CSV rows and chart titles stays on one line.
  ASSERT_TRUE(LoadHardwareProfile(path, &p, {"linear_mfu=\n0.4"}).ok());
  EXPECT_DOUBLE_EQ(p.linear_mfu, 0.4);
  EXPECT_EQ(p.name, "test (linear_mfu= 0.4)");
  ASSERT_TRUE(LoadHardwareProfile(path, &p).ok());  // none: the file as it is
  EXPECT_EQ(p.name, "test");
  EXPECT_DOUBLE_EQ(p.inter_node.bandwidth, 10e9);

  const std::pair<const char*, const char*> refused[] = {
      {"linear_mfu", "'linear_mfu': expected FIELD=VALUE"},
      {"=0.5", "'=0.5': expected FIELD=VALUE"},
      {"linear_mfu=fast", "'linear_mfu=fast': the value is not valid JSON"},
      {"linear_mfu=", "'linear_mfu=': the value is not valid JSON"},
      {"network.nic.bandwidth=1e9", "the profile has no \"network.nic\""},
      {"network..bandwidth=1e9", "an empty field name"},
      {"attention_efficiency.2.0=64", "\"attention_efficiency.2\" must be an index below 2"},
      {"attention_efficiency.first.0=64", "\"attention_efficiency.first\" must be an index below 2"},
      {"attention_efficiency.01.0=64", "\"attention_efficiency.01\" must be an index below 2"},
      {"linear_mfu.value=0.5", "\"linear_mfu\" is 0.5, which has no fields"},
      // The profile's own checks run on the result.
      {"linear_mfu=1.5", "with linear_mfu=1.5: hardware profile: \"linear_mfu\" must be in [1e-06, 1]"},
      {"network.inter_node.bw=1e9", "network.inter_node: unknown key \"bw\""},
      {"attention_efficiency.1.0=64", "q_len 64 is not above the previous 128"},
  };
  for (const auto& [spec, message] : refused) {
    const Status s = LoadHardwareProfile(path, &p, {spec});
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << spec;
    EXPECT_TRUE(Contains(s, message)) << spec << ": " << s.ToString();
    EXPECT_TRUE(Contains(s, path)) << s.ToString();
  }
  // A long value is named by its kind and size, not printed.
  const Status s = LoadHardwareProfile(path, &p, {"source=\"" + std::string(100, 'a') + "\"", "source.text=1"});
  EXPECT_TRUE(Contains(s, "\"source\" is a string of 102 bytes, which has no fields")) << s.ToString();
}

TEST(RankCostsTest, LinearAndHead) {
  const RankCosts k(TestModel(), TestProfile(), /*tp=*/2);
  EXPECT_DOUBLE_EQ(k.LinearFlopsPerToken(), 73728.0);
  EXPECT_NEAR(k.LinearForward(1000), 73728.0 * 1000 / 1e12, 73728e3 / 1e12 * kRel);
  EXPECT_NEAR(k.HeadForward(1000), 2.0 * 64 * 256 * 1000 / 1e12, kRel);
  EXPECT_DOUBLE_EQ(k.KvBytesPerToken(), 2.0 * 2 * 16 * 2);  // K and V, 2 heads of 16, bf16
  EXPECT_DOUBLE_EQ(k.HiddenBytesPerToken(), 64.0 * 2);
  // 12 h + 4 h_kv + 6 ffn = 768 + 128 + 768 bytes at 2-byte elements.
  EXPECT_DOUBLE_EQ(k.ActivationBytesPerToken(), 1664.0);
}

// Fewer K/V heads than tp: each device holds a replica of one, so the rank
// projects, keeps and moves tp heads' K/V (here 4 of 16 at tp 4, for the
// model's 2).
TEST(RankCostsTest, ReplicatedKvHeadsAtTpAboveKvHeads) {
  const RankCosts k(TestModel(), TestProfile(), /*tp=*/4);
  EXPECT_EQ(sim::RankKvHeads(TestModel(), 4), 4);
  EXPECT_EQ(sim::RankKvHeads(TestModel(), 2), 2);
  EXPECT_DOUBLE_EQ(k.KvBytesPerToken(), 2.0 * 4 * 16 * 2);
  EXPECT_DOUBLE_EQ(k.LinearFlopsPerToken(), 2.0 * 64 * (128 + 2 * 64) + 6.0 * 64 * 128);
  EXPECT_DOUBLE_EQ(k.ActivationBytesPerToken(), (12.0 * 64 + 4 * 64 + 6 * 128) * 2 / 2);
}

// With tp_collectives, a layer's forward also pays sequence parallelism's
// two all-gathers and two reduce-scatters of the rank's T x h activations
// over its tp devices: 4 x ((tp - 1) latency + (tp - 1) / tp x T h dt / bw).
TEST(RankCostsTest, TensorParallelCollectives) {
  HardwareProfile p = TestProfile();  // intra 100 GB/s + 1 us, inter 10 GB/s + 10 us, 2 GPUs per node
  const double flops = 73728.0 * 1000;
  EXPECT_FALSE(p.tp_collectives);  // by default linear_mfu includes them
  p.tp_collectives = true;
  // tp 2, inside a node: 4 x (1e-6 + 1/2 x 1000 x 64 x 2 / 1e11).
  EXPECT_NEAR(RankCosts(TestModel(), p, 2).LinearForward(1000), flops / 1e12 + 4 * (1e-6 + 0.5 * 128e3 / 1e11), 1e-18);
  // tp 4 spans two nodes: the inter-node link, 4 x (3 x 1e-5 + 3/4 x 128e3 / 1e10)
  // (and 4 replicated K/V heads' projections: 81920 FLOPs per token).
  EXPECT_NEAR(RankCosts(TestModel(), p, 4).LinearForward(1000),
              81920.0 * 1000 / 2e12 + 4 * (3e-5 + 0.75 * 128e3 / 1e10), 1e-18);
  // One device, or no tokens: nothing to gather.
  EXPECT_DOUBLE_EQ(RankCosts(TestModel(), p, 1).LinearForward(1000), flops / 5e11);
  EXPECT_EQ(RankCosts(TestModel(), p, 2).LinearForward(0), 0.0);
  // The JSON field is a boolean.
  std::string json = sim_test::kTestProfileJson;
  json.replace(json.find("\"dtype_bytes\""), 0, "\"tp_collectives\": true, ");
  HardwareProfile q;
  ASSERT_TRUE(ParseHardwareProfile(json, &q).ok());
  EXPECT_TRUE(q.tp_collectives);
  json.replace(json.find("true"), 4, "1");
  EXPECT_TRUE(Contains(ParseHardwareProfile(json, &q), "\"tp_collectives\" must be true or false"));
}

TEST(RankCostsTest, AttentionUsesPairsAndTheQueryLengthsEfficiency) {
  const RankCosts k(TestModel(), TestProfile(), 2);
  // Whole 1024 document: 1024 * 1025 / 2 pairs, 4 * 16 * 4 FLOPs each, efficiency 1.
  const double whole = 4.0 * (1024.0 * 1025 / 2) * 16 * 4 / 2e12;
  EXPECT_NEAR(k.AttentionForward(0, 1024), whole, whole * kRel);
  // Rows [512, 1024): 512 * 1024 - 512 * 511 / 2 = 393472 pairs at efficiency 5/6.
  const double tail = 4.0 * 393472 * 64 / (2e12 * (5.0 / 6));
  EXPECT_NEAR(k.AttentionForward(512, 1024), tail, tail * kRel);
  EXPECT_EQ(k.AttentionForward(7, 7), 0.0);
  // CP over 2: half the pairs per rank, on 256-row shards (efficiency 2/3).
  const double cp2 = 4.0 * (1024.0 * 1025 / 2) * 64 / 2 / (2e12 * (2.0 / 3));
  EXPECT_NEAR(k.AttentionForwardCp(1024, 2), cp2, cp2 * kRel);
  EXPECT_NEAR(k.AttentionForwardCp(1024, 1), whole, whole * kRel);
}

TEST(RankCostsTest, PhaseShares) {
  const RankCosts k(TestModel(), TestProfile(), 2);
  // (h + 2 h_kv) / (2h + 2 h_kv + 3 ffn) = (64 + 64) / (128 + 64 + 384).
  EXPECT_DOUBLE_EQ(k.PreAttentionShare(), 2.0 / 9);
  // Without recomputation the backward runs O projection + MLP (7/9 of the
  // FLOPs) before attention.
  EXPECT_DOUBLE_EQ(k.BackwardLinearFactor(), 2.0);
  EXPECT_DOUBLE_EQ(k.BeforeAttentionShare(false), 2.0 / 9);
  EXPECT_DOUBLE_EQ(k.BeforeAttentionShare(true), 7.0 / 9);
}

// A layer backward's transient peak (fc1's): with sequence parallelism the
// re-gathered input and the full-sequence input gradient (tp h each), the
// gradient of fc1's output (2 ffn); recomputed, also fc1's and SwiGLU's
// outputs (3 ffn). Without tensor parallelism nothing is gathered.
TEST(RankCostsTest, BackwardWorkingSet) {
  EXPECT_DOUBLE_EQ(RankCosts(TestModel(), TestProfile(), 2).BackwardWorkingBytesPerToken(),
                   (2 * (64 + 64) + 2 * 128) * 2.0);
  EXPECT_DOUBLE_EQ(RankCosts(TestModel(), TestProfile(), 2, /*recompute_mlp=*/true).BackwardWorkingBytesPerToken(),
                   (2 * (64 + 64) + 5 * 128) * 2.0);
  EXPECT_DOUBLE_EQ(RankCosts(TestModel(), TestProfile(), 1).BackwardWorkingBytesPerToken(), (64 + 2 * 128) * 2.0);
  // The logits come and go before a layer's backward: the larger of the two
  // counts, per device of tp 2.
  sim::MemoryInput in;
  in.logits_tokens = in.working_tokens = 100;
  EXPECT_DOUBLE_EQ(sim::DeviceMemoryBytes(RankCosts(TestModel(), TestProfile(), 2), in), 100 * 256 * 6.0 / 2);
  ModelConfig small_vocab = TestModel();
  small_vocab.vocab_size = 32;
  EXPECT_DOUBLE_EQ(sim::DeviceMemoryBytes(RankCosts(small_vocab, TestProfile(), 2), in), 100 * 1024.0 / 2);
}

TEST(RankCostsTest, MlpRecomputation) {
  const RankCosts k(TestModel(), TestProfile(), 2, /*recompute_mlp=*/true);
  // The MLP is 6 * 64 * 128 = 49152 of the 73728 forward FLOPs per token;
  // the backward reruns it: 2 + 2/3.
  EXPECT_DOUBLE_EQ(k.BackwardLinearFactor(), 2.0 + 2.0 / 3);
  // The MLP's 6 ffn and its input's 2h go (the input is the pre-MLP norm's,
  // fused into fc1 and recomputed with it): 10 x 64 + 4 x 64 elements.
  EXPECT_DOUBLE_EQ(k.ActivationBytesPerToken(), 896.0 - 128.0);
  // After attention only the QKV projection's backward, 2 x 2/9 of the
  // forward time, remains.
  EXPECT_NEAR(k.BeforeAttentionShare(true), 1.0 - (4.0 / 9) / (8.0 / 3), 1e-15);
  EXPECT_DOUBLE_EQ(k.LinearForward(1000), RankCosts(TestModel(), TestProfile(), 2).LinearForward(1000));
}

TEST(RankCostsTest, BackwardLinearWithCollectivesAndRecomputation) {
  // tp 2 on one node (100 GB/s, 1 us): the 4 collectives of 1000 tokens
  // move 4 x (1/2) x 64 x 2 = 256 B per token: 4 x 1 us + 256000 B / 100
  // GB/s = 6.56e-6 s; the FLOPs 73728 x 1000 / (2 x 1e12 x 0.5) = 7.3728e-5 s.
  HardwareProfile hw = TestProfile();
  hw.tp_collectives = true;
  hw.gpus_per_node = 2;
  const double flops = 7.3728e-5, comm = 4e-6 + 256000.0 / 100e9;
  const RankCosts plain(TestModel(), hw, 2);
  EXPECT_NEAR(plain.TpCollectives(1000), comm, comm * kRel);
  // Backward, no recomputation: 2 x both. After attention: the QKV
  // projection's backward (2 x 2/9 of the FLOPs) and its all-gather's (2 x
  // 1/4 of the collectives).
  EXPECT_NEAR(plain.LinearBackward(1000), 2 * (flops + comm), flops * kRel);
  RankCosts::LinearSplit s = plain.LinearPass(1000, /*backward=*/true);
  EXPECT_NEAR(s.after, 2 * (2.0 / 9 * flops + 0.25 * comm), flops * kRel);
  EXPECT_NEAR(s.before + s.after, plain.LinearBackward(1000), flops * kRel);
  s = plain.LinearPass(1000, /*backward=*/false);
  EXPECT_NEAR(s.before, 2.0 / 9 * flops + 0.25 * comm, flops * kRel);
  EXPECT_NEAR(s.before + s.after, plain.LinearForward(1000), flops * kRel);
  // The MLP recomputed: its FLOPs (2/3 of them) and its forward's all-gather
  // and reduce-scatter (half the collectives) once more, all before
  // attention's backward.
  const RankCosts re(TestModel(), hw, 2, /*recompute_mlp=*/true);
  EXPECT_DOUBLE_EQ(re.BackwardCollectivesFactor(), 2.5);
  EXPECT_NEAR(re.LinearBackward(1000), (2 + 2.0 / 3) * flops + 2.5 * comm, flops * kRel);
  s = re.LinearPass(1000, /*backward=*/true);
  EXPECT_NEAR(s.after, 2 * (2.0 / 9 * flops + 0.25 * comm), flops * kRel);
  EXPECT_NEAR(s.before, (2 + 2.0 / 3 - 4.0 / 9) * flops + 2 * comm, flops * kRel);
}

TEST(RankCostsTest, AllToAllRingAndPointToPoint) {
  const RankCosts k(TestModel(), TestProfile(), 2);
  // Inter-node: 10 us + max(2 MB, 1 MB) / (2 devices * 10 GB/s).
  EXPECT_NEAR(k.AllToAll(2e6, 1e6, true), 1e-5 + 2e6 / 2e10, kRel);
  EXPECT_NEAR(k.AllToAll(1e6, 2e6, false), 1e-6 + 2e6 / 2e11, kRel);
  // Ring over 4 ranks, 8 MB, intra: 3 latencies + 8 MB * 3/4 / 200 GB/s.
  EXPECT_NEAR(k.Ring(4, 8e6, false), 3e-6 + 8e6 * 0.75 / 2e11, kRel);
  EXPECT_EQ(k.Ring(1, 8e6, true), 0.0);
  EXPECT_NEAR(k.PointToPoint(4e6, true), 1e-5 + 4e6 / 2e10, kRel);
}

TEST(RankCostsTest, MemoryPerDevice) {
  const RankCosts k(TestModel(), TestProfile(), 2);
  sim::MemoryInput in;
  in.stage_params = 1000;
  in.optimizer_shards = 4;
  in.activation_tokens = 10;
  in.buffer_bytes = 100;
  // (1000 * (2 + 4) + 1000 * 12 / 4 + 10 * 1664 + 100) / 2 devices.
  EXPECT_DOUBLE_EQ(sim::DeviceMemoryBytes(k, in), (6000.0 + 3000 + 16640 + 100) / 2);
  // The last stage's logits: bf16 and their float32 copy, 256 x (2 + 4) B
  // per token, on top.
  EXPECT_DOUBLE_EQ(k.LogitsBytesPerToken(), 1536.0);
  in.logits_tokens = 3;
  EXPECT_DOUBLE_EQ(sim::DeviceMemoryBytes(k, in), (6000.0 + 3000 + 16640 + 3 * 1536 + 100) / 2);
  // fp32 training (the cpu profile, as distca-train): weights and gradients
  // 4 B each, replicated; Adam m and v 8 B, sharded; no master copy.
  // Activations and logits scale with the element size (3328 and
  // 256 x (4 + 4) = 2048 B per token).
  HardwareProfile fp32 = TestProfile();
  fp32.dtype_bytes = 4;
  const RankCosts k32(TestModel(), fp32, 2);
  EXPECT_DOUBLE_EQ(sim::DeviceMemoryBytes(k32, in), (8000.0 + 2000 + 10 * 3328 + 3 * 2048 + 100) / 2);
  // A run that never steps the optimizer has no moments: bf16 keeps its
  // sharded fp32 master copy (4 B), fp32 has nothing sharded.
  in.optimizer_moments = false;
  EXPECT_DOUBLE_EQ(sim::DeviceMemoryBytes(k, in), (6000.0 + 1000 + 16640 + 3 * 1536 + 100) / 2);
  EXPECT_DOUBLE_EQ(sim::DeviceMemoryBytes(k32, in), (8000.0 + 10 * 3328 + 3 * 2048 + 100) / 2);
}

}  // namespace
}  // namespace distca
