// Model presets, validation and the parameter layout (include/distca/model.h).
#include <cmath>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "distca/attention.h"
#include "distca/model.h"

namespace distca {
namespace {

struct Preset {
  const char* name;
  int vocab_size, num_layers, hidden, q_heads, kv_heads, ffn_hidden;
  float rope_theta;
};

// The paper's shapes (DESIGN.md section 7) and two small ones.
constexpr Preset kPresets[] = {
    {"tiny", 256, 2, 64, 4, 2, 128, 10000.0f},
    {"small", 256, 4, 256, 8, 2, 704, 10000.0f},
    {"llama3-8b", 128256, 32, 4096, 32, 8, 14336, 500000.0f},
    {"llama-34b", 32000, 48, 8192, 64, 8, 22016, 1000000.0f},  // CodeLlama-34B
};

Status CheckPositive(const char* field, const char* flag, int value) {
  if (value > 0) return Status::Ok();
  return Status::InvalidArgument(fmt::format("{} must be positive, got {} ({})", field, value, flag));
}

}  // namespace

Status ModelPreset(std::string_view name, ModelConfig* config) {
  if (config == nullptr) return Status::InvalidArgument("ModelPreset: config must not be null");
  for (const Preset& p : kPresets) {
    if (name != p.name) continue;
    ModelConfig c;
    c.name = p.name;
    c.vocab_size = p.vocab_size;
    c.num_layers = p.num_layers;
    c.hidden = p.hidden;
    c.q_heads = p.q_heads;
    c.kv_heads = p.kv_heads;
    c.ffn_hidden = p.ffn_hidden;
    c.rope_theta = p.rope_theta;
    *config = c;
    return Status::Ok();
  }
  return Status::InvalidArgument(
      fmt::format("unknown model preset '{}' (known: {})", name, fmt::join(ModelPresetNames(), ", ")));
}

std::vector<std::string> ModelPresetNames() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

Status ValidateModelConfig(const ModelConfig& c) {
  DISTCA_RETURN_IF_ERROR(CheckPositive("vocab_size", "--vocab-size", c.vocab_size));
  DISTCA_RETURN_IF_ERROR(CheckPositive("num_layers", "--num-layers", c.num_layers));
  DISTCA_RETURN_IF_ERROR(CheckPositive("hidden_size", "--hidden-size", c.hidden));
  DISTCA_RETURN_IF_ERROR(CheckPositive("num_attention_heads", "--num-attention-heads", c.q_heads));
  DISTCA_RETURN_IF_ERROR(CheckPositive("num_query_groups", "--num-query-groups", c.kv_heads));
  DISTCA_RETURN_IF_ERROR(CheckPositive("ffn_hidden_size", "--ffn-hidden-size", c.ffn_hidden));
  // Bounds that keep every size in int64 and every per-layer loop short:
  // far above any real model (Llama-3-405B: 126 layers, hidden 16384).
  if (c.num_layers > kMaxLayers)
    return Status::OutOfRange(
        fmt::format("num_layers {} is above the limit of {} (--num-layers)", c.num_layers, kMaxLayers));
  for (auto [name, flag, v] :
       {std::tuple{"vocab_size", "--vocab-size", c.vocab_size}, std::tuple{"hidden_size", "--hidden-size", c.hidden},
        std::tuple{"ffn_hidden_size", "--ffn-hidden-size", c.ffn_hidden}})
    if (v > kMaxWidth)
      return Status::OutOfRange(fmt::format("{} {} is above the limit of {} ({})", name, v, kMaxWidth, flag));
  if (c.hidden % c.q_heads != 0) {
    return Status::InvalidArgument(
        fmt::format("hidden_size {} is not a multiple of num_attention_heads {} (--hidden-size, --num-attention-heads)",
                    c.hidden, c.q_heads));
  }
  if (c.q_heads % c.kv_heads != 0) {
    return Status::InvalidArgument(fmt::format(
        "num_attention_heads {} is not a multiple of num_query_groups {} (--num-attention-heads, --num-query-groups)",
        c.q_heads, c.kv_heads));
  }
  const int d = c.head_dim();
  if (d % 2 != 0) {
    return Status::InvalidArgument(
        fmt::format("head dim {} (hidden_size {} / num_attention_heads {}) must be even for RoPE (--hidden-size, "
                    "--num-attention-heads)",
                    d, c.hidden, c.q_heads));
  }
  if (d > AttentionShape::kMaxHeadDim) {
    return Status::OutOfRange(
        fmt::format("head dim {} (hidden_size {} / num_attention_heads {}) exceeds the attention "
                    "engine's limit {} (--hidden-size, --num-attention-heads)",
                    d, c.hidden, c.q_heads, AttentionShape::kMaxHeadDim));
  }
  if (!(std::isfinite(c.rope_theta) && c.rope_theta > 0.0f)) {
    return Status::InvalidArgument(fmt::format("rope_theta must be finite and positive, got {}", c.rope_theta));
  }
  if (!(std::isfinite(c.norm_eps) && c.norm_eps > 0.0f)) {
    return Status::InvalidArgument(fmt::format("norm_eps must be finite and > 0, got {}", c.norm_eps));
  }
  // The widths alone do not bound the total: 10,000 layers of hidden 2^24
  // hold about 2^64 parameters. Counted in 128 bits, as ParamLayout lays
  // them out, and bounded so that byte counts (x 16) stay in int64 too.
  __extension__ typedef __int128 Wide;  // GCC's 128-bit integer
  const Wide C = c.hidden, F = c.ffn_hidden, kv_dim = Wide{c.kv_heads} * d;
  const Wide per_layer = 2 * C + 2 * C * C + 2 * kv_dim * C + 3 * F * C;
  const Wide total = 2 * Wide{c.vocab_size} * C + C + Wide{c.num_layers} * per_layer;
  if (total > kMaxParameters)
    return Status::OutOfRange(fmt::format(
        "the model has about {:.3g} parameters, above the limit of {:.3g} (2^58; --num-layers, --hidden-size, "
        "--ffn-hidden-size, --vocab-size)",
        double(total), double(kMaxParameters)));
  return Status::Ok();
}

std::vector<ParamTensor> ParamLayout(const ModelConfig& c) {
  const int64_t V = c.vocab_size, C = c.hidden, F = c.ffn_hidden;
  const int64_t q_dim = int64_t{c.q_heads} * c.head_dim(), kv_dim = int64_t{c.kv_heads} * c.head_dim();
  std::vector<ParamTensor> layout;
  int64_t offset = 0;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    int64_t size = 1;
    for (int64_t s : shape) size *= s;
    layout.push_back({std::move(name), std::move(shape), offset, size});
    offset += size;
  };
  add("embed", {V, C});
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = fmt::format("layers.{}.", l);
    add(p + "attn_norm", {C});
    add(p + "attn.wq", {q_dim, C});
    add(p + "attn.wk", {kv_dim, C});
    add(p + "attn.wv", {kv_dim, C});
    add(p + "attn.wo", {C, q_dim});
    add(p + "mlp_norm", {C});
    add(p + "mlp.w_gate", {F, C});
    add(p + "mlp.w_up", {F, C});
    add(p + "mlp.w_down", {C, F});
  }
  add("final_norm", {C});
  add("lm_head", {V, C});
  return layout;
}

int64_t ParameterCount(const ModelConfig& c) {
  int64_t total = 0;
  for (const ParamTensor& t : ParamLayout(c)) total += t.size;
  return total;
}

}  // namespace distca
