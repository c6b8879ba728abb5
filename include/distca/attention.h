// The core-attention (CA) engine: softmax(Q K^T) V over a varlen batch of
// CA-tasks, forward and backward, on CPU.
//
// The contract is FlashAttention's varlen contract (flash_attn_varlen_func):
//   Q          (total_q, Hq, D)   fp32, row-major
//   K, V       (total_k, Hkv, D)  fp32, row-major
//   O          (total_q, Hq, D)   fp32
//   LSE        (Hq, total_q)      fp32, natural log of the softmax denominator
// A task's queries are the last q_len positions of its kv_len-long context.
// With causal masking, query row r of a task (0 <= r < q_len) sees the task's
// keys j <= r + kv_len - q_len (bottom-right alignment). A row that sees no key
// (possible when q_len > kv_len) gets O = 0 and LSE = -inf.
// GQA: query head h reads KV head h / (Hq / Hkv).
// Non-finite inputs are not checked and propagate; the mask is exact for
// finite inputs only (docs/attention.md, "Contract").
//
// Two ways to describe a batch:
//   - cu_seqlens (AttentionVarlenForward/Backward): task i owns Q rows
//     [cu_q[i], cu_q[i+1]) and K/V rows [cu_k[i], cu_k[i+1]).
//   - AttentionTask lists (AttentionForward/Backward): each task names its Q
//     rows and K/V rows, and several tasks may read the same K/V rows. This is
//     how an attention server runs all shards of one document against a single
//     shared KV prefix buffer. Q row ranges of different tasks must not overlap.
//
// Threading: calls are parallel over (task, head, tile) with OpenMP and are
// safe to issue from several threads at once on disjoint outputs. With more
// than one thread, the backward sums into dQ/dK/dV may be added in a different
// order from run to run (like FlashAttention's dQ atomics): results then agree
// to fp32 rounding, not bit for bit. One thread is deterministic.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "distca/status.h"

namespace distca {

// One CA-task: Q rows [q_offset, q_offset + q_len) against K/V rows
// [k_offset, k_offset + kv_len).
struct AttentionTask {
  int64_t q_offset = 0;
  int64_t q_len = 0;
  int64_t k_offset = 0;
  int64_t kv_len = 0;
};

struct AttentionShape {
  int64_t total_q = 0;         // rows of Q, O, dO, dQ
  int64_t total_k = 0;         // rows of K, V, dK, dV
  int q_heads = 0;             // Hq; a multiple of kv_heads
  int kv_heads = 0;            // Hkv
  int head_dim = 0;            // D, 1..kMaxHeadDim
  bool causal = true;          // Default: true (bottom-right aligned causal mask)
  float softmax_scale = 0.0f;  // Default: 0, meaning 1/sqrt(head_dim)

  static constexpr int kMaxHeadDim = 1024;
};

enum class AttentionKernel {
  kAuto,       // the fastest kernel this CPU supports
  kReference,  // plain loops, double accumulation: the oracle
  kScalar,     // the tiled kernel without vector instructions
  kAvx2,       // the tiled kernel with AVX2 + FMA
  kAvx512,     // the tiled kernel with AVX-512
};

struct AttentionExec {
  AttentionKernel kernel = AttentionKernel::kAuto;  // Default: kAuto
  int num_threads = 0;                              // Default: 0, OpenMP's default team size
};

struct AttentionForwardArgs {
  const float* q = nullptr;  // (total_q, Hq, D)
  const float* k = nullptr;  // (total_k, Hkv, D)
  const float* v = nullptr;  // (total_k, Hkv, D)
  float* out = nullptr;      // (total_q, Hq, D); rows no task owns are not written
  float* lse = nullptr;      // (Hq, total_q); entries no task owns are not written
};

struct AttentionBackwardArgs {
  const float* q = nullptr;     // (total_q, Hq, D)
  const float* k = nullptr;     // (total_k, Hkv, D)
  const float* v = nullptr;     // (total_k, Hkv, D)
  const float* dout = nullptr;  // (total_q, Hq, D)
  const float* lse = nullptr;   // (Hq, total_q), as written by the forward
  // Exactly one of `out` and `delta` is given. delta = rowsum(dO * O) per
  // (head, row); passing it lets a server run the backward without O.
  const float* out = nullptr;    // (total_q, Hq, D)
  const float* delta = nullptr;  // (Hq, total_q)
  float* dq = nullptr;           // (total_q, Hq, D), overwritten; zero where no task reads a row
  float* dk = nullptr;           // (total_k, Hkv, D), overwritten: sums over every query head of
  float* dv = nullptr;           //   the group and every task that read the row; zero elsewhere
};

Status AttentionForward(const AttentionShape& shape, std::span<const AttentionTask> tasks,
                        const AttentionForwardArgs& args, const AttentionExec& exec = {});

Status AttentionBackward(const AttentionShape& shape, std::span<const AttentionTask> tasks,
                         const AttentionBackwardArgs& args, const AttentionExec& exec = {});

// The cu_seqlens form. cu_seqlens_q and cu_seqlens_k hold n+1 non-decreasing
// prefix sums starting at 0 and ending at shape.total_q / shape.total_k.
Status AttentionVarlenForward(const AttentionShape& shape, std::span<const int32_t> cu_seqlens_q,
                              std::span<const int32_t> cu_seqlens_k, const AttentionForwardArgs& args,
                              const AttentionExec& exec = {});

Status AttentionVarlenBackward(const AttentionShape& shape, std::span<const int32_t> cu_seqlens_q,
                               std::span<const int32_t> cu_seqlens_k, const AttentionBackwardArgs& args,
                               const AttentionExec& exec = {});

// Converts cu_seqlens to the equivalent task list.
Status TasksFromCuSeqlens(std::span<const int32_t> cu_seqlens_q, std::span<const int32_t> cu_seqlens_k,
                          std::vector<AttentionTask>* tasks);

// Combines two partial results over disjoint key sets of the same queries:
// lse = log(exp(lse1) + exp(lse2)), out = (exp(lse1) out1 + exp(lse2) out2) / exp(lse).
// A side with LSE = -inf contributes nothing; both -inf gives out = 0, lse = -inf.
// A NaN in an LSE, or in the O row of a side that saw keys, reaches the result.
// `out`/`lse` may alias `out1`/`lse1` or `out2`/`lse2`.
//   out1, out2, out: (rows, heads, head_dim)   lse1, lse2, lse: (heads, rows)
Status MergePartials(int64_t rows, int heads, int head_dim, const float* out1, const float* lse1, const float* out2,
                     const float* lse2, float* out, float* lse);

// Number of (query, key) pairs the batch attends over (per head). Forward
// FLOPs = 4 * pairs * D * Hq; backward = 2.5x forward. Assumes valid tasks.
// Exact whenever the count fits in int64; INT64_MAX when it does not.
int64_t AttentionPairs(std::span<const AttentionTask> tasks, bool causal);

// Kernels this CPU can run (always includes kReference and kScalar), and names.
std::vector<AttentionKernel> AvailableAttentionKernels();
AttentionKernel ResolveAttentionKernel(AttentionKernel kernel);  // kAuto -> concrete kernel
const char* AttentionKernelName(AttentionKernel kernel);

}  // namespace distca
