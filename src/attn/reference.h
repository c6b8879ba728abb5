// The reference CA kernel: plain loops, easy to check by eye. It is the oracle
// every fast kernel is tested against. `In` is the tensor element type, `Acc`
// the accumulation type: <float, double> is the library's kReference kernel,
// <double, double> serves finite-difference checks, and <float, float> is the
// "same-precision naive implementation" that test tolerances are measured by.
//
// REQUIRES: arguments already validated (attention.cc does this).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "distca/attention.h"

namespace distca::attn {

// The softmax scale a shape asks for: softmax_scale, or 1/sqrt(D) when it is 0.
inline double EffectiveSoftmaxScale(const AttentionShape& s) {
  return s.softmax_scale != 0.0f ? double{s.softmax_scale} : 1.0 / std::sqrt(double(s.head_dim));
}

// Keys a task-local query row sees: [0, VisibleKeys(...)).
inline int64_t VisibleKeys(const AttentionTask& t, int64_t row, bool causal) {
  if (!causal) return t.kv_len;
  return std::clamp<int64_t>(row + t.kv_len - t.q_len + 1, 0, t.kv_len);
}

template <class In, class Acc>
void ReferenceForward(const AttentionShape& s, std::span<const AttentionTask> tasks, const In* q, const In* k,
                      const In* v, In* out, In* lse) {
  const int64_t dim = s.head_dim;
  const int group = s.q_heads / s.kv_heads;
  const Acc scale = static_cast<Acc>(EffectiveSoftmaxScale(s));
  std::vector<Acc> score;
  std::vector<Acc> acc(dim);
  for (const AttentionTask& t : tasks) {
    for (int h = 0; h < s.q_heads; ++h) {
      const int hk = h / group;
      for (int64_t r = 0; r < t.q_len; ++r) {
        const int64_t row = t.q_offset + r;
        const In* qr = q + (row * s.q_heads + h) * dim;
        In* o = out + (row * s.q_heads + h) * dim;
        const int64_t visible = VisibleKeys(t, r, s.causal);
        if (visible == 0) {
          std::fill(o, o + dim, In(0));
          lse[h * s.total_q + row] = -std::numeric_limits<In>::infinity();
          continue;
        }
        score.assign(visible, Acc(0));
        Acc max_score = -std::numeric_limits<Acc>::infinity();
        for (int64_t j = 0; j < visible; ++j) {
          const In* kr = k + ((t.k_offset + j) * s.kv_heads + hk) * dim;
          Acc dot = 0;
          for (int64_t d = 0; d < dim; ++d) dot += Acc(qr[d]) * Acc(kr[d]);
          score[j] = scale * dot;
          max_score = std::max(max_score, score[j]);
        }
        Acc sum = 0;
        for (int64_t j = 0; j < visible; ++j) sum += std::exp(score[j] - max_score);
        const Acc row_lse = max_score + std::log(sum);
        std::fill(acc.begin(), acc.end(), Acc(0));
        for (int64_t j = 0; j < visible; ++j) {
          const Acc prob = std::exp(score[j] - row_lse);
          const In* vr = v + ((t.k_offset + j) * s.kv_heads + hk) * dim;
          for (int64_t d = 0; d < dim; ++d) acc[d] += prob * Acc(vr[d]);
        }
        for (int64_t d = 0; d < dim; ++d) o[d] = static_cast<In>(acc[d]);
        lse[h * s.total_q + row] = static_cast<In>(row_lse);
      }
    }
  }
}

// dq, dk, dv are overwritten (zero where no task reads a row).
template <class In, class Acc>
void ReferenceBackward(const AttentionShape& s, std::span<const AttentionTask> tasks, const In* q, const In* k,
                       const In* v, const In* dout, const In* lse, const In* delta, In* dq, In* dk, In* dv) {
  const int64_t dim = s.head_dim;
  const int group = s.q_heads / s.kv_heads;
  const Acc scale = static_cast<Acc>(EffectiveSoftmaxScale(s));
  std::vector<Acc> dq_acc(s.total_q * s.q_heads * dim, Acc(0));
  std::vector<Acc> dk_acc(s.total_k * s.kv_heads * dim, Acc(0));
  std::vector<Acc> dv_acc(s.total_k * s.kv_heads * dim, Acc(0));
  for (const AttentionTask& t : tasks) {
    for (int h = 0; h < s.q_heads; ++h) {
      const int hk = h / group;
      for (int64_t r = 0; r < t.q_len; ++r) {
        const int64_t row = t.q_offset + r;
        const int64_t visible = VisibleKeys(t, r, s.causal);
        if (visible == 0) continue;  // O = 0 does not depend on any input
        const In* qr = q + (row * s.q_heads + h) * dim;
        const In* dor = dout + (row * s.q_heads + h) * dim;
        Acc* dqr = dq_acc.data() + (row * s.q_heads + h) * dim;
        const Acc row_lse = lse[h * s.total_q + row];
        const Acc row_delta = delta[h * s.total_q + row];
        for (int64_t j = 0; j < visible; ++j) {
          const int64_t kv_row = (t.k_offset + j) * s.kv_heads + hk;
          const In* kr = k + kv_row * dim;
          const In* vr = v + kv_row * dim;
          Acc dot = 0;
          Acc dprob = 0;
          for (int64_t d = 0; d < dim; ++d) {
            dot += Acc(qr[d]) * Acc(kr[d]);
            dprob += Acc(dor[d]) * Acc(vr[d]);
          }
          const Acc prob = std::exp(scale * dot - row_lse);
          const Acc dscore = prob * (dprob - row_delta);
          Acc* dkr = dk_acc.data() + kv_row * dim;
          Acc* dvr = dv_acc.data() + kv_row * dim;
          for (int64_t d = 0; d < dim; ++d) {
            dqr[d] += scale * dscore * Acc(kr[d]);
            dkr[d] += scale * dscore * Acc(qr[d]);
            dvr[d] += prob * Acc(dor[d]);
          }
        }
      }
    }
  }
  std::transform(dq_acc.begin(), dq_acc.end(), dq, [](Acc x) { return static_cast<In>(x); });
  std::transform(dk_acc.begin(), dk_acc.end(), dk, [](Acc x) { return static_cast<In>(x); });
  std::transform(dv_acc.begin(), dv_acc.end(), dv, [](Acc x) { return static_cast<In>(x); });
}

// delta[h][row] = sum_d dout[row][h][d] * out[row][h][d] for rows [row_begin, row_end).
template <class In, class Acc>
void ComputeDeltaRows(const AttentionShape& s, int64_t row_begin, int64_t row_end, const In* dout, const In* out,
                      In* delta) {
  const int64_t dim = s.head_dim;
  for (int64_t row = row_begin; row < row_end; ++row) {
    for (int h = 0; h < s.q_heads; ++h) {
      const In* a = dout + (row * s.q_heads + h) * dim;
      const In* b = out + (row * s.q_heads + h) * dim;
      Acc sum = 0;
      for (int64_t d = 0; d < dim; ++d) sum += Acc(a[d]) * Acc(b[d]);
      delta[h * s.total_q + row] = static_cast<In>(sum);
    }
  }
}

}  // namespace distca::attn
