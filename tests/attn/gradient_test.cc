// The reference backward against central finite differences of the reference
// forward, in double, on tiny shapes. The tiled kernels are in turn checked
// against the reference backward (kernel_test.cc), which closes the chain.
#include <random>

#include "attn/attention_testing.h"

namespace distca::testing {
namespace {

struct DoubleBatch {
  AttentionShape shape;
  std::vector<AttentionTask> tasks;
  std::vector<double> q, k, v, g;  // g: the upstream gradient dL/dO
};

// L = sum(O * g): its gradient with respect to O is g.
double Loss(const DoubleBatch& b) {
  std::vector<double> out(b.q.size(), 0.0), lse(b.shape.total_q * b.shape.q_heads, 0.0);
  attn::ReferenceForward<double, double>(b.shape, b.tasks, b.q.data(), b.k.data(), b.v.data(), out.data(), lse.data());
  double loss = 0.0;
  for (size_t i = 0; i < out.size(); ++i) loss += out[i] * b.g[i];
  return loss;
}

// Central difference, step 1e-5: truncation error ~ h^2 |f'''| ~ 1e-10 and
// rounding error ~ 1e-16 / h ~ 1e-11, both far below the 1e-7 tolerance.
void CheckGradient(DoubleBatch b, std::vector<double> DoubleBatch::*tensor, const std::vector<double>& analytic,
                   const char* name) {
  constexpr double kStep = 1e-5;
  std::vector<double>& x = b.*tensor;
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + kStep;
    const double up = Loss(b);
    x[i] = saved - kStep;
    const double down = Loss(b);
    x[i] = saved;
    const double numeric = (up - down) / (2 * kStep);
    EXPECT_NEAR(analytic[i], numeric, 1e-7 * (1.0 + std::abs(numeric))) << name << "[" << i << "]";
  }
}

void CheckAllGradients(DoubleBatch b, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, 1.0);
  const int64_t qn = b.shape.total_q * b.shape.q_heads * b.shape.head_dim;
  const int64_t kn = b.shape.total_k * b.shape.kv_heads * b.shape.head_dim;
  for (auto* t : {&b.q, &b.g}) {
    t->resize(qn);
    for (double& x : *t) x = dist(rng);
  }
  for (auto* t : {&b.k, &b.v}) {
    t->resize(kn);
    for (double& x : *t) x = dist(rng);
  }
  std::vector<double> out(qn), lse(b.shape.total_q * b.shape.q_heads), delta(lse.size());
  attn::ReferenceForward<double, double>(b.shape, b.tasks, b.q.data(), b.k.data(), b.v.data(), out.data(), lse.data());
  attn::ComputeDeltaRows<double, double>(b.shape, 0, b.shape.total_q, b.g.data(), out.data(), delta.data());
  std::vector<double> dq(qn), dk(kn), dv(kn);
  attn::ReferenceBackward<double, double>(b.shape, b.tasks, b.q.data(), b.k.data(), b.v.data(), b.g.data(), lse.data(),
                                          delta.data(), dq.data(), dk.data(), dv.data());
  CheckGradient(b, &DoubleBatch::q, dq, "dQ");
  CheckGradient(b, &DoubleBatch::k, dk, "dK");
  CheckGradient(b, &DoubleBatch::v, dv, "dV");
}

DoubleBatch TinyBatch(bool causal, float scale) {
  DoubleBatch b;
  b.shape = {
      .total_q = 0, .total_k = 0, .q_heads = 4, .kv_heads = 2, .head_dim = 3, .causal = causal, .softmax_scale = scale};
  // q_len < kv_len, q_len > kv_len (rows without keys), q_len == kv_len.
  for (auto [q_len, kv_len] : {std::pair{3, 5}, std::pair{4, 2}, std::pair{2, 2}}) {
    b.tasks.push_back({b.shape.total_q, q_len, b.shape.total_k, kv_len});
    b.shape.total_q += q_len;
    b.shape.total_k += kv_len;
  }
  return b;
}

TEST(GradientTest, CausalMatchesFiniteDifferences) { CheckAllGradients(TinyBatch(true, 0.0f), 1); }

TEST(GradientTest, FullMatchesFiniteDifferences) { CheckAllGradients(TinyBatch(false, 0.0f), 2); }

TEST(GradientTest, ExplicitScaleMatchesFiniteDifferences) { CheckAllGradients(TinyBatch(true, 0.8f), 3); }

// Two tasks reading overlapping K/V rows: dK/dV sum both tasks' contributions.
TEST(GradientTest, SharedKvMatchesFiniteDifferences) {
  DoubleBatch b;
  b.shape = {.total_q = 6, .total_k = 6, .q_heads = 2, .kv_heads = 1, .head_dim = 2, .causal = true};
  b.tasks = {{0, 2, 0, 3}, {2, 4, 0, 6}};  // shards [1,3) and [2,6) of one 6-token document
  CheckAllGradients(b, 4);
}

}  // namespace
}  // namespace distca::testing
