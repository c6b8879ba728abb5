// Layer kernels (src/model/layers.h).
#include "model/layers.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "oneapi/dnnl/dnnl.h"

namespace distca::model {
namespace {

// Row-wise kernels fork an OpenMP team only when there is enough work to pay
// for it (about 16K elements).
constexpr int64_t kParallelElements = int64_t{1} << 14;

// Arguments both Gemm overloads check the same way.
Status CheckGemmArgs(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc, bool trans_a,
                     bool trans_b) {
  if (M < 0 || N < 0 || K < 0)
    return Status::InvalidArgument(fmt::format("Gemm: negative size M={} N={} K={}", M, N, K));
  const int64_t a_cols = trans_a ? M : K, b_cols = trans_b ? K : N;
  if (lda < std::max<int64_t>(1, a_cols) || ldb < std::max<int64_t>(1, b_cols) || ldc < std::max<int64_t>(1, N)) {
    return Status::InvalidArgument(
        fmt::format("Gemm: leading dimensions lda={} ldb={} ldc={} are too small for "
                    "M={} N={} K={} (trans_a={}, trans_b={})",
                    lda, ldb, ldc, M, N, K, trans_a, trans_b));
  }
  return Status::Ok();
}

// C = beta * C without reading C when beta == 0 (the K == 0 case).
template <class T>
void ScaleMatrix(T beta, T* C, int64_t M, int64_t N, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == T(0) ? T(0) : beta * C[i * ldc + j];
}

template <class T>
T Sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

}  // namespace

Status Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
            const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  DISTCA_RETURN_IF_ERROR(CheckGemmArgs(M, N, K, lda, ldb, ldc, trans_a, trans_b));
  if (M == 0 || N == 0) return Status::Ok();
  if (K == 0) {
    ScaleMatrix(beta, C, M, N, ldc);
    return Status::Ok();
  }
  const dnnl_status_t st =
      dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (st != dnnl_success) {
    return Status::Internal(
        fmt::format("dnnl_sgemm(M={}, N={}, K={}) failed with oneDNN status {}", M, N, K, static_cast<int>(st)));
  }
  return Status::Ok();
}

Status Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
            const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  DISTCA_RETURN_IF_ERROR(CheckGemmArgs(M, N, K, lda, ldb, ldc, trans_a, trans_b));
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double sum = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double a = trans_a ? A[k * lda + i] : A[i * lda + k];
        const double b = trans_b ? B[j * ldb + k] : B[k * ldb + j];
        sum += a * b;
      }
      C[i * ldc + j] = alpha * sum + (beta == 0.0 ? 0.0 : beta * C[i * ldc + j]);
    }
  }
  return Status::Ok();
}

template <class T>
void EmbeddingForward(T* out, const int32_t* tokens, const T* table, int64_t N, int C) {
#pragma omp parallel for if (N * C >= kParallelElements)
  for (int64_t n = 0; n < N; ++n) std::copy_n(table + int64_t{tokens[n]} * C, C, out + n * C);
}

template <class T>
void EmbeddingBackward(T* dtable, const T* dout, const int32_t* tokens, int64_t N, int C) {
  // Serial over rows: two rows with the same token add into the same row of
  // dtable, always in row order.
  for (int64_t n = 0; n < N; ++n) {
    T* d = dtable + int64_t{tokens[n]} * C;
    const T* g = dout + n * C;
    for (int c = 0; c < C; ++c) d[c] += g[c];
  }
}

template <class T>
void RmsNormForward(T* out, T* rstd, const T* x, const T* weight, int64_t N, int C, float eps) {
#pragma omp parallel for if (N * C >= kParallelElements)
  for (int64_t n = 0; n < N; ++n) {
    const T* xn = x + n * C;
    double sum_sq = 0.0;
    for (int c = 0; c < C; ++c) sum_sq += double(xn[c]) * double(xn[c]);
    const T r = T(1.0 / std::sqrt(sum_sq / C + double(eps)));
    T* on = out + n * C;
    for (int c = 0; c < C; ++c) on[c] = xn[c] * r * weight[c];
    rstd[n] = r;
  }
}

template <class T>
void RmsNormBackward(T* dx, T* dweight, const T* dout, const T* x, const T* weight, const T* rstd, int64_t N, int C) {
  // y_c = x_c r w_c with r = (mean(x^2) + eps)^(-1/2), dr/dx_c = -r^3 x_c / C:
  //   dx_c = r (dy_c w_c - x_c r^2 mean_k(dy_k w_k x_k))
#pragma omp parallel for if (N * C >= kParallelElements)
  for (int64_t n = 0; n < N; ++n) {
    const T* xn = x + n * C;
    const T* gn = dout + n * C;
    const double r = rstd[n];
    double dot = 0.0;
    for (int c = 0; c < C; ++c) dot += double(gn[c]) * double(weight[c]) * double(xn[c]);
    const T coeff = T(r * r * dot / C);
    T* dn = dx + n * C;
    for (int c = 0; c < C; ++c) dn[c] += T(r) * (gn[c] * weight[c] - xn[c] * coeff);
  }
  // dweight sums over rows: serial over rows so the order is fixed.
  for (int64_t n = 0; n < N; ++n) {
    const T* xn = x + n * C;
    const T* gn = dout + n * C;
    for (int c = 0; c < C; ++c) dweight[c] += gn[c] * xn[c] * rstd[n];
  }
}

template <class T>
Status LinearForward(T* out, const T* x, const T* W, int64_t N, int I, int O, bool accumulate) {
  // out (N, O) = x (N, I) * W^T (I, O)
  return Gemm(false, true, N, O, I, T(1), x, I, W, I, accumulate ? T(1) : T(0), out, O);
}

template <class T>
Status LinearBackward(T* dx, T* dW, const T* dout, const T* x, const T* W, int64_t N, int I, int O,
                      bool accumulate_dx) {
  // dx (N, I) = dout (N, O) * W (O, I)
  DISTCA_RETURN_IF_ERROR(Gemm(false, false, N, I, O, T(1), dout, O, W, I, accumulate_dx ? T(1) : T(0), dx, I));
  // dW (O, I) += dout^T (O, N) * x (N, I)
  return Gemm(true, false, O, I, N, T(1), dout, O, x, I, T(1), dW, I);
}

template <class T>
void RopeTables(T* cos_table, T* sin_table, const int64_t* positions, int64_t N, int D, double theta) {
  const int half = D / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) inv_freq[i] = std::pow(theta, -2.0 * i / D);
#pragma omp parallel for if (N * half >= kParallelElements / 8)
  for (int64_t n = 0; n < N; ++n) {
    for (int i = 0; i < half; ++i) {
      const double angle = double(positions[n]) * inv_freq[i];
      cos_table[n * half + i] = T(std::cos(angle));
      sin_table[n * half + i] = T(std::sin(angle));
    }
  }
}

namespace {

// Rotates every head of every row by +angle (sign = 1) or -angle (sign = -1).
template <class T>
void Rotate(T* out, int64_t out_stride, const T* x, int64_t x_stride, const T* cos_table, const T* sin_table, int64_t N,
            int H, int D, T sign) {
  const int half = D / 2;
#pragma omp parallel for if (N * H * D >= kParallelElements)
  for (int64_t n = 0; n < N; ++n) {
    const T* cs = cos_table + n * half;
    const T* sn = sin_table + n * half;
    for (int h = 0; h < H; ++h) {
      const T* xh = x + n * x_stride + int64_t{h} * D;
      T* oh = out + n * out_stride + int64_t{h} * D;
      for (int i = 0; i < half; ++i) {
        const T x1 = xh[i], x2 = xh[i + half];
        const T s = sign * sn[i];
        oh[i] = x1 * cs[i] - x2 * s;
        oh[i + half] = x2 * cs[i] + x1 * s;
      }
    }
  }
}

}  // namespace

template <class T>
void RopeForward(T* out, int64_t out_stride, const T* x, int64_t x_stride, const T* cos_table, const T* sin_table,
                 int64_t N, int H, int D) {
  Rotate(out, out_stride, x, x_stride, cos_table, sin_table, N, H, D, T(1));
}

template <class T>
void RopeBackward(T* dx, int64_t dx_stride, const T* dout, int64_t dout_stride, const T* cos_table, const T* sin_table,
                  int64_t N, int H, int D) {
  // The Jacobian is a rotation R; dx = R^T dout = rotation by -angle.
  Rotate(dx, dx_stride, dout, dout_stride, cos_table, sin_table, N, H, D, T(-1));
}

template <class T>
void SwiGluForward(T* out, const T* gate_up, int64_t N, int F) {
#pragma omp parallel for if (N * F >= kParallelElements)
  for (int64_t n = 0; n < N; ++n) {
    const T* gate = gate_up + n * 2 * F;
    const T* up = gate + F;
    T* o = out + n * F;
    for (int i = 0; i < F; ++i) o[i] = gate[i] * Sigmoid(gate[i]) * up[i];
  }
}

template <class T>
void SwiGluBackward(T* dgate_up, const T* dout, const T* gate_up, int64_t N, int F) {
  // silu'(g) = s + g s (1 - s) with s = sigmoid(g)
#pragma omp parallel for if (N * F >= kParallelElements)
  for (int64_t n = 0; n < N; ++n) {
    const T* gate = gate_up + n * 2 * F;
    const T* up = gate + F;
    const T* d = dout + n * F;
    T* dgate = dgate_up + n * 2 * F;
    T* dup = dgate + F;
    for (int i = 0; i < F; ++i) {
      const T s = Sigmoid(gate[i]);
      const T silu = gate[i] * s;
      dgate[i] = d[i] * up[i] * (s + silu * (T(1) - s));
      dup[i] = d[i] * silu;
    }
  }
}

template <class T>
int64_t CrossEntropyForwardBackward(T* losses, T* dlogits, const T* logits, const int32_t* targets, int64_t N, int V,
                                    double scale) {
  int64_t count = 0;
#pragma omp parallel for if (N * V >= kParallelElements) reduction(+ : count)
  for (int64_t n = 0; n < N; ++n) {
    const T* l = logits + n * V;
    T* d = dlogits + n * V;
    const int32_t target = targets[n];
    if (target < 0) {
      losses[n] = T(0);
      std::fill_n(d, V, T(0));
      continue;
    }
    ++count;
    T max_logit = l[0];
    for (int i = 1; i < V; ++i) max_logit = std::max(max_logit, l[i]);
    double sum = 0.0;
    for (int i = 0; i < V; ++i) sum += std::exp(double(l[i] - max_logit));
    const double log_sum = std::log(sum);
    losses[n] = T(log_sum + double(max_logit) - double(l[target]));
    // softmax_i = exp(l_i - max - log_sum): never overflows.
    const double shift = double(max_logit) + log_sum;
    for (int i = 0; i < V; ++i) d[i] = T(std::exp(double(l[i]) - shift) * scale);
    d[target] -= T(scale);
  }
  return count;
}

#define DISTCA_INSTANTIATE_LAYERS(T)                                                                    \
  template void EmbeddingForward<T>(T*, const int32_t*, const T*, int64_t, int);                        \
  template void EmbeddingBackward<T>(T*, const T*, const int32_t*, int64_t, int);                       \
  template void RmsNormForward<T>(T*, T*, const T*, const T*, int64_t, int, float);                     \
  template void RmsNormBackward<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t, int);       \
  template Status LinearForward<T>(T*, const T*, const T*, int64_t, int, int, bool);                    \
  template Status LinearBackward<T>(T*, T*, const T*, const T*, const T*, int64_t, int, int, bool);     \
  template void RopeTables<T>(T*, T*, const int64_t*, int64_t, int, double);                            \
  template void RopeForward<T>(T*, int64_t, const T*, int64_t, const T*, const T*, int64_t, int, int);  \
  template void RopeBackward<T>(T*, int64_t, const T*, int64_t, const T*, const T*, int64_t, int, int); \
  template void SwiGluForward<T>(T*, const T*, int64_t, int);                                           \
  template void SwiGluBackward<T>(T*, const T*, const T*, int64_t, int);                                \
  template int64_t CrossEntropyForwardBackward<T>(T*, T*, const T*, const int32_t*, int64_t, int, double);

DISTCA_INSTANTIATE_LAYERS(float)
DISTCA_INSTANTIATE_LAYERS(double)

#undef DISTCA_INSTANTIATE_LAYERS

}  // namespace distca::model
