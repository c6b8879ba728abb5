// The Llama-style decoder: weights, the per-nano-batch forward and backward
// that a ping-pong executor drives (ModelPass), and the single-process oracle
// (ModelLossAndGrad). See include/distca/model.h.
//
// Per layer l and nano-batch (N rows), with the fused projections
// W_qkv = [wq; wk; wv] ((Hq + 2 Hkv) D, C) and W_gu = [w_gate; w_up] (2F, C),
// which are adjacent in the parameter layout:
//   BeforeAttention   h = attn_norm(x_l); qkv = h W_qkv^T; q, k = RoPE(q, k)
//   AfterAttention    x_mid = x_l + out wo^T; g = mlp_norm(x_mid);
//                     gu = g W_gu^T; x_{l+1} = x_mid + SwiGLU(gu) w_down^T
// Saved per (layer, nano-batch) for the backward: x_l, h, attn rstd, out,
// x_mid, g, mlp rstd, gu. SwiGLU(gu) is recomputed in the backward.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <numbers>
#include <random>

#include <fmt/format.h>

#include "common/aligned_buffer.h"
#include "common/timer.h"
#include "distca/attention.h"
#include "distca/model.h"
#include "model/layers.h"

namespace distca {
namespace {

using model::CrossEntropyForwardBackward;
using model::EmbeddingBackward;
using model::EmbeddingForward;
using model::LinearBackward;
using model::LinearForward;
using model::RmsNormBackward;
using model::RmsNormForward;
using model::RopeBackward;
using model::RopeForward;
using model::RopeTables;
using model::SwiGluBackward;
using model::SwiGluForward;

// Offsets of the tensors the layer code reads, into the flat buffers.
struct LayerOffsets {
  int64_t attn_norm = 0;
  int64_t wqkv = 0;  // wq, wk, wv back to back
  int64_t wo = 0;
  int64_t mlp_norm = 0;
  int64_t w_gate_up = 0;  // w_gate, w_up back to back
  int64_t w_down = 0;
};

struct ParamOffsets {
  int64_t embed = 0;
  std::vector<LayerOffsets> layers;
  int64_t final_norm = 0;
  int64_t lm_head = 0;
};

// Index arithmetic over ParamLayout's order: embed, 9 tensors per layer, final_norm, lm_head.
ParamOffsets ComputeOffsets(const std::vector<ParamTensor>& t, int num_layers) {
  constexpr int kPerLayer = 9;
  ParamOffsets o;
  o.embed = t[0].offset;
  for (int l = 0; l < num_layers; ++l) {
    const size_t base = 1 + size_t(l) * kPerLayer;
    o.layers.push_back({.attn_norm = t[base].offset,
                        .wqkv = t[base + 1].offset,
                        .wo = t[base + 4].offset,
                        .mlp_norm = t[base + 5].offset,
                        .w_gate_up = t[base + 6].offset,
                        .w_down = t[base + 8].offset});
  }
  o.final_norm = t[1 + size_t(num_layers) * kPerLayer].offset;
  o.lm_head = t[2 + size_t(num_layers) * kPerLayer].offset;
  return o;
}

// Sets the calling thread's OpenMP team size (which oneDNN follows) for its
// lifetime; threads <= 0 leaves it alone.
class ScopedOmpThreads {
 public:
  explicit ScopedOmpThreads(int threads) : saved_(omp_get_max_threads()), active_(threads > 0) {
    if (active_) omp_set_num_threads(threads);
  }
  ~ScopedOmpThreads() {
    if (active_) omp_set_num_threads(saved_);
  }
  ScopedOmpThreads(const ScopedOmpThreads&) = delete;
  ScopedOmpThreads& operator=(const ScopedOmpThreads&) = delete;

 private:
  int saved_;
  bool active_;
};

// N(0, 1) samples by Box-Muller from mt19937_64, so the sequence is the same
// with every standard library (std::normal_distribution's is not).
class NormalSampler {
 public:
  explicit NormalSampler(uint64_t seed) : rng_(seed) {}
  double Next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - Uniform();  // (0, 1]: log(u1) is finite
    const double u2 = Uniform();
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double angle = 2.0 * std::numbers::pi * u2;
    spare_ = radius * std::sin(angle);
    has_spare_ = true;
    return radius * std::cos(angle);
  }

 private:
  double Uniform() { return double(rng_() >> 11) * 0x1.0p-53; }  // [0, 1), 53 random bits
  std::mt19937_64 rng_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

// Grows a scratch buffer to at least `count` elements (contents undefined).
void Reserve(AlignedBuffer<float>& buffer, size_t count) {
  if (buffer.size() < count) buffer.Resize(count);
}

// Exactly `count` elements (kept when the size already matches).
void Fit(AlignedBuffer<float>& buffer, size_t count) {
  if (buffer.size() != count) buffer.Resize(count);
}

}  // namespace

// ---------------------------------------------------------------------------
// Transformer

class Transformer::Impl {
 public:
  ModelConfig config;
  std::vector<ParamTensor> tensors;
  AlignedBuffer<float> params;
  AlignedBuffer<float> grads;
};

Transformer::Transformer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Transformer::~Transformer() = default;

Status Transformer::Create(const ModelConfig& config, std::unique_ptr<Transformer>* out) {
  if (out == nullptr) return Status::InvalidArgument("Transformer::Create: out must not be null");
  DISTCA_RETURN_IF_ERROR(ValidateModelConfig(config).WithContext("model config '" + config.name + "'"));
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->tensors = ParamLayout(config);
  const int64_t count = ParameterCount(config);
  try {
    impl->params.Resize(size_t(count));
    impl->grads.Resize(size_t(count));
  } catch (const std::bad_alloc&) {
    return Status::Unavailable(fmt::format("model '{}': cannot allocate {} parameters and their gradients ({:.1f} GiB)",
                                           config.name, count, 8.0 * double(count) / double(1 << 30)));
  }
  out->reset(new Transformer(std::move(impl)));
  return Status::Ok();
}

const ModelConfig& Transformer::config() const { return impl_->config; }
const std::vector<ParamTensor>& Transformer::tensors() const { return impl_->tensors; }
int64_t Transformer::size() const { return int64_t(impl_->params.size()); }
float* Transformer::params() { return impl_->params.data(); }
const float* Transformer::params() const { return impl_->params.data(); }
float* Transformer::grads() { return impl_->grads.data(); }
void Transformer::ZeroGrads() { std::fill_n(impl_->grads.data(), impl_->grads.size(), 0.0f); }

void Transformer::InitWeights(uint64_t seed) {
  NormalSampler normal(seed);
  const double residual_scale = 1.0 / std::sqrt(2.0 * impl_->config.num_layers);
  for (const ParamTensor& t : impl_->tensors) {
    float* p = impl_->params.data() + t.offset;
    if (t.shape.size() == 1) {  // norm weights
      std::fill_n(p, t.size, 1.0f);
      continue;
    }
    const bool output_projection = t.name.ends_with(".attn.wo") || t.name.ends_with(".mlp.w_down");
    const double stddev = 0.02 * (output_projection ? residual_scale : 1.0);
    for (int64_t i = 0; i < t.size; ++i) p[i] = float(stddev * normal.Next());
  }
}

// ---------------------------------------------------------------------------
// ModelPass

class ModelPass::Impl {
 public:
  Impl(Transformer* model, int threads, int64_t max_logit_floats)
      : model_(model),
        config_(model->config()),
        offsets_(ComputeOffsets(model->tensors(), config_.num_layers)),
        threads_(threads),
        C_(config_.hidden),
        D_(config_.head_dim()),
        F_(config_.ffn_hidden),
        V_(config_.vocab_size),
        L_(config_.num_layers),
        q_dim_(config_.q_heads * D_),
        kv_dim_(config_.kv_heads * D_),
        qkv_dim_(q_dim_ + 2 * kv_dim_),
        max_logit_floats_(max_logit_floats) {}

  Status Begin(std::vector<TokenRows> nanos, double loss_scale);
  Status Loss(double* loss_sum, int64_t* targets);
  Status End();
  Status BeforeAttention(int l, int n, float* q, float* k, float* v);
  Status AfterAttention(int l, int n, const float* out);
  Status BeforeAttentionBackward(int l, int n, float* dout);
  Status AfterAttentionBackward(int l, int n, const float* dq, const float* dk, const float* dv);

  ModelTimes times;
  int64_t activation_bytes = 0;

 private:
  // What one layer keeps for the backward of one nano-batch.
  struct LayerActivations {
    AlignedBuffer<float> x;          // (N, C) layer input, the residual stream
    AlignedBuffer<float> attn_rstd;  // (N)
    AlignedBuffer<float> h;          // (N, C) attn_norm(x)
    AlignedBuffer<float> att;        // (N, Hq * D) attention output (a copy of the executor's)
    AlignedBuffer<float> x_mid;      // (N, C) x + att wo^T
    AlignedBuffer<float> mlp_rstd;   // (N)
    AlignedBuffer<float> g;          // (N, C) mlp_norm(x_mid)
    AlignedBuffer<float> gate_up;    // (N, 2F) g W_gu^T
  };

  struct NanoState {
    TokenRows rows;
    AlignedBuffer<float> rope_cos, rope_sin;  // (N, D/2), from the rows' document positions
    std::vector<LayerActivations> layers;     // L
    AlignedBuffer<float> x_out;               // (N, C) the last layer's output
    AlignedBuffer<float> dresid;              // (N, C) dL/d(residual stream) at the current point of the backward
    int forward_calls = 0;                    // callbacks done: 2 per layer
    int backward_calls = 0;
  };

  const float* P(int64_t offset) const { return model_->params() + offset; }
  float* G(int64_t offset) { return model_->grads() + offset; }
  // Output of layer l = input of layer l + 1.
  float* LayerOutput(NanoState& s, int l) { return l + 1 < L_ ? s.layers[size_t(l) + 1].x.data() : s.x_out.data(); }

  Status CheckCall(const char* what, int l, int n, bool backward, int expected_call) const;
  // One layer callback of nano-batch n: checks the call's order (CheckCall),
  // runs body(s, activations of layer l, its parameter offsets, rows) when
  // the nano-batch has rows, counts the call and its linear time.
  template <class Body>
  Status LayerStep(const char* what, int l, int n, bool backward, int expected_call, Body&& body);
  // Every nano-batch has made all 2 L of its forward (or backward) calls.
  Status CheckPassDone(const char* what, bool backward) const;

  Transformer* model_;
  ModelConfig config_;
  ParamOffsets offsets_;
  int threads_;
  const int C_, D_, F_, V_, L_;
  const int q_dim_, kv_dim_, qkv_dim_;

  std::vector<NanoState> nanos_;
  double loss_scale_ = 1.0;
  bool began_ = false, loss_done_ = false;

  // Scratch shared by all nano-batches (callbacks run one at a time).
  AlignedBuffer<float> qkv_;       // (N, (Hq + 2 Hkv) D): projections, then their gradients
  AlignedBuffer<float> act_;       // (N, F) SwiGLU output
  AlignedBuffer<float> dact_;      // (N, F)
  AlignedBuffer<float> dgate_up_;  // (N, 2F)
  AlignedBuffer<float> dnorm_;     // (N, C) gradient at a norm's output
  // LM head, over row chunks of at most head_rows_ (max_logit_floats_ / V).
  const int64_t max_logit_floats_;
  int64_t head_rows_ = 0;
  AlignedBuffer<float> head_h_;       // (rows, C) final_norm(x_out)
  AlignedBuffer<float> head_rstd_;    // (rows)
  AlignedBuffer<float> head_logits_;  // (rows, V) logits, then dlogits in place
  AlignedBuffer<float> head_losses_;  // (rows)
};

Status ModelPass::Impl::Begin(std::vector<TokenRows> nanos, double loss_scale) {
  began_ = loss_done_ = false;
  times = {};
  if (!std::isfinite(loss_scale))
    return Status::InvalidArgument(fmt::format("loss_scale {} is not finite", loss_scale));
  for (size_t n = 0; n < nanos.size(); ++n) {
    const TokenRows& r = nanos[n];
    const int64_t N = r.size();
    if (int64_t(r.positions.size()) != N || int64_t(r.targets.size()) != N) {
      return Status::InvalidArgument(fmt::format("nano-batch {}: {} tokens but {} positions and {} targets", n, N,
                                                 r.positions.size(), r.targets.size()));
    }
    for (int64_t i = 0; i < N; ++i) {
      if (r.tokens[i] < 0 || r.tokens[i] >= V_) {
        return Status::InvalidArgument(
            fmt::format("nano-batch {} row {}: token {} is outside the vocabulary [0, {})", n, i, r.tokens[i], V_));
      }
      if (r.targets[i] < -1 || r.targets[i] >= V_) {
        return Status::InvalidArgument(fmt::format(
            "nano-batch {} row {}: target {} is outside the vocabulary [0, {}) (or -1)", n, i, r.targets[i], V_));
      }
      if (r.positions[i] < 0)
        return Status::InvalidArgument(fmt::format("nano-batch {} row {}: negative position {}", n, i, r.positions[i]));
    }
  }
  ScopedOmpThreads threads(threads_);
  WallTimer timer;
  loss_scale_ = loss_scale;
  int64_t max_rows = 0, floats = 0;
  try {
    nanos_.resize(nanos.size());
    for (size_t n = 0; n < nanos.size(); ++n) {
      NanoState& s = nanos_[n];
      s.rows = std::move(nanos[n]);
      s.forward_calls = s.backward_calls = 0;
      const int64_t N = s.rows.size();
      const size_t rows = size_t(N), nc = size_t(N) * C_;
      max_rows = std::max(max_rows, N);
      Fit(s.rope_cos, rows * size_t(D_ / 2));
      Fit(s.rope_sin, rows * size_t(D_ / 2));
      s.layers.resize(size_t(L_));
      for (LayerActivations& a : s.layers) {
        Fit(a.x, nc);
        Fit(a.attn_rstd, rows);
        Fit(a.h, nc);
        Fit(a.att, rows * size_t(q_dim_));
        Fit(a.x_mid, nc);
        Fit(a.mlp_rstd, rows);
        Fit(a.g, nc);
        Fit(a.gate_up, rows * 2 * size_t(F_));
      }
      Fit(s.x_out, nc);
      Fit(s.dresid, nc);
      const int64_t per_layer = N * (4 * int64_t{C_} + 2 + q_dim_ + 2 * int64_t{F_});
      floats += int64_t{L_} * per_layer + N * (2 * int64_t{C_} + D_);
    }
    Reserve(qkv_, size_t(max_rows) * size_t(qkv_dim_));
    Reserve(act_, size_t(max_rows) * size_t(F_));
    Reserve(dact_, size_t(max_rows) * size_t(F_));
    Reserve(dgate_up_, size_t(max_rows) * 2 * size_t(F_));
    Reserve(dnorm_, size_t(max_rows) * size_t(C_));
    // The logits of a chunk take at most max_logit_floats_ (at least one row).
    head_rows_ = std::max<int64_t>(1, std::min<int64_t>(max_rows, max_logit_floats_ / V_));
    Reserve(head_h_, size_t(head_rows_) * size_t(C_));
    Reserve(head_rstd_, size_t(head_rows_));
    Reserve(head_logits_, size_t(head_rows_) * size_t(V_));
    Reserve(head_losses_, size_t(head_rows_));
  } catch (const std::bad_alloc&) {
    nanos_.clear();
    return Status::Unavailable(
        fmt::format("ModelPass: out of memory allocating activations for {} nano-batches of up "
                    "to {} rows",
                    nanos.size(), max_rows));
  }
  activation_bytes = floats * int64_t{sizeof(float)};
  for (NanoState& s : nanos_) {
    const int64_t N = s.rows.size();
    if (N == 0) continue;
    RopeTables(s.rope_cos.data(), s.rope_sin.data(), s.rows.positions.data(), N, D_, double(config_.rope_theta));
    float* x0 = L_ > 0 ? s.layers[0].x.data() : s.x_out.data();
    EmbeddingForward(x0, s.rows.tokens.data(), P(offsets_.embed), N, C_);
  }
  began_ = true;
  times.linear_seconds += timer.Seconds();
  return Status::Ok();
}

Status ModelPass::Impl::CheckCall(const char* what, int l, int n, bool backward, int expected_call) const {
  if (!began_) return Status::FailedPrecondition(fmt::format("ModelPass::{} before Begin", what));
  if (l < 0 || l >= L_)
    return Status::InvalidArgument(fmt::format("ModelPass::{}: layer {} not in [0, {})", what, l, L_));
  if (n < 0 || n >= int(nanos_.size())) {
    return Status::InvalidArgument(fmt::format("ModelPass::{}: nano-batch {} not in [0, {})", what, n, nanos_.size()));
  }
  if (backward && !loss_done_) return Status::FailedPrecondition(fmt::format("ModelPass::{} before Loss", what));
  if (!backward && loss_done_) return Status::FailedPrecondition(fmt::format("ModelPass::{} after Loss", what));
  const NanoState& s = nanos_[size_t(n)];
  const int done = backward ? s.backward_calls : s.forward_calls;
  if (done != expected_call) {
    return Status::FailedPrecondition(
        fmt::format("ModelPass::{}(layer {}, nano-batch {}) out of order: expected call {} of the {} but {} were done",
                    what, l, n, expected_call, backward ? "backward" : "forward", done));
  }
  return Status::Ok();
}

template <class Body>
Status ModelPass::Impl::LayerStep(const char* what, int l, int n, bool backward, int expected_call, Body&& body) {
  DISTCA_RETURN_IF_ERROR(CheckCall(what, l, n, backward, expected_call));
  ScopedOmpThreads threads(threads_);
  WallTimer timer;
  NanoState& s = nanos_[size_t(n)];
  const int64_t N = s.rows.size();
  if (N > 0) DISTCA_RETURN_IF_ERROR(body(s, s.layers[size_t(l)], offsets_.layers[size_t(l)], N));
  ++(backward ? s.backward_calls : s.forward_calls);
  times.linear_seconds += timer.Seconds();
  return Status::Ok();
}

Status ModelPass::Impl::CheckPassDone(const char* what, bool backward) const {
  for (size_t n = 0; n < nanos_.size(); ++n) {
    const int done = backward ? nanos_[n].backward_calls : nanos_[n].forward_calls;
    if (done != 2 * L_) {
      return Status::FailedPrecondition(fmt::format("ModelPass::{}: nano-batch {} has done {} of {} {} calls", what, n,
                                                    done, 2 * L_, backward ? "backward" : "forward"));
    }
  }
  return Status::Ok();
}

Status ModelPass::Impl::BeforeAttention(int l, int n, float* q, float* k, float* v) {
  return LayerStep(
      "BeforeAttention", l, n, false, 2 * l,
      [&](NanoState& s, LayerActivations& a, const LayerOffsets& o, int64_t N) -> Status {
        float* qkv = qkv_.data();
        RmsNormForward(a.h.data(), a.attn_rstd.data(), a.x.data(), P(o.attn_norm), N, C_, config_.norm_eps);
        DISTCA_RETURN_IF_ERROR(LinearForward(qkv, a.h.data(), P(o.wqkv), N, C_, qkv_dim_, false));
        RopeForward(q, q_dim_, qkv, qkv_dim_, s.rope_cos.data(), s.rope_sin.data(), N, config_.q_heads, D_);
        RopeForward(k, kv_dim_, qkv + q_dim_, qkv_dim_, s.rope_cos.data(), s.rope_sin.data(), N, config_.kv_heads, D_);
        for (int64_t i = 0; i < N; ++i)
          std::memcpy(v + i * kv_dim_, qkv + i * qkv_dim_ + q_dim_ + kv_dim_, sizeof(float) * size_t(kv_dim_));
        return Status::Ok();
      });
}

Status ModelPass::Impl::AfterAttention(int l, int n, const float* out) {
  return LayerStep(
      "AfterAttention", l, n, false, 2 * l + 1,
      [&](NanoState& s, LayerActivations& a, const LayerOffsets& o, int64_t N) -> Status {
        const size_t nc = size_t(N) * C_;
        std::memcpy(a.att.data(), out, sizeof(float) * size_t(N) * size_t(q_dim_));
        // x_mid = x + att wo^T
        std::memcpy(a.x_mid.data(), a.x.data(), sizeof(float) * nc);
        DISTCA_RETURN_IF_ERROR(LinearForward(a.x_mid.data(), a.att.data(), P(o.wo), N, q_dim_, C_, true));
        // x_next = x_mid + w_down(silu(g w_gate^T) * (g w_up^T))
        RmsNormForward(a.g.data(), a.mlp_rstd.data(), a.x_mid.data(), P(o.mlp_norm), N, C_, config_.norm_eps);
        DISTCA_RETURN_IF_ERROR(LinearForward(a.gate_up.data(), a.g.data(), P(o.w_gate_up), N, C_, 2 * F_, false));
        SwiGluForward(act_.data(), a.gate_up.data(), N, F_);
        float* x_next = LayerOutput(s, l);
        std::memcpy(x_next, a.x_mid.data(), sizeof(float) * nc);
        DISTCA_RETURN_IF_ERROR(LinearForward(x_next, act_.data(), P(o.w_down), N, F_, C_, true));
        return Status::Ok();
      });
}

Status ModelPass::Impl::Loss(double* loss_sum, int64_t* targets) {
  if (loss_sum == nullptr || targets == nullptr)
    return Status::InvalidArgument("ModelPass::Loss: loss_sum and targets must not be null");
  if (!began_) return Status::FailedPrecondition("ModelPass::Loss before Begin");
  if (loss_done_) return Status::FailedPrecondition("ModelPass::Loss called twice in one pass");
  DISTCA_RETURN_IF_ERROR(CheckPassDone("Loss", /*backward=*/false));
  ScopedOmpThreads threads(threads_);
  WallTimer timer;
  double sum = 0.0;
  int64_t count = 0;
  const float* final_norm = P(offsets_.final_norm);
  const float* lm_head = P(offsets_.lm_head);
  for (NanoState& s : nanos_) {
    const int64_t N = s.rows.size();
    std::fill_n(s.dresid.data(), size_t(N) * C_, 0.0f);
    for (int64_t r0 = 0; r0 < N; r0 += head_rows_) {
      const int64_t rows = std::min(head_rows_, N - r0);
      const float* x = s.x_out.data() + r0 * C_;
      float* logits = head_logits_.data();
      RmsNormForward(head_h_.data(), head_rstd_.data(), x, final_norm, rows, C_, config_.norm_eps);
      DISTCA_RETURN_IF_ERROR(LinearForward(logits, head_h_.data(), lm_head, rows, C_, V_, false));
      count += CrossEntropyForwardBackward(head_losses_.data(), logits, logits, s.rows.targets.data() + r0, rows, V_,
                                           loss_scale_);
      for (int64_t i = 0; i < rows; ++i) sum += double(head_losses_[size_t(i)]);
      // logits now hold dL/dlogits, already scaled by loss_scale.
      DISTCA_RETURN_IF_ERROR(
          LinearBackward(dnorm_.data(), G(offsets_.lm_head), logits, head_h_.data(), lm_head, rows, C_, V_, false));
      RmsNormBackward(s.dresid.data() + r0 * C_, G(offsets_.final_norm), dnorm_.data(), x, final_norm,
                      head_rstd_.data(), rows, C_);
    }
  }
  loss_done_ = true;
  *loss_sum = sum;
  *targets = count;
  times.linear_seconds += timer.Seconds();
  return Status::Ok();
}

Status ModelPass::Impl::BeforeAttentionBackward(int l, int n, float* dout) {
  return LayerStep(
      "BeforeAttentionBackward", l, n, true, 2 * (L_ - 1 - l),
      [&](NanoState& s, LayerActivations& a, const LayerOffsets& o, int64_t N) -> Status {
        float* d = s.dresid.data();  // dL/dx_{l+1} = dL/d(MLP output), also the residual path into x_mid
        SwiGluForward(act_.data(), a.gate_up.data(), N, F_);
        DISTCA_RETURN_IF_ERROR(
            LinearBackward(dact_.data(), G(o.w_down), d, act_.data(), P(o.w_down), N, F_, C_, false));
        SwiGluBackward(dgate_up_.data(), dact_.data(), a.gate_up.data(), N, F_);
        DISTCA_RETURN_IF_ERROR(LinearBackward(dnorm_.data(), G(o.w_gate_up), dgate_up_.data(), a.g.data(),
                                              P(o.w_gate_up), N, C_, 2 * F_, false));
        RmsNormBackward(d, G(o.mlp_norm), dnorm_.data(), a.x_mid.data(), P(o.mlp_norm), a.mlp_rstd.data(), N, C_);
        // d is now dL/dx_mid = dL/d(att wo^T).
        DISTCA_RETURN_IF_ERROR(LinearBackward(dout, G(o.wo), d, a.att.data(), P(o.wo), N, q_dim_, C_, false));
        return Status::Ok();
      });
}

Status ModelPass::Impl::AfterAttentionBackward(int l, int n, const float* dq, const float* dk, const float* dv) {
  return LayerStep(
      "AfterAttentionBackward", l, n, true, 2 * (L_ - 1 - l) + 1,
      [&](NanoState& s, LayerActivations& a, const LayerOffsets& o, int64_t N) -> Status {
        float* dqkv = qkv_.data();  // (N, qkv_dim): gradients w.r.t. the pre-RoPE projections
        RopeBackward(dqkv, qkv_dim_, dq, q_dim_, s.rope_cos.data(), s.rope_sin.data(), N, config_.q_heads, D_);
        RopeBackward(dqkv + q_dim_, qkv_dim_, dk, kv_dim_, s.rope_cos.data(), s.rope_sin.data(), N, config_.kv_heads,
                     D_);
        for (int64_t i = 0; i < N; ++i)
          std::memcpy(dqkv + i * qkv_dim_ + q_dim_ + kv_dim_, dv + i * kv_dim_, sizeof(float) * size_t(kv_dim_));
        DISTCA_RETURN_IF_ERROR(
            LinearBackward(dnorm_.data(), G(o.wqkv), dqkv, a.h.data(), P(o.wqkv), N, C_, qkv_dim_, false));
        // dresid: dL/dx_mid -> dL/dx_l (residual plus the attention branch).
        RmsNormBackward(s.dresid.data(), G(o.attn_norm), dnorm_.data(), a.x.data(), P(o.attn_norm), a.attn_rstd.data(),
                        N, C_);
        return Status::Ok();
      });
}

Status ModelPass::Impl::End() {
  if (!began_ || !loss_done_) return Status::FailedPrecondition("ModelPass::End before Begin and Loss");
  DISTCA_RETURN_IF_ERROR(CheckPassDone("End", /*backward=*/true));
  ScopedOmpThreads threads(threads_);
  WallTimer timer;
  for (NanoState& s : nanos_)
    EmbeddingBackward(G(offsets_.embed), s.dresid.data(), s.rows.tokens.data(), s.rows.size(), C_);
  began_ = false;  // the next pass starts with Begin
  times.linear_seconds += timer.Seconds();
  return Status::Ok();
}

ModelPass::ModelPass(Transformer* model, int threads, int64_t max_logit_floats)
    : impl_(std::make_unique<Impl>(model, threads, max_logit_floats)) {}
ModelPass::~ModelPass() = default;

Status ModelPass::Begin(std::vector<TokenRows> nanos, double loss_scale) {
  return impl_->Begin(std::move(nanos), loss_scale);
}
Status ModelPass::Loss(double* loss_sum, int64_t* targets) { return impl_->Loss(loss_sum, targets); }
Status ModelPass::End() { return impl_->End(); }
Status ModelPass::BeforeAttention(int layer, int nano, float* q, float* k, float* v) {
  return impl_->BeforeAttention(layer, nano, q, k, v);
}
Status ModelPass::AfterAttention(int layer, int nano, const float* out, const float* /*lse*/) {
  return impl_->AfterAttention(layer, nano, out);
}
Status ModelPass::BeforeAttentionBackward(int layer, int nano, float* dout) {
  return impl_->BeforeAttentionBackward(layer, nano, dout);
}
Status ModelPass::AfterAttentionBackward(int layer, int nano, const float* dq, const float* dk, const float* dv) {
  return impl_->AfterAttentionBackward(layer, nano, dq, dk, dv);
}
const ModelTimes& ModelPass::times() const { return impl_->times; }
int64_t ModelPass::activation_bytes() const { return impl_->activation_bytes; }

// ---------------------------------------------------------------------------
// ModelLossAndGrad: ModelPass with one nano-batch and attention run locally.

Status ModelLossAndGrad(Transformer* model, const std::vector<std::vector<int32_t>>& docs, double loss_scale,
                        double* loss_sum, int64_t* targets) {
  if (model == nullptr || loss_sum == nullptr || targets == nullptr)
    return Status::InvalidArgument("ModelLossAndGrad: model, loss_sum and targets must not be null");
  const ModelConfig& c = model->config();
  TokenRows rows;
  std::vector<int32_t> cu_seqlens = {0};
  for (const std::vector<int32_t>& doc : docs) {
    if (doc.empty()) continue;
    if (rows.size() + int64_t(doc.size()) > int64_t{std::numeric_limits<int32_t>::max()})
      return Status::OutOfRange("ModelLossAndGrad: more than 2^31 - 1 tokens in the batch");
    for (size_t i = 0; i < doc.size(); ++i) {
      rows.tokens.push_back(doc[i]);
      rows.positions.push_back(int64_t(i));
      rows.targets.push_back(i + 1 < doc.size() ? doc[i + 1] : -1);
    }
    cu_seqlens.push_back(int32_t(rows.size()));
  }
  const int64_t N = rows.size();
  const int L = c.num_layers, D = c.head_dim();
  const size_t qn = size_t(N) * size_t(c.q_heads) * size_t(D), kn = size_t(N) * size_t(c.kv_heads) * size_t(D);
  ModelPass pass(model, 0);
  DISTCA_RETURN_IF_ERROR(pass.Begin({std::move(rows)}, loss_scale));

  // What the executor would keep per layer: q, k, v, out, lse.
  struct Saved {
    AlignedBuffer<float> q, k, v, out, lse;
  };
  std::vector<Saved> saved(static_cast<size_t>(L));
  AlignedBuffer<float> dout(qn), dq(qn), dk(kn), dv(kn);
  const AttentionShape shape{.total_q = N, .total_k = N, .q_heads = c.q_heads, .kv_heads = c.kv_heads, .head_dim = D};
  for (int l = 0; l < L; ++l) {
    Saved& s = saved[size_t(l)];
    s.q.Resize(qn);
    s.k.Resize(kn);
    s.v.Resize(kn);
    s.out.Resize(qn);
    s.lse.Resize(size_t(N) * size_t(c.q_heads));
    DISTCA_RETURN_IF_ERROR(pass.BeforeAttention(l, 0, s.q.data(), s.k.data(), s.v.data()));
    if (N > 0) {
      DISTCA_RETURN_IF_ERROR(AttentionVarlenForward(
          shape, cu_seqlens, cu_seqlens,
          {.q = s.q.data(), .k = s.k.data(), .v = s.v.data(), .out = s.out.data(), .lse = s.lse.data()}));
    }
    DISTCA_RETURN_IF_ERROR(pass.AfterAttention(l, 0, s.out.data(), s.lse.data()));
  }
  DISTCA_RETURN_IF_ERROR(pass.Loss(loss_sum, targets));
  for (int l = L - 1; l >= 0; --l) {
    Saved& s = saved[size_t(l)];
    DISTCA_RETURN_IF_ERROR(pass.BeforeAttentionBackward(l, 0, dout.data()));
    if (N > 0) {
      DISTCA_RETURN_IF_ERROR(AttentionVarlenBackward(shape, cu_seqlens, cu_seqlens,
                                                     {.q = s.q.data(),
                                                      .k = s.k.data(),
                                                      .v = s.v.data(),
                                                      .dout = dout.data(),
                                                      .lse = s.lse.data(),
                                                      .out = s.out.data(),
                                                      .dq = dq.data(),
                                                      .dk = dk.data(),
                                                      .dv = dv.data()}));
    }
    DISTCA_RETURN_IF_ERROR(pass.AfterAttentionBackward(l, 0, dq.data(), dk.data(), dv.data()));
  }
  return pass.End();
}

}  // namespace distca
