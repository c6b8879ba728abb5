// The planner's parts: layout, cost model, traffic, validation, JSON, budget.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "distca/plan.h"
#include "plan/planner_internal.h"

namespace distca {
namespace {

bool Contains(const Status& s, const std::string& needle) { return s.message().find(needle) != std::string::npos; }

TEST(LayoutTest, EqualTokensAndContiguousPieces) {
  std::vector<PlanDocument> docs;
  ASSERT_TRUE(LinearLayout({5, 1000, 3, 77, 2048}, 7, &docs).ok());
  std::vector<int64_t> tokens(7, 0);
  int last_rank = 0;
  for (const PlanDocument& d : docs) {
    int64_t pos = 0;
    for (const PlanPiece& p : d.pieces) {
      EXPECT_EQ(p.begin, pos);
      EXPECT_GE(p.rank, last_rank);  // documents are laid out in order
      last_rank = p.rank;
      tokens[p.rank] += p.end - p.begin;
      pos = p.end;
    }
    EXPECT_EQ(pos, d.length);
  }
  const auto [lo, hi] = std::minmax_element(tokens.begin(), tokens.end());
  EXPECT_LE(*hi - *lo, 1);
  EXPECT_EQ(std::accumulate(tokens.begin(), tokens.end(), int64_t{0}), 5 + 1000 + 3 + 77 + 2048);
}

TEST(LayoutTest, BadInput) {
  std::vector<PlanDocument> docs;
  EXPECT_TRUE(Contains(LinearLayout({}, 2, &docs), "no documents"));
  EXPECT_TRUE(Contains(LinearLayout({5, 0}, 2, &docs), "document 1 has length 0"));
  EXPECT_TRUE(Contains(LinearLayout({5, -3}, 2, &docs), "document 1 has length -3"));
  EXPECT_TRUE(Contains(LinearLayout({5}, 0, &docs), "ranks must be positive"));
  EXPECT_TRUE(Contains(LinearLayout({3}, 4, &docs), "cannot give each of 4 ranks a token"));
  EXPECT_EQ(LinearLayout({kMaxDocumentLength + 1}, 1, &docs).code(), StatusCode::kOutOfRange);
}

TEST(CostModelTest, CausalPairsAndMirroredPairs) {
  for (int64_t b = 0; b < 40; b += 3) {
    for (int64_t e = b; e < 60; e += 7) {
      int64_t brute = 0;
      for (int64_t row = b; row < e; ++row) brute += row + 1;  // row sees keys 0..row
      EXPECT_EQ(CausalPairs(b, e), brute) << b << " " << e;
    }
  }
  // DESIGN.md section 3: tokens p and L-1-p of a length-L document cost L+1.
  const int64_t L = 1000;
  for (int64_t p = 0; p < L / 2; p += 37) EXPECT_EQ(CausalPairs(p, p + 1) + CausalPairs(L - 1 - p, L - p), L + 1);
  const CostModel flops = CostModel::Flops({.q_heads = 32, .kv_heads = 8, .head_dim = 128, .dtype_bytes = 2});
  EXPECT_DOUBLE_EQ(flops.TaskCost(0, 4096), 4.0 * CausalPairs(0, 4096) * 128 * 32);
  EXPECT_EQ(flops.TaskCost(5, 5), 0.0);
}

TEST(CostModelTest, TableInterpolatesBilinearlyAndScalesOutside) {
  CostModel t;
  const std::string csv =
      "# seconds per task\nq_len,kv_len,seconds\n128,128,1\n128,1024,4\n512,512,3\n512,1024,8\n"
      "128,512,2\n";  // (512, 128) is below the diagonal and filled from (128, 128)
  ASSERT_TRUE(CostModel::FromTableCsv(csv, &t).ok());
  EXPECT_TRUE(t.measured());
  EXPECT_DOUBLE_EQ(t.TaskCost(1024 - 512, 1024), 8.0);  // q 512, kv 1024: a grid point
  EXPECT_DOUBLE_EQ(t.TaskCost(512 - 128, 512), 2.0);
  // Midpoint of q in [128, 512] at kv 1024: halfway between 4 and 8.
  EXPECT_DOUBLE_EQ(t.TaskCost(1024 - 320, 1024), 6.0);
  // Beyond the grid: kv 2048 scales the (512, 1024) value by the pair ratio.
  const double pairs_in = 512.0 * 1024 - 512.0 * 511 / 2, pairs_out = 512.0 * 2048 - 512.0 * 511 / 2;
  EXPECT_NEAR(t.TaskCost(2048 - 512, 2048), 8.0 * pairs_out / pairs_in, 1e-9);
}

// The lookup finds a cell by the coordinate's binary exponent; checked
// against a plain search over grids with several points per octave and few
// on a power of two, at every grid point, between them and beyond both
// ends (where costs scale from the clamped point by causal pairs), and on a
// table of one point.
TEST(CostModelTest, TableLookupMatchesABinarySearch) {
  const std::vector<double> q = {3, 5, 6, 7, 12, 100, 1000}, kv = {3, 5, 6, 7, 12, 100, 1000, 1500, 70000};
  std::string csv = "q_len,kv_len,seconds\n";
  std::vector<double> at(q.size() * kv.size());
  for (size_t i = 0; i < q.size(); ++i)
    for (size_t j = 0; j < kv.size(); ++j) {
      at[i * kv.size() + j] = 1e-6 * double(1 + 3 * i + 7 * j + (i * j) % 5);
      if (kv[j] >= q[i]) csv += fmt::format("{},{},{}\n", q[i], kv[j], at[i * kv.size() + j]);
    }
  for (size_t i = 0; i < q.size(); ++i)  // cells below the diagonal copy (kv, kv)
    for (size_t j = 0; j < kv.size(); ++j)
      if (kv[j] < q[i])
        at[i * kv.size() + j] = at[size_t(std::find(q.begin(), q.end(), kv[j]) - q.begin()) * kv.size() + j];
  CostModel t;
  ASSERT_TRUE(CostModel::FromTableCsv(csv, &t).ok());
  const auto bracket = [](const std::vector<double>& g, double x) {
    x = std::clamp(x, g.front(), g.back());
    size_t i = size_t(std::upper_bound(g.begin(), g.end(), x) - g.begin());
    i = std::clamp<size_t>(i, 1, g.size() - 1) - 1;
    return std::pair{i, (x - g[i]) / (g[i + 1] - g[i])};
  };
  std::vector<int64_t> kv_lens;
  for (int64_t kv_len = 1; kv_len <= 90000; kv_len += kv_len < 200 ? 1 : 97) kv_lens.push_back(kv_len);
  kv_lens.insert(kv_lens.end(), {1000, 1500, 70000, 70001, 1 << 20});
  for (int64_t kv_len : kv_lens) {
    for (int64_t q_len :
         {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{6}, int64_t{8}, int64_t{12}, int64_t{13}, int64_t{99},
          int64_t{100}, int64_t{512}, int64_t{1000}, int64_t{1001}, int64_t{5000}}) {
      if (q_len > kv_len) continue;
      const auto [qi, qw] = bracket(q, double(q_len));
      const auto [ki, kw] = bracket(kv, double(kv_len));
      const auto cell = [&](size_t a, size_t b) { return at[a * kv.size() + b]; };
      double want = (1 - qw) * ((1 - kw) * cell(qi, ki) + kw * cell(qi, ki + 1)) +
                    qw * ((1 - kw) * cell(qi + 1, ki) + kw * cell(qi + 1, ki + 1));
      const double qc = std::clamp(double(q_len), q.front(), q.back());
      const double kc = std::clamp(double(kv_len), kv.front(), kv.back());
      if (qc != double(q_len) || kc != double(kv_len))
        want *= CausalPairsReal(double(q_len), double(kv_len)) / CausalPairsReal(std::min(qc, kc), kc);
      EXPECT_NEAR(t.TaskCost(kv_len - q_len, kv_len), want, 1e-15 * std::max(1.0, want)) << q_len << ", " << kv_len;
    }
  }
  // One point: every task scales from it by causal pairs.
  CostModel one;
  ASSERT_TRUE(CostModel::FromTableCsv("q_len,kv_len,seconds\n64,256,2e-3\n", &one).ok());
  for (int64_t kv_len : {1, 64, 256, 1000}) {
    for (int64_t q_len : {int64_t{1}, int64_t{64}, kv_len}) {
      if (q_len > kv_len) continue;
      EXPECT_NEAR(one.TaskCost(kv_len - q_len, kv_len),
                  2e-3 * CausalPairsReal(double(q_len), double(kv_len)) / CausalPairsReal(64, 256), 1e-15)
          << q_len << ", " << kv_len;
    }
  }
}

std::vector<int64_t> Skewed();  // below: one long document and many short ones

// The busiest rank's forward + backward bytes in a plan of `docs` at eps
// under `policy`, without a budget.
int64_t MaxRankBytesAt(const std::vector<int64_t>& docs, PlanOptions o, const CostModel& cost, double eps,
                       PlanPolicy policy) {
  o.policy = policy;
  o.tolerance = eps;
  o.comm_budget = 0;
  Plan q;
  EXPECT_TRUE(BuildPlan(docs, o, cost, &q).ok());
  return q.stats.traffic.max_rank_bytes();
}

// With a measured table a merged task does not cost the sum of its parts;
// bound_met still says whether the final loads meet (1 + eps) x their mean.
TEST(PlannerTest, BoundMetDescribesTheFinalLoadsUnderATable) {
  CostModel t;
  ASSERT_TRUE(CostModel::FromTableCsv("q_len,kv_len,seconds\n128,128,1\n128,4096,9\n4096,4096,40\n", &t).ok());
  int met = 0, missed = 0;
  for (const std::vector<int64_t>& docs :
       {std::vector<int64_t>{4096, 512, 256, 1024, 128, 2048}, std::vector<int64_t>{8192, 128, 128, 256}, Skewed()}) {
    for (int servers : {0, 3}) {
      for (double eps : {0.0, 0.01, 0.05, 0.3}) {
        PlanOptions o;
        o.ranks = 4;
        o.dedicated_servers = servers;
        o.tolerance = eps;
        Plan p;
        ASSERT_TRUE(BuildPlan(docs, o, t, &p).ok());
        EXPECT_TRUE(ValidatePlan(p, t).ok());
        const bool within = p.stats.load_max <= (1 + eps) * p.stats.load_mean * (1 + 1e-9);
        EXPECT_EQ(p.bound_met, within) << docs.size() << " documents, " << servers << " servers, eps " << eps;
        (within ? met : missed) += 1;
      }
    }
  }
  // Both answers occur (8 and 16 today), so both are checked.
  EXPECT_GT(met, 0);
  EXPECT_GT(missed, 0);
}

// A table with a per-task floor (a kernel call costs something however
// small): a move that joins the receiver's task of the document is charged
// what it adds to that task, not its own cost with the floor. Charged the
// floor per block, the greedy moved one block at a time, its receiver
// looked full early, and block 8 missed a bound that block 128 meets
// (max/mean 1.189 against 1.020; found by a randomized search).
TEST(PlannerTest, SmallBlocksUnderATableWithAFloorMeetTheBound) {
  CostModel t;
  ASSERT_TRUE(CostModel::FromTableCsv("q_len,kv_len,seconds\n1,1,0.00001\n1,2048,0.00001\n2048,2048,0.001\n", &t).ok());
  for (int64_t block : {128, 8, 1}) {
    PlanOptions o;
    o.ranks = 2;
    o.tolerance = 0.1;
    o.block = block;
    Plan p;
    ASSERT_TRUE(BuildPlan({2048}, o, t, &p).ok());
    EXPECT_TRUE(ValidatePlan(p, t).ok());
    EXPECT_TRUE(p.bound_met) << "block " << block << ": max/mean " << p.stats.max_over_mean();
    EXPECT_LE(p.stats.max_over_mean(), 1.1 * (1 + 1e-9)) << "block " << block;
  }
}

TEST(CostModelTest, TableErrors) {
  CostModel t;
  EXPECT_TRUE(Contains(CostModel::FromTableCsv("q,kv,s\n1,1,1\n", &t), "expected header"));
  EXPECT_TRUE(Contains(CostModel::FromTableCsv("q_len,kv_len,seconds\n", &t), "no data rows"));
  EXPECT_TRUE(Contains(CostModel::FromTableCsv("q_len,kv_len,seconds\n1,2\n", &t), "three comma-separated"));
  EXPECT_TRUE(Contains(CostModel::FromTableCsv("q_len,kv_len,seconds\n4,2,1\n", &t), "q_len <= kv_len"));
  EXPECT_TRUE(Contains(CostModel::FromTableCsv("q_len,kv_len,seconds\n1,2,-1\n", &t), "seconds > 0"));
  EXPECT_TRUE(Contains(CostModel::FromTableCsv("q_len,kv_len,seconds\n1,2,1\n1,2,3\n", &t), "duplicate"));
  // So large that loads would overflow to infinity.
  EXPECT_TRUE(Contains(CostModel::FromTableCsv("q_len,kv_len,seconds\n128,128,1e308\n", &t), "beyond 1e9"));
  EXPECT_TRUE(Contains(CostModel::FromTableCsv("q_len,kv_len,seconds\n4096,4096,5e-324\n", &t), "below 1e-15"));
  EXPECT_TRUE(Contains(CostModel::FromTableCsv("q_len,kv_len,seconds\n1e160,1e160,1\n", &t), "beyond 2^32"));
  EXPECT_TRUE(Contains(CostModel::FromTableCsv("q_len,kv_len,seconds\n1,2,1\n2,4,1\n", &t), "not a full grid"));
  // A table of kMaxTableRows rows loads; one more row is refused.
  std::string big = "q_len,kv_len,seconds\n";
  for (int64_t i = 1; i <= CostModel::kMaxTableRows; ++i) big += fmt::format("1,{},1\n", i);
  EXPECT_TRUE(CostModel::FromTableCsv(big, &t).ok());
  big += fmt::format("1,{},1\n", CostModel::kMaxTableRows + 1);
  EXPECT_TRUE(Contains(CostModel::FromTableCsv(big, &t), "table line 65538: more than 65536 data rows"));
}

// A plan small enough to count its bytes by hand (see the comments).
Plan HandPlan() {
  Plan p;
  p.ranks = 2;
  p.block = 2;
  p.model = {.q_heads = 2, .kv_heads = 1, .head_dim = 4, .dtype_bytes = 2};
  // 8 tokens, 4 per rank: rank 0 holds doc 0 [0, 4); rank 1 holds doc 0 [4, 6) and doc 1 [0, 2).
  EXPECT_TRUE(LinearLayout({6, 2}, 2, &p.documents).ok());
  p.tasks = {{0, 0, 4, 1}, {0, 4, 6, 1}, {1, 0, 2, 0}};
  return p;
}

TEST(StatsTest, HandCountedTraffic) {
  Plan p = HandPlan();
  const CostModel cost = CostModel::Flops(p.model);
  PlanStats s;
  ASSERT_TRUE(ComputePlanStats(p, cost, &s).ok());
  // Rows: Q/O/dO/dQ 2*4*2 = 16 B, K+V 2*1*4*2 = 16 B, LSE/delta 2*4 = 8 B, dK+dV fp32 32 B.
  // Foreign query rows: doc 0 [0, 4) on server 1 (owner rank 0), doc 1 [0, 2) on server 0 (owner 1): 6.
  // Foreign K/V rows: doc 0 [0, 6) minus held [4, 6) on server 1: 4; doc 1 [0, 2) on server 0: 2.
  EXPECT_EQ(s.traffic.forward_bytes, 6 * (16 + 16 + 8) + 6 * 16);             // Q; O+LSE; K/V
  EXPECT_EQ(s.traffic.backward_bytes, 6 * (3 * 16 + 2 * 8) + 6 * (16 + 32));  // Q,dO,LSE,delta,dQ; K/V, dK/dV
  EXPECT_EQ(s.traffic.sent[0], 4 * 64 + 4 * 32 + 2 * 40 + 2 * 32);            // to server 1; back to rank 1
  EXPECT_EQ(s.traffic.received[0], 4 * 40 + 4 * 32 + 2 * 64 + 2 * 32);
  EXPECT_EQ(s.traffic.sent[1], s.traffic.received[0]);
  EXPECT_EQ(s.traffic.received[1], s.traffic.sent[0]);
  EXPECT_EQ(s.traffic.total_bytes(), s.traffic.sent[0] + s.traffic.sent[1]);
  EXPECT_EQ(s.traffic.max_rank_bytes(), std::max(s.traffic.sent[0], s.traffic.received[0]));
  // By exchange, rank 0: as owner it ships 4 query rows and 4 K/V rows to
  // server 1; as a server it takes 2 and 2 from rank 1.
  const auto at = [&](PlanExchange e) { return static_cast<size_t>(e); };
  const std::array<int64_t, kPlanExchanges> sent0 = {
      4 * 16 + 4 * 16,            // forward dispatch: Q, K/V
      2 * (16 + 8),               // forward return: O, LSE
      4 * 2 * (16 + 8) + 4 * 16,  // backward dispatch: Q, dO, LSE, delta; K/V
      2 * 16 + 2 * 32};           // backward return: dQ; dK/dV in fp32
  const std::array<int64_t, kPlanExchanges> received0 = {2 * 16 + 2 * 16, 4 * (16 + 8), 2 * 2 * (16 + 8) + 2 * 16,
                                                         4 * 16 + 4 * 32};
  EXPECT_EQ(s.traffic.max_exchange_bytes(), 4 * 2 * (16 + 8) + 4 * 16);  // rank 0's backward dispatch
  int64_t sum = 0;
  for (PlanExchange e : {PlanExchange::kForwardDispatch, PlanExchange::kForwardReturn, PlanExchange::kBackwardDispatch,
                         PlanExchange::kBackwardReturn}) {
    SCOPED_TRACE(at(e));
    EXPECT_EQ(s.traffic.exchange_sent[at(e)][0], sent0[at(e)]);
    EXPECT_EQ(s.traffic.exchange_received[at(e)][0], received0[at(e)]);
    // Two ranks: what one sends the other receives.
    EXPECT_EQ(s.traffic.exchange_sent[at(e)][1], received0[at(e)]);
    EXPECT_EQ(s.traffic.exchange_received[at(e)][1], sent0[at(e)]);
    sum += sent0[at(e)];
  }
  EXPECT_EQ(sum, s.traffic.sent[0]);
  // Rows that stay: server 1 holds doc 0 [4, 6) itself, 2 query rows and 2
  // K/V rows; server 0 holds nothing it serves.
  const std::array<int64_t, kPlanExchanges> local1 = {2 * 16 + 2 * 16, 2 * (16 + 8), 2 * 2 * (16 + 8) + 2 * 16,
                                                      2 * 16 + 2 * 32};
  for (int e = 0; e < kPlanExchanges; ++e) {
    EXPECT_EQ(s.traffic.exchange_local[e][0], 0);
    EXPECT_EQ(s.traffic.exchange_local[e][1], local1[e]);
  }
  // With them, the largest is server 1's backward dispatch: rank 0's 4 rows
  // in, plus its own 2.
  EXPECT_EQ(s.traffic.max_exchange_bytes(true), 4 * 2 * (16 + 8) + 4 * 16 + local1[2]);
  EXPECT_DOUBLE_EQ(s.load[1], 32.0 * CausalPairs(0, 6));  // 4 * D * Hq = 32 FLOPs per pair
  EXPECT_DOUBLE_EQ(s.load[0], 32.0 * CausalPairs(0, 2));
  EXPECT_EQ(s.tasks, 3);
}

// Pieces in order are found by binary search, and a document's K/V traffic
// counted per owner and server when it has many (AddPrefixTraffic); pieces
// in any other order (a plan file may list them so) are scanned pair by
// pair: both count the same bytes. A document in many pieces on random
// ranks, tasks cut inside and across them, on ranks and dedicated servers.
TEST(StatsTest, PiecesOutOfOrderCountTheSameBytes) {
  std::mt19937 rng(7);
  Plan p;
  p.ranks = 3;
  p.dedicated_servers = 2;
  p.block = 64;
  p.model = {.q_heads = 2, .kv_heads = 1, .head_dim = 4, .dtype_bytes = 2};
  for (int64_t length : {997, 5}) {
    PlanDocument doc;
    doc.length = length;
    for (int64_t pos = 0; pos < length;) {
      const int64_t end = std::min(length, pos + 1 + int64_t(rng() % 40));
      doc.pieces.push_back({int(rng() % 3), pos, end});
      pos = end;
    }
    p.documents.push_back(doc);
  }
  // Tasks cut at random piece boundaries and block multiples (allowed cuts).
  for (int32_t d = 0; d < 2; ++d) {
    const PlanDocument& doc = p.documents[d];
    std::vector<int64_t> cuts;
    for (const PlanPiece& piece : doc.pieces)
      if (rng() % 2) cuts.push_back(piece.end);
    for (int64_t pos = p.block; pos < doc.length; pos += p.block) cuts.push_back(pos);
    cuts.push_back(doc.length);
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    int64_t pos = 0;
    for (int64_t end : cuts) {
      p.tasks.push_back({d, pos, end, int32_t(rng() % 5)});
      pos = end;
    }
  }
  const CostModel cost = CostModel::Flops(p.model);
  PlanStats ordered;
  ASSERT_TRUE(ComputePlanStats(p, cost, &ordered).ok());
  p.stats = ordered;
  ASSERT_TRUE(ValidatePlanForLayout(p, cost).ok());
  {  // A cut one row past a piece boundary that is no block multiple is refused.
    Plan bad = p;
    const std::vector<PlanPiece>& pieces = p.documents[0].pieces;
    auto piece_end = [&](int64_t pos) {
      return std::any_of(pieces.begin(), pieces.end(), [&](const PlanPiece& q) { return q.end == pos; });
    };
    size_t i = 0;  // a task of document 0 ending at a piece boundary, with room after it
    while (bad.tasks[i].q_end % p.block == 0 || piece_end(bad.tasks[i].q_end + 1) ||
           bad.tasks[i].q_end + 1 >= bad.tasks[i + 1].q_end)
      ++i;
    ASSERT_EQ(bad.tasks[i + 1].doc, 0);
    ++bad.tasks[i].q_end;
    ++bad.tasks[i + 1].q_begin;
    ASSERT_TRUE(ComputePlanStats(bad, cost, &bad.stats).ok());
    EXPECT_TRUE(Contains(ValidatePlanForLayout(bad, cost), "not a multiple of the block"));
  }
  Plan shuffled = p;
  for (PlanDocument& doc : shuffled.documents) std::reverse(doc.pieces.begin(), doc.pieces.end());
  PlanStats scanned;
  ASSERT_TRUE(ComputePlanStats(shuffled, cost, &scanned).ok());
  const PlanTraffic& a = ordered.traffic;
  const PlanTraffic& b = scanned.traffic;
  EXPECT_GT(a.total_bytes(), 0);
  EXPECT_EQ(a.forward_bytes, b.forward_bytes);
  EXPECT_EQ(a.backward_bytes, b.backward_bytes);
  EXPECT_EQ(a.sent, b.sent);
  EXPECT_EQ(a.received, b.received);
  EXPECT_EQ(a.exchange_sent, b.exchange_sent);
  EXPECT_EQ(a.exchange_received, b.exchange_received);
  EXPECT_EQ(a.exchange_local, b.exchange_local);
  EXPECT_EQ(ordered.load, scanned.load);
}

// Rank 0's bytes per exchange as given; with two ranks, what one sends the
// other receives.
void ExpectTwoRankExchanges(const PlanTraffic& t, const std::array<int64_t, kPlanExchanges>& sent0,
                            const std::array<int64_t, kPlanExchanges>& received0) {
  for (int e = 0; e < kPlanExchanges; ++e) {
    SCOPED_TRACE(e);
    EXPECT_EQ(t.exchange_sent[e][0], sent0[e]);
    EXPECT_EQ(t.exchange_received[e][0], received0[e]);
    EXPECT_EQ(t.exchange_sent[e][1], received0[e]);
    EXPECT_EQ(t.exchange_received[e][1], sent0[e]);
  }
}

TEST(StatsTest, HandCountedTrafficInDistcasArtifactFormat) {
  // The hand plan above, with the published DistCA's rows: its backward
  // dispatch carries Q, O, dO and LSE (3 * 16 + 8 B) and its dK/dV return in
  // bf16 (16 B); the rest as this project's runtime.
  Plan p = HandPlan();
  p.model.wire = PlanWire::kDistcaArtifact;
  PlanStats s;
  ASSERT_TRUE(ComputePlanStats(p, CostModel::Flops(p.model), &s).ok());
  const std::array<int64_t, kPlanExchanges> sent0 = {4 * 16 + 4 * 16, 2 * (16 + 8), 4 * (3 * 16 + 8) + 4 * 16,
                                                     2 * 16 + 2 * 16};
  const std::array<int64_t, kPlanExchanges> received0 = {2 * 16 + 2 * 16, 4 * (16 + 8), 2 * (3 * 16 + 8) + 2 * 16,
                                                         4 * 16 + 4 * 16};
  const std::array<int64_t, kPlanExchanges> local1 = {2 * 16 + 2 * 16, 2 * (16 + 8), 2 * (3 * 16 + 8) + 2 * 16,
                                                      2 * 16 + 2 * 16};
  ExpectTwoRankExchanges(s.traffic, sent0, received0);
  for (int e = 0; e < kPlanExchanges; ++e) EXPECT_EQ(s.traffic.exchange_local[e][1], local1[e]) << e;
  EXPECT_EQ(s.traffic.forward_bytes, 6 * (16 + 16 + 8) + 6 * 16);
  EXPECT_EQ(s.traffic.backward_bytes, 6 * (3 * 16 + 8 + 16) + 6 * (16 + 16));
}

TEST(StatsTest, HandCountedTrafficInDistcasNoResendFormat) {
  // The same plan in DistCA's format without the resend: the forward returns
  // O alone, the backward dispatch carries dO alone (the server kept Q, K/V,
  // O and LSE), dQ and dK/dV return in bf16.
  Plan p = HandPlan();
  p.model.wire = PlanWire::kDistcaArtifactNoResend;
  PlanStats s;
  ASSERT_TRUE(ComputePlanStats(p, CostModel::Flops(p.model), &s).ok());
  const std::array<int64_t, kPlanExchanges> sent0 = {4 * 16 + 4 * 16, 2 * 16, 4 * 16, 2 * 16 + 2 * 16};
  const std::array<int64_t, kPlanExchanges> received0 = {2 * 16 + 2 * 16, 4 * 16, 2 * 16, 4 * 16 + 4 * 16};
  ExpectTwoRankExchanges(s.traffic, sent0, received0);
  EXPECT_EQ(s.traffic.forward_bytes, 6 * (16 + 16) + 6 * 16);
  EXPECT_EQ(s.traffic.backward_bytes, 6 * 16 + 6 * (16 + 16));
  PlanWire wire;
  ASSERT_TRUE(ParsePlanWire("distca-artifact-no-resend", &wire).ok());
  EXPECT_EQ(wire, PlanWire::kDistcaArtifactNoResend);
  EXPECT_STREQ(PlanWireName(wire), "distca-artifact-no-resend");
}

// A hand-built plan's shape is bounded before anything is sized by it.
TEST(ValidateTest, HugeRankCountsAreRefusedBeforeAllocating) {
  Plan p;
  p.ranks = std::numeric_limits<int>::max();
  const CostModel cost = CostModel::Flops(p.model);
  for (const Status& s : {ValidatePlan(p, cost), ValidatePlanForLayout(p, cost), ValidatePlanStructure(p)}) {
    EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << s.ToString();
    EXPECT_NE(s.message().find("above the limit"), std::string::npos) << s.ToString();
  }
}

TEST(ValidateTest, AcceptsTheHandPlanAndCatchesEveryBreak) {
  const CostModel cost = CostModel::Flops(HandPlan().model);
  auto validated = [&](Plan p) {
    const Status st = ComputePlanStats(p, cost, &p.stats);
    return st.ok() ? ValidatePlan(p, cost) : st;
  };
  EXPECT_TRUE(validated(HandPlan()).ok());

  Plan p = HandPlan();
  p.tasks.pop_back();
  EXPECT_TRUE(Contains(validated(p), "computed by no task"));
  p = HandPlan();
  p.tasks[1].q_begin = 2;  // [2, 6) overlaps [0, 4)
  EXPECT_TRUE(Contains(validated(p), "computed twice"));
  p = HandPlan();
  p.tasks.back().q_end = p.documents[p.tasks.back().doc].length + 2;  // a block multiple past the end
  EXPECT_TRUE(Contains(validated(p), "run past its length"));
  p = HandPlan();
  p.tasks[0].q_end = 3;  // 3 is no block multiple (block 2) nor a piece boundary
  p.tasks[1].q_begin = 3;
  EXPECT_TRUE(Contains(validated(p), "not a multiple of the block"));
  p = HandPlan();
  p.tasks[2].server = 2;
  EXPECT_TRUE(Contains(validated(p), "server 2, which does not exist"));
  p = HandPlan();
  p.documents[0].pieces[1].begin = 5;
  EXPECT_TRUE(Contains(validated(p), "pieces do not partition"));
  p = HandPlan();
  p.documents[1].pieces[0].rank = 0;  // rank 0 now holds 6 tokens, rank 1 holds 2
  EXPECT_TRUE(Contains(validated(p), "more than one block"));

  // Statistics that do not match the plan.
  p = HandPlan();
  ASSERT_TRUE(ComputePlanStats(p, cost, &p.stats).ok());
  p.stats.load[0] *= 1.01;
  EXPECT_TRUE(Contains(ValidatePlan(p, cost), "recomputed"));
  p = HandPlan();
  ASSERT_TRUE(ComputePlanStats(p, cost, &p.stats).ok());
  p.stats.traffic.forward_bytes -= 1;
  EXPECT_TRUE(Contains(ValidatePlan(p, cost), "traffic"));
  // The tolerance it reports must be a number >= 0.
  ASSERT_TRUE(ComputePlanStats(p, cost, &p.stats).ok());
  ASSERT_TRUE(ValidatePlan(p, cost).ok());
  Plan claim = p;
  claim.tolerance_used = -0.5;
  EXPECT_TRUE(Contains(ValidatePlan(claim, cost), "tolerance_used is -0.5"));
  // A document longer than the planner supports.
  Plan huge = p;
  huge.documents[0].length = kMaxDocumentLength + 1;
  huge.documents[0].pieces.back().end = kMaxDocumentLength + 1;
  EXPECT_TRUE(Contains(ValidatePlanStructure(huge), "more than the supported"));
  p = HandPlan();
  // Bytes moved from one exchange to another, totals unchanged.
  ASSERT_TRUE(ComputePlanStats(p, cost, &p.stats).ok());
  p.stats.traffic.exchange_sent[0][0] -= 1;
  p.stats.traffic.exchange_sent[1][0] += 1;
  EXPECT_TRUE(Contains(ValidatePlan(p, cost), "traffic"));
}

// The paper policy lists an item it never split as one task (it stores it
// as two halves around its middle): with nothing to move, its plan is the
// colocated one, task for task.
TEST(PlannerTest, PaperListsAnUnsplitItemAsOneTask) {
  PlanOptions o;
  o.ranks = 3;
  o.block = 16;
  o.tolerance = 10;  // no recipient is short of the mean by more than this
  const CostModel cost = CostModel::Flops(o.model);
  Plan colocated, paper;
  o.policy = PlanPolicy::kColocated;
  ASSERT_TRUE(BuildPlan({4096, 512, 512, 1024}, o, cost, &colocated).ok());
  o.policy = PlanPolicy::kPaper;
  ASSERT_TRUE(BuildPlan({4096, 512, 512, 1024}, o, cost, &paper).ok());
  EXPECT_TRUE(ValidatePlan(paper, cost).ok());
  ASSERT_EQ(paper.tasks.size(), colocated.tasks.size());
  EXPECT_EQ(paper.stats.tasks, colocated.stats.tasks);
  EXPECT_EQ(paper.stats.traffic.total_bytes(), colocated.stats.traffic.total_bytes());
}

// The paper policy reads a donor's items by the least score each can have
// and stops where none can win; the published scan reads every item at
// every step; by default it reads in full for its first steps, then from
// the index. On random batches (equal short documents, whose scores tie;
// long documents cut in parts; mixes), ranks, dedicated servers, blocks,
// tolerances and both cost models, on ranks in order and renamed, the two
// give the same plan, task for task, and the same loads.
// Two plans of one layout are the same: task for task, and load for load.
void ExpectSamePlan(const Plan& got, const std::vector<double>& got_loads, const Plan& want,
                    const std::vector<double>& want_loads, int iter) {
  ASSERT_EQ(got.tasks.size(), want.tasks.size()) << "case " << iter;
  for (size_t t = 0; t < want.tasks.size(); ++t) {
    const PlanTask &a = got.tasks[t], &b = want.tasks[t];
    ASSERT_TRUE(a.doc == b.doc && a.q_begin == b.q_begin && a.q_end == b.q_end && a.server == b.server)
        << "case " << iter << ", task " << t;
  }
  EXPECT_EQ(got_loads, want_loads) << "case " << iter;
}

TEST(PlannerTest, PaperIndexedReadMatchesThePublishedFullScan) {
  CostModel table;
  ASSERT_TRUE(CostModel::FromTableCsv("q_len,kv_len,seconds\n128,128,1\n128,4096,9\n4096,4096,40\n", &table).ok());
  std::mt19937_64 rng(5);
  int split = 0, moved = 0;
  for (int iter = 0; iter < 200; ++iter) {
    PlanOptions o;
    o.ranks = 2 + int(rng() % 7);
    o.dedicated_servers = int(rng() % 4) == 0 ? int(rng() % 6) : 0;
    o.block = int64_t{1} << (rng() % 8);
    o.policy = PlanPolicy::kColocated;
    std::vector<int64_t> docs;
    switch (iter % 3) {
      case 0:  // equal short documents: their scores tie
        docs.assign(20 + rng() % 400, 1 + int64_t(rng() % 64));
        break;
      case 1:  // a few long ones
        for (int n = 1 + int(rng() % 4); n > 0; --n) docs.push_back(1000 + int64_t(rng() % 60000));
        break;
      default:  // a mix
        for (int n = 1 + int(rng() % 60); n > 0; --n) docs.push_back(1 + int64_t(rng() % (rng() % 2 ? 200 : 20000)));
    }
    const CostModel& cost = rng() % 2 ? table : CostModel::Flops(o.model);
    Plan layout;
    ASSERT_TRUE(BuildPlan(docs, o, cost, &layout).ok());
    if (rng() % 2) {  // ranks renamed: earlier items need not sit on lower servers
      std::vector<int> name(o.ranks);
      std::iota(name.begin(), name.end(), 0);
      std::shuffle(name.begin(), name.end(), rng);
      for (PlanDocument& d : layout.documents)
        for (PlanPiece& piece : d.pieces) piece.rank = name[piece.rank];
    }
    const double eps = std::array<double, 4>{0.0, 0.01, 0.05, 0.3}[rng() % 4];
    Plan full = layout;
    std::vector<double> full_loads;
    ASSERT_TRUE(plan::PlanPaper(cost, eps, plan::PaperScan::kFull, &full, &full_loads).ok());
    for (plan::PaperScan scan : {plan::PaperScan::kIndexed, plan::PaperScan::kAuto}) {
      Plan other = layout;
      std::vector<double> other_loads;
      ASSERT_TRUE(plan::PlanPaper(cost, eps, scan, &other, &other_loads).ok());
      ASSERT_NO_FATAL_FAILURE(ExpectSamePlan(other, other_loads, full, full_loads, iter));
    }
    // Count the cases that moved work, and those that cut an item.
    moved += full.tasks.size() != layout.tasks.size() ||
             !std::equal(full.tasks.begin(), full.tasks.end(), layout.tasks.begin(),
                         [](const PlanTask& a, const PlanTask& b) { return a.server == b.server; });
    split += full.tasks.size() > layout.tasks.size();
  }
  EXPECT_GT(moved, 100);
  EXPECT_GT(split, 30);
}

// The distca policy's relocation pass reads an index of the servers running
// a document's tasks once there are more than 16 of them; the plan must be
// the one a read of every server gives.
TEST(PlannerTest, DistcaIndexedRelocationMatchesTheFullRead) {
  CostModel table;
  ASSERT_TRUE(CostModel::FromTableCsv("q_len,kv_len,seconds\n128,128,1\n128,4096,9\n4096,4096,40\n", &table).ok());
  std::mt19937_64 rng(11);
  int wide = 0;  // cases with a document's tasks on more than 16 servers
  for (int iter = 0; iter < 60; ++iter) {
    PlanOptions o;
    o.ranks = 17 + int(rng() % 48);
    o.dedicated_servers = std::array<int, 3>{0, int(rng() % 20), 40 + int(rng() % 80)}[rng() % 3];
    o.block = int64_t{1} << (rng() % 7);
    o.policy = PlanPolicy::kColocated;
    std::vector<int64_t> docs;
    for (int n = 1 + int(rng() % 5); n > 0; --n) docs.push_back(1 + int64_t(rng() % (rng() % 2 ? 4000 : 400000)));
    const CostModel& cost = rng() % 2 ? table : CostModel::Flops(o.model);
    Plan layout;
    ASSERT_TRUE(BuildPlan(docs, o, cost, &layout).ok());
    const double eps = std::array<double, 4>{0.0, 0.01, 0.05, 0.2}[rng() % 4];
    Plan scan = layout, indexed = layout;
    std::vector<double> scan_loads, indexed_loads;
    ASSERT_TRUE(plan::PlanDistca(cost, eps, plan::DistcaRead::kScan, &scan, &scan_loads).ok());
    ASSERT_TRUE(plan::PlanDistca(cost, eps, plan::DistcaRead::kAuto, &indexed, &indexed_loads).ok());
    ASSERT_NO_FATAL_FAILURE(ExpectSamePlan(indexed, indexed_loads, scan, scan_loads, iter));
    std::vector<std::set<int>> servers(docs.size());
    for (const PlanTask& t : scan.tasks) servers[t.doc].insert(t.server);
    wide += std::any_of(servers.begin(), servers.end(), [](const std::set<int>& s) { return s.size() > 16; });
  }
  EXPECT_GT(wide, 30);
}

TEST(JsonTest, RoundTripAndErrors) {
  PlanOptions o;
  o.ranks = 3;
  o.dedicated_servers = 1;
  Plan p;
  const CostModel cost = CostModel::Flops(o.model);
  ASSERT_TRUE(BuildPlan({5000, 300, 12000, 700}, o, cost, &p).ok());
  Plan q;
  ASSERT_TRUE(PlanFromJson(PlanToJson(p), &q).ok());
  ASSERT_TRUE(ComputePlanStats(q, cost, &q.stats).ok());
  EXPECT_TRUE(ValidatePlan(q, cost).ok());
  EXPECT_EQ(q.ranks, 3);
  EXPECT_EQ(q.dedicated_servers, 1);
  EXPECT_EQ(q.tasks.size(), p.tasks.size());
  EXPECT_EQ(q.stats.traffic.total_bytes(), p.stats.traffic.total_bytes());
  EXPECT_EQ(q.policy, PlanPolicy::kDistca);
  EXPECT_EQ(q.model.wire, PlanWire::kDistca);
  // Every field survives, non-default ones included: the same file again.
  PlanOptions other = o;
  other.policy = PlanPolicy::kPaper;
  other.block = 64;
  other.tolerance = 0.2;
  other.model = {.q_heads = 8, .kv_heads = 2, .head_dim = 32, .dtype_bytes = 4};
  Plan r;
  ASSERT_TRUE(BuildPlan({5000, 300, 12000, 700}, other, CostModel::Flops(other.model), &r).ok());
  ASSERT_TRUE(PlanFromJson(PlanToJson(r), &q).ok());
  EXPECT_EQ(PlanToJson(q), PlanToJson(r));
  EXPECT_EQ(q.block, 64);
  EXPECT_EQ(q.policy, PlanPolicy::kPaper);
  EXPECT_EQ(q.tolerance_used, r.tolerance_used);
  EXPECT_EQ(q.bound_met, r.bound_met);
  EXPECT_EQ(q.model.head_dim, 32);
  EXPECT_EQ(q.model.dtype_bytes, 4);
  // The wire format survives the round trip, and sets the bytes.
  p.model.wire = PlanWire::kDistcaArtifact;
  ASSERT_TRUE(ComputePlanStats(p, cost, &p.stats).ok());
  ASSERT_TRUE(PlanFromJson(PlanToJson(p), &q).ok());
  EXPECT_EQ(q.model.wire, PlanWire::kDistcaArtifact);
  ASSERT_TRUE(ComputePlanStats(q, cost, &q.stats).ok());
  EXPECT_EQ(q.stats.traffic.total_bytes(), p.stats.traffic.total_bytes());
  EXPECT_TRUE(Contains(PlanFromJson(R"({"ranks": 1, "model": {"q_heads": 4, "kv_heads": 2, "head_dim": 8,
                                        "dtype_bytes": 2, "wire": "nccl"}, "documents": [], "tasks": []})",
                                    &q),
                       "unknown wire format 'nccl'"));

  EXPECT_TRUE(Contains(PlanFromJson("{", &q), "not valid JSON"));
  EXPECT_TRUE(Contains(PlanFromJson("[1]", &q), "object"));
  EXPECT_TRUE(Contains(PlanFromJson(R"({"documents": [], "tasks": []})", &q), "missing \"ranks\""));
  EXPECT_TRUE(Contains(PlanFromJson(R"({"ranks": 0, "documents": [], "tasks": []})", &q), "outside"));
  EXPECT_TRUE(Contains(PlanFromJson(R"({"ranks": 1, "documents": {}, "tasks": []})", &q), "must be an array"));
  EXPECT_TRUE(Contains(PlanFromJson(R"({"ranks": 1, "documents": [{"id": 1, "length": 3, "pieces": []}],
                                        "tasks": []})",
                                    &q),
                       "ids must be 0, 1, 2"));
  EXPECT_TRUE(
      Contains(PlanFromJson(R"({"ranks": 1, "documents": [], "tasks": [{"doc": "a"}]})", &q), "must be an integer"));
  EXPECT_TRUE(
      Contains(PlanFromJson(R"({"ranks": 1, "policy": "best", "documents": [], "tasks": []})", &q), "unknown policy"));
  // The planner's own limits hold for a plan read from a file too (before
  // anything is allocated per server).
  EXPECT_TRUE(Contains(PlanFromJson(R"({"ranks": 16777216, "dedicated_servers": 16777216, "documents": [],
                                        "tasks": []})",
                                    &q),
                       "plan: 16777216 ranks and 16777216 dedicated servers are above the limit"));
  EXPECT_TRUE(Contains(PlanFromJson(R"({"ranks": 1, "model": {"q_heads": 4, "kv_heads": 2, "head_dim": 8,
                                        "dtype_bytes": 16}, "documents": [], "tasks": []})",
                                    &q),
                       "dtype_bytes (16) at most 8"));
  EXPECT_TRUE(Contains(PlanFromJson(R"({"ranks": 1, "model": {"q_heads": 2, "kv_heads": 4, "head_dim": 8,
                                        "dtype_bytes": 2}, "documents": [], "tasks": []})",
                                    &q),
                       "q_heads (2) is not a multiple of kv_heads (4)"));
  // ... and for a plan made by hand.
  q = p;
  q.dedicated_servers = kMaxPlanServers;
  EXPECT_EQ(ComputePlanStats(q, cost, &q.stats).code(), StatusCode::kOutOfRange);
}

// A batch whose colocated plan is badly imbalanced: one long document.
std::vector<int64_t> Skewed() { return {60000, 500, 800, 1200, 300, 2000, 700, 900, 1500, 400, 3000, 640}; }

TEST(PlannerTest, PoliciesOnASkewedBatch) {
  PlanOptions o;
  o.ranks = 8;
  const CostModel cost = CostModel::Flops(o.model);
  std::map<PlanPolicy, Plan> plans;
  for (PlanPolicy policy : {PlanPolicy::kColocated, PlanPolicy::kPaper, PlanPolicy::kDistca}) {
    o.policy = policy;
    ASSERT_TRUE(BuildPlan(Skewed(), o, cost, &plans[policy]).ok());
    EXPECT_TRUE(ValidatePlan(plans[policy], cost).ok());
  }
  EXPECT_GT(plans[PlanPolicy::kColocated].stats.max_over_mean(), 1.5);
  EXPECT_LT(plans[PlanPolicy::kPaper].stats.max_over_mean(), plans[PlanPolicy::kColocated].stats.max_over_mean());
  EXPECT_LE(plans[PlanPolicy::kDistca].stats.max_over_mean(), 1.05 + 1e-9);
  EXPECT_TRUE(plans[PlanPolicy::kDistca].bound_met);
  // The other policies aim at no bound; the flag still says whether it holds.
  EXPECT_FALSE(plans[PlanPolicy::kColocated].bound_met);
}

TEST(PlannerTest, ABalancedBatchMovesNothing) {
  // One 1024 document per rank: every rank already has the mean load, so no
  // policy moves a byte, and each runs its own rank's rows.
  PlanOptions o;
  o.ranks = 4;
  const CostModel cost = CostModel::Flops(o.model);
  for (PlanPolicy policy : {PlanPolicy::kColocated, PlanPolicy::kPaper, PlanPolicy::kDistca}) {
    o.policy = policy;
    Plan p;
    ASSERT_TRUE(BuildPlan({1024, 1024, 1024, 1024}, o, cost, &p).ok()) << PlanPolicyName(policy);
    EXPECT_TRUE(ValidatePlan(p, cost).ok()) << PlanPolicyName(policy);
    EXPECT_EQ(p.stats.traffic.total_bytes(), 0) << PlanPolicyName(policy);
    EXPECT_DOUBLE_EQ(p.stats.max_over_mean(), 1.0) << PlanPolicyName(policy);
    for (const PlanTask& t : p.tasks) EXPECT_EQ(t.server, t.doc) << PlanPolicyName(policy);
  }
}

TEST(PlannerTest, AGivenUnevenLayout) {
  // Two "stages": ranks 0 and 1 hold a 2048 document half each, ranks 2 and
  // 3 one 256 document each (1024 and 256 tokens a rank).
  PlanOptions o;
  o.ranks = 4;
  const CostModel cost = CostModel::Flops(o.model);
  std::vector<PlanDocument> docs(3);
  docs[0].length = 2048;
  docs[0].pieces = {{0, 0, 1024}, {1, 1024, 2048}};
  docs[1].length = 256;
  docs[1].pieces = {{2, 0, 256}};
  docs[2].length = 256;
  docs[2].pieces = {{3, 0, 256}};
  for (PlanPolicy policy : {PlanPolicy::kColocated, PlanPolicy::kPaper, PlanPolicy::kDistca}) {
    o.policy = policy;
    Plan p;
    ASSERT_TRUE(BuildPlanForLayout(docs, o, cost, &p).ok()) << PlanPolicyName(policy);
    EXPECT_EQ(p.documents.size(), 3u);
    EXPECT_EQ(p.documents[0].pieces.size(), 2u);
    EXPECT_TRUE(ValidatePlanForLayout(p, cost).ok()) << PlanPolicyName(policy);
    EXPECT_TRUE(Contains(ValidatePlan(p, cost), "ranks hold between 256 and 1024 tokens")) << PlanPolicyName(policy);
  }
  // distca balances the attention over all four servers all the same.
  o.policy = PlanPolicy::kDistca;
  Plan balanced;
  ASSERT_TRUE(BuildPlanForLayout(docs, o, cost, &balanced).ok());
  EXPECT_TRUE(balanced.bound_met);
  EXPECT_LE(balanced.stats.max_over_mean(), 1.05 + 1e-9);
  // Bad layouts are refused with the reason.
  Plan p;
  o.policy = PlanPolicy::kDistca;
  std::vector<PlanDocument> bad = docs;
  bad[0].pieces[1].begin = 1000;
  EXPECT_TRUE(Contains(BuildPlanForLayout(bad, o, cost, &p), "pieces do not partition"));
  bad = docs;
  bad[1].pieces[0].rank = 4;
  EXPECT_TRUE(Contains(BuildPlanForLayout(bad, o, cost, &p), "rank 4, which does not exist"));
  bad = docs;
  bad[2].length = 0;
  bad[2].pieces.clear();
  EXPECT_TRUE(Contains(BuildPlanForLayout(bad, o, cost, &p), "document 2 has length 0"));
  EXPECT_TRUE(Contains(BuildPlanForLayout({}, o, cost, &p), "no documents"));
}

TEST(PlannerTest, DedicatedServersTakeWork) {
  PlanOptions o;
  o.ranks = 4;
  o.dedicated_servers = 2;
  const CostModel cost = CostModel::Flops(o.model);
  Plan p;
  ASSERT_TRUE(BuildPlan(Skewed(), o, cost, &p).ok());
  ASSERT_TRUE(ValidatePlan(p, cost).ok());
  EXPECT_GT(p.stats.load[4], 0.0);
  EXPECT_GT(p.stats.load[5], 0.0);
  EXPECT_LE(p.stats.max_over_mean(), 1.05 + 1e-9);
}

// distca: a rank holding a later piece of a document already needs (and
// gets) its K/V prefix, so rows of that document cost it only their Q. Rank 0
// holds the first 4096 tokens of a 4224-token document, rank 1 its last 128
// among short documents, rank 2 short documents only and the most room. At
// eps 0.5 rank 1 has room for all rank 0 sheds: every moved row goes there
// (to rank 2 they would bring the 4096-row prefix along), and rank 2
// receives nothing more than under the colocated plan.
TEST(PlannerTest, DistcaSendsRowsWhereTheirPrefixAlreadyIs) {
  std::vector<int64_t> docs = {4096 + 128};
  for (int i = 0; i < 31 + 32; ++i) docs.push_back(128);
  PlanOptions o;
  o.ranks = 3;
  o.tolerance = 0.5;
  const CostModel cost = CostModel::Flops(o.model);
  Plan colocated, p;
  o.policy = PlanPolicy::kColocated;
  ASSERT_TRUE(BuildPlan(docs, o, cost, &colocated).ok());
  ASSERT_EQ(colocated.documents[0].pieces.size(), 2u);
  ASSERT_EQ(colocated.documents[0].pieces[1].rank, 1);
  o.policy = PlanPolicy::kDistca;
  ASSERT_TRUE(BuildPlan(docs, o, cost, &p).ok());
  ASSERT_TRUE(ValidatePlan(p, cost).ok());
  EXPECT_TRUE(p.bound_met);
  int64_t moved = 0;
  for (const PlanTask& t : p.tasks) {
    if (t.doc != 0) continue;
    EXPECT_NE(t.server, 2) << "rows [" << t.q_begin << ", " << t.q_end << ") of the long document";
    if (t.server == 1 && t.q_begin < 4096) moved += std::min<int64_t>(t.q_end, 4096) - t.q_begin;
  }
  EXPECT_GT(moved, 0);
  EXPECT_EQ(p.stats.traffic.received[2], colocated.stats.traffic.received[2]);
}

// distca's greedy alone (no first-fit fallback): a donor whose move
// overshoots the cap receives like any other server. Three ranks, block 256,
// eps 0.15 (cap 309,616 causal pairs): rank 0 holds an 815-token document
// (332,520 pairs), rank 2 documents of 931 and 287 tokens (475,174), rank 1
// nothing. Rank 2 must shed 165,558; its smallest chunk that covers that is
// [512, 931) of the long document (302,518 pairs, the next cut down gives
// 138,550), so it drops to 172,656 and rank 1 is left 7,098 of room, less
// than any block of rank 0's document. Rank 0 can only shed to rank 2: a
// greedy that never offered the ex-donor's room got stuck here.
TEST(PlannerTest, DistcaGreedyLetsAnOvershootingDonorReceive) {
  Plan p;
  p.ranks = 3;
  p.block = 256;
  for (const auto& [length, rank] : {std::pair<int64_t, int>{931, 2}, {815, 0}, {287, 2}})
    p.documents.push_back({.length = length, .pieces = {{.rank = rank, .begin = 0, .end = length}}});
  const CostModel cost = CostModel::Flops(p.model);
  std::vector<double> loads;
  ASSERT_TRUE(plan::PlanDistcaGreedyOnly(cost, 0.15, &p, &loads).ok());
  EXPECT_TRUE(p.bound_met);
  ASSERT_TRUE(ValidatePlanStructure(p).ok());  // its statistics are not filled in
  const double pair = cost.TaskCost(0, 1);
  EXPECT_DOUBLE_EQ(loads[2], double(CausalPairs(0, 512) + CausalPairs(0, 287) + CausalPairs(256, 512)) * pair);
  EXPECT_DOUBLE_EQ(loads[1], double(CausalPairs(512, 931)) * pair);
  EXPECT_DOUBLE_EQ(loads[0], double(CausalPairs(0, 256) + CausalPairs(512, 815)) * pair);
}

// A bound no plan can meet: a 1024-token document over ranks 4-7 (256 rows
// each) and 256 one-token documents on each of ranks 0-3; mean 65,728
// causal pairs, so at eps 0.05 the cap is 69,014.
std::vector<PlanDocument> UnreachableBoundDocs() {
  std::vector<PlanDocument> docs;
  docs.push_back({.length = 1024, .pieces = {}});
  for (int r = 4; r < 8; ++r) docs[0].pieces.push_back({.rank = r, .begin = 256 * (r - 4), .end = 256 * (r - 3)});
  for (int r = 0; r < 4; ++r)
    for (int n = 0; n < 256; ++n) docs.push_back({.length = 1, .pieces = {{.rank = r, .begin = 0, .end = 1}}});
  return docs;
}

// The distca greedy alone (no fallback, no retries) on `built`'s documents.
Plan GreedyOnly(Plan built, const CostModel& cost, double eps, std::vector<double>* loads) {
  built.tasks.clear();
  EXPECT_TRUE(plan::PlanDistcaGreedyOnly(cost, eps, &built, loads).ok());
  return built;
}

// Where the greedy gets stuck and first-fit decreasing packs the blocks, the
// ranks within the cap keep their own rows: 57 short documents (1,233
// tokens) on 8 ranks and a dedicated server, block 16, eps 0.01 (two ranks
// within the cap, the rest above it: the server lowers the mean). A packing
// that offered each unit to its owner in its one pass let units overflowing
// early ranks fill later ranks first: 355 rows served away from home, 28.2
// MB, where this one serves 187 away, 14.5 MB.
TEST(PlannerTest, DistcaFallbackPackingKeepsRanksWithinTheCapHome) {
  const std::vector<int64_t> lengths = {34, 25, 35, 9,  5,  11, 21, 25, 14, 11, 22, 31, 39, 38, 11, 25, 23, 16, 18,
                                        20, 20, 25, 16, 30, 14, 17, 37, 7,  15, 31, 37, 13, 18, 11, 5,  7,  34, 7,
                                        16, 26, 30, 32, 11, 22, 38, 27, 19, 12, 18, 18, 17, 39, 7,  33, 38, 36, 17};
  PlanOptions o;
  o.ranks = 8;
  o.dedicated_servers = 1;
  o.block = 16;
  o.tolerance = 0.01;
  const CostModel cost = CostModel::Flops(o.model);
  Plan colocated;
  o.policy = PlanPolicy::kColocated;
  ASSERT_TRUE(BuildPlan(lengths, o, cost, &colocated).ok());
  const std::vector<double>& own = colocated.stats.load;
  const double cap = (1 + o.tolerance) * colocated.stats.load_mean;
  std::vector<double> loads;
  ASSERT_FALSE(GreedyOnly(colocated, cost, o.tolerance, &loads).bound_met);  // so the packing runs
  Plan p;
  o.policy = PlanPolicy::kDistca;
  ASSERT_TRUE(BuildPlan(lengths, o, cost, &p).ok());
  ASSERT_TRUE(ValidatePlan(p, cost).ok());
  EXPECT_TRUE(p.bound_met);
  int within = 0;
  for (int r = 0; r < o.ranks; ++r) within += own[r] <= cap;
  EXPECT_EQ(within, 2);
  for (const PlanTask& t : p.tasks)
    ForEachPieceOverlapping(p.documents[t.doc], t.q_begin, t.q_end,
                            [&](size_t, const PlanPiece& piece, int64_t, int64_t) {
                              EXPECT_TRUE(piece.rank == t.server || own[piece.rank] > cap)
                                  << "rank " << piece.rank << ", within the cap, serves none of rows [" << t.q_begin
                                  << ", " << t.q_end << ") of document " << t.doc << ": server " << t.server << " does";
                            });
}

// With a measured table the greedy's cap comes from the colocated mean, and
// cutting a document moves the mean (the table's costs do not add up), so a
// plan within the cap can end above (1 + eps) x its own mean. One
// 5,658-token document on 4 ranks and 3 dedicated servers, block 512: eps
// 0.5 is met (1.37 x the mean), and eps 1 had been missed at 2.02 x, the
// servers idle; the plan for a tighter bound meets it.
TEST(PlannerTest, DistcaWithATableTriesTighterBoundsWhereTheMeanMoved) {
  CostModel table;
  ASSERT_TRUE(CostModel::FromTableCsv("q_len,kv_len,seconds\n1,1,0.00002\n1,128,0.00002\n1,4096,0.00003\n"
                                      "1,65536,0.0002\n128,128,0.00003\n128,4096,0.0002\n128,65536,0.003\n"
                                      "4096,4096,0.004\n4096,65536,0.09\n65536,65536,0.9\n",
                                      &table)
                  .ok());
  PlanOptions o;
  o.ranks = 4;
  o.dedicated_servers = 3;
  o.block = 512;
  o.policy = PlanPolicy::kDistca;
  for (double eps : {0.5, 1.0}) {
    o.tolerance = eps;
    Plan p;
    ASSERT_TRUE(BuildPlan({5658}, o, table, &p).ok());
    ASSERT_TRUE(ValidatePlan(p, table).ok());
    EXPECT_TRUE(p.bound_met) << "eps " << eps;
    EXPECT_LE(p.stats.load_max, (1 + eps) * p.stats.load_mean * (1 + 1e-9)) << "eps " << eps;
  }
  // The greedy alone at eps 1 misses.
  Plan colocated;
  o.policy = PlanPolicy::kColocated;
  ASSERT_TRUE(BuildPlan({5658}, o, table, &colocated).ok());
  std::vector<double> loads;
  EXPECT_FALSE(GreedyOnly(colocated, table, 1.0, &loads).bound_met);
}

// A table whose pairs cost more on short tasks (1 + 128 / q_len ns each): a
// 1,024-token document on rank 0 and four of 256 on rank 1, block 128. Cut,
// the document costs more than whole, and the greedy, capped from the
// colocated mean, misses (1.15 x the mean) where the plan for FLOPs, costed
// by the table, is within 1.05 x: distca keeps that one.
TEST(PlannerTest, DistcaWithATableAlsoTriesThePlanForFlops) {
  CostModel table;
  ASSERT_TRUE(CostModel::FromTableCsv("q_len,kv_len,seconds\n128,128,1.6512e-05\n128,256,4.928e-05\n"
                                      "128,512,0.000114816\n128,1024,0.000245888\n256,256,4.9344e-05\n"
                                      "256,512,0.000147648\n256,1024,0.000344256\n512,512,0.00016416\n"
                                      "512,1024,0.00049184\n1024,1024,0.0005904\n",
                                      &table)
                  .ok());
  PlanOptions o;
  o.ranks = 2;
  o.policy = PlanPolicy::kDistca;
  Plan p;
  ASSERT_TRUE(BuildPlan({1024, 256, 256, 256, 256}, o, table, &p).ok());
  ASSERT_TRUE(ValidatePlan(p, table).ok());
  EXPECT_TRUE(p.bound_met);
  EXPECT_LE(p.stats.max_over_mean(), 1.05 + 1e-9);
  // The table's own greedy misses.
  Plan colocated;
  o.policy = PlanPolicy::kColocated;
  ASSERT_TRUE(BuildPlan({1024, 256, 256, 256, 256}, o, table, &colocated).ok());
  std::vector<double> loads;
  const Plan greedy = GreedyOnly(colocated, table, 0.05, &loads);
  EXPECT_FALSE(greedy.bound_met);
  const double mean = std::accumulate(loads.begin(), loads.end(), 0.0) / double(loads.size());
  EXPECT_GT(*std::max_element(loads.begin(), loads.end()), 1.1 * mean);
}

// Block 256: rank 7's rows are one indivisible unit of 229,504 pairs, the
// colocated maximum, which no plan lowers; moves elsewhere (rank 6's unit
// under a looser bound) only add bytes, so distca returns the colocated
// plan: the same maximum, fewer bytes.
TEST(PlannerTest, DistcaKeepsTheColocatedPlanWhenItCannotLowerTheMaximum) {
  const std::vector<PlanDocument> docs = UnreachableBoundDocs();
  PlanOptions o;
  o.ranks = 8;
  o.block = 256;
  const CostModel cost = CostModel::Flops(o.model);
  Plan colocated, distca;
  o.policy = PlanPolicy::kColocated;
  ASSERT_TRUE(BuildPlanForLayout(docs, o, cost, &colocated).ok());
  o.policy = PlanPolicy::kDistca;
  ASSERT_TRUE(BuildPlanForLayout(docs, o, cost, &distca).ok());
  EXPECT_FALSE(distca.bound_met);
  EXPECT_DOUBLE_EQ(distca.stats.load_max, colocated.stats.load_max);
  EXPECT_DOUBLE_EQ(colocated.stats.load_max, double(CausalPairs(768, 1024)) * cost.TaskCost(0, 1));
  EXPECT_EQ(distca.stats.traffic.total_bytes(), colocated.stats.traffic.total_bytes());
}

// Block 128: rank 7's blocks (106,560 and 122,944 pairs) exceed the cap, so
// the bound is missed, but not by as much as the colocated plan misses it:
// distca tries looser bounds and keeps the lowest maximum, here the largest
// indivisible block, which no plan can beat (at eps 0.05 alone its greedy
// could not move rank 7's blocks and returned the colocated plan).
TEST(PlannerTest, DistcaMissingTheBoundKeepsTheLowestMaximumItFinds) {
  const std::vector<PlanDocument> docs = UnreachableBoundDocs();
  PlanOptions o;
  o.ranks = 8;
  o.block = 128;
  const CostModel cost = CostModel::Flops(o.model);
  Plan distca;
  o.policy = PlanPolicy::kDistca;
  ASSERT_TRUE(BuildPlanForLayout(docs, o, cost, &distca).ok());
  ASSERT_TRUE(ValidatePlan(distca, cost).ok());
  EXPECT_FALSE(distca.bound_met);
  EXPECT_DOUBLE_EQ(distca.stats.load_max, double(CausalPairs(896, 1024)) * cost.TaskCost(0, 1));
  // The greedy alone at eps 0.05 lowers nothing: rank 7 keeps its 229,504.
  std::vector<double> loads;
  EXPECT_FALSE(GreedyOnly(distca, cost, 0.05, &loads).bound_met);
  EXPECT_DOUBLE_EQ(loads[7], double(CausalPairs(768, 1024)) * cost.TaskCost(0, 1));
}

// The greedy's 2% tie-break is measured from the fewest bytes per unit: a
// chain of moves each within 2% of the one before (1.0, 1.019, 1.035) must
// not carry the choice to a move 3.5% worse than the best.
TEST(PlannerTest, DistcaTieBreakStaysWithinTheSlackOfTheCheapest) {
  struct Candidate {
    double score, size;
  };
  const auto score = [](const Candidate& c) { return c.score; };
  const auto size = [](const Candidate& c) { return c.size; };
  const std::vector<Candidate> chain = {{1.0, 1.0}, {1.019, 2.0}, {1.035, 3.0}};
  EXPECT_EQ(plan::LargestNearCheapest(chain, 0.02, score, size), &chain[1]);
  // Equal sizes: the first; the cheapest alone when nothing is near it.
  const std::vector<Candidate> equal = {{1.0, 2.0}, {1.01, 2.0}};
  EXPECT_EQ(plan::LargestNearCheapest(equal, 0.02, score, size), &equal[0]);
  const std::vector<Candidate> apart = {{2.0, 9.0}, {1.0, 1.0}};
  EXPECT_EQ(plan::LargestNearCheapest(apart, 0.02, score, size), &apart[1]);
  EXPECT_EQ(plan::LargestNearCheapest(std::vector<Candidate>{}, 0.02, score, size), nullptr);
}

TEST(PlannerTest, CommBudgetRaisesTolerance) {
  PlanOptions o;
  o.ranks = 8;
  const CostModel cost = CostModel::Flops(o.model);
  Plan tight, colocated;
  ASSERT_TRUE(BuildPlan(Skewed(), o, cost, &tight).ok());
  o.policy = PlanPolicy::kColocated;
  ASSERT_TRUE(BuildPlan(Skewed(), o, cost, &colocated).ok());
  o.policy = PlanPolicy::kDistca;
  // A budget between what the layout alone moves and what eps = 0.05 moves.
  o.comm_budget = (colocated.stats.traffic.max_rank_bytes() + tight.stats.traffic.max_rank_bytes()) / 2;
  ASSERT_GT(tight.stats.traffic.max_rank_bytes(), o.comm_budget);
  Plan p;
  ASSERT_TRUE(BuildPlan(Skewed(), o, cost, &p).ok());
  EXPECT_TRUE(ValidatePlan(p, cost).ok());
  EXPECT_GT(p.tolerance_used, 0.05);
  EXPECT_LE(p.stats.traffic.max_rank_bytes(), o.comm_budget);
  EXPECT_LE(p.stats.max_over_mean(), 1 + p.tolerance_used + 1e-9);
  // Steps of 0.05 from the requested tolerance.
  const double steps = (p.tolerance_used - 0.05) / 0.05;
  EXPECT_NEAR(steps, std::round(steps), 1e-9);

  if (colocated.stats.traffic.max_rank_bytes() > 1) {
    o.comm_budget = 1;
    EXPECT_TRUE(Contains(BuildPlan(Skewed(), o, cost, &p), "below what the linear layout alone moves"));
  }

  // A colocated plan is not searched, but it is held to the budget all the
  // same: refused below the layout's need, kept as it is when the budget
  // may grow to it or holds it.
  {
    PlanOptions c = o;
    c.policy = PlanPolicy::kColocated;
    const int64_t need = colocated.stats.traffic.max_rank_bytes();
    ASSERT_GT(need, 1);
    c.comm_budget = need - 1;
    EXPECT_TRUE(Contains(BuildPlan(Skewed(), c, cost, &p), "below what the linear layout alone moves"));
    c.budget_grows = true;
    ASSERT_TRUE(BuildPlan(Skewed(), c, cost, &p).ok());
    EXPECT_EQ(p.stats.traffic.max_rank_bytes(), need);
    c.budget_grows = false;
    c.comm_budget = need;
    ASSERT_TRUE(BuildPlan(Skewed(), c, cost, &p).ok());
    EXPECT_EQ(p.stats.traffic.max_rank_bytes(), need);
  }

  // The same search with the budget on each exchange (a buffer that holds
  // one all-to-all at a time).
  o.budget_per_exchange = true;
  o.comm_budget = (colocated.stats.traffic.max_exchange_bytes() + tight.stats.traffic.max_exchange_bytes()) / 2;
  ASSERT_GT(tight.stats.traffic.max_exchange_bytes(), o.comm_budget);
  ASSERT_TRUE(BuildPlan(Skewed(), o, cost, &p).ok());
  EXPECT_TRUE(ValidatePlan(p, cost).ok());
  EXPECT_GT(p.tolerance_used, 0.05);
  EXPECT_LE(p.stats.traffic.max_exchange_bytes(), o.comm_budget);
  // The step below does not fit.
  PlanOptions below = o;
  below.comm_budget = 0;
  below.tolerance = p.tolerance_used - 0.05;
  Plan q;
  ASSERT_TRUE(BuildPlan(Skewed(), below, cost, &q).ok());
  EXPECT_GT(q.stats.traffic.max_exchange_bytes(), o.comm_budget);
  if (colocated.stats.traffic.max_exchange_bytes() > 1) {
    o.comm_budget = 1;
    EXPECT_TRUE(Contains(BuildPlan(Skewed(), o, cost, &p), "on the busiest rank in one exchange"));
  }

  // A buffer that also stages the rows a rank keeps (DistCA's): the same
  // search on the larger counts.
  o.budget_counts_local = true;
  const int64_t colocated_need = colocated.stats.traffic.max_exchange_bytes(true);
  const int64_t tight_need = tight.stats.traffic.max_exchange_bytes(true);
  ASSERT_GT(tight_need, colocated_need);
  o.comm_budget = (colocated_need + tight_need) / 2;
  ASSERT_TRUE(BuildPlan(Skewed(), o, cost, &p).ok());
  EXPECT_TRUE(ValidatePlan(p, cost).ok());
  EXPECT_GT(p.tolerance_used, 0.05);
  EXPECT_LE(p.stats.traffic.max_exchange_bytes(true), o.comm_budget);
  below = o;
  below.comm_budget = 0;
  below.tolerance = p.tolerance_used - 0.05;
  ASSERT_TRUE(BuildPlan(Skewed(), below, cost, &q).ok());
  EXPECT_GT(q.stats.traffic.max_exchange_bytes(true), o.comm_budget);
  // Below what any plan needs: an error naming the scope, or, with
  // budget_grows, a plan within the colocated plan's need. (Just below the
  // layout's need a plan may still fit: ABudgetBelowTheLayoutsNeedCanStillFit.)
  o.comm_budget = 1;
  EXPECT_TRUE(Contains(BuildPlan(Skewed(), o, cost, &p), "in one exchange, its own rows included"));
  o.comm_budget = colocated_need - 1;
  o.budget_grows = true;
  ASSERT_TRUE(BuildPlan(Skewed(), o, cost, &p).ok());
  EXPECT_TRUE(ValidatePlan(p, cost).ok());
  EXPECT_LE(p.stats.traffic.max_exchange_bytes(true), colocated_need);
  EXPECT_GT(p.tolerance_used, 0.05);
  // It only counts single exchanges.
  o.budget_per_exchange = false;
  EXPECT_TRUE(Contains(BuildPlan(Skewed(), o, cost, &p), "needs budget_per_exchange"));
}

// With budget_grows, a budget below what the layout needs rises to that
// need, and the requested tolerance stands where its plan fits the raised
// budget: here rank 0 holds eight 512 documents (the most tokens, about
// the mean attention) and keeps them, rank 1 one 2048 document, which
// spreads over rank 1 and an idle dedicated server; the busiest exchange,
// rank 0's own rows, is what the colocated plan's is.
TEST(PlannerTest, BudgetGrowsKeepsTheToleranceWhereItsPlanFits) {
  PlanOptions o;
  o.ranks = 2;
  o.dedicated_servers = 1;
  o.budget_per_exchange = true;
  o.budget_counts_local = true;
  const CostModel cost = CostModel::Flops(o.model);
  std::vector<PlanDocument> docs(9);
  for (int d = 0; d < 8; ++d) {
    docs[d].length = 512;
    docs[d].pieces = {{0, 0, 512}};
  }
  docs[8].length = 2048;
  docs[8].pieces = {{1, 0, 2048}};
  auto need = [&](PlanPolicy policy, int64_t budget, bool grows, Plan* p) {
    PlanOptions x = o;
    x.policy = policy;
    x.comm_budget = budget;
    x.budget_grows = grows;
    EXPECT_TRUE(BuildPlanForLayout(docs, x, cost, p).ok()) << PlanPolicyName(policy);
    return p->stats.traffic.max_exchange_bytes(true);
  };
  Plan colocated, free, grown;
  const int64_t layout_need = need(PlanPolicy::kColocated, 0, false, &colocated);
  int exercised = 0;
  for (PlanPolicy policy : {PlanPolicy::kPaper, PlanPolicy::kDistca}) {
    const int64_t plan_need = need(policy, 0, false, &free);
    need(policy, 1, true, &grown);
    EXPECT_TRUE(ValidatePlanForLayout(grown, cost).ok());
    if (plan_need <= layout_need) {
      ++exercised;
      EXPECT_EQ(grown.tolerance_used, o.tolerance) << PlanPolicyName(policy);
      EXPECT_EQ(grown.stats.traffic.max_exchange_bytes(true), plan_need) << PlanPolicyName(policy);
    } else {
      EXPECT_GT(grown.tolerance_used, o.tolerance) << PlanPolicyName(policy);
      EXPECT_LE(grown.stats.traffic.max_exchange_bytes(true), layout_need) << PlanPolicyName(policy);
    }
  }
  EXPECT_GT(exercised, 0);  // the case this test is for occurs
  // Colocated moves nothing at any eps: its tolerance stands too.
  need(PlanPolicy::kColocated, 1, true, &grown);
  EXPECT_EQ(grown.tolerance_used, o.tolerance);
}

// The budget search (galloping, then bisection over steps of 0.05) lands on
// the step a step-by-step search finds: the first whose busiest rank fits.
// Budgets from the tightest to the loosest, with 4 ranks alone and with 60
// idle servers (a pipeline bubble: eps in the tens). Some cases start more
// than twice over the budget and fit within 60 steps: the search gallops
// from their first step rather than stepping through them.
TEST(PlannerTest, CommBudgetSearchFindsTheFirstStepThatFits) {
  int most_steps = 0;
  int galloped_early = 0;
  for (PlanPolicy policy : {PlanPolicy::kPaper, PlanPolicy::kDistca}) {
    for (int servers : {0, 60}) {
      PlanOptions o;
      o.ranks = 4;
      o.dedicated_servers = servers;
      const CostModel cost = CostModel::Flops(o.model);
      auto traffic_at = [&](double eps, PlanPolicy pol) { return MaxRankBytesAt(Skewed(), o, cost, eps, pol); };
      const int64_t low = traffic_at(0.05, PlanPolicy::kColocated), high = traffic_at(0.05, policy);
      ASSERT_LT(low, high) << PlanPolicyName(policy) << " " << servers;
      for (double f : {0.0, 0.01, 0.1, 0.3, 0.6, 0.9}) {
        o.policy = policy;
        o.comm_budget = std::max<int64_t>(1, low + int64_t(f * double(high - low)));
        int first = 1;
        while (traffic_at(0.05 + 0.05 * first, policy) > o.comm_budget) ++first;
        most_steps = std::max(most_steps, first);
        // Galloping skips step 3 (1 -> 2 -> 4); budget >= low, the layout's need.
        if (first > 3 && first <= 60 && traffic_at(0.15, policy) > 2 * o.comm_budget) ++galloped_early;
        Plan p;
        ASSERT_TRUE(BuildPlan(Skewed(), o, cost, &p).ok());
        EXPECT_NEAR(p.tolerance_used, 0.05 + 0.05 * first, 1e-12)
            << PlanPolicyName(policy) << ", " << servers << " servers, budget " << o.comm_budget;
        EXPECT_LE(p.stats.traffic.max_rank_bytes(), o.comm_budget);
        EXPECT_TRUE(ValidatePlan(p, cost).ok());
      }
    }
  }
  EXPECT_GT(most_steps, 60);  // galloping and bisection ran, not only the step-by-step start
  EXPECT_GT(galloped_early, 0);
}

// A budget below what the layout alone moves can still be met: here the
// colocated plan's busiest rank moves 227328 bytes, the plan at eps 1.15
// 214528 (a tail piece served where its prefix lives); and, counting own
// rows per exchange, 103808 against 103680 at eps 0.9. Both budgets are met
// by a search, not refused.
TEST(PlannerTest, ABudgetBelowTheLayoutsNeedCanStillFit) {
  struct Case {
    std::vector<int64_t> docs;
    int ranks, servers, kv_heads, head_dim;
    int64_t block;
    bool per_exchange;
  };
  for (const Case& c :
       {Case{{430, 2674, 1729, 1220, 2763}, 3, 3, 1, 8, 32, false}, Case{{1297}, 4, 1, 8, 128, 64, true}}) {
    PlanOptions o;
    o.ranks = c.ranks;
    o.dedicated_servers = c.servers;
    o.block = c.block;
    o.model.kv_heads = c.kv_heads;
    o.model.head_dim = c.head_dim;
    if (c.kv_heads == 1) o.model.q_heads = 4;
    o.budget_per_exchange = c.per_exchange;
    o.budget_counts_local = c.per_exchange;
    const CostModel cost = CostModel::Flops(o.model);
    auto need = [&](const Plan& q) {
      return c.per_exchange ? q.stats.traffic.max_exchange_bytes(true) : q.stats.traffic.max_rank_bytes();
    };
    PlanOptions colocated = o;
    colocated.policy = PlanPolicy::kColocated;
    Plan layout;
    ASSERT_TRUE(BuildPlan(c.docs, colocated, cost, &layout).ok());
    // The least any step up to eps 3 needs.
    int64_t least = need(layout);
    for (int k = 0; k <= 60; ++k) {
      PlanOptions x = o;
      x.tolerance = 0.05 * k;
      Plan q;
      ASSERT_TRUE(BuildPlan(c.docs, x, cost, &q).ok());
      least = std::min(least, need(q));
    }
    ASSERT_LT(least, need(layout)) << c.docs.size();
    o.comm_budget = least;
    Plan p;
    const Status s = BuildPlan(c.docs, o, cost, &p);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_LE(need(p), least);
    EXPECT_TRUE(ValidatePlan(p, cost).ok());
    // Below that, nothing fits: refused, naming the layout's need.
    o.comm_budget = least - 1;
    EXPECT_TRUE(Contains(BuildPlan(c.docs, o, cost, &p), "below what the linear layout alone moves"));
  }
}

// A search step one rounding unit past the colocated imbalance can still
// move a block ((1 + eps) mean rounds below the busiest load): it is not
// taken for a policy moving work beyond that imbalance (an Internal error
// before), and the search goes on to a step that fits. Found by a fuzzer.
TEST(PlannerTest, CommBudgetSearchToleratesRoundingAtTheColocatedImbalance) {
  PlanOptions o;
  o.ranks = 3;
  o.block = 16;
  o.policy = PlanPolicy::kDistca;
  o.tolerance = 0.39635382992479673;
  const CostModel cost = CostModel::Flops(o.model);
  // The budget: the colocated plan's own busiest rank (2 MiB today: rank 1
  // returns 161 rows of fp32 dK/dV, 8192 B each, to rank 0 and sends 95 K/V
  // rows twice, 2 x 4096 B, to rank 2).
  PlanOptions colocated = o;
  colocated.policy = PlanPolicy::kColocated;
  Plan layout;
  ASSERT_TRUE(BuildPlan({227, 256}, colocated, cost, &layout).ok());
  o.comm_budget = layout.stats.traffic.max_rank_bytes();
  ASSERT_EQ(o.comm_budget, 256 * 8192);
  Plan p;
  const Status s = BuildPlan({227, 256}, o, cost, &p);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(ValidatePlan(p, cost).ok());
  EXPECT_LE(p.stats.traffic.max_rank_bytes(), o.comm_budget);
}

// Traffic is not monotone in eps: here step 30 (eps 1.55) fits, steps 31-50
// do not, 51 and 53 do. Galloping from step 20 to 40 and 80 and bisecting
// found step 56 (eps 2.85, max/mean 3.8). The search now gallops over steps
// 1, 2 and 4 (over twice the budget) and from step 8 on, each within twice
// the budget, steps one at a time: it finds step 30 (max/mean 2.5).
TEST(PlannerTest, CommBudgetSearchStepsThroughNonMonotoneTraffic) {
  PlanOptions o;
  o.ranks = 2;
  o.dedicated_servers = 10;
  const CostModel cost = CostModel::Flops(o.model);
  const std::vector<int64_t> docs = {11938, 18523, 18965};
  auto traffic_at = [&](double eps) { return MaxRankBytesAt(docs, o, cost, eps, o.policy); };
  o.comm_budget = 515970304;
  for (int k = 8; k < 30; ++k) ASSERT_LE(traffic_at(0.05 + 0.05 * k), 2 * o.comm_budget) << k;
  EXPECT_GT(traffic_at(1.50), o.comm_budget);
  EXPECT_LE(traffic_at(1.55), o.comm_budget);
  EXPECT_GT(traffic_at(1.60), o.comm_budget);
  Plan p;
  ASSERT_TRUE(BuildPlan(docs, o, cost, &p).ok());
  EXPECT_NEAR(p.tolerance_used, 1.55, 1e-12);
  EXPECT_LE(p.stats.traffic.max_rank_bytes(), o.comm_budget);
}

// On random batches, ranks, servers, blocks and budget scopes, with a budget
// met at a random step up to 60, the search returns the step a step-by-step
// search finds first, also where it gallops from steps far above the budget
// (a fuzz of 2,800 such cases found no difference; this runs a sample).
TEST(PlannerTest, CommBudgetSearchMatchesAStepByStepSearchOnRandomBatches) {
  std::mt19937_64 rng(11);
  int cases = 0, far = 0;
  for (int iter = 0; iter < 300; ++iter) {
    PlanOptions o;
    o.ranks = 2 + int(rng() % 6);
    o.dedicated_servers = int(rng() % 40);
    o.block = int64_t{16} << (rng() % 3);
    o.policy = rng() % 2 ? PlanPolicy::kDistca : PlanPolicy::kPaper;
    o.budget_per_exchange = rng() % 2;
    o.budget_counts_local = o.budget_per_exchange && rng() % 2;
    std::vector<int64_t> docs(1 + rng() % 8);
    for (int64_t& d : docs) d = 64 + int64_t(rng() % 30000);
    const CostModel cost = CostModel::Flops(o.model);
    auto need = [&](const Plan& q) {
      return o.budget_per_exchange ? q.stats.traffic.max_exchange_bytes(o.budget_counts_local)
                                   : q.stats.traffic.max_rank_bytes();
    };
    std::vector<int64_t> traffic(61);
    for (int k = 0; k <= 60; ++k) {
      PlanOptions x = o;
      x.tolerance = 0.05 + 0.05 * k;
      Plan q;
      ASSERT_TRUE(BuildPlan(docs, x, cost, &q).ok());
      traffic[k] = need(q);
    }
    o.comm_budget = traffic[1 + rng() % 60];
    if (o.comm_budget <= 0 || traffic[0] <= o.comm_budget) continue;  // no search
    int first = 1;
    while (traffic[first] > o.comm_budget) ++first;
    ++cases;
    PlanOptions co = o;
    co.policy = PlanPolicy::kColocated;
    co.comm_budget = 0;
    Plan layout;
    ASSERT_TRUE(BuildPlan(docs, co, cost, &layout).ok());
    // Galloping skips a step here: 1 -> 2 -> 4, step 3 untried.
    if (need(layout) <= o.comm_budget && traffic[2] > 2 * o.comm_budget && first > 3) ++far;
    Plan p;
    const Status s = BuildPlan(docs, o, cost, &p);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_NEAR(p.tolerance_used, 0.05 + 0.05 * first, 1e-9) << "case " << iter;
  }
  EXPECT_GT(cases, 200);
  EXPECT_GT(far, 50);  // cases where the search skips steps before its first fit
}

// A budget below what the layout alone moves, first met at eps 0.35, where
// eps 0.1 needs more than twice the budget. Galloping from such a step ran
// past the colocated imbalance, where nothing moves and nothing fits, and
// the search reported that no tolerance fits; below the layout's need the
// search steps one at a time. Found by a fuzzer (5 of 40 such cases).
TEST(PlannerTest, CommBudgetSearchBelowTheLayoutsNeedTriesEveryStep) {
  PlanOptions o;
  o.ranks = 3;
  o.dedicated_servers = 1;
  o.block = 32;
  o.policy = PlanPolicy::kDistca;
  const CostModel cost = CostModel::Flops(o.model);
  const std::vector<int64_t> docs = {16084, 8240, 13814, 16317};
  auto traffic_at = [&](double eps, PlanPolicy policy) { return MaxRankBytesAt(docs, o, cost, eps, policy); };
  o.comm_budget = traffic_at(0.35, PlanPolicy::kDistca);
  ASSERT_GT(traffic_at(0.05, PlanPolicy::kColocated), o.comm_budget);  // below the layout's need
  // Far from it at steps 1, 2 and 4: galloping would skip steps 3 and 5-7.
  for (double eps : {0.1, 0.15, 0.25}) ASSERT_GT(traffic_at(eps, PlanPolicy::kDistca), 2 * o.comm_budget) << eps;
  for (int k = 1; k < 6; ++k) ASSERT_GT(traffic_at(0.05 + 0.05 * k, PlanPolicy::kDistca), o.comm_budget) << k;
  Plan p;
  const Status s = BuildPlan(docs, o, cost, &p);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_NEAR(p.tolerance_used, 0.35, 1e-12);
  EXPECT_LE(p.stats.traffic.max_rank_bytes(), o.comm_budget);
  EXPECT_TRUE(ValidatePlan(p, cost).ok());
}

// The tightest budget (what the layout alone moves) must be reachable by
// every policy: the paper policy's recipients keep pulling while their
// deficit exceeds eps * mean, so its search runs past the colocated max/mean.
TEST(PlannerTest, TightestCommBudgetFitsEveryPolicy) {
  // Loads 1, 1, 1, 0.5: max/mean - 1 = 0.14 but rank 3's deficit is 0.43 of the mean.
  const std::vector<int64_t> shallow = {4096, 4096, 4096, 2048, 2048};
  for (PlanPolicy policy : {PlanPolicy::kPaper, PlanPolicy::kDistca}) {
    for (const std::vector<int64_t>& docs : {Skewed(), shallow}) {
      PlanOptions o;
      o.ranks = 4;
      const CostModel cost = CostModel::Flops(o.model);
      Plan colocated, p;
      o.policy = PlanPolicy::kColocated;
      ASSERT_TRUE(BuildPlan(docs, o, cost, &colocated).ok());
      o.policy = policy;
      o.comm_budget = std::max<int64_t>(1, colocated.stats.traffic.max_rank_bytes());
      const Status s = BuildPlan(docs, o, cost, &p);
      ASSERT_TRUE(s.ok()) << PlanPolicyName(policy) << ": " << s.ToString();
      EXPECT_TRUE(ValidatePlan(p, cost).ok());
      EXPECT_LE(p.stats.traffic.max_rank_bytes(), o.comm_budget);
    }
  }
}

// Byte counts that 64 bits cannot hold are refused, not wrapped: 32 ranks
// of a 2^31-token document at the widest model move about 31 x 2^30 K/V
// rows of 3 x 2^27 bytes each backward, past 2^63.
TEST(PlannerTest, ByteCountsBeyond64BitsAreRefused) {
  PlanOptions o;
  o.ranks = 32;
  o.policy = PlanPolicy::kColocated;
  o.model = {4096, 4096, 4096, 8, PlanWire::kDistca};
  Plan p;
  const Status s = BuildPlan({kMaxDocumentLength}, o, CostModel::Flops(o.model), &p);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << s.ToString();
  EXPECT_TRUE(Contains(s, "more than 64-bit counters can hold")) << s.ToString();
  // A narrower model fits.
  o.model = {32, 8, 128, 2, PlanWire::kDistca};
  ASSERT_TRUE(BuildPlan({kMaxDocumentLength}, o, CostModel::Flops(o.model), &p).ok());
  EXPECT_GT(p.stats.traffic.total_bytes(), 0);
}

TEST(PlannerTest, BadOptions) {
  const CostModel cost = CostModel::Flops(PlanModel{});
  Plan p;
  PlanOptions o;
  o.ranks = 0;
  EXPECT_TRUE(Contains(BuildPlan({100}, o, cost, &p), "ranks must be positive"));
  o.ranks = 2;
  o.tolerance = -1;
  EXPECT_TRUE(Contains(BuildPlan({100}, o, cost, &p), "tolerance"));
  o.tolerance = 0.05;
  o.block = 0;
  EXPECT_TRUE(Contains(BuildPlan({100}, o, cost, &p), "block must be positive"));
  o.block = 128;
  o.model.kv_heads = 5;
  EXPECT_TRUE(Contains(BuildPlan({100}, o, cost, &p), "not a multiple of kv_heads"));
  o.model.kv_heads = 8;
  EXPECT_TRUE(Contains(BuildPlan({}, o, cost, &p), "no documents"));
  // Sizes whose bytes would overflow 64 bits, and absurd server counts.
  o.model.head_dim = 1 << 30;
  EXPECT_TRUE(Contains(BuildPlan({100}, o, cost, &p), "must be at most 16777216"));
  o.model.head_dim = 128;
  o.model.dtype_bytes = 16;
  EXPECT_TRUE(Contains(BuildPlan({100}, o, cost, &p), "dtype_bytes (16) at most 8"));
  o.model.dtype_bytes = 2;
  o.dedicated_servers = kMaxPlanServers;
  EXPECT_TRUE(Contains(BuildPlan({100}, o, cost, &p), "above the limit of 1048576 in all"));
  o.dedicated_servers = 0;
  PlanPolicy policy;
  EXPECT_TRUE(Contains(ParsePlanPolicy("fastest", &policy), "unknown policy 'fastest'"));
}

}  // namespace
}  // namespace distca
