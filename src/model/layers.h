// The model's layer kernels, forward and backward, llm.c style: plain loops
// over row-major arrays, one function per layer and direction.
//
// Every kernel is a template on the element type T, instantiated for float
// (the model) and double (the finite-difference tests). GEMMs go through
// Gemm(): oneDNN's dnnl_sgemm for float, plain loops for double.
//
// Conventions: N = rows (tokens), C = channels, V = vocabulary, F = MLP
// width, H = heads, D = head_dim. Shapes are given as (rows, columns).
// "+=" in a contract means the kernel accumulates into that output; "=" means
// it overwrites. Element-wise and row-wise kernels are parallel over rows with
// OpenMP when the work is large; every output is computed in a fixed order,
// so results do not depend on the number of threads.
#pragma once

#include <cstdint>

#include "distca/status.h"

namespace distca::model {

// C(M, N) = alpha * op(A)(M, K) * op(B)(K, N) + beta * C, row-major;
// op(X) = X^T when trans. lda/ldb/ldc are row strides of the stored arrays.
// beta == 0 does not read C. M, N or K may be 0.
Status Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
            const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
Status Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
            const double* B, int64_t ldb, double beta, double* C, int64_t ldc);

// Token embedding.
//   out (N, C) = table[tokens[n]]          table (V, C)
template <class T>
void EmbeddingForward(T* out, const int32_t* tokens, const T* table, int64_t N, int C);
//   dtable (V, C) += dout rows, scattered by token
template <class T>
void EmbeddingBackward(T* dtable, const T* dout, const int32_t* tokens, int64_t N, int C);

// RMSNorm: out = x * rstd * weight with rstd = 1 / sqrt(mean(x^2) + eps).
//   x, out (N, C)   weight (C)   rstd (N), saved for the backward
template <class T>
void RmsNormForward(T* out, T* rstd, const T* x, const T* weight, int64_t N, int C, float eps);
//   dx (N, C) += dL/dx     dweight (C) += dL/dweight     from dout (N, C)
template <class T>
void RmsNormBackward(T* dx, T* dweight, const T* dout, const T* x, const T* weight, const T* rstd, int64_t N, int C);

// Linear layer without bias: out (N, O) = x (N, I) W^T, W (O, I).
// accumulate: out += x W^T instead of out = x W^T (a residual add for free).
template <class T>
Status LinearForward(T* out, const T* x, const T* W, int64_t N, int I, int O, bool accumulate);
//   dx (N, I) = dout (N, O) W     (overwritten; accumulate_dx: +=)
//   dW (O, I) += dout^T x         (always accumulated)
template <class T>
Status LinearBackward(T* dx, T* dW, const T* dout, const T* x, const T* W, int64_t N, int I, int O, bool accumulate_dx);

// RoPE, Llama / Hugging Face "rotate_half" convention: within each head the
// pair (i, i + D/2), 0 <= i < D/2, is rotated by angle pos * theta^(-2i/D):
//   out[i]       = x[i] cos - x[i + D/2] sin
//   out[i + D/2] = x[i + D/2] cos + x[i] sin
// RopeTables fills cos and sin (N, D/2) for the rows' positions (the token's
// position inside its document); angles are computed in double.
// REQUIRES: D even.
template <class T>
void RopeTables(T* cos_table, T* sin_table, const int64_t* positions, int64_t N, int D, double theta);
//   out (N, H, D) = rotate(x (N, H, D)); rows are out_stride / x_stride
//   elements apart (H * D when dense). out may be x (same stride): in place.
template <class T>
void RopeForward(T* out, int64_t out_stride, const T* x, int64_t x_stride, const T* cos_table, const T* sin_table,
                 int64_t N, int H, int D);
//   dx = inverse rotation of dout (the rotation is orthogonal). May alias.
template <class T>
void RopeBackward(T* dx, int64_t dx_stride, const T* dout, int64_t dout_stride, const T* cos_table, const T* sin_table,
                  int64_t N, int H, int D);

// SwiGLU on the fused gate/up projection: gate_up (N, 2F) holds row n's gate
// in columns [0, F) and up in [F, 2F).
//   out (N, F) = silu(gate) * up,   silu(g) = g * sigmoid(g)
template <class T>
void SwiGluForward(T* out, const T* gate_up, int64_t N, int F);
//   dgate_up (N, 2F) = dL/d(gate, up) from dout (N, F)   (overwritten)
template <class T>
void SwiGluBackward(T* dgate_up, const T* dout, const T* gate_up, int64_t N, int F);

// Softmax cross-entropy over logits (N, V) with targets (N); target -1 marks
// an ignored row. Numerically stable (max subtracted, sums in double).
//   losses (N) = logsumexp(logits[n]) - logits[n][target]   (0 for ignored rows)
//   dlogits (N, V) = (softmax(logits[n]) - onehot(target)) * scale   (0 for ignored rows)
// dlogits may be logits (in place). Returns the number of target rows.
// REQUIRES: every target in [-1, V).
template <class T>
int64_t CrossEntropyForwardBackward(T* losses, T* dlogits, const T* logits, const int32_t* targets, int64_t N, int V,
                                    double scale);

}  // namespace distca::model
