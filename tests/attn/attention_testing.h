// Helpers for CA engine tests: random batches, oracle runs and error bounds.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attn/reference.h"
#include "distca/attention.h"

namespace distca::testing {

inline std::vector<float> RandomTensor(int64_t n, std::mt19937_64& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = dist(rng);
  return x;
}

// One batch with its inputs: Q, K, V and an upstream gradient dO.
struct Batch {
  AttentionShape shape;
  std::vector<AttentionTask> tasks;
  std::vector<float> q, k, v, dout;

  int64_t QSize() const { return shape.total_q * shape.q_heads * shape.head_dim; }
  int64_t KSize() const { return shape.total_k * shape.kv_heads * shape.head_dim; }
  int64_t LseSize() const { return shape.total_q * shape.q_heads; }
};

// Fills q, k, v, dout. Scores have a standard deviation near `score_std`
// (so softmax is neither flat nor one-hot).
inline void FillInputs(Batch* b, uint64_t seed, float score_std = 2.0f) {
  std::mt19937_64 rng(seed);
  const float qk_scale = std::sqrt(score_std);
  b->q = RandomTensor(b->QSize(), rng, qk_scale);
  b->k = RandomTensor(b->KSize(), rng, qk_scale);
  b->v = RandomTensor(b->KSize(), rng);
  b->dout = RandomTensor(b->QSize(), rng);
}

// Tasks laid out back to back, each with its own K/V rows (the cu_seqlens form).
inline Batch PackedBatch(const std::vector<std::pair<int64_t, int64_t>>& q_kv_lens, int hq, int hkv, int dim,
                         bool causal, uint64_t seed) {
  Batch b;
  b.shape.q_heads = hq;
  b.shape.kv_heads = hkv;
  b.shape.head_dim = dim;
  b.shape.causal = causal;
  for (auto [q_len, kv_len] : q_kv_lens) {
    b.tasks.push_back({b.shape.total_q, q_len, b.shape.total_k, kv_len});
    b.shape.total_q += q_len;
    b.shape.total_k += kv_len;
  }
  FillInputs(&b, seed);
  return b;
}

struct ForwardResult {
  std::vector<float> out, lse;
};

struct BackwardResult {
  std::vector<float> dq, dk, dv;
};

inline ForwardResult RunForward(const Batch& b, AttentionKernel kernel, int threads = 2) {
  ForwardResult r;
  r.out.assign(b.QSize(), std::numeric_limits<float>::quiet_NaN());
  r.lse.assign(b.LseSize(), std::numeric_limits<float>::quiet_NaN());
  AttentionForwardArgs a{b.q.data(), b.k.data(), b.v.data(), r.out.data(), r.lse.data()};
  Status s = AttentionForward(b.shape, b.tasks, a, {kernel, threads});
  EXPECT_TRUE(s.ok()) << s.ToString();
  return r;
}

// Gradient buffers for `b`, NaN-filled (so that unwritten entries show), and
// the backward's arguments from the forward result `fwd` (delta computed
// from O) writing into them.
inline AttentionBackwardArgs BackwardArgs(const Batch& b, const ForwardResult& fwd, BackwardResult* r) {
  r->dq.assign(b.QSize(), std::numeric_limits<float>::quiet_NaN());
  r->dk.assign(b.KSize(), std::numeric_limits<float>::quiet_NaN());
  r->dv.assign(b.KSize(), std::numeric_limits<float>::quiet_NaN());
  AttentionBackwardArgs a;
  a.q = b.q.data();
  a.k = b.k.data();
  a.v = b.v.data();
  a.dout = b.dout.data();
  a.lse = fwd.lse.data();
  a.out = fwd.out.data();
  a.dq = r->dq.data();
  a.dk = r->dk.data();
  a.dv = r->dv.data();
  return a;
}

// Backward from the forward result `fwd` (delta computed from O, or from
// precomputed delta when `use_delta`).
inline BackwardResult RunBackward(const Batch& b, const ForwardResult& fwd, AttentionKernel kernel, int threads = 2,
                                  bool use_delta = false) {
  BackwardResult r;
  AttentionBackwardArgs a = BackwardArgs(b, fwd, &r);
  std::vector<float> delta;
  if (use_delta) {
    delta.assign(b.LseSize(), 0.0f);
    attn::ComputeDeltaRows<float, double>(b.shape, 0, b.shape.total_q, b.dout.data(), fwd.out.data(), delta.data());
    a.delta = delta.data();
    a.out = nullptr;
  }
  Status s = AttentionBackward(b.shape, b.tasks, a, {kernel, threads});
  EXPECT_TRUE(s.ok()) << s.ToString();
  return r;
}

// Forward and backward of the plain fp32 implementation (float accumulation):
// the "same-precision naive implementation" that tolerances are measured by.
inline void NaiveFp32(const Batch& b, ForwardResult* fwd, BackwardResult* bwd) {
  fwd->out.assign(b.QSize(), 0.0f);
  fwd->lse.assign(b.LseSize(), 0.0f);
  attn::ReferenceForward<float, float>(b.shape, b.tasks, b.q.data(), b.k.data(), b.v.data(), fwd->out.data(),
                                       fwd->lse.data());
  std::vector<float> delta(b.LseSize(), 0.0f);
  attn::ComputeDeltaRows<float, float>(b.shape, 0, b.shape.total_q, b.dout.data(), fwd->out.data(), delta.data());
  bwd->dq.assign(b.QSize(), 0.0f);
  bwd->dk.assign(b.KSize(), 0.0f);
  bwd->dv.assign(b.KSize(), 0.0f);
  attn::ReferenceBackward<float, float>(b.shape, b.tasks, b.q.data(), b.k.data(), b.v.data(), b.dout.data(),
                                        fwd->lse.data(), delta.data(), bwd->dq.data(), bwd->dk.data(), bwd->dv.data());
}

// Largest |a - b|, treating equal infinities as equal and NaN as infinitely wrong.
inline double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0.0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (a[i] == b[i]) continue;  // covers matching infinities
    const double d = std::abs(double(a[i]) - double(b[i]));
    if (std::isnan(d)) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, d);
  }
  return worst;
}

inline double MaxAbsFinite(const std::vector<float>& a) {
  double m = 0.0;
  for (float x : a)
    if (std::isfinite(x)) m = std::max(m, double(std::abs(x)));
  return m;
}

// Tolerance (STYLE.md rule 2, as in flash-attention's tests): the fast kernel
// may be at most twice as far from the double-precision oracle as a naive
// fp32 implementation is, plus a floor of 16 fp32 ulps of the largest value.
// The floor covers rows with few keys, where the naive error is near zero but
// the fast kernel still rounds the folded scale*log2(e) and evaluates exp2 by
// a polynomial accurate to about 2 ulp.
inline bool WithinNaiveBound(const std::vector<float>& fast, const std::vector<float>& naive,
                             const std::vector<float>& oracle, const std::string& what, std::string* why) {
  const double naive_err = MaxAbsDiff(naive, oracle);
  if (!std::isfinite(naive_err)) {  // the bound would admit any kernel
    *why = what + ": the naive fp32 result differs from the oracle by " + std::to_string(naive_err);
    return false;
  }
  const double floor = 16.0 * std::numeric_limits<float>::epsilon() * std::max(1.0, MaxAbsFinite(oracle));
  const double fast_err = MaxAbsDiff(fast, oracle);
  if (fast_err <= 2.0 * naive_err + floor) return true;
  *why = what + ": fast error " + std::to_string(fast_err) + ", naive fp32 error " + std::to_string(naive_err) +
         ", floor " + std::to_string(floor);
  return false;
}

inline void ExpectWithinNaiveBound(const std::vector<float>& fast, const std::vector<float>& naive,
                                   const std::vector<float>& oracle, const std::string& what) {
  std::string why;
  EXPECT_TRUE(WithinNaiveBound(fast, naive, oracle, what, &why)) << why;
}

// What a fast kernel is checked against: the double-precision oracle's
// forward and backward, and the same chain in plain fp32 (the error bound).
struct Oracles {
  ForwardResult ref_fwd, naive_fwd;
  BackwardResult ref_bwd, naive_bwd;
};
inline Oracles OraclesFor(const Batch& b) {
  Oracles o;
  o.ref_fwd = RunForward(b, AttentionKernel::kReference);
  o.ref_bwd = RunBackward(b, o.ref_fwd, AttentionKernel::kReference);
  NaiveFp32(b, &o.naive_fwd, &o.naive_bwd);
  return o;
}

// dQ, dK and dV each within the bound above.
inline void ExpectBackwardWithinNaiveBound(const BackwardResult& fast, const BackwardResult& naive,
                                           const BackwardResult& oracle) {
  ExpectWithinNaiveBound(fast.dq, naive.dq, oracle.dq, "dQ");
  ExpectWithinNaiveBound(fast.dk, naive.dk, oracle.dk, "dK");
  ExpectWithinNaiveBound(fast.dv, naive.dv, oracle.dv, "dV");
}

// Fast tiled kernels this CPU runs (the ones to check against the oracle).
inline std::vector<AttentionKernel> TiledKernels() {
  std::vector<AttentionKernel> k;
  for (AttentionKernel x : AvailableAttentionKernels())
    if (x != AttentionKernel::kReference) k.push_back(x);
  return k;
}

}  // namespace distca::testing
