// The whole model: configuration, parameter layout and initialization, the
// gradient of the tiny model against finite differences of its loss, and
// disaggregated attention (ModelPass driven by the ping-pong executor on two
// local ranks) against the single-process oracle.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <mutex>
#include <random>
#include <vector>

#include "distca/comm.h"
#include "distca/model.h"
#include "distca/pingpong.h"
#include "distca/plan.h"

namespace distca {
namespace {

ModelConfig Tiny() {
  ModelConfig c;
  EXPECT_TRUE(ModelPreset("tiny", &c).ok());
  return c;
}

std::unique_ptr<Transformer> MakeModel(const ModelConfig& config, uint64_t seed) {
  std::unique_ptr<Transformer> model;
  const Status s = Transformer::Create(config, &model);
  EXPECT_TRUE(s.ok()) << s.ToString();
  model->InitWeights(seed);
  model->ZeroGrads();
  return model;
}

// Matrices 5x larger than at initialization (std 0.1): attention is then far
// from uniform, so that the scores, and with them RoPE positions and the Q/K
// gradients, matter to the loss.
void SharpenWeights(Transformer* model) {
  for (const ParamTensor& p : model->tensors())
    if (p.shape.size() > 1)
      std::for_each(model->params() + p.offset, model->params() + p.offset + p.size, [](float& w) { w *= 5.0f; });
}

std::vector<std::vector<int32_t>> RandomDocs(const std::vector<int>& lengths, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> docs;
  for (int len : lengths) {
    docs.emplace_back();
    for (int i = 0; i < len; ++i) docs.back().push_back(int32_t(rng() % uint64_t(vocab)));
  }
  return docs;
}

int64_t TargetCount(const std::vector<std::vector<int32_t>>& docs) {
  int64_t n = 0;
  for (const auto& d : docs) n += std::max<int64_t>(0, int64_t(d.size()) - 1);
  return n;
}

// ---------------------------------------------------------------------------
// Configuration

TEST(ModelConfigTest, PresetsValidateAndCountParameters) {
  for (const std::string& name : ModelPresetNames()) {
    ModelConfig c;
    ASSERT_TRUE(ModelPreset(name, &c).ok()) << name;
    EXPECT_EQ(c.name, name);
    EXPECT_TRUE(ValidateModelConfig(c).ok()) << name;
  }
  ModelConfig c;
  ASSERT_TRUE(ModelPreset("small", &c).ok());
  EXPECT_EQ(c.head_dim(), 32);
  // Llama-3-8B's published parameter count (untied embedding and LM head).
  ASSERT_TRUE(ModelPreset("llama3-8b", &c).ok());
  EXPECT_EQ(ParameterCount(c), 8030261248);
  EXPECT_EQ(c.rope_theta, 500000.0f);
  const Status unknown = ModelPreset("gpt5", &c);
  EXPECT_EQ(unknown.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.message().find("tiny"), std::string::npos) << unknown.message();
}

TEST(ModelConfigTest, ValidationNamesTheField) {
  struct Case {
    void (*edit)(ModelConfig&);
    const char* expected;
  };
  const Case cases[] = {
      {[](ModelConfig& c) { c.q_heads = 6, c.kv_heads = 4, c.hidden = 96; },
       "num_attention_heads 6 is not a multiple of num_query_groups 4"},
      {[](ModelConfig& c) { c.q_heads = 6, c.kv_heads = 4, c.hidden = 96; }, "--num-query-groups"},
      {[](ModelConfig& c) { c.hidden = 100, c.q_heads = 8; }, "--hidden-size"},
      {[](ModelConfig& c) { c.hidden = 36; }, "must be even for RoPE"},  // head dim 9
      {[](ModelConfig& c) { c.num_layers = 0; }, "--num-layers"},
      {[](ModelConfig& c) { c.ffn_hidden = -1; }, "--ffn-hidden-size"},
      {[](ModelConfig& c) { c.kv_heads = 0; }, "--num-query-groups"},
      {[](ModelConfig& c) { c.vocab_size = 0; }, "vocab_size"},
      {[](ModelConfig& c) { c.rope_theta = 0; }, "rope_theta"},
      {[](ModelConfig& c) { c.norm_eps = -1; }, "norm_eps"},
      {[](ModelConfig& c) { c.num_layers = kMaxLayers + 1; }, "num_layers 10001 is above the limit"},
      {[](ModelConfig& c) { c.vocab_size = kMaxWidth + 1; }, "(--vocab-size)"},
      {[](ModelConfig& c) { c.hidden = 2 * kMaxWidth, c.q_heads = 1 << 20, c.kv_heads = 1 << 20; }, "(--hidden-size)"},
      {[](ModelConfig& c) { c.ffn_hidden = kMaxWidth + 1; }, "(--ffn-hidden-size)"},
      // Every width within its bound, the total about 2^64 parameters.
      {[](ModelConfig& c) {
         c.num_layers = kMaxLayers, c.hidden = c.ffn_hidden = kMaxWidth, c.q_heads = c.kv_heads = 1 << 14;
       },
       "parameters, above the limit"},
  };
  for (const Case& k : cases) {
    ModelConfig c = Tiny();
    k.edit(c);
    const Status s = ValidateModelConfig(c);
    EXPECT_FALSE(s.ok()) << k.expected;
    EXPECT_NE(s.message().find(k.expected), std::string::npos) << s.message();
    std::unique_ptr<Transformer> model;
    EXPECT_FALSE(Transformer::Create(c, &model).ok());
  }
}

TEST(ModelConfigTest, LargeCountsStayExact) {
  // 1000 layers of hidden and ffn 2^22 (head dim 1024): about 2^56.8
  // parameters, within the bound and counted exactly.
  ModelConfig c = Tiny();
  c.num_layers = 1000, c.hidden = c.ffn_hidden = 1 << 22, c.q_heads = c.kv_heads = 1 << 12;
  ASSERT_TRUE(ValidateModelConfig(c).ok());
  const int64_t C = c.hidden, per_layer = 2 * C + 2 * C * C + 2 * C * C + 3 * C * C;
  EXPECT_EQ(ParameterCount(c), 2 * c.vocab_size * C + C + c.num_layers * per_layer);
}

TEST(ModelConfigTest, LayoutAndInitialization) {
  const ModelConfig c = Tiny();
  const std::vector<ParamTensor> t = ParamLayout(c);
  ASSERT_EQ(t.size(), size_t(3 + 9 * c.num_layers));
  EXPECT_EQ(t[0].name, "embed");
  EXPECT_EQ(t[2].name, "layers.0.attn.wq");
  EXPECT_EQ(t[2].shape, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(t[3].shape, (std::vector<int64_t>{32, 64}));  // wk: Hkv * D = 2 * 16
  EXPECT_EQ(t[9].name, "layers.0.mlp.w_down");
  EXPECT_EQ(t[9].shape, (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(t.back().name, "lm_head");
  int64_t offset = 0;
  for (const ParamTensor& p : t) {
    EXPECT_EQ(p.offset, offset) << p.name;
    offset += p.size;
  }
  EXPECT_EQ(offset, ParameterCount(c));

  auto a = MakeModel(c, 7), b = MakeModel(c, 7), other = MakeModel(c, 8);
  ASSERT_EQ(a->size(), ParameterCount(c));
  EXPECT_TRUE(std::equal(a->params(), a->params() + a->size(), b->params()));
  EXPECT_FALSE(std::equal(a->params(), a->params() + a->size(), other->params()));
  for (const ParamTensor& p : t) {
    const float* w = a->params() + p.offset;
    if (p.shape.size() == 1) {
      EXPECT_TRUE(std::all_of(w, w + p.size, [](float x) { return x == 1.0f; })) << p.name;
      continue;
    }
    double sum = 0, sum_sq = 0;
    for (int64_t i = 0; i < p.size; ++i) sum += w[i], sum_sq += double(w[i]) * w[i];
    const double mean = sum / double(p.size), stddev = std::sqrt(sum_sq / double(p.size) - mean * mean);
    const bool scaled = p.name.ends_with("wo") || p.name.ends_with("w_down");
    const double expected = 0.02 / (scaled ? std::sqrt(2.0 * c.num_layers) : 1.0);
    // >= 2048 samples: the sample stddev is within ~1.6% (1 sigma) of the true one; 8% is 5 sigma.
    EXPECT_NEAR(stddev, expected, 0.08 * expected) << p.name;
    EXPECT_NEAR(mean, 0.0, 5 * expected / std::sqrt(double(p.size))) << p.name;
  }
}

// ---------------------------------------------------------------------------
// Whole-model gradient against finite differences of the loss (fp32 model)

// Loss (mean over targets, accumulated in double) at the current weights;
// gradients go to a scratch buffer that is cleared.
double MeanLoss(Transformer* model, const std::vector<std::vector<int32_t>>& docs) {
  double sum = 0;
  int64_t targets = 0;
  EXPECT_TRUE(ModelLossAndGrad(model, docs, 1.0, &sum, &targets).ok());
  model->ZeroGrads();
  return sum / double(targets);
}

// d/dt of f at t = 0 by central differences at steps t and t/2, combined by
// Richardson extrapolation so that the O(t^2) truncation error cancels (O(t^4) remains).
double Derivative(const std::function<double(double)>& f, double t) {
  auto central = [&](double h) { return (f(h) - f(-h)) / (2 * h); };
  return (4 * central(t / 2) - central(t)) / 3;
}

TEST(ModelGradientTest, TinyModelMatchesFiniteDifferences) {
  const ModelConfig c = Tiny();
  auto model = MakeModel(c, 1);
  const auto docs = RandomDocs({19, 1, 12, 30}, c.vocab_size, 2);  // a 1-token document has no target
  // At initialization the logits are small: the loss is near log(V).
  EXPECT_NEAR(MeanLoss(model.get(), docs), std::log(double(c.vocab_size)), 0.1);
  SharpenWeights(model.get());
  const int64_t n_targets = TargetCount(docs);
  double loss_sum = 0;
  int64_t targets = 0;
  ASSERT_TRUE(ModelLossAndGrad(model.get(), docs, 1.0 / double(n_targets), &loss_sum, &targets).ok());
  ASSERT_EQ(targets, n_targets);
  const double loss = loss_sum / double(targets);
  const std::vector<float> grad(model->grads(), model->grads() + model->size());
  model->ZeroGrads();
  const std::vector<float> params(model->params(), model->params() + model->size());

  // Error budget of a Richardson derivative with step t: truncation O(t^4) (measured: at most 4e-5 relative at
  // the steps below, where steps 2x larger or smaller agree), plus fp32 rounding of the loss, ~eps |L| per
  // evaluation, amplified by ~1/t. Tolerance: 1e-3 relative (25x the truncation) plus 4 eps |L| / t. A wrong
  // gradient of any layer errs by O(1) relative.
  auto tolerance = [&](double numeric, double t) {
    return 1e-3 * std::abs(numeric) + 4 * std::numeric_limits<float>::epsilon() * loss / t;
  };

  // Along random directions d, entries N(0, 0.1^2) like the weights: dL/dt of L(w + t d).
  std::mt19937_64 rng(3);
  std::normal_distribution<double> normal;
  for (int dir = 0; dir < 3; ++dir) {
    std::vector<float> d(params.size());
    for (float& x : d) x = float(0.1 * normal(rng));
    double analytic = 0;
    for (size_t i = 0; i < d.size(); ++i) analytic += double(grad[i]) * d[i];
    constexpr double t = 1e-2;  // moves each weight by ~1%
    const double numeric = Derivative(
        [&](double s) {
          for (size_t i = 0; i < d.size(); ++i) model->params()[i] = float(params[i] + s * d[i]);
          return MeanLoss(model.get(), docs);
        },
        t);
    EXPECT_NEAR(analytic, numeric, tolerance(numeric, t)) << "direction " << dir;
  }
  std::copy(params.begin(), params.end(), model->params());

  // Single weights: the largest-gradient entry of every tensor of one layer and of the ends.
  for (const ParamTensor& p : model->tensors()) {
    if (!(p.name == "embed" || p.name.starts_with("layers.1.") || p.name == "final_norm" || p.name == "lm_head"))
      continue;
    int64_t best = p.offset;
    for (int64_t i = p.offset; i < p.offset + p.size; ++i)
      if (std::abs(grad[size_t(i)]) > std::abs(grad[size_t(best)])) best = i;
    constexpr double h = 0.1;  // the weights' scale; one weight moves the loss smoothly
    float* w = model->params() + best;
    const float saved = *w;
    const double numeric = Derivative(
        [&](double s) {
          *w = float(saved + s);
          const double l = MeanLoss(model.get(), docs);
          *w = saved;
          return l;
        },
        h);
    EXPECT_NEAR(grad[size_t(best)], numeric, tolerance(numeric, h)) << p.name << " element " << best - p.offset;
  }
}

// ---------------------------------------------------------------------------
// ModelPass driven by hand: a nano-batch with no rows, reuse, call order

// One OpenMP thread for the calling thread while alive: the attention
// backward is bit-reproducible only with one thread (include/distca/attention.h).
class SingleThreaded {
 public:
  SingleThreaded() : saved_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~SingleThreaded() { omp_set_num_threads(saved_); }

 private:
  int saved_;
};

// The rows of `docs` back to back, each token's target the next one of its
// document; *cu gets the documents' boundaries.
TokenRows DocRows(const std::vector<std::vector<int32_t>>& docs, std::vector<int32_t>* cu) {
  TokenRows rows;
  *cu = {0};
  for (const auto& d : docs) {
    for (size_t i = 0; i < d.size(); ++i) {
      rows.tokens.push_back(d[i]);
      rows.positions.push_back(int64_t(i));
      rows.targets.push_back(i + 1 < d.size() ? d[i + 1] : -1);
    }
    cu->push_back(int32_t(rows.size()));
  }
  return rows;
}

// One whole pass driven by hand: nano-batch 0 holds `rows` (documents at
// `cu`), nano-batch 1 no rows (its buffers are null); attention by the CA
// engine.
void DrivePass(ModelPass* pass, const ModelConfig& c, const TokenRows& rows, const std::vector<int32_t>& cu,
               double loss_scale, double* loss, int64_t* targets) {
  const int64_t N = rows.size();
  const int D = c.head_dim(), L = c.num_layers;
  const AttentionShape shape{.total_q = N, .total_k = N, .q_heads = c.q_heads, .kv_heads = c.kv_heads, .head_dim = D};
  ASSERT_TRUE(pass->Begin({rows, TokenRows{}}, loss_scale).ok());
  std::vector<std::vector<float>> q(L), k(L), v(L), o(L), lse(L);
  for (int l = 0; l < L; ++l) {
    q[l].resize(size_t(N * c.q_heads * D));
    o[l].resize(q[l].size());
    k[l].resize(size_t(N * c.kv_heads * D));
    v[l].resize(k[l].size());
    lse[l].resize(size_t(N * c.q_heads));
    ASSERT_TRUE(pass->BeforeAttention(l, 1, nullptr, nullptr, nullptr).ok());
    ASSERT_TRUE(pass->BeforeAttention(l, 0, q[l].data(), k[l].data(), v[l].data()).ok());
    ASSERT_TRUE(
        AttentionVarlenForward(shape, cu, cu, {q[l].data(), k[l].data(), v[l].data(), o[l].data(), lse[l].data()})
            .ok());
    ASSERT_TRUE(pass->AfterAttention(l, 1, nullptr, nullptr).ok());
    ASSERT_TRUE(pass->AfterAttention(l, 0, o[l].data(), lse[l].data()).ok());
  }
  ASSERT_TRUE(pass->Loss(loss, targets).ok());
  std::vector<float> dout(q[0].size()), dq(q[0].size()), dk(k[0].size()), dv(k[0].size());
  for (int l = L - 1; l >= 0; --l) {
    ASSERT_TRUE(pass->BeforeAttentionBackward(l, 0, dout.data()).ok());
    ASSERT_TRUE(pass->BeforeAttentionBackward(l, 1, nullptr).ok());
    AttentionBackwardArgs args{.q = q[l].data(),
                               .k = k[l].data(),
                               .v = v[l].data(),
                               .dout = dout.data(),
                               .lse = lse[l].data(),
                               .out = o[l].data(),
                               .dq = dq.data(),
                               .dk = dk.data(),
                               .dv = dv.data()};
    ASSERT_TRUE(AttentionVarlenBackward(shape, cu, cu, args).ok());
    ASSERT_TRUE(pass->AfterAttentionBackward(l, 0, dq.data(), dk.data(), dv.data()).ok());
    ASSERT_TRUE(pass->AfterAttentionBackward(l, 1, nullptr, nullptr, nullptr).ok());
  }
  ASSERT_TRUE(pass->End().ok());
}

// Every gradient of `model` within 1e-5 of its tensor's largest in
// `reference`, times `factor` (a few eps_fp32 of partial sums that stay
// within a few times that largest gradient; 1e-5 of it is ~100 eps).
void ExpectGradsNear(Transformer& model, Transformer& reference, double factor) {
  for (const ParamTensor& p : model.tensors()) {
    double scale = 0;
    for (int64_t i = p.offset; i < p.offset + p.size; ++i)
      scale = std::max(scale, std::abs(double(reference.grads()[i])));
    for (int64_t i = p.offset; i < p.offset + p.size; ++i)
      ASSERT_NEAR(model.grads()[i], factor * reference.grads()[i], 1e-5 * scale) << p.name << " " << i - p.offset;
  }
}

// Two random documents (25 and 14 tokens) as rows, and the oracle's loss
// and gradients on them (loss scale 0.5) for a model initialized with
// `model_seed`.
struct OracleCase {
  std::vector<int32_t> cu;
  TokenRows rows;
  std::unique_ptr<Transformer> oracle;
  double loss = 0;
  int64_t targets = 0;
};
void MakeOracleCase(const ModelConfig& c, uint64_t docs_seed, uint64_t model_seed, OracleCase* k) {
  const auto docs = RandomDocs({25, 14}, c.vocab_size, docs_seed);
  k->oracle = MakeModel(c, model_seed);
  ASSERT_TRUE(ModelLossAndGrad(k->oracle.get(), docs, 0.5, &k->loss, &k->targets).ok());
  k->rows = DocRows(docs, &k->cu);
}

TEST(ModelPassTest, EmptyNanoBatchAndReuseMatchOracle) {
  SingleThreaded single_threaded;
  const ModelConfig c = Tiny();
  OracleCase k;
  ASSERT_NO_FATAL_FAILURE(MakeOracleCase(c, 4, 5, &k));
  const double ref_loss = k.loss;
  const int64_t ref_targets = k.targets;
  const auto& oracle = k.oracle;
  const auto& rows = k.rows;
  const auto& cu = k.cu;
  auto model = MakeModel(c, 5);
  ModelPass pass(model.get(), 1);
  for (int repeat = 0; repeat < 2; ++repeat) {
    double loss = 0;
    int64_t targets = 0;
    ASSERT_NO_FATAL_FAILURE(DrivePass(&pass, c, rows, cu, 0.5, &loss, &targets));
    EXPECT_EQ(targets, ref_targets);
    // Same rows, same kernels, same order as the oracle: the same bits.
    EXPECT_EQ(loss, ref_loss);
    EXPECT_GT(pass.activation_bytes(), 0);
    EXPECT_GT(pass.times().linear_seconds, 0.0);
    if (repeat == 0) {
      for (int64_t i = 0; i < model->size(); ++i) ASSERT_EQ(model->grads()[i], oracle->grads()[i]) << i;
    }
  }
  // The second pass adds onto the first: twice the oracle's gradients up to
  // the rounding of those additions.
  ExpectGradsNear(*model, *oracle, 2.0);
}

// The LM head in chunks of 7 rows (39 rows: five full chunks and a short
// one): the loss and every gradient as the oracle's, which runs it in one.
TEST(ModelPassTest, ChunkedLmHeadMatchesOracle) {
  SingleThreaded single_threaded;
  const ModelConfig c = Tiny();
  OracleCase k;
  ASSERT_NO_FATAL_FAILURE(MakeOracleCase(c, 8, 6, &k));
  auto model = MakeModel(c, 6);
  ModelPass pass(model.get(), 1, 7 * int64_t{c.vocab_size} + 3);
  double loss = 0;
  int64_t targets = 0;
  ASSERT_NO_FATAL_FAILURE(DrivePass(&pass, c, k.rows, k.cu, 0.5, &loss, &targets));
  EXPECT_EQ(targets, k.targets);
  EXPECT_NEAR(loss, k.loss, 1e-6 * std::abs(k.loss));
  ExpectGradsNear(*model, *k.oracle, 1.0);
}

TEST(ModelPassTest, RejectsCallsOutOfOrderAndBadTokens) {
  const ModelConfig c = Tiny();
  auto model = MakeModel(c, 1);
  ModelPass pass(model.get(), 0);
  std::vector<float> buf(1024);
  const auto out_of_order = [](const Status& st, StatusCode code, const std::string& why) {
    EXPECT_EQ(st.code(), code) << st.ToString();
    EXPECT_NE(st.message().find(why), std::string::npos) << st.ToString();
  };
  out_of_order(pass.BeforeAttention(0, 0, buf.data(), buf.data(), buf.data()), StatusCode::kFailedPrecondition,
               "ModelPass::BeforeAttention before Begin");
  // Each check on its own (valid everything else), by its message: a token
  // past the vocabulary would read past the embedding table.
  const auto refused = [&](const TokenRows& rows, double scale, const std::string& why) {
    const Status st = pass.Begin({rows}, scale);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << why;
    EXPECT_NE(st.message().find(why), std::string::npos) << st.ToString();
  };
  refused({.tokens = {1, 256}, .positions = {0, 1}, .targets = {2, -1}}, 1.0,
          "row 1: token 256 is outside the vocabulary [0, 256)");
  refused({.tokens = {-1, 2}, .positions = {0, 1}, .targets = {2, -1}}, 1.0, "row 0: token -1 is outside");
  refused({.tokens = {1, 2}, .positions = {0, 1}, .targets = {256, -1}}, 1.0, "row 0: target 256 is outside");
  refused({.tokens = {1, 2}, .positions = {0, -1}, .targets = {2, -1}}, 1.0, "row 1: negative position -1");
  refused({.tokens = {1, 2}, .positions = {0}, .targets = {2, -1}}, 1.0, "2 tokens but 1 positions and 2 targets");
  refused({.tokens = {1, 2}, .positions = {0, 1}, .targets = {2, -1}}, std::nan(""), "loss_scale nan is not finite");
  TokenRows rows{.tokens = {1, 2}, .positions = {0, 1}, .targets = {2, -1}};
  ASSERT_TRUE(pass.Begin({rows}, 1.0).ok());
  out_of_order(pass.AfterAttention(0, 0, buf.data(), buf.data()), StatusCode::kFailedPrecondition,
               "ModelPass::AfterAttention(layer 0, nano-batch 0) out of order: expected call 1 of the forward but 0 "
               "were done");
  out_of_order(pass.BeforeAttention(1, 0, buf.data(), buf.data(), buf.data()), StatusCode::kFailedPrecondition,
               "ModelPass::BeforeAttention(layer 1, nano-batch 0) out of order: expected call 2");
  out_of_order(pass.BeforeAttention(0, 1, buf.data(), buf.data(), buf.data()), StatusCode::kInvalidArgument,
               "nano-batch 1 not in [0, 1)");
  double loss = 0;
  int64_t targets = 0;
  out_of_order(pass.Loss(&loss, &targets), StatusCode::kFailedPrecondition,
               "ModelPass::Loss: nano-batch 0 has done 0 of " + std::to_string(2 * c.num_layers) + " forward calls");
  out_of_order(pass.End(), StatusCode::kFailedPrecondition, "ModelPass::End before Begin and Loss");
}

// ---------------------------------------------------------------------------
// Disaggregated attention on two local ranks equals the single-process oracle

struct RankResult {
  double loss = 0;
  int64_t targets = 0;
  std::vector<float> grads;
};

TEST(ModelPassTest, PingPongOnTwoRanksMatchesOracle) {
  const ModelConfig c = Tiny();
  constexpr int kRanks = 2;
  constexpr uint64_t kSeed = 11;
  const std::vector<int> lengths = {37, 64, 23, 50, 9, 41};
  const auto docs = RandomDocs(lengths, c.vocab_size, 6);
  const double loss_scale = 1.0 / double(TargetCount(docs));

  auto oracle = MakeModel(c, kSeed);
  SharpenWeights(oracle.get());
  double ref_loss = 0;
  int64_t ref_targets = 0;
  ASSERT_TRUE(ModelLossAndGrad(oracle.get(), docs, loss_scale, &ref_loss, &ref_targets).ok());

  // Two nano-batches of whole documents, each laid out over both ranks.
  std::vector<int64_t> lengths64(lengths.begin(), lengths.end());
  std::vector<std::vector<int>> nano_docs;
  ASSERT_TRUE(SplitNanoBatches(lengths64, 2, &nano_docs).ok());
  PlanOptions po;
  po.ranks = kRanks;
  po.block = 16;
  po.model = {.q_heads = c.q_heads, .kv_heads = c.kv_heads, .head_dim = c.head_dim(), .dtype_bytes = 4};
  const CostModel cost = CostModel::Flops(po.model);
  std::vector<Plan> plans;
  int split_documents = 0;  // documents whose second piece starts at a position > 0 on another rank
  for (const auto& nd : nano_docs) {
    std::vector<int64_t> nano_lengths;
    for (int d : nd) nano_lengths.push_back(lengths64[size_t(d)]);
    plans.emplace_back();
    ASSERT_TRUE(BuildPlan(nano_lengths, po, cost, &plans.back()).ok());
    for (const PlanDocument& doc : plans.back().documents)
      if (doc.pieces.size() > 1 && doc.pieces[1].rank != doc.pieces[0].rank) ++split_documents;
  }
  // RoPE must use document positions: a rank's piece of a split document does not start at 0.
  ASSERT_GE(split_documents, 1);

  for (bool ping_pong : {true, false}) {
    std::vector<RankResult> results(kRanks);
    CommOptions co;
    co.backend = CommOptions::Backend::kLocal;
    co.local_ranks = kRanks;
    const Status s = RunOnRanks(co, [&](Comm& comm) -> Status {
      auto model = MakeModel(c, kSeed);
      SharpenWeights(model.get());
      PingPongOptions o;
      o.layers = c.num_layers;
      o.ping_pong = ping_pong;
      o.dispatch.q_heads = c.q_heads;
      o.dispatch.kv_heads = c.kv_heads;
      o.dispatch.head_dim = c.head_dim();
      o.dispatch.exec.num_threads = 1;
      std::unique_ptr<PingPongExecutor> ex;
      DISTCA_RETURN_IF_ERROR(PingPongExecutor::Create(&comm, plans, o, &ex));
      // This rank's rows of each nano-batch, in the dispatcher's local order.
      std::vector<TokenRows> nanos(plans.size());
      for (size_t n = 0; n < plans.size(); ++n) {
        const int64_t local = ex->local_tokens(int(n));
        TokenRows& r = nanos[n];
        r.tokens.assign(size_t(local), -1);
        r.positions.assign(size_t(local), -1);
        r.targets.assign(size_t(local), -1);
        for (size_t d = 0; d < nano_docs[n].size(); ++d) {
          const std::vector<int32_t>& doc = docs[size_t(nano_docs[n][d])];
          for (size_t pos = 0; pos < doc.size(); ++pos) {
            const int64_t row = ex->dispatcher(int(n)).LocalRow(int(d), int64_t(pos));
            if (row < 0) continue;
            r.tokens[size_t(row)] = doc[pos];
            r.positions[size_t(row)] = int64_t(pos);
            r.targets[size_t(row)] = pos + 1 < doc.size() ? doc[pos + 1] : -1;
          }
        }
      }
      ModelPass pass(model.get(), 1);
      RankResult& out = results[size_t(comm.rank())];
      DISTCA_RETURN_IF_ERROR(pass.Begin(std::move(nanos), loss_scale));
      DISTCA_RETURN_IF_ERROR(ex->Forward(pass));
      DISTCA_RETURN_IF_ERROR(pass.Loss(&out.loss, &out.targets));
      DISTCA_RETURN_IF_ERROR(ex->Backward(pass));
      DISTCA_RETURN_IF_ERROR(pass.End());
      out.grads.assign(model->grads(), model->grads() + model->size());
      return Status::Ok();
    });
    ASSERT_TRUE(s.ok()) << s.ToString();

    double loss = 0;
    int64_t targets = 0;
    std::vector<double> grads(size_t(oracle->size()), 0.0);
    for (const RankResult& r : results) {
      loss += r.loss;
      targets += r.targets;
      for (size_t i = 0; i < grads.size(); ++i) grads[i] += r.grads[i];
    }
    EXPECT_EQ(targets, ref_targets);
    EXPECT_NEAR(loss, ref_loss, 1e-5 * ref_loss) << "ping_pong " << ping_pong;
    // Both sides compute the same fp32 function with different summation orders (GEMM blocking over other row
    // counts, attention split into tasks on two servers, the sum over ranks), so they differ by rounding only:
    // a few eps_fp32 of each tensor's largest gradient (measured: below 1e-6 of it, ~8 eps). 1e-5 of it (~80
    // eps) leaves 10x; a token at a wrong position or a missing piece errs by O(1e-2) or more.
    for (const ParamTensor& p : oracle->tensors()) {
      double scale = 0, worst = 0;
      for (int64_t i = p.offset; i < p.offset + p.size; ++i) {
        scale = std::max(scale, std::abs(double(oracle->grads()[i])));
        worst = std::max(worst, std::abs(grads[size_t(i)] - double(oracle->grads()[i])));
      }
      EXPECT_LE(worst, 1e-5 * scale) << p.name << " ping_pong " << ping_pong << " scale " << scale;
    }
  }
}

}  // namespace
}  // namespace distca
