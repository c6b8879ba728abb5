// The Llama-style decoder: configuration, parameters, hand-written forward
// and backward (llm.c style), AdamW.
//
// Model: token embedding -> num_layers x [RMSNorm -> Q/K/V projections (GQA)
// -> RoPE -> core attention -> output projection -> residual add -> RMSNorm ->
// SwiGLU MLP -> residual add] -> final RMSNorm -> LM head -> next-token
// cross-entropy inside each document. fp32; GEMMs through oneDNN.
//
// Core attention is not part of the model: the model produces Q, K, V per
// layer and consumes O, so that attention can run colocated or disaggregated
// (ModelPass implements the runtime's LayerCallbacks).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "distca/pingpong.h"
#include "distca/status.h"

namespace distca {

struct ModelConfig {
  std::string name = "custom";
  int vocab_size = 256;      // V. Default: 256 (byte-level tokens)
  int num_layers = 2;        // L
  int hidden = 64;           // C
  int q_heads = 4;           // Hq; C must be a multiple
  int kv_heads = 2;          // Hkv; Hq must be a multiple
  int ffn_hidden = 128;      // F
  float rope_theta = 10000;  // RoPE base
  float norm_eps = 1e-5f;    // RMSNorm epsilon
  int head_dim() const { return q_heads > 0 ? hidden / q_heads : 0; }
};

// Presets: "tiny" (tests), "small" (the demo), "llama3-8b", "llama-34b"
// (the paper's shapes; for memory accounting and the simulator).
Status ModelPreset(std::string_view name, ModelConfig* config);
std::vector<std::string> ModelPresetNames();
// Bounds on a model's shape: far above any real model (Llama-3-405B has 126
// layers, hidden 16384, vocabulary 128256), low enough that every size fits
// in int64 and per-layer loops stay short.
inline constexpr int kMaxLayers = 10'000;
inline constexpr int kMaxWidth = 1 << 24;  // vocab_size, hidden_size, ffn_hidden_size
// And on the parameter count (which the widths and layers alone let reach
// 2^64): 2^58, so that 16 bytes per parameter still fit in int64.
inline constexpr int64_t kMaxParameters = int64_t{1} << 58;
// Every field positive and within the bounds above, C divisible by Hq, Hq by
// Hkv, head_dim even (RoPE), at most kMaxParameters parameters.
Status ValidateModelConfig(const ModelConfig& config);

// One named parameter tensor inside the flat parameter buffer.
struct ParamTensor {
  std::string name;            // e.g. "layers.3.attn.wq"
  std::vector<int64_t> shape;  // row-major; linear weights are (out, in)
  int64_t offset = 0;          // in floats, into the flat buffer
  int64_t size = 0;            // elements
};

// Parameter layout, in order:
//   embed (V, C)
//   per layer l: layers.l.attn_norm (C), layers.l.attn.wq (Hq*D, C),
//     layers.l.attn.wk (Hkv*D, C), layers.l.attn.wv (Hkv*D, C),
//     layers.l.attn.wo (C, Hq*D), layers.l.mlp_norm (C),
//     layers.l.mlp.w_gate (F, C), layers.l.mlp.w_up (F, C), layers.l.mlp.w_down (C, F)
//   final_norm (C), lm_head (V, C)
std::vector<ParamTensor> ParamLayout(const ModelConfig& config);
int64_t ParameterCount(const ModelConfig& config);

// Weights and their gradients, each one flat fp32 buffer (so that the
// data-parallel all-reduce and the optimizer see one array).
class Transformer {
 public:
  static Status Create(const ModelConfig& config, std::unique_ptr<Transformer>* out);
  ~Transformer();

  const ModelConfig& config() const;
  const std::vector<ParamTensor>& tensors() const;
  int64_t size() const;  // number of parameters
  float* params();
  const float* params() const;
  float* grads();
  void ZeroGrads();
  // Norm weights = 1; other weights ~ N(0, 0.02), output projections (wo,
  // w_down) scaled by 1/sqrt(2L). Deterministic in the seed.
  void InitWeights(uint64_t seed);

  class Impl;

 private:
  explicit Transformer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The tokens one rank holds for one nano-batch, in the dispatcher's local
// row order: row i is token tokens[i] at document position positions[i]
// (RoPE uses it), predicting targets[i] (-1: no target, e.g. a document's last token).
struct TokenRows {
  std::vector<int32_t> tokens;
  std::vector<int64_t> positions;
  std::vector<int32_t> targets;
  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
};

// Seconds spent in the model's linear work (everything but core attention).
struct ModelTimes {
  double linear_seconds = 0.0;
};

// One forward + backward of the model over nano-batches of token rows. It is
// the LayerCallbacks a PingPongExecutor drives:
//   pass.Begin(...)               embeddings of every nano-batch
//   executor.Forward(pass)        layers; attention by the executor
//   pass.Loss(...)                final norm, LM head, cross-entropy and its backward
//   executor.Backward(pass)       layers in reverse
//   pass.End()                    embedding backward
// Gradients are added to model->grads() (the caller zeroes them), scaled by
// `loss_scale` (typically 1 / number of targets in the global batch).
// Activations are kept per (layer, nano-batch) between forward and backward.
class ModelPass : public LayerCallbacks {
 public:
  // REQUIRES: model outlives the pass. threads: OpenMP threads for GEMMs (0 = default).
  // The LM head runs over row chunks whose logits hold at most
  // max_logit_floats floats (at least one row; default 2^24, 64 MiB).
  static constexpr int64_t kDefaultMaxLogitFloats = int64_t{1} << 24;
  ModelPass(Transformer* model, int threads, int64_t max_logit_floats = kDefaultMaxLogitFloats);
  ~ModelPass() override;

  Status Begin(std::vector<TokenRows> nanos, double loss_scale);
  // Sum over rows of the cross-entropy (natural log), and the number of
  // targets, for all nano-batches; runs the head's backward.
  Status Loss(double* loss_sum, int64_t* targets);
  Status End();

  Status BeforeAttention(int layer, int nano, float* q, float* k, float* v) override;
  Status AfterAttention(int layer, int nano, const float* out, const float* lse) override;
  Status BeforeAttentionBackward(int layer, int nano, float* dout) override;
  Status AfterAttentionBackward(int layer, int nano, const float* dq, const float* dk, const float* dv) override;

  const ModelTimes& times() const;
  int64_t activation_bytes() const;  // bytes held for backward

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Single-process oracle: forward + backward of the whole model over one
// batch of documents with attention run directly by the CA engine (one
// causal task per document). `docs` lists each document's tokens. Returns the
// summed loss and target count; adds gradients (scaled by loss_scale) to
// model->grads(). Used by tests and as the reference for distributed runs.
Status ModelLossAndGrad(Transformer* model, const std::vector<std::vector<int32_t>>& docs, double loss_scale,
                        double* loss_sum, int64_t* targets);

struct AdamWOptions {
  float beta1 = 0.9f;         // Default: 0.9
  float beta2 = 0.95f;        // Default: 0.95
  float eps = 1e-8f;          // Default: 1e-8
  float weight_decay = 0.1f;  // Default: 0.1, not applied to norm weights (1-D tensors)
};

// AdamW over the flat parameter buffer; m and v are its state (8 bytes per
// parameter: weight decay is chosen per tensor, not stored per parameter).
class AdamW {
 public:
  AdamW(const Transformer& model, const AdamWOptions& options);
  // One update with learning rate lr (step counts from 1 inside).
  void Step(Transformer* model, float lr);
  int64_t step() const { return step_; }
  std::vector<float>& m() { return m_; }
  std::vector<float>& v() { return v_; }
  const std::vector<float>& m() const { return m_; }
  const std::vector<float>& v() const { return v_; }
  void set_step(int64_t step) { step_ = step; }

 private:
  struct Range {
    int64_t offset, size;
    bool decay;  // matrices decay; 1-D tensors (norm weights) do not
  };
  AdamWOptions options_;
  std::vector<Range> ranges_;  // the model's tensors
  std::vector<float> m_, v_;
  int64_t step_ = 0;
};

// Scales grads so that their global L2 norm is at most max_norm (no-op when
// max_norm <= 0); returns the norm before clipping.
double ClipGradNorm(float* grads, int64_t n, double max_norm);

// Cosine schedule with linear warmup: lr rises linearly over warmup steps to
// max_lr, then follows a cosine to min_lr at total_steps. step counts from 0.
float CosineLearningRate(int64_t step, int64_t warmup, int64_t total_steps, float max_lr, float min_lr);

}  // namespace distca
