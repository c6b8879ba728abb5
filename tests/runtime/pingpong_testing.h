// A synthetic layer stack for the ping-pong executor: each layer's callbacks
// are deterministic maps of the previous layer's activations, so outputs
// depend on every attention result, in forward and backward.
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "distca/pingpong.h"

namespace distca::testing {

class SyntheticStack : public LayerCallbacks {
 public:
  SyntheticStack(const PingPongExecutor& ex, const std::vector<Plan>& plans, int layers, int hq, int hkv, int dim)
      : layers_(layers), hq_(hq), hkv_(hkv), dim_(dim) {
    for (int n = 0; n < ex.nano_batches(); ++n) {
      const int64_t rows = ex.local_tokens(n);
      std::vector<float> h(size_t(rows * hq * dim));
      // Initial activations depend on (nano-batch, document, position).
      for (size_t doc = 0; doc < plans[n].documents.size(); ++doc)
        for (int64_t pos = 0; pos < plans[n].documents[doc].length; ++pos) {
          const int64_t row = ex.dispatcher(n).LocalRow(int(doc), pos);
          if (row < 0) continue;
          for (int64_t i = 0; i < hq * dim; ++i)
            h[row * hq * dim + i] = std::sin(0.1f * float(pos + 1) + 0.37f * float(i) + 1.3f * float(doc + 7 * n));
        }
      h_.push_back(std::vector<std::vector<float>>(size_t(layers + 1), std::vector<float>()));
      h_.back()[0] = std::move(h);
      g_.push_back(std::vector<std::vector<float>>(size_t(layers + 1), std::vector<float>()));
    }
  }

  Status BeforeAttention(int l, int n, float* q, float* k, float* v) override {
    const std::vector<float>& h = h_[n][l];
    const int64_t rows = int64_t(h.size()) / (hq_ * dim_);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < hq_ * dim_; ++i) q[r * hq_ * dim_ + i] = 0.9f * h[r * hq_ * dim_ + i] + 0.01f * float(l);
      for (int64_t i = 0; i < hkv_ * dim_; ++i) {
        k[r * hkv_ * dim_ + i] = 0.8f * h[r * hq_ * dim_ + i] - 0.02f * float(l);
        v[r * hkv_ * dim_ + i] = std::tanh(h[r * hq_ * dim_ + (hq_ * dim_ - 1 - i)]);
      }
    }
    return Status::Ok();
  }
  Status AfterAttention(int l, int n, const float* out, const float* lse) override {
    const std::vector<float>& h = h_[n][l];
    std::vector<float>& next = h_[n][l + 1];
    next.resize(h.size());
    const int64_t rows = int64_t(h.size()) / (hq_ * dim_);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < hq_ * dim_; ++i)
        next[r * hq_ * dim_ + i] =
            h[r * hq_ * dim_ + i] + 0.5f * out[r * hq_ * dim_ + i] + 0.001f * lse[(i / dim_) * rows + r];
    return Status::Ok();
  }
  Status BeforeAttentionBackward(int l, int n, float* dout) override {
    std::vector<float>& g = g_[n][l + 1];
    if (l + 1 == layers_) g = h_[n][layers_];  // dL/dh of the top layer: the output itself
    for (size_t i = 0; i < g.size(); ++i) dout[i] = 0.5f * g[i];
    return Status::Ok();
  }
  Status AfterAttentionBackward(int l, int n, const float* dq, const float* dk, const float* dv) override {
    const std::vector<float>& up = g_[n][l + 1];
    std::vector<float>& g = g_[n][l];
    g.resize(up.size());
    const int64_t rows = int64_t(up.size()) / (hq_ * dim_);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < hq_ * dim_; ++i) {
        float x = up[r * hq_ * dim_ + i] + 0.9f * dq[r * hq_ * dim_ + i];
        if (i < hkv_ * dim_) x += 0.8f * dk[r * hkv_ * dim_ + i] + 0.3f * dv[r * hkv_ * dim_ + i];
        g[r * hq_ * dim_ + i] = x;
      }
    return Status::Ok();
  }

  // Everything this rank computed: final activations and input gradients.
  std::vector<float> Results() const {
    std::vector<float> all;
    for (size_t n = 0; n < h_.size(); ++n) {
      all.insert(all.end(), h_[n][layers_].begin(), h_[n][layers_].end());
      all.insert(all.end(), g_[n][0].begin(), g_[n][0].end());
    }
    return all;
  }

 private:
  int layers_, hq_, hkv_, dim_;
  std::vector<std::vector<std::vector<float>>> h_, g_;  // [nano][layer]
};

// Plans the two nano-batches of `lengths` for `ranks` ranks.
inline Status NanoPlans(const std::vector<int64_t>& lengths, int ranks, PlanPolicy policy, int hq, int hkv, int dim,
                        std::vector<Plan>* plans) {
  std::vector<std::vector<int>> nano_docs;
  DISTCA_RETURN_IF_ERROR(SplitNanoBatches(lengths, 2, &nano_docs));
  PlanOptions o;
  o.ranks = ranks;
  o.policy = policy;
  o.block = 16;
  o.model = {.q_heads = hq, .kv_heads = hkv, .head_dim = dim, .dtype_bytes = 4};
  const CostModel cost = CostModel::Flops(o.model);
  plans->clear();
  for (const auto& docs : nano_docs) {
    std::vector<int64_t> nano_lengths;
    for (int d : docs) nano_lengths.push_back(lengths[d]);
    plans->emplace_back();
    DISTCA_RETURN_IF_ERROR(BuildPlan(nano_lengths, o, cost, &plans->back()));
  }
  return Status::Ok();
}

// Runs the stack with ping-pong on and off (and on a fault-injecting comm)
// on this rank and checks that every run gives identical bits.
inline Status CheckPingPongEquivalence(Comm& comm, const std::vector<Plan>& plans, BackwardMode mode) {
  constexpr int kLayers = 3, kHq = 4, kHkv = 2, kDim = 8;
  std::vector<float> expected;
  for (int variant = 0; variant < 3; ++variant) {
    std::unique_ptr<Comm> faulty;
    Comm* c = &comm;
    if (variant == 2) {
      faulty = MakeFaultInjectingComm(&comm, {.seed = 5 + uint64_t(comm.rank()), .max_delay_us = 500});
      c = faulty.get();
    }
    PingPongOptions o;
    o.layers = kLayers;
    o.ping_pong = variant != 1;
    o.dispatch.q_heads = kHq;
    o.dispatch.kv_heads = kHkv;
    o.dispatch.head_dim = kDim;
    o.dispatch.backward = mode;
    o.dispatch.exec.num_threads = 1;
    std::unique_ptr<PingPongExecutor> ex;
    DISTCA_RETURN_IF_ERROR(PingPongExecutor::Create(c, plans, o, &ex));
    SyntheticStack stack(*ex, plans, kLayers, kHq, kHkv, kDim);
    DISTCA_RETURN_IF_ERROR(ex->Forward(stack));
    DISTCA_RETURN_IF_ERROR(ex->Backward(stack));
    const std::vector<float> got = stack.Results();
    if (variant == 0) {
      expected = got;
    } else if (got != expected) {
      return Status::Internal(fmt::format("rank {}: results with {} differ from ping-pong", comm.rank(),
                                          variant == 1 ? "ping-pong off" : "injected delays"));
    }
  }
  return Status::Ok();
}

}  // namespace distca::testing
