// AdamW, gradient clipping and the learning-rate schedule (include/distca/model.h).
#include <algorithm>
#include <cmath>
#include <numbers>

#include "distca/model.h"

namespace distca {

AdamW::AdamW(const Transformer& model, const AdamWOptions& options)
    : options_(options), m_(size_t(model.size()), 0.0f), v_(size_t(model.size()), 0.0f) {
  for (const ParamTensor& t : model.tensors()) ranges_.push_back({t.offset, t.size, t.shape.size() >= 2});
}

void AdamW::Step(Transformer* model, float lr) {
  ++step_;
  const double t = double(step_);
  // Bias corrections 1 - beta^t in double: beta2^t approaches 1 slowly.
  const float correction1 = float(1.0 - std::pow(double(options_.beta1), t));
  const float correction2 = float(1.0 - std::pow(double(options_.beta2), t));
  const float beta1 = options_.beta1, beta2 = options_.beta2, eps = options_.eps;
  float* params = model->params();
  const float* grads = model->grads();
  float* m = m_.data();
  float* v = v_.data();
  // p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p), as PyTorch's AdamW
  // (decoupled decay), tensor by tensor: matrices decay, norm weights not.
  for (const Range& r : ranges_) {
    const float wd = r.decay ? options_.weight_decay : 0.0f;
    const int64_t end = r.offset + r.size;
#pragma omp parallel for if (r.size >= (int64_t{1} << 16))
    for (int64_t i = r.offset; i < end; ++i) {
      const float g = grads[i];
      m[i] = beta1 * m[i] + (1.0f - beta1) * g;
      v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
      const float m_hat = m[i] / correction1;
      const float v_hat = v[i] / correction2;
      params[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + wd * params[i]);
    }
  }
}

double ClipGradNorm(float* grads, int64_t n, double max_norm) {
  double sum_sq = 0.0;
  for (int64_t i = 0; i < n; ++i) sum_sq += double(grads[i]) * double(grads[i]);
  const double norm = std::sqrt(sum_sq);
  // A non-finite norm is returned untouched so that the caller can skip the step.
  if (max_norm > 0.0 && std::isfinite(norm) && norm > max_norm) {
    const float scale = float(max_norm / norm);
    for (int64_t i = 0; i < n; ++i) grads[i] *= scale;
  }
  return norm;
}

float CosineLearningRate(int64_t step, int64_t warmup, int64_t total_steps, float max_lr, float min_lr) {
  // Warmup: step 0 gets max_lr / warmup, step warmup - 1 gets max_lr.
  if (step < warmup) return max_lr * float(step + 1) / float(warmup);
  if (step >= total_steps) return min_lr;
  const double progress = double(step - warmup) / double(total_steps - warmup);  // [0, 1)
  const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return float(double(min_lr) + coeff * (double(max_lr) - double(min_lr)));
}

}  // namespace distca
