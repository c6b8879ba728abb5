// Every strategy on tiny configurations whose iteration time is worked out by
// hand here (test profile and model in sim_test_util.h: 2 layers, tp 2).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <optional>
#include <string>

#include "distca/plan.h"
#include "sim/costs.h"
#include "sim/strategy.h"
#include "sim_test_util.h"

namespace distca {
namespace {

using sim_test::TestOptions;

// Sums of a few dozen products: a relative 1e-12 is far above rounding and
// far below any modeling difference.
constexpr double kRel = 1e-12;

// The test model's layer backward working set, bytes per token on a rank of
// tp 2: tp (h + h) + 2 ffn = 2 x 128 + 256 elements of 2 bytes. It sets the
// peak on every stage but the last, whose logits (256 x 6 B) are larger.
constexpr double kWork = 1024;

using sim_test::Contains;

SimResult SimulateOne(const SimOptions& o, const std::vector<std::vector<int64_t>>& batches, SimStrategy strategy) {
  std::vector<SimResult> results;
  const Status s = Simulate(o, batches, {strategy}, &results);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return results.empty() ? SimResult{} : results[0];
}

struct Parts {
  double lin, ca, head;  // one layer, one rank: 1024 tokens; attention of one 1024 document
};
Parts PartsFor(const SimOptions& o) {
  const sim::RankCosts k(o.model, o.hardware, o.tp);
  return {k.LinearForward(1024), k.AttentionForward(0, 1024), k.HeadForward(1024)};
}

// Two ranks (tp 2), one 1024-token chunk each (m = 1), 2 layers:
//   forward  = 2 * (lin + ca) + head,  backward = 2 * (2 lin + 2.5 ca) + 2 head.
double OneChunkPerRank(const Parts& p) {
  return 2 * (p.lin + p.ca) + p.head + 2 * (2 * p.lin + 2.5 * p.ca) + 2 * p.head;
}

TEST(MegatronTest, DataParallelOnly) {
  SimOptions o = TestOptions();
  o.cp = 1;
  const SimResult r = SimulateOne(o, {{1024, 1024}}, SimStrategy::kMegatron);
  const double want = OneChunkPerRank(PartsFor(o));
  EXPECT_NEAR(r.iteration_s, want, want * kRel);
  EXPECT_NEAR(r.idle_fraction, 0.0, 1e-12);
  EXPECT_EQ(r.bytes_moved, 0.0);
  EXPECT_EQ(r.cp, 1);
  EXPECT_NEAR(r.tokens_per_s, 2048 / want, 2048 / want * kRel);
}

TEST(MegatronTest, ContextParallelPaysTheAllGather) {
  SimOptions o = TestOptions();
  o.cp = 2;
  const sim::RankCosts k(o.model, o.hardware, o.tp);
  // One replica (d = 2 / 2) runs both chunks, one after the other, each
  // spread over the 2 ranks: 512 tokens each; the document's pairs halve, on
  // 256-row shards; the group spans 4 devices > 2 per node: the K/V of the
  // chunk's 1024 tokens (128 B each) ring-gathered at 10 GB/s. Ring
  // attention's backward passes the K/V once more besides the dK/dV.
  const double lin = k.LinearForward(512), head = k.HeadForward(512);
  const double ca = k.AttentionForwardCp(1024, 2);
  const double ag = 1e-5 + 1024.0 * 128 / 2 / (2 * 10e9);
  const double micro_batch = 2 * (lin + ca + ag) + head + 2 * (2 * lin + 2.5 * ca + 2 * ag) + 2 * head;
  const double want = 2 * micro_batch;
  const SimResult r = SimulateOne(o, {{1024, 1024}}, SimStrategy::kMegatron);
  EXPECT_NEAR(r.iteration_s, want, want * kRel);
  // Per micro-batch: gather forward, K/V again + dK/dV backward, 2 layers,
  // half the chunk's K/V to each rank.
  EXPECT_DOUBLE_EQ(r.bytes_moved, 2 * (3.0 * 2 * 1024 * 128 * 1));
  // Summed over the iteration's two micro-batches.
  EXPECT_NEAR(r.breakdown.forward_comm_s, 2 * ag, ag * kRel);
  EXPECT_EQ(r.cp, 2);
  // Memory per device (tp 2): bf16 weights + fp32 grads, the optimizer over
  // the 2 ranks, one micro-batch's 512 tokens x 2 layers of 1664 bytes and
  // their logits (256 x (2 + 4) bytes each), and ring attention's two K/V
  // shards and their dK/dV (4 x 512 x 128 bytes; at CP 2 as much as the
  // chunk's gathered K/V and partials).
  const double params = double(ParameterCount(o.model));
  const double mem = (params * 6 + params * 12 / 2 + 512.0 * 2 * 1664 + 512.0 * 1536 + 4 * 512.0 * 128) / 2;
  EXPECT_NEAR(r.memory_max_bytes, mem, mem * kRel);
  EXPECT_TRUE(r.memory_fits);
}

TEST(MegatronTest, RingAttentionHoldsTwoShardsAndTheirGradients) {
  // 4 ranks (8 devices, tp 2), CP 4, one replica running four 1024-token
  // chunks: each rank holds 256 tokens. Ring attention holds the shard's
  // K/V in use and the next one arriving, and in the backward their dK/dV:
  // 4 x 256 tokens x 128 B, half of the chunk's gathered K/V plus partials
  // (2 x 1024 x 128 B) that an all-gather would hold.
  SimOptions o = TestOptions();
  o.gpus = 8;
  o.batch_size = 4;
  o.cp = 4;
  const SimResult r = SimulateOne(o, {{1024, 1024, 1024, 1024}}, SimStrategy::kMegatron);
  ASSERT_EQ(r.cp, 4);
  const double params = double(ParameterCount(o.model));
  const double mem = (params * 6 + params * 12 / 4 + 256.0 * 2 * 1664 + 256.0 * 1536 + 4 * 256.0 * 128) / 2;
  EXPECT_NEAR(r.memory_max_bytes, mem, mem * kRel);
}

TEST(MegatronTest, SweepPicksTheFasterCp) {
  SimOptions o = TestOptions();
  o.cp = 1;
  const double t1 = SimulateOne(o, {{1024, 1024}}, SimStrategy::kMegatron).iteration_s;
  o.cp = 2;
  const double t2 = SimulateOne(o, {{1024, 1024}}, SimStrategy::kMegatron).iteration_s;
  o.cp = 0;
  const SimResult r = SimulateOne(o, {{1024, 1024}}, SimStrategy::kMegatron);
  EXPECT_DOUBLE_EQ(r.iteration_s, std::min(t1, t2));
  EXPECT_EQ(r.cp, t1 <= t2 ? 1 : 2);
}

TEST(MegatronTest, SweepKeepsToDegreesThatFitInMemory) {
  SimOptions o = TestOptions();
  o.cp = 1;
  const SimResult one = SimulateOne(o, {{1024, 1024}}, SimStrategy::kMegatron);
  o.cp = 2;
  const SimResult two = SimulateOne(o, {{1024, 1024}}, SimStrategy::kMegatron);
  ASSERT_LT(one.iteration_s, two.iteration_s);  // no all-gather: CP 1 is faster
  ASSERT_GT(one.memory_max_bytes, two.memory_max_bytes);
  o.cp = 0;
  // Memory between the two: only CP 2 fits, and the sweep takes it.
  o.hardware.memory_bytes = (one.memory_max_bytes + two.memory_max_bytes) / 2;
  SimResult r = SimulateOne(o, {{1024, 1024}}, SimStrategy::kMegatron);
  EXPECT_EQ(r.cp, 2);
  EXPECT_TRUE(r.memory_fits);
  EXPECT_DOUBLE_EQ(r.iteration_s, two.iteration_s);
  // Nothing fits: the degree needing the least memory (here the largest),
  // flagged.
  o.hardware.memory_bytes = two.memory_max_bytes / 2;
  r = SimulateOne(o, {{1024, 1024}}, SimStrategy::kMegatron);
  EXPECT_EQ(r.cp, 2);
  EXPECT_FALSE(r.memory_fits);
}

TEST(WlbIdealTest, ContextParallelTimeAndBytesByHand) {
  // CP 2 over both ranks, one replica running the two 1024 chunks one after
  // the other. Per micro-batch and layer, per rank:
  //   linear 512 x 73728 / (2 x 1e12 x 0.5) = 3.7748736e-5 s;
  //   attention: half of 4 x 64 x 524800 pairs on 256-row shards (efficiency
  //     0.5 + 0.5 / 3), over 2 x 1e12: 5.03808e-5 s;
  //   all-gather of 1024 x 128 B over the 2 nodes: 1e-5 + 65536 / 2e10 =
  //     1.32768e-5 s (the reduce-scatter in the backward pass the same);
  //   LM head 512 x 2 x 64 x 256 / 1e12 = 1.6777216e-5 s.
  // A micro-batch: 2 layers forward (+ head), backward 2 x linear, 2.5 x
  // attention, 1 x the exchange (+ 2 x head).
  SimOptions o = TestOptions();
  o.cp = 2;
  const double lin = 3.7748736e-5, ca = 5.03808e-5, ag = 1.32768e-5, head = 1.6777216e-5;
  const double want = 2 * (2 * (lin + ca + ag) + head + 2 * (2 * lin + 2.5 * ca + ag) + 2 * head);
  const SimResult r = SimulateOne(o, {{1024, 1024}}, SimStrategy::kWlbIdeal);
  EXPECT_NEAR(r.iteration_s, want, want * kRel);
  EXPECT_NEAR(r.iteration_s, 1.365193728e-3, 1e-15);
  // K/V gathered forward and dK/dV scattered backward: 2 x 2 layers x 1024
  // rows x 128 B x (c - 1) per micro-batch.
  EXPECT_DOUBLE_EQ(r.bytes_moved, 2 * (2.0 * 2 * 1024 * 128));
  EXPECT_EQ(r.cp, 2);
  EXPECT_EQ(r.idle_fraction, 0.0);
}

TEST(WlbIdealTest, PacksWholeDocumentsAndWaitsForTheSlowestReplica) {
  SimOptions o = TestOptions();
  o.cp = 1;
  const sim::RankCosts k(o.model, o.hardware, o.tp);
  const Parts p = PartsFor(o);
  // {1024, 512, 512} into 2 bins: {1024} and {512, 512}; one per replica.
  const double slow = OneChunkPerRank(p);
  const double ca512 = 2 * k.AttentionForward(0, 512);
  const double fast = 2 * (p.lin + ca512) + p.head + 2 * (2 * p.lin + 2.5 * ca512) + 2 * p.head;
  const SimResult r = SimulateOne(o, {{1024, 512, 512}}, SimStrategy::kWlbIdeal);
  EXPECT_NEAR(r.iteration_s, slow, slow * kRel);
  EXPECT_NEAR(r.idle_fraction, (slow - fast) / slow / 2, 1e-12);
}

TEST(WlbIdealTest, KeepsEveryLayersGatheredKv) {
  SimOptions o = TestOptions();
  o.cp = 2;
  const SimResult wlb = SimulateOne(o, {{1024, 1024}}, SimStrategy::kWlbIdeal);
  const SimResult meg = SimulateOne(o, {{1024, 1024}}, SimStrategy::kMegatron);
  // Same micro-batches (one 1024 document each, 512 tokens per rank, K/V
  // 128 B a token). Per-document CP keeps the other rank's 512 tokens of
  // K/V for both layers (131072 B) and adds only the dK/dV partials of one
  // layer (1024 rows, 131072 B); megatron's ring keeps none but holds two
  // shards' K/V and their dK/dV (4 x 512 rows, 262144 B).
  const double params = double(ParameterCount(o.model));
  // Per rank: states (bf16, sharded over the 2 ranks), 2 layers x 1664 B of
  // activations and 1536 B of logits for 512 tokens; per device of tp 2.
  const double common = params * 6 + params * 12 / 2 + 512.0 * 2 * 1664 + 512.0 * 1536;
  EXPECT_NEAR(wlb.memory_max_bytes, (common + 131072 + 131072) / 2, common * kRel);
  // As the DistCA artifact keeps it: also the K/V prefixes of its two query
  // chunks, concatenated (rank 0 holds shards 0 and 3 of a 1024 document in
  // 4: prefixes of 256 and 1024 rows), for both layers: 2 x (512 + 1280) x
  // 128 = 458752 B, 3.5 ranks' shares (2c - 1/2).
  o.wlb_artifact_kv = true;
  const SimResult artifact = SimulateOne(o, {{1024, 1024}}, SimStrategy::kWlbIdeal);
  EXPECT_NEAR(artifact.memory_max_bytes, (common + 458752 + 131072) / 2, common * kRel);
  EXPECT_EQ(artifact.iteration_s, wlb.iteration_s);  // memory only
  EXPECT_NEAR(meg.memory_max_bytes, (common + 262144) / 2, common * kRel);
}

TEST(WlbBalanceTest, LightestBinThenEmptiestThenSetAside) {
  // Breakpoint 1000: workload x^2 + x, x = l / 1000; cap 1000.
  // 600 -> bin 0 (0.96); 500 -> bin 1 (0.75); 400 -> bin 1 (900 tokens,
  // 1.31); 300 -> bin 0 (900, 1.35); 200 fits in neither (1100 > 1000) and
  // is set aside, then goes to the lighter bin 1.
  auto bins = sim::WlbBalance({300, 600, 200, 500, 400}, 2, 1000, 1000.0);
  ASSERT_EQ(bins.size(), 2u);
  EXPECT_EQ(bins[0], (std::vector<int64_t>{600, 300}));
  EXPECT_EQ(bins[1], (std::vector<int64_t>{500, 400, 200}));
  // Breakpoint 100 (quadratic dominates): 500 -> bin 0 (30); six 150s ->
  // bin 1 (900 tokens, 22.5); 120 no longer fits the lighter bin 1 and goes
  // to the emptier bin 0.
  bins = sim::WlbBalance({150, 150, 500, 150, 150, 120, 150, 150}, 2, 1000, 100.0);
  EXPECT_EQ(bins[0], (std::vector<int64_t>{500, 120}));
  EXPECT_EQ(bins[1], (std::vector<int64_t>(6, 150)));
}

// Seconds of one micro-batch on one rank, pp 1, 2 layers: `tokens` of linear
// work and forward attention `ca`.
// ag / bwd_comm: exposed CP communication per layer, forward / backward.
double MicroBatch(const sim::RankCosts& k, double tokens, double ca, double ag = 0, double bwd_comm = 0) {
  return 2 * (k.LinearForward(tokens) + ca + ag) + k.HeadForward(tokens) +
         2 * (2 * k.LinearForward(tokens) + 2.5 * ca + bwd_comm) + 2 * k.HeadForward(tokens);
}

TEST(WlbIdealTest, ArtifactMicroBatchesRebalanceEachMicroBatchOverTheReplicas) {
  SimOptions o = TestOptions();
  o.cp = 1;
  o.micro_batches = 1;
  const sim::RankCosts k(o.model, o.hardware, o.tp);
  // One micro-batch per replica: {1024, 512, 512} into 2 bins of 1024
  // tokens: {1024} and {512, 512}, as the chunk packing does.
  const double slow = MicroBatch(k, 1024, k.AttentionForward(0, 1024));
  SimResult r = SimulateOne(o, {{1024, 512, 512}}, SimStrategy::kWlbIdeal);
  EXPECT_NEAR(r.iteration_s, slow, slow * kRel);
  // Two micro-batches per replica: the documents form two groups of 1024
  // tokens ({1024} and {512, 512}), each balanced over the 2 replicas:
  // replica 0 runs {1024} then {512}, replica 1 only {512}.
  o.micro_batches = 2;
  const double small = MicroBatch(k, 512, k.AttentionForward(0, 512));
  r = SimulateOne(o, {{1024, 512, 512}}, SimStrategy::kWlbIdeal);
  EXPECT_NEAR(r.iteration_s, slow + small, (slow + small) * kRel);
  EXPECT_NEAR(r.idle_fraction, slow / (slow + small) / 2, 1e-12);
  // Balancing the whole batch at once over the 4 bins of 512 tokens puts the
  // 1024 document aside and then into an empty bin: the same split here.
  o.wlb_scope = WlbScope::kWholeBatch;
  r = SimulateOne(o, {{1024, 512, 512}}, SimStrategy::kWlbIdeal);
  EXPECT_NEAR(r.iteration_s, slow + small, (slow + small) * kRel);
  // The artifact's pipeline benchmark caps bins at 512 / 2 = 256 tokens:
  // every document is set aside, then placed by workload, largest first:
  // 1024 -> bin 0, 512 -> bin 1, 512 -> bin 2; replica 0 runs bins 0 and 2.
  o.wlb_scope = WlbScope::kWholeBatchArtifactCap;
  r = SimulateOne(o, {{1024, 512, 512}}, SimStrategy::kWlbIdeal);
  EXPECT_NEAR(r.iteration_s, slow + small, (slow + small) * kRel);
  // Scopes that disagree: {768, 768, 256, 256}. Per micro-batch: the groups
  // {768} and {768, 256, 256}; the 768 of the second fits no replica's 640
  // and is set aside, then joins replica 0's 256: replica 0 runs {768} and
  // {256, 768}, replica 1 only {256}. The whole batch over 4 bins of 512:
  // both 768s set aside, the 256s to bins 0 and 1, the 768s to bins 2 and 3:
  // each replica runs {256} and {768}.
  const auto ca = [&](int64_t len) { return k.AttentionForward(0, len); };
  o.wlb_scope = WlbScope::kPerMicroBatch;
  const double per = MicroBatch(k, 768, ca(768)) + MicroBatch(k, 1024, ca(256) + ca(768));
  r = SimulateOne(o, {{768, 768, 256, 256}}, SimStrategy::kWlbIdeal);
  EXPECT_NEAR(r.iteration_s, per, per * kRel);
  o.wlb_scope = WlbScope::kWholeBatch;
  const double whole = MicroBatch(k, 256, ca(256)) + MicroBatch(k, 768, ca(768));
  r = SimulateOne(o, {{768, 768, 256, 256}}, SimStrategy::kWlbIdeal);
  EXPECT_NEAR(r.iteration_s, whole, whole * kRel);
  EXPECT_NEAR(r.idle_fraction, 0.0, 1e-12);
  WlbScope scope;
  ASSERT_TRUE(ParseWlbScope("whole-batch-artifact-cap", &scope).ok());
  EXPECT_EQ(scope, WlbScope::kWholeBatchArtifactCap);
  EXPECT_STREQ(WlbScopeName(WlbScope::kPerMicroBatch), "per-micro-batch");
  EXPECT_TRUE(Contains(ParseWlbScope("global", &scope), "unknown wlb-ideal balancing scope 'global'"));
}

TEST(WlbIdealTest, BreakpointWeighsAttentionAgainstTheLinearLayers) {
  SimOptions o = TestOptions();
  o.cp = 1;
  o.micro_batches = 1;
  o.wlb_scope = WlbScope::kWholeBatch;
  o.max_doc_len = 760;  // 2 chunks of 760 tokens
  const sim::RankCosts k(o.model, o.hardware, o.tp);
  const auto ca = [&](int64_t len) { return k.AttentionForward(0, len); };
  const std::vector<int64_t> docs = {500, 150, 150, 150, 150, 150, 150, 120};
  // 1520 tokens into 2 bins capped at 760. Breakpoint 100 (the quadratic
  // term dominates): 500 -> bin 0; five 150s -> bin 1 (750 tokens, still
  // the lighter); the sixth fits only bin 0 (650); 120 fits neither, is set
  // aside, then joins the lighter bin 1: {500, 150} and {5 x 150, 120}.
  o.wlb_breakpoint = 100;
  const double quadratic = std::max(MicroBatch(k, 650, ca(500) + ca(150)), MicroBatch(k, 870, 5 * ca(150) + ca(120)));
  SimResult r = SimulateOne(o, {docs}, SimStrategy::kWlbIdeal);
  EXPECT_NEAR(r.iteration_s, quadratic, quadratic * kRel);
  // Breakpoint 1e6 (tokens dominate): bins alternate by tokens, 500 | 150,
  // 150, 150, 150 | 150 | 150; 120 fits neither, then joins bin 0 (650
  // tokens, the lighter): {500, 150, 120} and {5 x 150}.
  o.wlb_breakpoint = 1000000;
  const double linear = std::max(MicroBatch(k, 770, ca(500) + ca(150) + ca(120)), MicroBatch(k, 750, 5 * ca(150)));
  r = SimulateOne(o, {docs}, SimStrategy::kWlbIdeal);
  EXPECT_NEAR(r.iteration_s, linear, linear * kRel);
  o.wlb_breakpoint = -1;
  EXPECT_TRUE(Contains(ValidateSimOptions(o), "wlb-ideal's breakpoint must be in [0, 1073741824] tokens"));
}

TEST(MegatronTest, ArtifactMicroBatchesJoinAReplicasChunks) {
  SimOptions o = TestOptions();
  o.cp = 2;
  o.micro_batches = 1;
  const sim::RankCosts k(o.model, o.hardware, o.tp);
  // One replica, one micro-batch of both chunks (2048 tokens, 1024 per
  // rank); each document's pairs halve on 256-row shards; the ring gathers
  // the K/V of 2048 tokens, and twice in the backward pass (K/V, dK/dV).
  const double ag = 1e-5 + 2048.0 * 128 / 2 / (2 * 10e9);
  const double want = MicroBatch(k, 1024, 2 * k.AttentionForwardCp(1024, 2), ag, 2 * ag);
  const SimResult r = SimulateOne(o, {{1024, 1024}}, SimStrategy::kMegatron);
  EXPECT_NEAR(r.iteration_s, want, want * kRel);
}

TEST(MegatronTest, AReplicasChunksSplitAsEvenlyAsTheCountAllows) {
  // Three 1024 chunks on one replica (CP 2 over both ranks) in 2
  // micro-batches: chunks [0, 1) and [1, 3) (k g / m boundaries), 512 and
  // 1024 tokens a rank, their rings carrying 1024 and 2048 tokens' K/V.
  SimOptions o = TestOptions();
  o.cp = 2;
  o.micro_batches = 2;
  o.batch_size = 3;
  const sim::RankCosts k(o.model, o.hardware, o.tp);
  const double ag1 = 1e-5 + 1024.0 * 128 / 2 / (2 * 10e9), ag2 = 1e-5 + 2048.0 * 128 / 2 / (2 * 10e9);
  const double ca = k.AttentionForwardCp(1024, 2);
  const double want = MicroBatch(k, 512, ca, ag1, 2 * ag1) + MicroBatch(k, 1024, 2 * ca, ag2, 2 * ag2);
  const SimResult r = SimulateOne(o, {{1024, 1024, 1024}}, SimStrategy::kMegatron);
  EXPECT_NEAR(r.iteration_s, want, want * kRel);
}

TEST(CadTest, ArtifactMicroBatchesHoldTheWholeBatch) {
  SimOptions o = TestOptions();
  const SimResult chunks = SimulateOne(o, {{1024, 512, 512}}, SimStrategy::kDistca);
  // m = 1: one wave of B L / G = 1024 tokens per rank, as chunk mode at c 1.
  o.micro_batches = 1;
  const SimResult whole = SimulateOne(o, {{1024, 512, 512}}, SimStrategy::kDistca);
  EXPECT_DOUBLE_EQ(whole.iteration_s, chunks.iteration_s);
  EXPECT_EQ(chunks.cp, 1);
  EXPECT_EQ(whole.cp, 0);  // no c_min: the ranks hold B L / (m G) tokens
  // One document, two waves: the first is empty and costs nothing; every
  // strategy still runs.
  o.micro_batches = 2;
  std::vector<SimResult> all;
  const Status s = Simulate(o, {{2048}},
                            {SimStrategy::kWlbIdeal, SimStrategy::kMegatron, SimStrategy::kDistcaPaper,
                             SimStrategy::kDistca, SimStrategy::kColocated},
                            &all);
  ASSERT_TRUE(s.ok()) << s.ToString();
  // CAD's two waves: the empty one costs nothing, the other is the whole
  // batch's plan, as with one micro-batch.
  for (const SimResult& r : all) {
    EXPECT_GT(r.iteration_s, 0.0) << SimStrategyName(r.strategy);
    if (r.strategy == SimStrategy::kDistca || r.strategy == SimStrategy::kDistcaPaper) {
      SimOptions one = o;
      one.micro_batches = 1;
      EXPECT_DOUBLE_EQ(r.iteration_s, SimulateOne(one, {{2048}}, r.strategy).iteration_s)
          << SimStrategyName(r.strategy);
    }
  }
  // More micro-batches than tokens per rank is refused.
  o.micro_batches = 2048;
  std::vector<SimResult> results;
  EXPECT_TRUE(Contains(Simulate(o, {{1024, 512, 512}}, {SimStrategy::kDistca}, &results),
                       "leave less than one token per rank"));
}

TEST(WlbIdealTest, MeasuredForwardAndBackwardEachCostTheirOwn) {
  // As ContextParallelTimeAndBytesByHand, with core attention from a table
  // that times the passes apart (sim_test::SplitTableProfile): per rank and
  // layer the four 256-row shards over 2 ranks, 1.3 ms forward and 3.7 ms
  // backward (not 2.5 x 1.3).
  SimOptions o = TestOptions();
  o.hardware = sim_test::SplitTableProfile();
  o.cp = 2;
  const double lin = 3.7748736e-5, ag = 1.32768e-5, head = 1.6777216e-5, fwd = 1.3e-3, bwd = 3.7e-3;
  const double want = 2 * (2 * (lin + fwd + ag) + head + 2 * (2 * lin + bwd + ag) + 2 * head);
  const SimResult r = SimulateOne(o, {{1024, 1024}}, SimStrategy::kWlbIdeal);
  EXPECT_NEAR(r.iteration_s, want, want * kRel);
  EXPECT_NEAR(r.breakdown.forward_attention_s, 2 * fwd, fwd * kRel);
  EXPECT_NEAR(r.breakdown.backward_attention_s, 2 * bwd, bwd * kRel);
}

TEST(CadTest, MeasuredForwardAndBackwardEachCostTheirOwn) {
  // One rank, one 1024 document (as OneDocumentOneRankIsTheColocatedTime):
  // the table's whole-document point, 5 ms forward and 15 ms backward.
  SimOptions o = TestOptions();
  o.hardware = sim_test::SplitTableProfile();
  o.gpus = 2;
  o.batch_size = 1;
  const Parts p = PartsFor(o);
  ASSERT_NEAR(p.ca, 5e-3, 5e-3 * kRel);
  const double want = 2 * (p.lin + 5e-3) + p.head + 2 * (2 * p.lin + 15e-3) + 2 * p.head;
  for (SimStrategy s : {SimStrategy::kDistca, SimStrategy::kDistcaPaper, SimStrategy::kColocated}) {
    const SimResult r = SimulateOne(o, {{1024}}, s);
    EXPECT_NEAR(r.iteration_s, want, want * kRel) << SimStrategyName(s);
    EXPECT_NEAR(r.breakdown.forward_attention_s, 5e-3, 5e-3 * kRel) << SimStrategyName(s);
    EXPECT_NEAR(r.breakdown.backward_attention_s, 15e-3, 15e-3 * kRel) << SimStrategyName(s);
  }
}

TEST(CadTest, DistcaBalancesTheSecondsItsServersSpend) {
  // Rank 0 holds a 1024-token document, rank 1 four of 256. The table
  // charges a causal pair more the longer the task's prefix (1 + kv / 1024
  // ns), so a plan even in FLOPs leaves the server of the long prefix
  // slower. Planned by the table, as distca does by default, the servers'
  // seconds are within eps of the mean, and the iteration is shorter (by
  // 7%: 1.83 ms against 1.97, idle 0.2% against 6.3%). distca-paper plans
  // by FLOPs, as published, whatever the option.
  SimOptions o = TestOptions();
  o.hardware.attention_tables = {sim_test::ByPrefixTable()};
  o.ping_pong = false;
  o.comm_budget = 0;
  const std::vector<int64_t> docs = {1024, 256, 256, 256, 256};
  const SimResult timed = SimulateOne(o, {docs}, SimStrategy::kDistca);
  const SimResult paper = SimulateOne(o, {docs}, SimStrategy::kDistcaPaper);
  o.plan_by_flops = true;
  const SimResult flops = SimulateOne(o, {docs}, SimStrategy::kDistca);
  EXPECT_LE(timed.load_max_over_mean, 1.0 + o.tolerance + 1e-9);  // in the table's seconds
  EXPECT_LE(flops.load_max_over_mean, 1.0 + o.tolerance + 1e-9);  // in FLOPs
  EXPECT_LT(timed.iteration_s, flops.iteration_s * 0.95);
  EXPECT_LT(timed.idle_fraction, flops.idle_fraction / 10);
  EXPECT_EQ(SimulateOne(o, {docs}, SimStrategy::kDistcaPaper).iteration_s, paper.iteration_s);
  // Without a table there is nothing else to plan by.
  o.hardware = sim_test::TestProfile();
  const double by_flops = SimulateOne(o, {docs}, SimStrategy::kDistca).iteration_s;
  o.plan_by_flops = false;
  EXPECT_EQ(SimulateOne(o, {docs}, SimStrategy::kDistca).iteration_s, by_flops);
}

// The same result in every output.
void ExpectSameRun(const SimResult& got, const SimResult& want, const std::string& where) {
  EXPECT_EQ(got.iteration_s, want.iteration_s) << where;
  EXPECT_EQ(got.bytes_moved, want.bytes_moved) << where;
  EXPECT_EQ(got.idle_fraction, want.idle_fraction) << where;
  EXPECT_EQ(got.memory_max_bytes, want.memory_max_bytes) << where;
  EXPECT_EQ(got.load_max_over_mean, want.load_max_over_mean) << where;
  EXPECT_EQ(got.tolerance_used, want.tolerance_used) << where;
  EXPECT_EQ(got.max_buffer_bytes, want.max_buffer_bytes) << where;
}

TEST(CadTest, DistcaKeepsTheFastestOfItsPlansByTheTableByFlopsAndAtLooserBounds) {
  // One wave (one tick) with the table above: the table's plans balance the
  // servers' seconds and move 1.93 MB, the plans by FLOPs 1.84 MB. On a
  // fast link the table's tick is shorter (with ping-pong: 1.40 ms against
  // 1.48 at 1 TB/s), on a slow one, where the transfers show, the FLOPs
  // plans' (6.29 ms against 6.95 at 100 MB/s). At eps 0.05 alone
  // (fixed_tolerance) distca keeps the shorter of the two; by default also
  // of the plans by FLOPs at eps 0.1, 0.2 and 0.4, which move fewer bytes.
  // In this one-tick run that is exactly the fastest of the runs planned
  // one way alone at each bound.
  SimOptions o = TestOptions();
  o.hardware.attention_tables = {sim_test::ByPrefixTable()};
  o.comm_budget = 0;
  const std::vector<int64_t> docs = {768, 256, 512, 256, 256};
  bool table_faster = false, flops_faster = false, looser_faster = false;
  for (bool ping_pong : {false, true}) {
    for (double bandwidth : {1e12, 1e10, 1e9, 1e8, 1e7}) {
      const std::string where = fmt::format("{} B/s, ping-pong {}", bandwidth, ping_pong);
      o.ping_pong = ping_pong;
      o.hardware.inter_node.bandwidth = bandwidth;
      o.plan_by_table = true;
      const SimResult table = SimulateOne(o, {docs}, SimStrategy::kDistca);
      o.plan_by_table = false;
      o.plan_by_flops = true;
      const SimResult flops = SimulateOne(o, {docs}, SimStrategy::kDistca);
      SimResult fastest = flops.iteration_s < table.iteration_s ? flops : table;
      ExpectSameRun(SimulateOne(
                        [&] {
                          SimOptions f = o;
                          f.plan_by_flops = false;
                          f.fixed_tolerance = true;
                          return f;
                        }(),
                        {docs}, SimStrategy::kDistca),
                    fastest, where + ", eps 0.05 alone");
      for (double looser : {0.1, 0.2, 0.4}) {
        SimOptions at = o;
        at.tolerance = looser;
        const SimResult r = SimulateOne(at, {docs}, SimStrategy::kDistca);
        if (r.iteration_s < fastest.iteration_s) {
          fastest = r;
          looser_faster = true;
        }
      }
      o.plan_by_flops = false;
      ExpectSameRun(SimulateOne(o, {docs}, SimStrategy::kDistca), fastest, where);
      table_faster = table_faster || table.iteration_s < flops.iteration_s;
      flops_faster = flops_faster || flops.iteration_s < table.iteration_s;
    }
  }
  EXPECT_TRUE(table_faster);
  EXPECT_TRUE(flops_faster);
  EXPECT_TRUE(looser_faster);
  // One of the two alone, not both.
  o.plan_by_flops = o.plan_by_table = true;
  std::vector<SimResult> r;
  EXPECT_FALSE(Simulate(o, {docs}, {SimStrategy::kDistca}, &r).ok());
}

TEST(CadTest, OneDocumentOneRankIsTheColocatedTime) {
  // 2 devices: one rank, one 1024 document, nothing to plan.
  SimOptions o = TestOptions();
  o.gpus = 2;
  o.batch_size = 1;
  const double want = OneChunkPerRank(PartsFor(o));
  for (SimStrategy s : {SimStrategy::kDistca, SimStrategy::kDistcaPaper, SimStrategy::kColocated}) {
    const SimResult r = SimulateOne(o, {{1024}}, s);
    EXPECT_NEAR(r.iteration_s, want, want * kRel) << SimStrategyName(s);
    EXPECT_EQ(r.bytes_moved, 0.0);
    EXPECT_EQ(r.cp, 1);
  }
}

// Two ranks' clocks: Step(compute, comm) runs compute(r) on each rank at its
// own pace and, under it, an exchange among the ranks with bytes in it
// (comm(r) > 0) that starts when they are done with the steps before (the
// later of their clocks) and ends, for each, when the slower transfer does.
struct Clocks {
  double t[2] = {0, 0};
  template <class Compute, class Comm>
  void Step(Compute&& compute, Comm&& comm) {
    double ready = 0, transfer = 0;
    for (int r = 0; r < 2; ++r) {
      if (comm(r) <= 0) continue;
      ready = std::max(ready, t[r]);
      transfer = std::max(transfer, comm(r));
    }
    for (int r = 0; r < 2; ++r) {
      t[r] += compute(r);
      if (comm(r) > 0) t[r] = std::max(t[r], ready + transfer);
    }
  }
  double End() const { return std::max(t[0], t[1]); }
};
// No seconds: a step without compute, or without an exchange.
const auto kZero = [](int) { return 0.0; };

// The iteration of one wave `docs` on 2 ranks (m = 1) from the planner's own
// plans: with ping-pong of the two nano-batches SplitNanoBatches makes,
// without it of the whole wave. Per rank r and nano-batch n: linear over the
// tokens it holds, split into the part before attention (share p = 2/9 of
// the test model's FLOPs forward, 7/9 backward; of the tensor-parallel
// collectives, when the profile costs them, 1/4 forward, 3/4 backward) and
// after it; CA = its load / 2e12 (efficiency 1 everywhere); the dispatch and
// the return all-to-alls of its bytes (forward or backward share, split 0.64
// / 0.36 forward, 0.52 / 0.48 backward) across nodes. Each rank keeps its own
// clock; an exchange waits for both ranks' step before it and lasts as long
// as the slower transfer. With L = o.model.num_layers:
//   ping-pong on, fill and drain included, steps (compute | the exchange it
//   hides): layer 1 opens with before_0 alone, then (before_1 | out_0);
//   every layer then (ca_0 | out_1), (ca_1 | back_0), and the next opens
//   with (after_0 + before_0 | back_1), (after_1 + before_1 | out_0); layer
//   L closes with (after_0 | back_1), after_1 alone.
//   ping-pong off, layer by layer: before, (| out), ca, (| back), after.
// `steady`, when given, gets the ping-pong iteration without fill and drain
// (every layer as the steady state).
double PlannedIteration(const SimOptions& o, const std::vector<int64_t>& docs, PlanPolicy policy, bool ping_pong,
                        double* bytes, double head_tokens = 1024, double* steady = nullptr, double* barrier = nullptr) {
  // distca balances the two nano-batches; distca-paper (the paper policy)
  // takes the batch's halves in order, as DistCA's artifact does.
  std::vector<std::vector<int64_t>> nanos;
  if (!ping_pong) {
    nanos = {docs};
  } else if (policy == PlanPolicy::kPaper) {
    nanos = sim::SplitIntoWaves(docs, 2, (std::accumulate(docs.begin(), docs.end(), int64_t{0}) + 1) / 2);
  } else {
    std::vector<std::vector<int>> index;
    EXPECT_TRUE(SplitNanoBatches(docs, 2, &index).ok());
    for (const auto& part : index) {
      nanos.emplace_back();
      for (int d : part) nanos.back().push_back(docs[d]);
    }
  }
  const sim::RankCosts k(o.model, o.hardware, o.tp);
  const double L = o.model.num_layers;
  const size_t nn = nanos.size();
  double pass_s[2] = {0, 0}, steady_s[2] = {0, 0}, barrier_s[2] = {0, 0};
  *bytes = 0;
  for (int pass = 0; pass < 2; ++pass) {
    const double lin_factor = pass == 0 ? 1.0 : 2.0, ca_factor = pass == 0 ? 1.0 : 2.5;
    const double before_share = pass == 0 ? 2.0 / 9 : 7.0 / 9;
    const size_t out_ex = pass == 0 ? 0 : 2, back_ex = out_ex + 1;  // the pass's dispatch and return
    const double collectives_before = pass == 0 ? 0.25 : 0.75;
    using Grid = std::vector<std::vector<double>>;
    Grid before(nn, std::vector<double>(2, 0.0)), after = before, ca = before, out = before, back = before;
    for (size_t n = 0; n < nn; ++n) {
      const std::vector<int64_t>& nano = nanos[n];
      PlanOptions po;
      po.ranks = 2;
      po.policy = policy;
      po.tolerance = o.tolerance;
      // distca-paper (the paper policy) is costed with DistCA's wire format
      // unless the options name one for all.
      po.model = {4, 2, 16, 2,
                  o.cad_wire.value_or(policy == PlanPolicy::kPaper ? PlanWire::kDistcaArtifact : PlanWire::kDistca)};
      Plan plan;
      EXPECT_TRUE(BuildPlan(nano, po, CostModel::Flops(po.model), &plan).ok());
      const PlanTraffic& t = plan.stats.traffic;
      if (pass == 0) *bytes += L * double(t.total_bytes());
      std::vector<double> tokens(2, 0.0);
      for (const PlanDocument& d : plan.documents)
        for (const PlanPiece& p : d.pieces) tokens[p.rank] += double(p.end - p.begin);
      for (int r = 0; r < 2; ++r) {
        const double comm = lin_factor * k.TpCollectives(tokens[r]);
        const double flops = lin_factor * k.LinearForward(tokens[r]) - comm;
        before[n][r] = before_share * flops + collectives_before * comm;
        after[n][r] = flops + comm - before[n][r];
        ca[n][r] = ca_factor * plan.stats.load[r] / 2e12;
        const double out_s = double(t.exchange_sent[out_ex][r]), out_r = double(t.exchange_received[out_ex][r]);
        const double back_s = double(t.exchange_sent[back_ex][r]), back_r = double(t.exchange_received[back_ex][r]);
        if (out_s + out_r + back_s + back_r > 0) {
          out[n][r] = k.AllToAll(out_s, out_r, true);
          back[n][r] = k.AllToAll(back_s, back_r, true);
        }
      }
    }
    if (nn == 2) {
      // fill_drain false: every layer as the steady state.
      auto run = [&](bool fill_drain) {
        Clocks c;
        for (int l = 0; l < int(L); ++l) {
          const bool opens = fill_drain && l == 0;
          if (opens)
            c.Step([&](int r) { return before[0][r]; }, kZero);
          else
            c.Step([&](int r) { return after[0][r] + before[0][r]; }, [&](int r) { return back[1][r]; });
          c.Step([&](int r) { return (opens ? 0.0 : after[1][r]) + before[1][r]; }, [&](int r) { return out[0][r]; });
          c.Step([&](int r) { return ca[0][r]; }, [&](int r) { return out[1][r]; });
          c.Step([&](int r) { return ca[1][r]; }, [&](int r) { return back[0][r]; });
        }
        if (fill_drain) {
          c.Step([&](int r) { return after[0][r]; }, [&](int r) { return back[1][r]; });
          c.Step([&](int r) { return after[1][r]; }, kZero);
        }
        return c.End();
      };
      pass_s[pass] = run(true);
      steady_s[pass] = run(false);
      // With a barrier after every step, each step its slower rank.
      auto slowest = [](auto&& f) { return std::max(f(0), f(1)); };
      const double open = slowest([&](int r) { return before[0][r]; }) +
                          slowest([&](int r) { return std::max(before[1][r], out[0][r]); });
      const double attention = slowest([&](int r) { return std::max(ca[0][r], out[1][r]); }) +
                               slowest([&](int r) { return std::max(ca[1][r], back[0][r]); });
      const double boundary = slowest([&](int r) { return std::max(after[0][r] + before[0][r], back[1][r]); }) +
                              slowest([&](int r) { return std::max(after[1][r] + before[1][r], out[0][r]); });
      const double close = slowest([&](int r) { return std::max(after[0][r], back[1][r]); }) +
                           slowest([&](int r) { return after[1][r]; });
      barrier_s[pass] = open + L * attention + (L - 1) * boundary + close;
    } else {
      Clocks c;
      for (int l = 0; l < int(L); ++l) {
        for (size_t n = 0; n < nn; ++n) {
          c.Step([&](int r) { return before[n][r]; }, kZero);
          c.Step(kZero, [&](int r) { return out[n][r]; });
          c.Step([&](int r) { return ca[n][r]; }, kZero);
          c.Step(kZero, [&](int r) { return back[n][r]; });
          c.Step([&](int r) { return after[n][r]; }, kZero);
        }
      }
      pass_s[pass] = c.End();
      for (size_t n = 0; n < nn; ++n)
        for (const Grid* g : {&before, &out, &ca, &back, &after})
          barrier_s[pass] += L * std::max((*g)[n][0], (*g)[n][1]);
    }
  }
  const double head = k.HeadForward(head_tokens);
  if (steady != nullptr) *steady = steady_s[0] + head + steady_s[1] + 2 * head;
  if (barrier != nullptr) *barrier = barrier_s[0] + head + barrier_s[1] + 2 * head;
  return pass_s[0] + head + pass_s[1] + 2 * head;
}

TEST(CadTest, CostsThePlannersTasksAndTraffic) {
  SimOptions o = TestOptions();
  o.comm_budget = 0;
  o.fixed_tolerance = true;  // distca's plans at eps, as the reference plans them
  o.hardware.attention_efficiency = {{1.0, 1.0}};
  // The second batch's halves in order ({256, 256} and {1024, 256, 256})
  // differ from its balanced split ({1024} and the four 256s): distca-paper
  // takes the first, distca the second.
  for (const std::vector<int64_t>& docs :
       {std::vector<int64_t>{1024, 256, 256, 256, 256}, std::vector<int64_t>{256, 256, 1024, 256, 256}})
    // 1 layer (no steady boundary), 2, 3 and 40 (the reference runs every
    // layer, the simulator adds the layers after a steady one at once); with and without the TP
    // collectives; each strategy's own wire format, and both forced.
    for (std::optional<PlanWire> wire : {std::optional<PlanWire>(), std::optional<PlanWire>(PlanWire::kDistca),
                                         std::optional<PlanWire>(PlanWire::kDistcaArtifact)}) {
      for (int layers : {1, 2, 3, 40}) {
        o.cad_wire = wire;
        for (bool collectives : {false, true}) {
          o.model.num_layers = layers;
          o.hardware.tp_collectives = collectives;
          for (bool ping_pong : {true, false}) {
            o.ping_pong = ping_pong;
            for (SimStrategy s : {SimStrategy::kDistca, SimStrategy::kDistcaPaper}) {
              const std::string what = std::string(SimStrategyName(s)) + ", " + std::to_string(layers) +
                                       " layers, collectives " + std::to_string(collectives) + ", ping-pong " +
                                       std::to_string(ping_pong) + ", wire " + (wire ? PlanWireName(*wire) : "default");
              const PlanPolicy policy = s == SimStrategy::kDistca ? PlanPolicy::kDistca : PlanPolicy::kPaper;
              double bytes = 0, steady = 0, barrier = 0;
              const double want = PlannedIteration(o, docs, policy, ping_pong, &bytes, 1024, &steady, &barrier);
              ASSERT_GT(bytes, 0) << what;
              // Fill and drain only add; without the collectives' extra cover
              // this case exposes traffic at the pass's ends, so they show
              // (by over 0.1% with a few layers; 40 dilute them).
              if (ping_pong) {
                EXPECT_GE(want, steady) << what;
                if (!collectives && layers <= 3) {
                  EXPECT_GT(want, steady * (1 + 1e-3)) << what;
                }
              }
              const SimResult r = SimulateOne(o, {docs}, s);
              EXPECT_NEAR(r.iteration_s, want, want * kRel) << what;
              // Never slower than a barrier after every step, the same
              // compute and transfers paired the same way.
              EXPECT_LE(r.iteration_s, barrier * (1 + kRel)) << what;
              EXPECT_DOUBLE_EQ(r.bytes_moved, bytes) << what;
            }
          }
        }
      }
    }
  // The wire format changes the bytes (here the backward's: O instead of
  // delta, bf16 instead of fp32 dK/dV).
  const std::vector<int64_t> docs = {1024, 256, 256, 256, 256};
  o.cad_wire = PlanWire::kDistca;
  const double ours = SimulateOne(o, {docs}, SimStrategy::kDistca).bytes_moved;
  o.cad_wire = PlanWire::kDistcaArtifact;
  EXPECT_NE(SimulateOne(o, {docs}, SimStrategy::kDistca).bytes_moved, ours);
}

TEST(CadTest, RanksWithoutExchangesRunAtTheirOwnPace) {
  // Ping holds a 512-token document on rank 0 and eight of 64 on rank 1,
  // pong the mirror image (distca-paper takes the batch's halves in order).
  // With nothing moved (eps 100) and no document cut, no rank exchanges
  // anything: each runs its steps at its own pace, and the iteration is one
  // rank's work (both do the same), not the sum of every step's slower rank.
  SimOptions o = TestOptions();
  o.comm_budget = 0;
  o.tolerance = 100;
  o.hardware.attention_efficiency = {{1.0, 1.0}};
  std::vector<int64_t> docs = {512};
  for (int i = 0; i < 16; ++i) docs.push_back(64);
  docs.push_back(512);
  const SimResult r = SimulateOne(o, {docs}, SimStrategy::kDistcaPaper);
  ASSERT_EQ(r.bytes_moved, 0.0);
  const sim::RankCosts k(o.model, o.hardware, o.tp);
  const double L = o.model.num_layers, lin = k.LinearForward(512);
  const double heavy = k.AttentionForward(0, 512), light = 8 * k.AttentionForward(0, 64);
  ASSERT_GT(heavy, 2 * light);
  const double head = k.HeadForward(1024);
  // Forward: two nano-batches' linear work and both attentions a layer;
  // backward: twice the linear work, 2.5 times the attention.
  const double want = L * (2 * lin + heavy + light) + head + L * (2 * 2 * lin + 2.5 * (heavy + light)) + 2 * head;
  EXPECT_NEAR(r.iteration_s, want, want * kRel);
  // A barrier after every step would pay the heavy attention twice a layer.
  const double barriers = L * (2 * lin + 2 * heavy) + head + L * (2 * 2 * lin + 2.5 * 2 * heavy) + 2 * head;
  EXPECT_LT(r.iteration_s, barriers * 0.95);
  EXPECT_NEAR(r.idle_fraction, 0.0, 1e-12);
}

TEST(ColocatedTest, LaterRankFetchesTheKvPrefixOfACutDocument) {
  // {512, 1024, 512} on 2 ranks: the 1024 is cut at its middle; rank 1
  // serves rows [512, 1024) and fetches K/V [0, 512) from rank 0, with the
  // traffic exposed (no ping-pong), as distca-train --attention colocated.
  SimOptions o = TestOptions();
  o.hardware.attention_efficiency = {{1.0, 1.0}};
  const std::vector<int64_t> docs = {512, 1024, 512};
  double bytes = 0;
  const double want = PlannedIteration(o, docs, PlanPolicy::kColocated, /*ping_pong=*/false, &bytes);
  ASSERT_GT(bytes, 0);
  const SimResult r = SimulateOne(o, {docs}, SimStrategy::kColocated);
  EXPECT_NEAR(r.iteration_s, want, want * kRel);
  EXPECT_DOUBLE_EQ(r.bytes_moved, bytes);
  EXPECT_EQ(r.cp, 1);
  // Ping-pong is off for colocated whatever the option says.
  o.ping_pong = false;
  EXPECT_DOUBLE_EQ(SimulateOne(o, {docs}, SimStrategy::kColocated).iteration_s, r.iteration_s);
}

TEST(ColocatedTest, EachExchangeCarriesItsOwnBytes) {
  // The same cut document: only K/V move. Rows of K+V are 2 * 2 * 16 * 2 =
  // 128 B, of fp32 dK+dV 256 B; the 2 ranks of tp 2 span 2 nodes (10 GB/s
  // and 10 us a device). Forward: K/V [0, 512) go out (65536 B), nothing
  // comes back, yet the return, an empty all-to-all, costs its latency.
  // Backward: K/V out again, dK/dV back (131072 B). Both ranks hold 1024
  // tokens (the same linear work) and rank 1 serves more attention, so the
  // exposed communication per layer is exactly the two exchanges.
  SimOptions o = TestOptions();
  o.hardware.attention_efficiency = {{1.0, 1.0}};
  const SimResult r = SimulateOne(o, {{512, 1024, 512}}, SimStrategy::kColocated);
  const double bw = 2 * 10e9, lat = 1e-5;
  const double forward = (lat + 65536 / bw) + lat, backward = (lat + 65536 / bw) + (lat + 131072 / bw);
  EXPECT_NEAR(r.breakdown.forward_comm_s, forward, forward * kRel);
  EXPECT_NEAR(r.breakdown.backward_comm_s, backward, backward * kRel);
  // Per layer: (65536 + 65536 + 131072) B.
  EXPECT_DOUBLE_EQ(r.bytes_moved, 2 * 262144.0);
  // Idle is waiting for another rank, not a rank's own transfers (busy, as
  // the baselines' rings are): rank 1 never waits, and rank 0 waits only for
  // rank 1's longer attention (512 rows over a 1024 prefix against 512 over
  // 512), forward and backward, in each of the 2 layers.
  const sim::RankCosts k(o.model, o.hardware, o.tp);
  const double extra = k.AttentionForward(512, 1024) - k.AttentionForward(0, 512);
  const double waited = 2 * (extra + (k.AttentionBackward(512, 1024) - k.AttentionBackward(0, 512)));
  ASSERT_GT(waited, 0.0);
  // (The sums run in different orders: equal to rounding.)
  EXPECT_NEAR(r.idle_fraction, waited / (2 * r.iteration_s), 1e-12);
  // The plan's balance, in causal pairs: rank 1 serves 393472 + 131328,
  // rank 0 twice 131328.
  EXPECT_NEAR(r.load_max_over_mean, 524800.0 / 393728.0, 1e-12);
}

TEST(CadTest, ReportsTheBalanceItsPlansReach) {
  // The batch above, balanced: distca caps the busiest server at (1 + eps)
  // x the mean; the baselines plan nothing and report none.
  SimOptions o = TestOptions();
  o.ping_pong = false;
  o.fixed_tolerance = true;  // not also at looser bounds
  for (double eps : {0.02, 0.05, 0.2}) {
    o.tolerance = eps;
    const SimResult r = SimulateOne(o, {{512, 1024, 512}}, SimStrategy::kDistca);
    EXPECT_GE(r.load_max_over_mean, 1.0) << eps;
    EXPECT_LE(r.load_max_over_mean, 1.0 + eps + 1e-9) << eps;
  }
  EXPECT_EQ(SimulateOne(o, {{512, 1024, 512}}, SimStrategy::kWlbIdeal).load_max_over_mean, 0.0);
}

// A step's busy time is the union of the rank's compute, from the step's
// start, and its own transfer, from when the exchange's last rank is ready.
TEST(CadTest, StepBusyIsComputeOrOwnTransfer) {
  EXPECT_EQ(sim::StepBusySeconds(3, 0, 0), 3);  // no transfer
  EXPECT_EQ(sim::StepBusySeconds(3, 2, 0), 3);  // hidden under the compute
  EXPECT_EQ(sim::StepBusySeconds(1, 2, 0), 2);  // longer than the compute
  // Ready first, a peer 1 s later: compute [0, 1], transfer [1, 2]; the
  // rank never waits.
  EXPECT_EQ(sim::StepBusySeconds(1, 1, 1), 2);
  // A peer 3 s later: compute [0, 1], transfer [3, 4]; 2 s waiting.
  EXPECT_EQ(sim::StepBusySeconds(1, 1, 3), 2);
  // Compute [0, 4], transfer [1, 3]: inside it.
  EXPECT_EQ(sim::StepBusySeconds(4, 2, 1), 4);
  EXPECT_EQ(sim::StepBusySeconds(0, 2, 5), 2);  // an exchange step alone
}

TEST(ColocatedTest, KeepsThisRuntimesWireWhateverTheOptionSays) {
  // distca-train --attention colocated has one wire format; --wire sets the
  // CAD strategies' only (DistCA's without the resend would also count what
  // servers keep for the backward in memory).
  SimOptions o = TestOptions();
  const SimResult plain = SimulateOne(o, {{512, 1024, 512}}, SimStrategy::kColocated);
  o.cad_wire = PlanWire::kDistcaArtifactNoResend;
  const SimResult other = SimulateOne(o, {{512, 1024, 512}}, SimStrategy::kColocated);
  EXPECT_EQ(other.iteration_s, plain.iteration_s);
  EXPECT_EQ(other.memory_max_bytes, plain.memory_max_bytes);
  EXPECT_EQ(other.bytes_moved, plain.bytes_moved);
  EXPECT_EQ(StrategyWire(SimStrategy::kColocated, o), PlanWire::kDistca);
  EXPECT_EQ(StrategyWire(SimStrategy::kDistca, o), PlanWire::kDistcaArtifactNoResend);
  EXPECT_EQ(StrategyWire(SimStrategy::kDistcaPaper, o), PlanWire::kDistcaArtifactNoResend);
  EXPECT_EQ(StrategyWire(SimStrategy::kWlbIdeal, o), std::nullopt);
  EXPECT_EQ(StrategyWire(SimStrategy::kMegatron, o), std::nullopt);
  o.cad_wire.reset();  // each its own
  EXPECT_EQ(StrategyWire(SimStrategy::kDistca, o), PlanWire::kDistca);
  EXPECT_EQ(StrategyWire(SimStrategy::kDistcaPaper, o), PlanWire::kDistcaArtifact);
}

// distca's buffers on its busiest rank, in the rank's bytes, from what the
// runtime allocates (src/runtime/dispatcher.cc) for each nano-batch in
// flight: in a pass, a send buffer for the larger of its two exchanges' sends
// and a receive buffer for the larger receive, the server's assembled rows
// (those the dispatch brings, and its own) and its results (those the return
// sends, and its own); the larger pass counts.
double DistcaBuffers(const SimOptions& o, const std::vector<std::vector<int64_t>>& nanos) {
  std::vector<double> per_rank(2, 0.0);
  for (const std::vector<int64_t>& nano : nanos) {
    PlanOptions po;
    po.ranks = 2;
    po.tolerance = o.tolerance;
    po.model = {4, 2, 16, 2, PlanWire::kDistca};
    Plan plan;
    EXPECT_TRUE(BuildPlan(nano, po, CostModel::Flops(po.model), &plan).ok());
    const PlanTraffic& t = plan.stats.traffic;
    for (int r = 0; r < 2; ++r) {
      auto pass = [&](int dispatch, int ret) {
        const double send = double(std::max(t.exchange_sent[dispatch][r], t.exchange_sent[ret][r]));
        const double receive = double(std::max(t.exchange_received[dispatch][r], t.exchange_received[ret][r]));
        const double rows = double(t.exchange_received[dispatch][r] + t.exchange_local[dispatch][r]);
        const double results = double(t.exchange_sent[ret][r] + t.exchange_local[ret][r]);
        return send + receive + rows + results;
      };
      per_rank[r] += std::max(pass(0, 1), pass(2, 3));
    }
  }
  return std::max(per_rank[0], per_rank[1]);
}

TEST(CadTest, CMinIsTheSmallestDegreeWhoseTokensFit) {
  // 2 ranks, B = 2: at c 1 each rank holds a 1024 chunk per wave (2 waves);
  // at c 2 a wave is one chunk over both ranks, 512 tokens each (4 waves).
  SimOptions o = TestOptions();
  o.comm_budget = 1'000'000'000;  // per device: DistCA allocates it (four times); distca's bounds what moves
  o.hardware.attention_efficiency = {{1.0, 1.0}};
  const double params = double(ParameterCount(o.model));
  double buffer = 0;
  auto memory = [&](double tokens) {  // 2 layers, the logits (256 x (2 + 4) B), tp 2
    return (params * 6 + params * 12 / 2 + tokens * 2 * 1664 + tokens * 1536 + buffer) / 2;
  };
  for (SimStrategy s : {SimStrategy::kDistca, SimStrategy::kDistcaPaper}) {
    const bool paper = s == SimStrategy::kDistcaPaper;
    // c 1: a wave of both documents, a nano-batch each, laid out over both
    // ranks; c 2: a wave of one document, one plan.
    buffer = paper ? sim::kDistcaArtifactBufferCopies * 1e9 * 2 : DistcaBuffers(o, {{1024}, {1024}});
    const double at_1024 = memory(1024);
    o.hardware.memory_bytes = at_1024;
    SimResult r = SimulateOne(o, {{1024, 1024}}, s);
    EXPECT_EQ(r.cp, 1) << SimStrategyName(s);
    EXPECT_TRUE(r.memory_fits);
    EXPECT_NEAR(r.memory_max_bytes, at_1024, at_1024 * kRel);
    o.hardware.memory_bytes = memory(1023);
    if (!paper) buffer = DistcaBuffers(o, {{1024}});
    const double at_512 = memory(512);
    r = SimulateOne(o, {{1024, 1024}}, s);
    EXPECT_EQ(r.cp, 2) << SimStrategyName(s);
    EXPECT_TRUE(r.memory_fits);
    EXPECT_NEAR(r.memory_max_bytes, at_512, at_512 * kRel);
    // Two waves, each one 1024 document laid out over the 2 ranks (one plan:
    // a single document cannot be split into nano-batches); the LM head
    // runs over the 512 tokens of a rank.
    const PlanPolicy policy = paper ? PlanPolicy::kPaper : PlanPolicy::kDistca;
    double bytes = 0;
    const double want = 2 * PlannedIteration(o, {1024}, policy, /*ping_pong=*/false, &bytes, 512);
    EXPECT_NEAR(r.iteration_s, want, want * kRel);
    EXPECT_DOUBLE_EQ(r.bytes_moved, 2 * bytes);
    o.hardware.memory_bytes = memory(511);
    r = SimulateOne(o, {{1024, 1024}}, s);
    EXPECT_EQ(r.cp, 2) << SimStrategyName(s);  // the largest degree, flagged
    EXPECT_FALSE(r.memory_fits);
  }
}

// distca allocates its buffers per exchange: a budget that does not bind
// (the same plans) leaves its memory as it is, and the buffers it counts are
// those of the plans.
TEST(CadTest, DistcasMemoryIsThatOfItsPlansWhateverTheBudget) {
  SimOptions o = TestOptions();
  const double expected = DistcaBuffers(o, {{1024}});
  ASSERT_GT(expected, 0);
  double memory = -1;
  for (int64_t budget : {int64_t{0}, int64_t{1'000'000'000}, int64_t{2} << 30}) {
    o.comm_budget = budget;
    const sim::SimContext ctx(o);
    sim::BatchOutcome out;
    ASSERT_TRUE(sim::SimulateDistca(ctx, {1024, 1024}, 2, &out).ok());
    const double most = *std::max_element(out.memory_bytes.begin(), out.memory_bytes.end());
    if (memory < 0) memory = most;
    EXPECT_DOUBLE_EQ(most, memory) << budget;
    EXPECT_DOUBLE_EQ(*std::max_element(out.buffer_bytes.begin(), out.buffer_bytes.end()), expected / o.tp) << budget;
  }
}

TEST(CadTest, PaperBufferStagesOwnRowsAndGrowsWhereNothingFits) {
  // The setting of CMinIsTheSmallestDegreeWhoseTokensFit at c = 1 (memory
  // ample): one wave of two 1024 documents, one nano-batch each, every
  // document laid out over both ranks. A 1-byte buffer holds nothing, not
  // even the layout's own rows: distca fails; distca-paper, like DistCA's
  // artifact, tries its tolerances, keeps the last one's plans (eps 1: the
  // paper policy moves nothing there) and enlarges the buffer to their need
  // rounded up to whole GiB plus 0.5 GiB per device, on every rank.
  SimOptions o = TestOptions();
  o.comm_budget = 1;
  o.hardware.attention_efficiency = {{1.0, 1.0}};
  std::vector<SimResult> results;
  const Status failed = Simulate(o, {{1024, 1024}}, {SimStrategy::kDistca}, &results);
  EXPECT_TRUE(Contains(failed, "below what the linear layout alone moves")) << failed.ToString();
  // The planner's budget is a rank's (tp devices); the message says so.
  EXPECT_TRUE(Contains(failed, "a rank of tp 2 devices: comm budget 2 x 1 bytes")) << failed.ToString();
  // The budget alone fails (the waves plan without it): the degree cannot
  // run, FailedPrecondition, which Simulate skips for the next degree.
  {
    const sim::SimContext ctx(o);
    sim::BatchOutcome out;
    const Status at_degree = sim::SimulateDistca(ctx, {1024, 1024}, 1, &out);
    EXPECT_EQ(at_degree.code(), StatusCode::kFailedPrecondition) << at_degree.ToString();
  }
  const SimResult r = SimulateOne(o, {{1024, 1024}}, SimStrategy::kDistcaPaper);
  EXPECT_EQ(r.cp, 1);
  EXPECT_DOUBLE_EQ(r.tolerance_used, sim::kDistcaArtifactTolerances.back());
  std::vector<std::vector<int>> nanos;
  ASSERT_TRUE(SplitNanoBatches({1024, 1024}, 2, &nanos).ok());
  ASSERT_EQ(nanos.size(), 2u);
  PlanOptions po;
  po.ranks = 2;
  po.policy = PlanPolicy::kPaper;
  po.model = {4, 2, 16, 2, PlanWire::kDistcaArtifact};
  po.tolerance = 1.0;
  po.budget_per_exchange = po.budget_counts_local = true;
  Plan plan;  // both nano-batches are this one document
  ASSERT_TRUE(BuildPlan({1024}, po, CostModel::Flops(po.model), &plan).ok());
  const int64_t need = plan.stats.traffic.max_exchange_bytes(true);
  ASSERT_GT(need, 2);
  const double buffer = sim::DistcaArtifactEnlargedBuffer(double(need) / 2) * 2;  // tp 2
  EXPECT_DOUBLE_EQ(buffer, 1.5 * 1024 * 1024 * 1024 * 2);                         // need is a few KB
  // Allocated four times: two dispatchers, each with a send and a receive buffer.
  const double allocated = sim::kDistcaArtifactBufferCopies * buffer;
  const double params = double(ParameterCount(o.model));
  const double want = (params * 6 + params * 12 / 2 + 1024.0 * 2 * 1664 + 1024.0 * 1536 + allocated) / 2;
  EXPECT_NEAR(r.memory_max_bytes, want, want * kRel);

  // The enlarged buffer stays for the batches after: the second of two
  // such batches fits at the first tolerance (1.5 GiB holds its few KB).
  const SimResult two = SimulateOne(o, {{1024, 1024}, {1024, 1024}}, SimStrategy::kDistcaPaper);
  EXPECT_NEAR(two.tolerance_used, (1.0 + 0.05) / 2, 1e-12);
  EXPECT_NEAR(two.memory_max_bytes, want, want * kRel);
  // And for the ticks after, in one batch: two waves of one document each
  // (one plan per tick), the first enlarging the buffer, the second fitting.
  o.micro_batches = 2;
  const SimResult waves = SimulateOne(o, {{1024, 1024}}, SimStrategy::kDistcaPaper);
  EXPECT_NEAR(waves.tolerance_used, (1.0 + 0.05) / 2, 1e-12);
  // With pipeline stages DistCA's artifact stops where nothing fits.
  o.micro_batches = 0;
  o.gpus = 8;
  o.pp = 2;
  std::vector<SimResult> staged;
  EXPECT_TRUE(Contains(Simulate(o, {{1024, 1024}}, {SimStrategy::kDistcaPaper}, &staged),
                       "DistCA's pipeline schedule stops here"));
}

// Both nano-batches of a tick at one tolerance: a 1536-token ping and a
// 512-token pong (distca-paper takes a wave's halves in order), a buffer
// that holds the pong's plan at the first tolerance but the ping's at none:
// as the artifact checks both together, both run at the last tolerance (a
// check of each alone would keep the pong at the first).
TEST(CadTest, PaperPlansATicksNanoBatchesAtOneTolerance) {
  SimOptions o = TestOptions();
  o.hardware.attention_efficiency = {{1.0, 1.0}};
  PlanOptions po;
  po.ranks = 2;
  po.policy = PlanPolicy::kPaper;
  po.model = {4, 2, 16, 2, PlanWire::kDistcaArtifact};
  po.budget_per_exchange = po.budget_counts_local = true;
  auto need = [&](int64_t doc, double eps) {
    po.tolerance = eps;
    Plan plan;
    EXPECT_TRUE(BuildPlan({doc}, po, CostModel::Flops(po.model), &plan).ok());
    return plan.stats.traffic.max_exchange_bytes(true);
  };
  const int64_t budget = need(512, 0.05) + need(512, 0.05) % 2;  // even: per device of tp 2
  for (double eps : sim::kDistcaArtifactTolerances) {
    if (eps >= 0.05) {
      ASSERT_GT(need(1536, eps), budget) << eps;
    }
  }
  o.comm_budget = budget / 2;
  const SimResult r = SimulateOne(o, {{1536, 512}}, SimStrategy::kDistcaPaper);
  EXPECT_DOUBLE_EQ(r.tolerance_used, 1.0);  // both plans
}

// With an ample buffer the first tolerance tried is kept: with one stage
// the first of the artifact's list not below the requested one (0.15: 0.2;
// 0: 0), with stages the requested one (its pipeline list adds it).
TEST(CadTest, PaperToleranceListsStartFromTheRequestedOne) {
  SimOptions o = TestOptions();
  o.hardware.attention_efficiency = {{1.0, 1.0}};
  o.comm_budget = 1'000'000'000;
  o.tolerance = 0.15;
  EXPECT_DOUBLE_EQ(SimulateOne(o, {{1024, 1024}}, SimStrategy::kDistcaPaper).tolerance_used, 0.2);
  o.tolerance = 0;
  EXPECT_DOUBLE_EQ(SimulateOne(o, {{1024, 1024}}, SimStrategy::kDistcaPaper).tolerance_used, 0.0);
  o.gpus = 8;
  o.pp = 2;
  o.tolerance = 0.15;
  EXPECT_DOUBLE_EQ(SimulateOne(o, {{1024, 1024}}, SimStrategy::kDistcaPaper).tolerance_used, 0.15);
}

TEST(CadTest, WithoutTheResendServersKeepWhatTheyServe) {
  // Two 1024-token documents, one per nano-batch, each laid out over both
  // ranks (1024 tokens a rank in the tick); a fixed 2 GiB buffer, so the
  // buffer term is the same in every wire format. Without the resend a rank
  // keeps, for every layer, the Q, K/V and O of every row it serves (its own
  // included) and drops its own rows' Q, K and V: memory moves by that much
  // against DistCA's resending format, on the rank that keeps the most.
  SimOptions o = TestOptions();
  o.hardware.attention_efficiency = {{1.0, 1.0}};
  o.cad_wire = PlanWire::kDistcaArtifact;
  const SimResult resend = SimulateOne(o, {{1024, 1024}}, SimStrategy::kDistcaPaper);
  o.cad_wire = PlanWire::kDistcaArtifactNoResend;
  const SimResult kept = SimulateOne(o, {{1024, 1024}}, SimStrategy::kDistcaPaper);
  PlanOptions po;
  po.ranks = 2;
  po.policy = PlanPolicy::kPaper;
  po.model = {4, 2, 16, 2, PlanWire::kDistcaArtifactNoResend};
  Plan plan;  // both nano-batches are this one document
  ASSERT_TRUE(BuildPlan({1024}, po, CostModel::Flops(po.model), &plan).ok());
  const PlanTraffic& t = plan.stats.traffic;
  const int d = int(PlanExchange::kForwardDispatch), f = int(PlanExchange::kForwardReturn);
  const sim::RankCosts k(o.model, o.hardware, o.tp);
  const double dropped = 1024 * (k.HiddenBytesPerToken() + k.KvBytesPerToken());         // Q, K, V of the rank's rows
  ASSERT_DOUBLE_EQ(k.HiddenBytesPerToken() + k.KvBytesPerToken(), (64 + 2 * 32) * 2.0);  // h 64, 2 K/V heads of 16
  double most = -1e300;
  for (int r = 0; r < 2; ++r) {
    const double served = 2.0 * double(t.exchange_received[d][r] + t.exchange_local[d][r] + t.exchange_sent[f][r] +
                                       t.exchange_local[f][r]);
    most = std::max(most, served - dropped);
  }
  EXPECT_NEAR(kept.memory_max_bytes - resend.memory_max_bytes, most * o.model.num_layers / 2,
              1e-6 * std::abs(most) * o.model.num_layers);
  // DistCA's pipeline schedule resends: no such format with stages.
  o.pp = 2;
  std::vector<SimResult> results;
  EXPECT_TRUE(Contains(Simulate(o, {{1024, 1024}}, {SimStrategy::kDistcaPaper}, &results),
                       "without pipeline stages only (pp 2)"));
}

TEST(CadTest, ArtifactBufferRoundsUpToWholeGiBPlusAHalf) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  EXPECT_DOUBLE_EQ(sim::DistcaArtifactEnlargedBuffer(1), 1.5 * kGiB);
  EXPECT_DOUBLE_EQ(sim::DistcaArtifactEnlargedBuffer(kGiB), 1.5 * kGiB);
  EXPECT_DOUBLE_EQ(sim::DistcaArtifactEnlargedBuffer(kGiB + 1), 2.5 * kGiB);
}

TEST(CadTest, NominalMemoryTakesTheLargerOfTheFirstAndLastStage) {
  // 4 devices, tp 2, pp 2: one rank per stage, one layer each, B = 2 chunks
  // of 1024: at c = 1 two waves of 1024 tokens a rank. The first stage holds
  // both waves' activations (2 x 1024 x 1664 B) and a layer backward's
  // working set (1024 x kWork), the last one wave's and its logits (1024 x
  // (1664 + 256 x 6) B); each half the weights, the optimizer unsharded (one
  // rank per stage), no buffer (budget 0); per device of tp 2.
  SimOptions o = TestOptions();
  o.pp = 2;
  o.comm_budget = 0;
  const double half = double(ParameterCount(o.model)) / 2;
  const double first = (half * 18 + 2 * 1024.0 * 1664 + 1024.0 * kWork) / 2,
               last = (half * 18 + 1024.0 * (1664 + 1536)) / 2;
  ASSERT_GT(first, last);
  EXPECT_NEAR(sim::CadMemoryBytes(sim::SimContext(o), 1), first, first * kRel);
  // A vocabulary 4x larger: the last stage's logits dominate.
  o.model.vocab_size = 1024;
  const double half_v = double(ParameterCount(o.model)) / 2;
  const double first_v = (half_v * 18 + 2 * 1024.0 * 1664 + 1024.0 * kWork) / 2,
               last_v = (half_v * 18 + 1024.0 * (1664 + 6144)) / 2;
  ASSERT_GT(last_v, first_v);
  EXPECT_NEAR(sim::CadMemoryBytes(sim::SimContext(o), 1), last_v, last_v * kRel);
}

// 8 devices as pp 2 stages of 2 ranks (tp 2), two micro-batches.
SimOptions TwoStagesOfTwoRanks() {
  SimOptions o = TestOptions();
  o.gpus = 8;
  o.pp = 2;
  o.micro_batches = 2;
  return o;
}

TEST(CadTest, EachStageKeepsItsWaveOnItsOwnRanks) {
  // Two active stages of 2 ranks: stage 0's nano-batch {1536}, stage 1's
  // {256, 256}. Pooled into one linear layout they would hold 512 tokens a
  // rank; each on its own ranks, 768 and 256.
  std::vector<PlanDocument> layout;
  ASSERT_TRUE(sim::StageLayout({{1536}, {256, 256}}, 2, &layout).ok());
  ASSERT_EQ(layout.size(), 3u);
  std::vector<int64_t> tokens(4, 0);
  for (const PlanDocument& d : layout)
    for (const PlanPiece& p : d.pieces) tokens[p.rank] += p.end - p.begin;
  EXPECT_EQ(tokens, (std::vector<int64_t>{768, 768, 256, 256}));
  EXPECT_EQ(layout[0].pieces.size(), 2u);  // the 1536 document, cut between ranks 0 and 1
  // A stage with nothing in this nano-batch holds nothing; one with fewer
  // tokens than ranks uses as many ranks as it has tokens.
  ASSERT_TRUE(sim::StageLayout({{}, {1}}, 2, &layout).ok());
  ASSERT_EQ(layout.size(), 1u);
  EXPECT_EQ(layout[0].pieces.size(), 1u);
  EXPECT_EQ(layout[0].pieces[0].rank, 2);

  // End to end: pp 2, two waves of different sizes ({1536} and {512}); in
  // the tick where both stages are busy, the last stage's ranks hold wave
  // 0's 768 tokens a rank, which its memory (one wave in flight, its
  // logits) shows: 768 tokens, not the 512 of a pooled layout.
  const SimOptions o = TwoStagesOfTwoRanks();
  const sim::SimContext ctx(o);
  sim::BatchOutcome out;
  ASSERT_TRUE(sim::SimulateDistca(ctx, {1536, 512}, 1, &out).ok());
  const double half = double(ParameterCount(o.model)) / 2;  // a stage's weights; one layer each
  const double last = (half * (6 + 12.0 / 2) + 768.0 * (1664 + 1536)) / 2;
  for (int r : {2, 3})  // with the buffers of what its exchanges move, reported apart
    EXPECT_NEAR(out.memory_bytes[r] - out.buffer_bytes[r], last, last * kRel) << r;
}

TEST(CadTest, EveryStageGivesEachOfItsRanksATokenInEachNanoBatch) {
  // pp 2, 2 ranks a stage, {1024, 1, 1024, 1024} balanced by tokens into
  // waves {1024, 1024} and {1024, 1}, each cut into nano-batches {1024} and
  // the rest. Tick 0: stage 0's wave 0, two plans. Tick 1: stage 1's wave
  // 0 and stage 0's wave 1, whose second nano-batch ({1}) cannot give both
  // of stage 0's ranks a token: one plan of whole waves, although the
  // stages' second nano-batches hold 1025 tokens for 4 ranks together.
  // Tick 2: stage 1's wave 1, one plan for the same reason.
  const SimOptions o = TwoStagesOfTwoRanks();
  const sim::SimContext ctx(o);
  sim::BatchOutcome out;
  ASSERT_TRUE(sim::SimulateDistca(ctx, {1024, 1, 1024, 1024}, 1, &out).ok());
  EXPECT_EQ(out.plans, 2 + 1 + 1);
  // A stage whose wave is one document runs it in the first nano-batch, its
  // ranks serving attention in the second: {2048, 1024, 2} balanced into
  // waves {2048} and {1024, 2}, the second cut into {1024} and {2}. Tick 0
  // (wave {2048} alone) has nothing to overlap: one plan. Tick 1: stage 0's
  // {2} gives each of its 2 ranks a token: two plans (pooled with stage
  // 1's empty part, 2 tokens for 4 ranks, it had run whole). Tick 2: two.
  ASSERT_TRUE(sim::SimulateDistca(ctx, {2048, 1024, 2}, 1, &out).ok());
  EXPECT_EQ(out.plans, 1 + 2 + 2);
}

TEST(CadTest, DistcaBalancesItsWavesByTokensWithPipelineStages) {
  // pp 2, two waves of nominally 2048 tokens from {1536, 1536, 512, 512}:
  // cut in order (distca-paper) they hold 1536 and 2560 tokens, balanced
  // (distca) 2048 each. Stage 0 holds both waves in flight at the peak, at
  // most 1280 tokens a rank in order, 1024 balanced: its memory shows it.
  SimOptions o = TestOptions();
  o.gpus = 8;
  o.pp = 2;
  o.batch_size = 4;
  o.micro_batches = 2;
  o.comm_budget = 1'000'000'000;
  const sim::SimContext ctx(o);
  const double half = double(ParameterCount(o.model)) / 2;
  // The buffer: DistCA's allocated four times (two dispatchers, each with a
  // send and a receive buffer); distca's, what its exchanges move, apart.
  auto stage0 = [&](double tokens, double copies) {
    return (half * (6 + 12.0 / 2) + 2 * tokens * 1664 + tokens * kWork + copies * 1e9 * 2) / 2;
  };
  const double four = sim::kDistcaArtifactBufferCopies;
  sim::BatchOutcome distca, paper;
  ASSERT_TRUE(sim::SimulateDistca(ctx, {1536, 1536, 512, 512}, 1, &distca).ok());
  ASSERT_TRUE(sim::SimulateDistcaPaper(ctx, {1536, 1536, 512, 512}, 1, &paper).ok());
  for (int r : {0, 1}) {
    EXPECT_NEAR(distca.memory_bytes[r] - distca.buffer_bytes[r], stage0(1024, 0), stage0(1024, 0) * kRel) << r;
    EXPECT_NEAR(paper.memory_bytes[r], stage0(1280, four), stage0(1280, four) * kRel) << r;
  }
  // With one stage the batch's order is kept: the same waves as the paper's.
  o.gpus = 4;
  o.pp = 1;
  const sim::SimContext flat(o);
  sim::BatchOutcome a, b;
  ASSERT_TRUE(sim::SimulateDistca(flat, {1536, 1536, 512, 512}, 1, &a).ok());
  ASSERT_TRUE(sim::SimulateDistcaPaper(flat, {1536, 1536, 512, 512}, 1, &b).ok());
  ASSERT_EQ(a.memory_bytes.size(), b.memory_bytes.size());
  for (size_t r = 0; r < a.memory_bytes.size(); ++r)  // the same tokens; the buffers differ
    EXPECT_NEAR(b.memory_bytes[r] - a.memory_bytes[r], four * 1e9 * 2 / 2 - a.buffer_bytes[r], 1e-3) << r;
}

TEST(CadTest, AlignedTicksHoldTwoPipelineDepthsLessOneWaves) {
  // pp 2, 4 waves of one 1024-token document, 512 tokens a rank. DistCA's
  // aligned ticks: stage 0 runs F0 F1 F2 B0 F3 B1 B2 B3 (its first
  // steady-state backward a dummy), stage 1 F0 B0 F1 B1 F2 B2 F3 B3: stage 0
  // holds 3 waves (1F1B would hold 2), stage 1 one wave and its logits (256
  // x 6 B per token).
  SimOptions o = TestOptions();
  o.gpus = 8;
  o.pp = 2;
  o.batch_size = 4;
  o.micro_batches = 4;
  o.comm_budget = 1'000'000'000;
  const sim::SimContext ctx(o);
  EXPECT_EQ(ctx.CadInFlight(4), 3);
  EXPECT_EQ(ctx.CadInFlight(4, 1), 1);
  EXPECT_EQ(ctx.CadInFlight(2), 2);
  const double half = double(ParameterCount(o.model)) / 2, states = half * (6 + 12.0 / 2), buffer = 1e9 * 2;
  for (SimStrategy s : {SimStrategy::kDistca, SimStrategy::kDistcaPaper}) {
    sim::BatchOutcome out;
    const Status st = s == SimStrategy::kDistca ? sim::SimulateDistca(ctx, {1024, 1024, 1024, 1024}, 1, &out)
                                                : sim::SimulateDistcaPaper(ctx, {1024, 1024, 1024, 1024}, 1, &out);
    ASSERT_TRUE(st.ok()) << st.ToString();
    // DistCA's buffer is allocated (four times); distca's holds what its
    // exchanges move, reported apart.
    const bool paper = s == SimStrategy::kDistcaPaper;
    for (int r : {0, 1}) {
      const double stage0 =
          (states + 3 * 512 * 1664.0 + 512 * kWork + (paper ? sim::kDistcaArtifactBufferCopies * buffer : 0)) / 2;
      const double stage1 =
          (states + 512 * 1664.0 + 512 * 1536.0 + (paper ? sim::kDistcaArtifactBufferCopies * buffer : 0)) / 2;
      const double own0 = paper ? 0 : out.buffer_bytes[r], own1 = paper ? 0 : out.buffer_bytes[2 + r];
      EXPECT_NEAR(out.memory_bytes[r] - own0, stage0, stage0 * kRel) << SimStrategyName(s) << r;
      EXPECT_NEAR(out.memory_bytes[2 + r] - own1, stage1, stage1 * kRel) << SimStrategyName(s) << r;
      if (paper) {
        EXPECT_DOUBLE_EQ(out.buffer_bytes[r], sim::kDistcaArtifactBufferCopies * buffer / 2);
      }
    }
  }
}

TEST(CadTest, WithPipelineStagesTheFastestDegreeThatFits) {
  // 8 devices, tp 2, pp 2: G = 2 ranks per stage, B = 2 chunks of 32
  // 64-token documents (linear work dominates). CAD at c = 1 runs one wave
  // of all of them (2 ticks a pass), at c = 2 two waves of half (3 ticks of
  // half the tokens): here c = 2 is faster, and c_min = 1 would have been
  // kept before. It must pick the faster of the two.
  SimOptions o = TestOptions();
  o.gpus = 8;
  o.pp = 2;
  o.batch_size = 2;
  const std::vector<std::vector<int64_t>> batch = {std::vector<int64_t>(32, 64)};
  for (SimStrategy s : {SimStrategy::kDistca, SimStrategy::kDistcaPaper}) {
    const sim::SimContext ctx(o);
    double time[3] = {0, 0, 0};
    for (int c : {1, 2}) {
      sim::BatchOutcome out;
      const Status st = s == SimStrategy::kDistca ? sim::SimulateDistca(ctx, batch[0], c, &out)
                                                  : sim::SimulateDistcaPaper(ctx, batch[0], c, &out);
      ASSERT_TRUE(st.ok()) << st.ToString();
      time[c] = out.iteration_s;
    }
    ASSERT_LT(time[2], time[1]) << SimStrategyName(s);
    const int fastest = 2;
    const SimResult r = SimulateOne(o, batch, s);
    EXPECT_EQ(r.cp, fastest) << SimStrategyName(s);
    EXPECT_DOUBLE_EQ(r.iteration_s, time[fastest]) << SimStrategyName(s);
  }
}

TEST(CadTest, WithPipelineStagesADegreeTheBudgetRulesOutIsSkipped) {
  // 8 devices, tp 2, pp 2 (G = 2 ranks a stage), B = 2 chunks of 1024:
  // {750, 274, 750, 274}. At c = 1 one wave of all four, at c = 2 two
  // waves of two; the nano-batches cut a document over a stage's two ranks,
  // and the second needs its K/V prefix from the first: what the layout
  // alone moves in one exchange, more at c = 1 than at c = 2. A budget of
  // 50,000 bytes a device (100,000 a rank) lies between: c = 1 cannot run
  // (FailedPrecondition), c = 2 runs with eps raised, and Simulate goes on
  // from the first to the second. Without a budget both run.
  SimOptions o = TestOptions();
  o.gpus = 8;
  o.pp = 2;
  o.batch_size = 2;
  const std::vector<int64_t> batch = {750, 274, 750, 274};
  o.comm_budget = 50'000;
  sim::BatchOutcome at2;
  {
    const sim::SimContext ctx(o);
    sim::BatchOutcome at1;
    const Status st1 = sim::SimulateDistca(ctx, batch, 1, &at1);
    EXPECT_EQ(st1.code(), StatusCode::kFailedPrecondition) << st1.ToString();
    EXPECT_TRUE(Contains(st1, "below what the linear layout alone moves")) << st1.ToString();
    const Status st2 = sim::SimulateDistca(ctx, batch, 2, &at2);
    ASSERT_TRUE(st2.ok()) << st2.ToString();
    EXPECT_GT(at2.tolerance_sum / at2.plans, o.tolerance);  // the budget binds
  }
  const SimResult r = SimulateOne(o, {batch}, SimStrategy::kDistca);
  EXPECT_EQ(r.cp, 2);
  EXPECT_DOUBLE_EQ(r.iteration_s, at2.iteration_s);
  o.comm_budget = 0;
  const sim::SimContext unbounded(o);
  for (int c : {1, 2}) {
    sim::BatchOutcome out;
    EXPECT_TRUE(sim::SimulateDistca(unbounded, batch, c, &out).ok()) << c;
  }
}

TEST(PipelineStrategiesTest, OneFOneBAgainstAlignedTicks) {
  // 4 devices, tp 2, pp 2: one rank per stage, one layer per stage, m = 2.
  SimOptions o = TestOptions();
  o.pp = 2;
  o.cp = 1;
  o.tolerance = 10;  // CAD: nothing is worth moving, so ticks are hand-computable
  const sim::RankCosts k(o.model, o.hardware, o.tp);
  const Parts p = PartsFor(o);
  const double a = p.lin + p.ca, c = 2 * p.lin + 2.5 * p.ca;
  const double p2p = k.PointToPoint(1024.0 * 128, true);  // 4 devices > 2 per node
  // 1F1B with f1 = a + head and b1 = c + 2 head on the last stage:
  //   makespan = a + 2 p2p + 2 (f1 + b1) + c.
  const double one_f_one_b = a + 2 * p2p + 2 * (a + p.head + c + 2 * p.head) + c;
  const SimResult mega = SimulateOne(o, {{1024, 1024}}, SimStrategy::kMegatron);
  EXPECT_NEAR(mega.iteration_s, one_f_one_b, one_f_one_b * kRel);
  // Aligned: 3 forward and 3 backward ticks of one layer each; the head runs
  // in the 2 ticks of each pass where the last stage is busy, and a p2p ends
  // the 2 where stage 0 is (forward: it sends; backward, mirrored: it
  // receives), not the one where only the last stage works.
  const double aligned = 3 * a + 3 * c + 2 * 2 * p2p + 2 * (p.head + 2 * p.head);
  const SimResult distca = SimulateOne(o, {{1024, 1024}}, SimStrategy::kDistca);
  const SimResult paper = SimulateOne(o, {{1024, 1024}}, SimStrategy::kDistcaPaper);
  EXPECT_NEAR(distca.iteration_s, aligned, aligned * kRel);
  EXPECT_NEAR(paper.iteration_s, aligned, aligned * kRel);
  // The paper's bubbles run dummy linear work (two forward ticks, 0 and 2,
  // and two backward ones have an idle stage, whose rank runs one layer of
  // a wave's 1024 tokens), neither faster nor busier: its results are
  // thrown away, so it counts as idle.
  EXPECT_NEAR(paper.idle_fraction, distca.idle_fraction, 1e-12);
  EXPECT_GT(paper.idle_fraction, 0.1);
  // That work, 2 x lin + 2 x 2 lin over the 2 ranks, is reported apart: 3
  // lin of each iteration.
  EXPECT_NEAR(paper.bubble_work_fraction, 3 * p.lin / aligned, 1e-12);
  EXPECT_EQ(distca.bubble_work_fraction, 0.0);
  // Memory per device (tp 2): each stage holds half the weights (the
  // optimizer unsharded, G = 1); stage 0 the activations of both
  // micro-batches in flight, stage 1 one micro-batch's and its logits (256 x
  // (2 + 4) bytes a token). distca also holds its runtime's buffers for
  // one layer (the comm budget bounds them, it is not allocated): with one
  // rank a stage nothing moves, but the server copies its own rows of a
  // 1024-token wave, at the backward's peak its Q, dO, LSE and delta (2 x
  // (128 + 16) B a row) and K/V (128 B), then dQ (128 B) and fp32 dK/dV
  // (256 B): 800 B a row, 400 a device.
  const double states = double(ParameterCount(o.model)) / 2 * (6 + 12);
  const double first = (states + 2 * 1024.0 * 1664 + 1024.0 * kWork) / 2,
               last = (states + 1024.0 * 1664 + 1024.0 * 1536) / 2;
  for (const SimResult* r : {&mega, &distca}) {
    const double buffers = r == &distca ? 1024.0 * 400 : 0.0;
    EXPECT_NEAR(r->memory_max_bytes, std::max(first, last) + buffers, first * kRel);
    EXPECT_NEAR(r->memory_mean_bytes, (first + last) / 2 + buffers, first * kRel);
  }
}

TEST(GradSyncTest, ClosesEveryIterationOnTheRanksThatHoldWeights) {
  SimOptions o = TestOptions();
  o.grad_sync = true;
  const sim::SimContext ctx(o);
  // G = 2 ranks of tp 2 on 4 devices, 2 per node: inter-node rings (10 GB/s,
  // 10 us). Reduce-scatter of 4 B gradients, all-gather of 2 B weights, each
  // device moving 1 / tp of them: (G - 1) latencies + P x bytes x (G - 1) /
  // G / (tp x bandwidth) each.
  const double P = double(ParameterCount(o.model));
  const double sync = 2 * 1e-5 + P * (4 + 2) * 0.5 / (2 * 10e9);
  EXPECT_NEAR(ctx.GradSyncSeconds(), sync, sync * kRel);
  // Appended to every strategy's iteration, the same at a shape.
  for (SimStrategy s : {SimStrategy::kWlbIdeal, SimStrategy::kMegatron, SimStrategy::kDistcaPaper, SimStrategy::kDistca,
                        SimStrategy::kColocated}) {
    const SimResult on = SimulateOne(o, {{1024, 512, 512}}, s);
    SimOptions off_options = o;
    off_options.grad_sync = false;
    const SimResult off = SimulateOne(off_options, {{1024, 512, 512}}, s);
    EXPECT_NEAR(on.iteration_s, off.iteration_s + sync, sync * kRel) << SimStrategyName(s);
    EXPECT_DOUBLE_EQ(on.grad_sync_s, ctx.GradSyncSeconds()) << SimStrategyName(s);
    EXPECT_EQ(off.grad_sync_s, 0.0) << SimStrategyName(s);
    EXPECT_DOUBLE_EQ(on.bytes_moved, off.bytes_moved) << SimStrategyName(s);
  }
  // Without the distributed optimizer: an all-reduce of the fp32 gradients
  // (reduce-scatter and all-gather of 4 B each), and the 12 B of master
  // weights and moments replicated: 12 P (1 - 1 / G) / tp = 3 P more per
  // device, for every strategy.
  SimOptions replicated = o;
  replicated.distributed_optimizer = false;
  const double all_reduce = 2 * 1e-5 + P * (4 + 4) * 0.5 / (2 * 10e9);
  EXPECT_NEAR(sim::SimContext(replicated).GradSyncSeconds(), all_reduce, all_reduce * kRel);
  // fp32 training: the weights gathered are 4 B too.
  SimOptions fp32 = o;
  fp32.hardware.dtype_bytes = 4;
  EXPECT_NEAR(sim::SimContext(fp32).GradSyncSeconds(), all_reduce, all_reduce * kRel);
  for (SimStrategy s : {SimStrategy::kWlbIdeal, SimStrategy::kMegatron, SimStrategy::kDistcaPaper, SimStrategy::kDistca,
                        SimStrategy::kColocated}) {
    const SimResult sharded = SimulateOne(o, {{1024, 512, 512}}, s);
    const SimResult full = SimulateOne(replicated, {{1024, 512, 512}}, s);
    EXPECT_NEAR(full.memory_max_bytes - sharded.memory_max_bytes, 3 * P, 3 * P * 1e-6) << SimStrategyName(s);
    EXPECT_NEAR(full.iteration_s - sharded.iteration_s, all_reduce - sync, sync * 1e-6) << SimStrategyName(s);
  }

  // Busy: the ranks that hold weights, not a stage's dedicated servers (pp
  // 2, G = 2 ranks then 1 server per stage).
  o.gpus = 8;
  o.pp = 2;
  const sim::SimContext two(o);
  ASSERT_EQ(two.stage_ranks, 2);
  sim::BatchOutcome b;
  b.iteration_s = 1;
  b.busy_s = {0.5, 0.5, 0.25, 0.5, 0.5, 0.25};
  ASSERT_TRUE(sim::AddGradSync(two, &b).ok());
  const double s2 = two.GradSyncSeconds();  // half the weights per stage
  EXPECT_NEAR(s2, 2 * 1e-5 + P / 2 * 6 * 0.5 / (2 * 10e9), s2 * kRel);
  EXPECT_DOUBLE_EQ(b.iteration_s, 1 + s2);
  EXPECT_EQ(b.busy_s, (std::vector<double>{0.5 + s2, 0.5 + s2, 0.25, 0.5 + s2, 0.5 + s2, 0.25}));
  b.busy_s.pop_back();  // 5 ranks are not 2 stages
  EXPECT_FALSE(sim::AddGradSync(two, &b).ok());
  b.busy_s = {0.5, 0.5};  // 1 rank per stage, not G = 2
  EXPECT_FALSE(sim::AddGradSync(two, &b).ok());

  // End to end, distca with a dedicated server per stage (8 devices, pp 2: 2
  // ranks and a server per stage): the sync lengthens the iteration, and of
  // the 6 ranks only the 4 that hold weights are busy for it, so the summed
  // idle time grows by 6 s - 4 s: idle' = (6 (I + s) - busy - 4 s) / (6 (I +
  // s)), busy = 6 I (1 - idle).
  o = TestOptions();
  o.gpus = 8;
  o.pp = 2;
  o.dedicated_servers = 1;
  SimOptions on_options = o;
  on_options.grad_sync = true;
  const double s3 = sim::SimContext(on_options).GradSyncSeconds();
  ASSERT_GT(s3, 0.0);
  const SimResult off = SimulateOne(o, {{1024, 1024}}, SimStrategy::kDistca);
  const SimResult on = SimulateOne(on_options, {{1024, 1024}}, SimStrategy::kDistca);
  const double I = off.iteration_s, busy = 6 * I * (1 - off.idle_fraction);
  EXPECT_NEAR(on.iteration_s, I + s3, I * kRel);
  EXPECT_NEAR(on.idle_fraction, (6 * (I + s3) - busy - 4 * s3) / (6 * (I + s3)), kRel);
}

TEST(SimulateTest, SpeedupIsOverWlbIdeal) {
  SimOptions o = TestOptions();
  std::vector<SimResult> results;
  ASSERT_TRUE(
      Simulate(o, {{1024, 512, 512}, {1024, 1024}}, {SimStrategy::kWlbIdeal, SimStrategy::kMegatron}, &results).ok());
  ASSERT_EQ(results.size(), 2u);
  EXPECT_DOUBLE_EQ(results[0].speedup, 1.0);
  EXPECT_DOUBLE_EQ(results[1].speedup, results[0].iteration_s / results[1].iteration_s);
  EXPECT_EQ(results[0].iteration_per_batch.size(), 2u);
  for (const SimResult& r : results) {
    ASSERT_EQ(r.idle_per_batch.size(), 2u);
    EXPECT_DOUBLE_EQ(r.idle_fraction, (r.idle_per_batch[0] + r.idle_per_batch[1]) / 2);
  }
  // The second batch (two equal documents on two ranks) leaves megatron no
  // idle time; the first (1024 beside 512 + 512) does.
  EXPECT_DOUBLE_EQ(results[1].idle_per_batch[1], 0.0);
  EXPECT_GT(results[1].idle_per_batch[0], 0.0);
}

TEST(SimulateTest, CadMicroBatchesAreTheWavesOfTheStrategiesThatRunWaves) {
  // 4 chunks as 4 micro-batches for the baselines, 2 waves for CAD: each
  // strategy as if the run gave it its own count.
  SimOptions o = TestOptions();
  o.batch_size = 4;
  o.micro_batches = 4;
  o.cad_micro_batches = 2;
  const std::vector<std::vector<int64_t>> batches = {{512, 1024, 256, 768, 1024, 512}};
  const std::vector<SimStrategy> all = {SimStrategy::kWlbIdeal, SimStrategy::kMegatron, SimStrategy::kDistcaPaper,
                                        SimStrategy::kDistca, SimStrategy::kColocated};
  std::vector<SimResult> mixed, four, two;
  ASSERT_TRUE(Simulate(o, batches, all, &mixed).ok());
  SimOptions each = o;
  each.cad_micro_batches = 0;
  ASSERT_TRUE(Simulate(each, batches, all, &four).ok());
  each.micro_batches = 2;
  ASSERT_TRUE(Simulate(each, batches, all, &two).ok());
  for (size_t i = 0; i < all.size(); ++i) {
    const double want = RunsAsWaves(all[i]) ? two[i].iteration_s : four[i].iteration_s;
    EXPECT_DOUBLE_EQ(mixed[i].iteration_s, want) << SimStrategyName(all[i]);
    if (RunsAsWaves(all[i]) || all[i] == SimStrategy::kWlbIdeal) {
      EXPECT_NE(two[i].iteration_s, four[i].iteration_s) << SimStrategyName(all[i]);
    }
  }
  // Speedups are over wlb-ideal's own micro-batches.
  EXPECT_DOUBLE_EQ(mixed[2].speedup, four[0].iteration_s / two[2].iteration_s);
  // It needs the baselines' count, and holds as that count must.
  o.micro_batches = 0;
  EXPECT_TRUE(Contains(ValidateSimOptions(o), "CAD micro-batches apply with micro-batches set"));
  o.micro_batches = 4;
  o.cad_micro_batches = -1;
  EXPECT_TRUE(Contains(ValidateSimOptions(o), "CAD micro-batches must be >= 0"));
  o.cad_micro_batches = 1 << 30;
  EXPECT_TRUE(Contains(ValidateSimOptions(o), "CAD micro-batches: "));
}

TEST(SimulateTest, RejectsBadOptionsAndBatches) {
  std::vector<SimResult> r;
  SimOptions o = TestOptions();
  o.gpus = 6;
  o.pp = 2;
  EXPECT_TRUE(Contains(Simulate(o, {{1024, 1024}}, {SimStrategy::kDistca}, &r), "not a multiple of tp x pp"));
  // tp x pp past an int (2 x 2^31 - 2): refused, not wrapped into a division by zero.
  o.pp = 0x7fffffff;
  EXPECT_TRUE(Contains(Simulate(o, {{1024, 1024}}, {SimStrategy::kDistca}, &r), "= 4294967294)"));
  o = TestOptions();
  o.batch_size = 3;
  o.cp = 1;
  EXPECT_TRUE(Contains(ValidateSimOptions(o), "batch size (3 chunks) is not a multiple of the 2 data-parallel"));
  o.cp = 0;
  EXPECT_TRUE(ValidateSimOptions(o).ok());  // CP 2: one replica runs all 3
  EXPECT_TRUE(Contains(Simulate(o, {{1024, 1024, 1024}}, {SimStrategy::kColocated}, &r),
                       "must be a multiple of the 2 ranks per stage (CP 1"));
  o = TestOptions();
  o.cp = 3;
  EXPECT_TRUE(Contains(ValidateSimOptions(o), "cp (3) must divide"));
  // eps past the bound would overflow the mean of a run's plans' eps.
  o = TestOptions();
  o.tolerance = kMaxSimTolerance;
  EXPECT_TRUE(ValidateSimOptions(o).ok());
  for (double bad : {-0.1, 2 * kMaxSimTolerance, std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::quiet_NaN()}) {
    o.tolerance = bad;
    EXPECT_TRUE(Contains(ValidateSimOptions(o), "tolerance must be a number in [0, 1e+06]")) << bad;
  }
  // Heads per tensor-parallel device: 4 query and 2 K/V heads.
  o = TestOptions();
  o.gpus = 6;
  o.tp = 3;
  EXPECT_TRUE(Contains(ValidateSimOptions(o), "tp (3) must divide the 4 query heads"));
  o.gpus = 8;
  o.tp = 4;  // one query head per device, the 2 K/V heads replicated twice
  EXPECT_TRUE(ValidateSimOptions(o).ok());
  o.model.q_heads = 6;
  o.model.kv_heads = 3;
  o.model.hidden = 96;
  o.tp = 2;
  o.gpus = 4;
  EXPECT_TRUE(Contains(ValidateSimOptions(o), "or be a multiple of, the 3 K/V heads"));
  o = TestOptions();
  o.model.num_layers = 3;
  o.pp = 2;
  EXPECT_TRUE(Contains(ValidateSimOptions(o), "do not split into pp = 2"));
  o = TestOptions();
  EXPECT_TRUE(Contains(Simulate(o, {{1024, 1000}}, {SimStrategy::kDistca}, &r), "holds 2024 tokens"));
  EXPECT_TRUE(
      Contains(Simulate(o, {{4096}}, {SimStrategy::kDistca}, &r), "outside [1, batch_size x max_doc_len = 2048]"));
  // A document longer than L (a docs file's) is accepted.
  EXPECT_TRUE(Simulate(o, {{2000, 48}}, {SimStrategy::kWlbIdeal, SimStrategy::kDistca}, &r).ok());
  // With pipeline stages CAD tries larger degrees after c_min; one whose
  // waves leave a rank without tokens (c 2: waves {2047} and {1} for 2
  // ranks) is skipped, not an error: c 1 runs.
  o.gpus = 8;
  o.pp = 2;
  for (SimStrategy s : {SimStrategy::kDistca, SimStrategy::kDistcaPaper}) {
    const Status st = Simulate(o, {{2047, 1}}, {s}, &r);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(r[0].cp, 1) << SimStrategyName(s);
  }
  o.gpus = 4;
  o.pp = 1;
  EXPECT_TRUE(Contains(Simulate(o, {}, {SimStrategy::kDistca}, &r), "no batches"));
  o.hardware = HardwareProfile{};
  EXPECT_TRUE(Contains(ValidateSimOptions(o), "hardware profile is incomplete"));
}

// 2 K/V heads at tp 4: each device holds a replica of one, so the job costs
// exactly what a model with 4 K/V heads does (weights, K/V projections,
// all-gathers, CAD's rows, memory).
TEST(SimulateTest, ReplicatedKvHeadsCostAsThatManyHeads) {
  SimOptions o = TestOptions();
  o.gpus = 8;
  o.tp = 4;
  o.cp = 2;  // the baselines' all-gathers
  o.grad_sync = true;
  SimOptions four = o;
  four.model.kv_heads = 4;
  EXPECT_DOUBLE_EQ(sim::SimContext(o).stage_params, sim::SimContext(four).stage_params);
  EXPECT_GT(sim::SimContext(o).stage_params, double(ParameterCount(o.model)));
  const std::vector<std::vector<int64_t>> batches = {{1024, 512, 512}, {2048}};
  for (SimStrategy s :
       {SimStrategy::kWlbIdeal, SimStrategy::kMegatron, SimStrategy::kDistcaPaper, SimStrategy::kDistca}) {
    const SimResult a = SimulateOne(o, batches, s), b = SimulateOne(four, batches, s);
    EXPECT_GT(a.bytes_moved, 0) << SimStrategyName(s);
    EXPECT_DOUBLE_EQ(a.bytes_moved, b.bytes_moved) << SimStrategyName(s);
    EXPECT_DOUBLE_EQ(a.iteration_s, b.iteration_s) << SimStrategyName(s);
    EXPECT_DOUBLE_EQ(a.memory_max_bytes, b.memory_max_bytes) << SimStrategyName(s);
  }
}

// Whether a CP group or a stage crosses nodes depends on where its devices
// sit, not only on its size: with 4 GPUs per node and tp 1, the group of
// ranks {3, 4, 5} spans two nodes though 3 devices fit on one.
TEST(SimulateTest, GroupsThatStraddleNodesRunOnTheInterNodeLink) {
  SimOptions o = TestOptions();
  o.hardware.gpus_per_node = 4;
  o.tp = 1;
  o.gpus = 6;
  const sim::SimContext flat(o);  // G 6: nodes {0-3}, {4, 5}
  EXPECT_FALSE(flat.CpInterNode(1));
  EXPECT_FALSE(flat.CpInterNode(2));  // {0,1} {2,3} {4,5}
  EXPECT_TRUE(flat.CpInterNode(3));   // {3,4,5}
  EXPECT_TRUE(flat.CpInterNode(6));
  EXPECT_TRUE(flat.stage_inter_node);
  o.pp = 2;
  const sim::SimContext piped(o);  // G 3: stage 0 on devices 0-2, stage 1 on 3-5
  EXPECT_FALSE(piped.CpInterNode(1));
  EXPECT_TRUE(piped.CpInterNode(3));  // stage 1's group
  EXPECT_TRUE(piped.stage_inter_node);
  EXPECT_TRUE(piped.pipeline_inter_node);  // device 1 (node 0) sends to device 4 (node 1)
  // Stages of 2 devices on 4-device nodes: stages 0-1 share node 0 and 2-3
  // node 1, but the boundary between stages 1 and 2 crosses, and the tick
  // waits for its message.
  o.gpus = 8;
  o.pp = 4;
  EXPECT_TRUE(sim::SimContext(o).pipeline_inter_node);
  o.gpus = 4;
  o.pp = 2;
  EXPECT_FALSE(sim::SimContext(o).pipeline_inter_node);  // one node
  o.gpus = 4;
  o.pp = 1;
  const sim::SimContext one_node(o);
  EXPECT_FALSE(one_node.CpInterNode(4));
  EXPECT_FALSE(one_node.stage_inter_node);
  // The ring's time follows: cp 3 pays the inter-node link, cp 2 does not.
  o.gpus = 6;
  o.batch_size = 6;
  std::vector<SimResult> r2, r3;
  o.cp = 2;
  ASSERT_TRUE(Simulate(o, {std::vector<int64_t>(6, 1024)}, {SimStrategy::kWlbIdeal}, &r2).ok());
  o.cp = 3;
  ASSERT_TRUE(Simulate(o, {std::vector<int64_t>(6, 1024)}, {SimStrategy::kWlbIdeal}, &r3).ok());
  EXPECT_GT(r3[0].breakdown.forward_comm_s, 5 * r2[0].breakdown.forward_comm_s);
}

// wlb-ideal's chunk micro-batches weigh attention against linear work at
// the model's breakpoint (576 tokens for the test model: 73728 linear FLOPs a
// token over 2 x 16 x 4), as the artifact's balancer does, not at L (1024).
// Here the two pack the batch into micro-batches of at most 1223 and 1127
// tokens (with L: {778, 143} and {489, 367, 224, 47}); the memory check sees
// the larger micro-batch.
TEST(SimulateTest, WlbPackingUsesTheModelsBreakpoint) {
  SimOptions o = TestOptions();
  o.cp = 1;  // 2 replicas of one micro-batch each
  const std::vector<int64_t> batch = {778, 143, 47, 367, 224, 489};
  const sim::SimContext ctx(o);
  EXPECT_DOUBLE_EQ(ctx.costs.LinearFlopsPerToken() / (2.0 * o.model.head_dim() * o.model.q_heads), 576.0);
  const std::vector<std::vector<int64_t>> at_breakpoint = sim::WlbPack(batch, 2, 576, 2048);
  const std::vector<std::vector<int64_t>> at_l = sim::WlbPack(batch, 2, 1024, 2048);
  auto largest = [](const std::vector<std::vector<int64_t>>& bins) {
    int64_t most = 0;
    for (const auto& b : bins) most = std::max(most, std::accumulate(b.begin(), b.end(), int64_t{0}));
    return most;
  };
  // By decreasing length, each document joins the bin of least WLB cost,
  // sum of (l/B)^2 + l/B. At B = 576: 778 (3.18) to bin 0; 489 (1.57), 367
  // (+1.04 = 2.61), 224 (+0.54 = 3.15) and 143 (3.15 < 3.18: +0.31) to bin
  // 1; 47 to bin 0: {778, 47} and {489, 367, 224, 143}, 1223 tokens. At B =
  // 1024: 778 (1.34) to bin 0; 489 (0.71), 367 (1.19), 224 (1.46) to bin 1;
  // 143 to bin 0 (1.50); 47 to bin 1: {778, 143} and {489, 367, 224, 47},
  // 1127 tokens.
  ASSERT_EQ(largest(at_breakpoint), 1223);
  ASSERT_EQ(largest(at_l), 1127);
  auto memory = [&](double tokens) {
    sim::MemoryInput mem;
    mem.stage_params = ctx.stage_params;
    mem.optimizer_shards = ctx.optimizer_shards;
    mem.activation_tokens = tokens * ctx.stage_layers;
    mem.logits_tokens = tokens;
    return sim::DeviceMemoryBytes(ctx.costs, mem);
  };
  const SimResult r = SimulateOne(o, {batch}, SimStrategy::kWlbIdeal);
  EXPECT_NEAR(r.memory_max_bytes, memory(1223), memory(1223) * 1e-12);
}

TEST(SimulateTest, ParsesStrategyLists) {
  std::vector<SimStrategy> s;
  ASSERT_TRUE(ParseSimStrategies("distca,wlb-ideal", &s).ok());
  EXPECT_EQ(s, (std::vector<SimStrategy>{SimStrategy::kDistca, SimStrategy::kWlbIdeal}));
  ASSERT_TRUE(ParseSimStrategies("colocated", &s).ok());
  EXPECT_EQ(s, (std::vector<SimStrategy>{SimStrategy::kColocated}));
  EXPECT_TRUE(Contains(ParseSimStrategies("distca,fast", &s), "unknown strategy 'fast'"));
  EXPECT_TRUE(Contains(ParseSimStrategies("distca,distca", &s), "listed twice"));
  EXPECT_TRUE(Contains(ParseSimStrategies("", &s), "unknown strategy ''"));
}

TEST(GridTest, PaperGridShapesAndCsv) {
  std::vector<GridPoint> points;
  ASSERT_TRUE(PaperGrid("3d", &points).ok());
  ASSERT_EQ(points.size(), 18u);  // the paper's Table 3: 2 models x 3 lengths x 3 GPU counts
  for (const GridPoint& p : points) {
    EXPECT_EQ(p.pp, 1);
    EXPECT_EQ(p.tp, 8);
    EXPECT_EQ(p.micro_batches, 1);
    EXPECT_EQ(p.recompute_mlp, p.max_doc_len >= 256 * 1024);
    EXPECT_DOUBLE_EQ(p.elongate, double(p.max_doc_len) / (64 * 1024));
  }
  // Llama-3-8B: 1M tokens per 64 GPUs at every length.
  for (int i = 0; i < 9; ++i)
    EXPECT_EQ(int64_t{points[i].batch_size} * points[i].max_doc_len, int64_t{points[i].gpus} / 64 * (1 << 20));
  EXPECT_EQ(points[0].Label(), "8B 128K 64");
  EXPECT_EQ(points[17].Label(), "34B 512K 256");
  EXPECT_EQ(points[17].batch_size, 8);
  ASSERT_TRUE(PaperGrid("4d", &points).ok());
  ASSERT_EQ(points.size(), 18u);  // Table 4
  for (const GridPoint& p : points) {
    EXPECT_EQ(p.pp, 2);
    EXPECT_EQ(p.micro_batches, 8);
    // CAD's micro-batches hold a ping and a pong chunk at least: where 8
    // would cut finer (B = 8: 8B 512K on 64 and 128 GPUs, 34B 384K on 128
    // and 256), 4.
    EXPECT_EQ(p.cad_micro_batches, p.batch_size < 16 ? p.batch_size / 2 : 0) << p.Label();
    if (p.model == "llama-34b") {
      EXPECT_LE(p.max_doc_len, 384 * 1024);
      EXPECT_GE(p.gpus, 128);
    }
    // The MLP recomputed from 256K, and at every length for 34B (the
    // artifact's 34B pipeline sweeps turn selective checkpointing on).
    EXPECT_EQ(p.recompute_mlp, p.max_doc_len >= 256 * 1024 || p.model == "llama-34b") << p.Label();
  }
  EXPECT_EQ(points[5].Label(), "8B 256K 256");
  EXPECT_EQ(points[5].batch_size, 32);
  EXPECT_FALSE(PaperGrid("5d", &points).ok());
  GridRecipe recipe;
  recipe.elongate_base = 128 * 1024;
  recipe.micro_batches = 2;
  ASSERT_TRUE(PaperGrid("3d", &points, recipe).ok());
  for (const GridPoint& p : points) {
    EXPECT_DOUBLE_EQ(p.elongate, double(p.max_doc_len) / (128 * 1024));
    EXPECT_EQ(p.micro_batches, 2);
    EXPECT_EQ(p.cad_micro_batches, 0) << p.Label();  // a count given for the grid holds for all
  }
  recipe.elongate_base = 0;
  EXPECT_FALSE(PaperGrid("3d", &points, recipe).ok());

  const std::string header = GridCsvHeader();
  SimResult r;
  r.strategy = SimStrategy::kDistcaPaper;
  r.grad_sync_s = 0.125;
  SimOptions run;
  run.wlb_scope = WlbScope::kWholeBatch;
  run.ping_pong = false;
  run.cad_wire = PlanWire::kDistca;
  run.comm_budget = 1000;
  run.tolerance = 0.1;
  run.dedicated_servers = 2;
  run.grad_sync = false;
  run.hardware.name = "h200-dgx";
  const std::string row = GridCsvRow(points[0], r, run, "whole");
  EXPECT_EQ(std::count(header.begin(), header.end(), ','), std::count(row.begin(), row.end(), ','));
  EXPECT_NE(row.find(",distca-paper,"), std::string::npos);
  // The last columns: micro-batches, MLP recomputation (128K: none), scope,
  // gradient sync seconds, then the run's settings, the packing and the
  // hardware profile.
  const std::string settings = ",0,distca,1000,0.1,2,0,1,1,0,whole,h200-dgx\n";
  EXPECT_NE(row.find("," + std::to_string(points[0].micro_batches) + ",0,whole-batch,0.125000" + settings),
            std::string::npos)
      << row;
  EXPECT_NE(header.find(",wlb_scope,grad_sync_s,ping_pong,wire,comm_budget,tolerance,servers,grad_sync,"
                        "distributed_optimizer,optimizer_moments,wlb_artifact_kv,packing,hardware\n"),
            std::string::npos);
  // A whole row, every column.
  r.iteration_s = 1.5;
  r.tokens_per_s = 12345.6;
  r.speedup = 1.2345;
  r.idle_fraction = 0.0625;
  r.memory_max_bytes = 12.5e9;
  r.memory_mean_bytes = 10.25e9;
  r.memory_fits = true;
  r.bytes_moved = 3.5e9;
  r.max_buffer_bytes = 2.125e9;
  r.cp = 4;
  r.tolerance_used = 0.05;
  r.load_max_over_mean = 1.03;
  const GridPoint& g = points[0];
  EXPECT_EQ(GridCsvRow(g, r, run, "whole"),
            g.Label() + "," + g.model + "," + std::to_string(g.gpus) + "," + std::to_string(g.tp) + "," +
                std::to_string(g.pp) + "," + std::to_string(g.max_doc_len) + "," + std::to_string(g.batch_size) +
                ",distca-paper,1.500000,12345.6,1.2345,0.0625,12.500,10.250,1,3.500,2.1250,4,0.050,1.0300," +
                std::to_string(g.micro_batches) + ",0,whole-batch,0.125000" + settings);
  // A row reports the micro-batches its strategy ran.
  GridPoint fewer = g;
  fewer.micro_batches = 8;
  fewer.cad_micro_batches = 4;
  EXPECT_NE(GridCsvRow(fewer, r, run, "whole").find(",0.050,1.0300,4,0,"), std::string::npos);
  r.strategy = SimStrategy::kWlbIdeal;
  EXPECT_NE(GridCsvRow(fewer, r, run, "whole").find(",8,0,whole-batch"), std::string::npos);
  r.strategy = SimStrategy::kDistcaPaper;
  // A profile's name with overrides holds commas (and could hold quotes):
  // the field is quoted, inner quotes doubled.
  run.hardware.name = "h200-dgx (linear_mfu=0.5, name=\"x\")";
  const std::string named = GridCsvRow(g, r, run, "whole");
  EXPECT_EQ(named.substr(named.rfind(",whole,")), ",whole,\"h200-dgx (linear_mfu=0.5, name=\"\"x\"\")\"\n");
  const std::string script = SpeedupPlotScript("g.csv", "s.png", "t", {SimStrategy::kWlbIdeal, SimStrategy::kDistca});
  EXPECT_NE(script.find("set output 's.png'"), std::string::npos);
  EXPECT_NE(script.find("every 2::1 using 11:xtic(1) title 'distca'"), std::string::npos);
  EXPECT_EQ(script.find("title 'wlb-ideal'"), std::string::npos);  // the reference is the dashed line at 1
  // A quote in a path is doubled inside gnuplot's single-quoted strings.
  const std::string quoted =
      SpeedupPlotScript("o'5/g.csv", "o'5/s.png", "t", {SimStrategy::kWlbIdeal, SimStrategy::kDistca});
  EXPECT_NE(quoted.find("set output 'o''5/s.png'"), std::string::npos) << quoted;
  EXPECT_NE(quoted.find("'o''5/g.csv' skip 1"), std::string::npos) << quoted;

  // The tolerance sweep's CSV and chart: eps first, the strategies in order.
  const std::string tol_header = ToleranceCsvHeader();
  const std::string tol_row = ToleranceCsvRow(0.1, r);
  EXPECT_EQ(std::count(tol_header.begin(), tol_header.end(), ','), std::count(tol_row.begin(), tol_row.end(), ','));
  EXPECT_EQ(tol_row.rfind("0.100,distca-paper,", 0), 0u);
  const std::string tol = TolerancePlotScript("t.csv", "t.png", "t", {SimStrategy::kDistcaPaper, SimStrategy::kDistca});
  EXPECT_NE(tol.find("set output 't.png'"), std::string::npos);
  EXPECT_NE(tol.find("every 2::0 using 1:3 with linespoints title 'distca-paper'"), std::string::npos);
  EXPECT_NE(tol.find("every 2::1 using 1:4 with linespoints title 'distca'"), std::string::npos);
}

}  // namespace
}  // namespace distca
