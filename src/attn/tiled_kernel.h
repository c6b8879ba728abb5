// Internal interface between the CA engine's driver (attention.cc: validation,
// work items, OpenMP) and the tiled kernels, which are compiled once per
// instruction set (tiled_kernel_{scalar,avx2,avx512}.cc) and picked at run time.
//
// Only plain structs and function declarations live here: code compiled with
// -mavx512f must not share inline functions or templates with generic code, or
// the linker may hand an AVX-512 copy to a CPU without it.
#pragma once

#include <cstdint>

#include "distca/attention.h"

namespace distca::attn {

// What both directions need to know about the batch's tensors.
struct ProblemShape {
  int64_t total_q = 0;
  int q_heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  bool causal = true;
  float scale = 0.0f;  // effective softmax scale (never 0)
};

struct ForwardProblem : ProblemShape {
  const float* q = nullptr;  // (total_q, Hq, D)
  const float* k = nullptr;  // (total_k, Hkv, D)
  const float* v = nullptr;  // (total_k, Hkv, D)
  float* out = nullptr;      // (total_q, Hq, D)
  float* lse = nullptr;      // (Hq, total_q)
};

struct BackwardProblem : ProblemShape {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* dout = nullptr;   // (total_q, Hq, D)
  const float* lse = nullptr;    // (Hq, total_q)
  const float* delta = nullptr;  // (Hq, total_q): rowsum(dO * O)
  float* dq = nullptr;           // zeroed by the driver; tiles add into it
  float* dk = nullptr;           // zeroed by the driver; tiles add into it
  float* dv = nullptr;           // zeroed by the driver; tiles add into it
  // Striped spin locks (0 = free) guarding the adds into dq and dk/dv, indexed
  // by (tensor, head, row / kLockRows) hashed into [0, lock_mask].
  int* locks = nullptr;
  int64_t lock_mask = 0;  // number of locks - 1; the count is a power of two
};

inline constexpr int64_t kLockRows = 64;

// One instruction-set variant of the tiled kernel.
struct TiledKernel {
  const char* name;
  int block_q;        // query rows per forward lane
  int forward_lanes;  // most (query head, block_q rows) lanes one forward call runs
  int block_k;        // key rows per backward work item
  // Scratch floats one thread needs, for a head dimension.
  int64_t (*forward_workspace)(int head_dim);
  int64_t (*backward_workspace)(int head_dim);
  // Forward for query heads [head0, head0 + heads), which must share one KV
  // head, and query rows [row0, row0 + rows) of `task`, with
  // heads * ceil(rows / block_q) <= forward_lanes. Writes those rows of out
  // and lse. `workspace` is forward_workspace(D) floats, 64-byte aligned,
  // private to the caller.
  void (*forward_tile)(const ForwardProblem& p, const AttentionTask& task, int head0, int heads, int64_t row0,
                       int64_t rows, float* workspace);
  // Backward for key rows [key0, key0 + block_k) of `task` (clipped to kv_len)
  // and KV head `kv_head`, over every query head of its group and every query
  // row that sees those keys. Adds into dq, dk, dv under the locks.
  void (*backward_tile)(const BackwardProblem& p, const AttentionTask& task, int kv_head, int64_t key0,
                        float* workspace);
};

const TiledKernel& ScalarTiledKernel();
#if defined(__x86_64__)
const TiledKernel& Avx2TiledKernel();
const TiledKernel& Avx512TiledKernel();
#endif

}  // namespace distca::attn
