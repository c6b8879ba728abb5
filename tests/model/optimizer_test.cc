// AdamW, gradient clipping and the learning-rate schedule.
#include <gtest/gtest.h>

#include <cmath>

#include "distca/model.h"

namespace distca {
namespace {

TEST(AdamWTest, MatchesHandComputedSteps) {
  ModelConfig c;
  ASSERT_TRUE(ModelPreset("tiny", &c).ok());
  std::unique_ptr<Transformer> model;
  ASSERT_TRUE(Transformer::Create(c, &model).ok());
  model->InitWeights(1);
  model->ZeroGrads();
  // Three parameters: one of a matrix (decayed), one of a norm weight (not
  // decayed), one matrix entry with a zero gradient (decay only).
  const std::vector<ParamTensor>& t = model->tensors();
  const int64_t w = t[2].offset + 5;  // layers.0.attn.wq
  const int64_t norm = t[1].offset;   // layers.0.attn_norm
  const int64_t idle = t[0].offset;   // embed
  model->params()[w] = 0.5f;
  model->params()[norm] = 1.0f;
  model->params()[idle] = -0.25f;
  AdamWOptions o;  // beta1 0.9, beta2 0.95, eps 1e-8, weight decay 0.1
  AdamW adam(*model, o);
  const float lr = 0.1f;

  // Step 1: m = 0.1 g, v = 0.05 g^2, so m_hat = g and v_hat = g^2:
  //   p -= lr * (g / (|g| + eps) + wd * p)
  model->grads()[w] = 0.2f;
  model->grads()[norm] = -0.4f;
  adam.Step(model.get(), lr);
  EXPECT_EQ(adam.step(), 1);
  // 0.5 - 0.1 * (0.2 / (0.2 + 1e-8) + 0.1 * 0.5) = 0.395000005
  EXPECT_NEAR(model->params()[w], 0.395000005, 1e-7);
  // 1 - 0.1 * (-0.4 / (0.4 + 1e-8)), no decay = 1.1000000025
  EXPECT_NEAR(model->params()[norm], 1.1000000025, 1e-7);
  // -0.25 - 0.1 * (0 + 0.1 * -0.25) = -0.2475
  EXPECT_NEAR(model->params()[idle], -0.2475, 1e-7);

  // Step 2 with gradient 0.1 on w:
  //   m = 0.9 * 0.02 + 0.1 * 0.1 = 0.028; v = 0.95 * 0.002 + 0.05 * 0.01 = 0.0024
  //   m_hat = 0.028 / 0.19 = 0.147368421; v_hat = 0.0024 / 0.0975 = 0.024615385; sqrt = 0.156892908;
  //   m_hat / sqrt = 0.939292...
  //   p = 0.395000005 - 0.1 * (0.147368421 / 0.156892908 + 0.1 * 0.395000005) = 0.2971207
  model->grads()[w] = 0.1f;
  model->grads()[norm] = 0.0f;
  adam.Step(model.get(), lr);
  const double m_hat = 0.028 / 0.19, v_hat = 0.0024 / 0.0975;
  const double expected = 0.395000005 - 0.1 * (m_hat / (std::sqrt(v_hat) + 1e-8) + 0.1 * 0.395000005);
  EXPECT_NEAR(expected, 0.2971207, 1e-7);  // the hand value above
  // fp32 state after two updates: a few ulp of values ~1.
  EXPECT_NEAR(model->params()[w], expected, 1e-6);
  EXPECT_NEAR(adam.m()[size_t(w)], 0.028, 1e-8);
  EXPECT_NEAR(adam.v()[size_t(w)], 0.0024, 1e-9);
}

TEST(ClipGradNormTest, ScalesToMaxNorm) {
  std::vector<float> g = {3.0f, 4.0f};
  EXPECT_DOUBLE_EQ(ClipGradNorm(g.data(), 2, 10.0), 5.0);  // below max: unchanged
  EXPECT_EQ(g, (std::vector<float>{3.0f, 4.0f}));
  EXPECT_DOUBLE_EQ(ClipGradNorm(g.data(), 2, 0.0), 5.0);  // max <= 0: no clipping
  EXPECT_DOUBLE_EQ(ClipGradNorm(g.data(), 2, 1.0), 5.0);
  EXPECT_FLOAT_EQ(g[0], 0.6f);
  EXPECT_FLOAT_EQ(g[1], 0.8f);
  // The norm is accumulated in double: 1e6 entries of 1e-3 square-sum exactly to 1.
  std::vector<float> many(1000000, 1e-3f);
  EXPECT_NEAR(ClipGradNorm(many.data(), int64_t(many.size()), 0.0), 1.0, 1e-6);
}

TEST(CosineLearningRateTest, WarmupPeakAndEnd) {
  constexpr float kMax = 1e-3f, kMin = 1e-4f;
  EXPECT_FLOAT_EQ(CosineLearningRate(0, 10, 100, kMax, kMin), 1e-4f);  // (0 + 1) / 10 of max
  EXPECT_FLOAT_EQ(CosineLearningRate(4, 10, 100, kMax, kMin), 5e-4f);
  EXPECT_FLOAT_EQ(CosineLearningRate(9, 10, 100, kMax, kMin), kMax);  // warmup reaches the peak
  EXPECT_FLOAT_EQ(CosineLearningRate(10, 10, 100, kMax, kMin), kMax);
  EXPECT_FLOAT_EQ(CosineLearningRate(55, 10, 100, kMax, kMin), 0.5f * (kMax + kMin));  // half way down
  EXPECT_FLOAT_EQ(CosineLearningRate(100, 10, 100, kMax, kMin), kMin);
  EXPECT_FLOAT_EQ(CosineLearningRate(500, 10, 100, kMax, kMin), kMin);
  EXPECT_FLOAT_EQ(CosineLearningRate(0, 0, 100, kMax, kMin), kMax);  // no warmup
  for (int64_t s = 11; s < 100; ++s)
    EXPECT_LT(CosineLearningRate(s, 10, 100, kMax, kMin), CosineLearningRate(s - 1, 10, 100, kMax, kMin));
}

}  // namespace
}  // namespace distca
