// The CA engine's driver: validates arguments, cuts the batch into work items,
// orders them by cost and runs them on an OpenMP team with the chosen kernel.
#include "distca/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <string>

#include <fmt/format.h>

#include "attn/reference.h"
#include "attn/tiled_kernel.h"
#include "common/aligned_buffer.h"
#include "common/cpu_features.h"

namespace distca {
namespace {

using attn::TiledKernel;

Status ValidateShape(const AttentionShape& s) {
  if (s.total_q < 0) return Status::InvalidArgument(fmt::format("shape.total_q is negative ({})", s.total_q));
  if (s.total_k < 0) return Status::InvalidArgument(fmt::format("shape.total_k is negative ({})", s.total_k));
  if (s.q_heads <= 0) return Status::InvalidArgument(fmt::format("shape.q_heads must be positive, got {}", s.q_heads));
  if (s.kv_heads <= 0)
    return Status::InvalidArgument(fmt::format("shape.kv_heads must be positive, got {}", s.kv_heads));
  if (s.q_heads % s.kv_heads != 0) {
    return Status::InvalidArgument(
        fmt::format("shape.q_heads ({}) is not a multiple of shape.kv_heads ({})", s.q_heads, s.kv_heads));
  }
  if (s.head_dim <= 0 || s.head_dim > AttentionShape::kMaxHeadDim) {
    return Status::InvalidArgument(
        fmt::format("shape.head_dim must be in [1, {}], got {}", AttentionShape::kMaxHeadDim, s.head_dim));
  }
  if (!std::isfinite(s.softmax_scale))
    return Status::InvalidArgument("shape.softmax_scale must be finite (0 selects 1/sqrt(head_dim))");
  // Element counts must fit in int64 with room to spare.
  const double elems = std::max(double(s.total_q) * s.q_heads, double(s.total_k) * s.kv_heads) * s.head_dim;
  if (elems > double(std::numeric_limits<int64_t>::max() / 8))
    return Status::OutOfRange("tensor sizes overflow 64-bit indexing");
  return Status::Ok();
}

Status ValidateTasks(const AttentionShape& s, std::span<const AttentionTask> tasks) {
  for (size_t i = 0; i < tasks.size(); ++i) {
    const AttentionTask& t = tasks[i];
    if (t.q_offset < 0 || t.q_len < 0 || t.k_offset < 0 || t.kv_len < 0) {
      return Status::InvalidArgument(
          fmt::format("tasks[{}] has a negative field (q_offset {}, q_len {}, "
                      "k_offset {}, kv_len {})",
                      i, t.q_offset, t.q_len, t.k_offset, t.kv_len));
    }
    if (t.q_offset > s.total_q || t.q_len > s.total_q - t.q_offset) {
      return Status::InvalidArgument(fmt::format("tasks[{}] reads Q rows [{}, {}+{}) beyond shape.total_q = {}", i,
                                                 t.q_offset, t.q_offset, t.q_len, s.total_q));
    }
    if (t.k_offset > s.total_k || t.kv_len > s.total_k - t.k_offset) {
      return Status::InvalidArgument(fmt::format("tasks[{}] reads K/V rows [{}, {}+{}) beyond shape.total_k = {}", i,
                                                 t.k_offset, t.k_offset, t.kv_len, s.total_k));
    }
  }
  // Each query row belongs to at most one task (outputs must not be shared).
  std::vector<size_t> order;
  for (size_t i = 0; i < tasks.size(); ++i)
    if (tasks[i].q_len > 0) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tasks[a].q_offset < tasks[b].q_offset; });
  for (size_t n = 1; n < order.size(); ++n) {
    const AttentionTask& prev = tasks[order[n - 1]];
    if (tasks[order[n]].q_offset < prev.q_offset + prev.q_len) {
      return Status::InvalidArgument(
          fmt::format("tasks[{}] and tasks[{}] own overlapping query rows (each Q row may belong to one task only)",
                      order[n - 1], order[n]));
    }
  }
  return Status::Ok();
}

Status RequirePointer(const void* p, const char* name, bool needed) {
  if (needed && p == nullptr) return Status::InvalidArgument(std::string(name) + " is null");
  return Status::Ok();
}

Status SelectKernel(AttentionKernel requested, AttentionKernel* kernel, const TiledKernel** tiled) {
  *kernel = ResolveAttentionKernel(requested);
  const std::vector<AttentionKernel> available = AvailableAttentionKernels();
  if (std::find(available.begin(), available.end(), *kernel) == available.end()) {
    return Status::Unavailable(std::string("attention kernel '") + AttentionKernelName(*kernel) +
                               "' needs instructions this CPU does not have");
  }
  *tiled = nullptr;
  switch (*kernel) {
    case AttentionKernel::kScalar:
      *tiled = &attn::ScalarTiledKernel();
      break;
#if defined(__x86_64__)
    case AttentionKernel::kAvx2:
      *tiled = &attn::Avx2TiledKernel();
      break;
    case AttentionKernel::kAvx512:
      *tiled = &attn::Avx512TiledKernel();
      break;
#endif
    default:
      break;
  }
  return Status::Ok();
}

int TeamSize(const AttentionExec& exec, size_t items) {
  const int wanted = exec.num_threads > 0 ? exec.num_threads : omp_get_max_threads();
  return static_cast<int>(std::max<size_t>(1, std::min<size_t>(static_cast<size_t>(wanted), items)));
}

// One unit of parallel work: a tile of one task for some heads.
struct WorkItem {
  int64_t cost;  // approximate (query, key) pairs, for longest-first ordering
  int64_t task;
  int64_t offset;    // first query row (forward) or key row (backward), task-local
  int head;          // first query head (forward) or the KV head (backward)
  int heads = 1;     // forward: query heads
  int64_t rows = 0;  // forward: query rows
};

// Longest first, so that a few expensive tiles do not finish last; ties keep
// their natural order so one thread reproduces bit for bit.
void SortByCost(std::vector<WorkItem>* items) {
  std::stable_sort(items->begin(), items->end(), [](const WorkItem& a, const WorkItem& b) { return a.cost > b.cost; });
}

// Runs `run(item, workspace)` for every item, longest first, on an OpenMP team
// with dynamic scheduling. Each thread owns one workspace of `floats` floats,
// allocated up front so that an allocation failure is a Status and not an
// exception inside a parallel region.
template <class Run>
Status RunWorkItems(std::vector<WorkItem>* items, int64_t floats, const AttentionExec& exec, const Run& run) {
  SortByCost(items);
  const int threads = TeamSize(exec, items->size());
  std::vector<AlignedBuffer<float>> workspaces;
  try {
    workspaces.resize(threads);
    for (auto& w : workspaces) w.Resize(static_cast<size_t>(floats));
  } catch (const std::bad_alloc&) {
    return Status::OutOfRange(fmt::format("cannot allocate {} attention workspaces of {} floats", threads, floats));
  }
  const int64_t n = static_cast<int64_t>(items->size());
  const WorkItem* list = items->data();
#pragma omp parallel num_threads(threads)
  {
    float* w = workspaces[omp_get_thread_num()].data();
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i) run(list[i], w);
  }
  return Status::Ok();
}

attn::ProblemShape KernelShape(const AttentionShape& s) {
  return {s.total_q, s.q_heads, s.kv_heads, s.head_dim, s.causal, static_cast<float>(attn::EffectiveSoftmaxScale(s))};
}

Status RunTiledForward(const TiledKernel& kernel, const AttentionShape& s, std::span<const AttentionTask> tasks,
                       const AttentionForwardArgs& a, const AttentionExec& exec) {
  attn::ForwardProblem p;
  static_cast<attn::ProblemShape&>(p) = KernelShape(s);
  p.q = a.q;
  p.k = a.k;
  p.v = a.v;
  p.out = a.out;
  p.lse = a.lse;

  // An item runs several query heads of one GQA group (they share K/V tiles)
  // and, when the group is small, several query tiles, up to the kernel's
  // lane limit: each K/V tile then serves up to forward_lanes tiles of work.
  const int group = s.q_heads / s.kv_heads;
  const int heads_per_item = std::min(group, kernel.forward_lanes);
  const int64_t rows_per_item = int64_t{kernel.block_q} * std::max(1, kernel.forward_lanes / 2 / heads_per_item);
  std::vector<WorkItem> items;
  for (size_t ti = 0; ti < tasks.size(); ++ti) {
    const AttentionTask& t = tasks[ti];
    for (int64_t row0 = 0; row0 < t.q_len; row0 += rows_per_item) {
      const int64_t rows = std::min<int64_t>(rows_per_item, t.q_len - row0);
      const int64_t keys = attn::VisibleKeys(t, row0 + rows - 1, s.causal) + kernel.block_q;
      for (int h = 0; h < s.q_heads;) {
        const int heads = std::min(heads_per_item, (h / group + 1) * group - h);  // stay in one group
        items.push_back({heads * rows * keys, int64_t(ti), row0, h, heads, rows});
        h += heads;
      }
    }
  }
  return RunWorkItems(&items, kernel.forward_workspace(s.head_dim), exec, [&](const WorkItem& it, float* w) {
    kernel.forward_tile(p, tasks[it.task], it.head, it.heads, it.offset, it.rows, w);
  });
}

Status RunTiledBackward(const TiledKernel& kernel, const AttentionShape& s, std::span<const AttentionTask> tasks,
                        const AttentionBackwardArgs& a, const float* delta, const AttentionExec& exec) {
  attn::BackwardProblem p;
  static_cast<attn::ProblemShape&>(p) = KernelShape(s);
  p.q = a.q;
  p.k = a.k;
  p.v = a.v;
  p.dout = a.dout;
  p.lse = a.lse;
  p.delta = delta;
  p.dq = a.dq;
  p.dk = a.dk;
  p.dv = a.dv;

  const int group = s.q_heads / s.kv_heads;
  std::vector<WorkItem> items;
  for (size_t ti = 0; ti < tasks.size(); ++ti) {
    const AttentionTask& t = tasks[ti];
    if (t.q_len == 0) continue;
    const int64_t shift = t.kv_len - t.q_len;
    for (int64_t key0 = 0; key0 < t.kv_len; key0 += kernel.block_k) {
      const int64_t first_row = s.causal ? std::max<int64_t>(0, key0 - shift) : 0;
      if (first_row >= t.q_len) break;  // later key tiles are seen by no query either
      const int64_t cols = std::min<int64_t>(kernel.block_k, t.kv_len - key0);
      const int64_t cost = group * (t.q_len - first_row + kernel.block_k) * cols;
      for (int hk = 0; hk < s.kv_heads; ++hk) items.push_back({cost, int64_t(ti), key0, hk});
    }
  }
  // Enough stripes that two threads rarely meet on one lock.
  constexpr int64_t kLocks = 4096;
  std::vector<int> locks(kLocks, 0);
  p.locks = locks.data();
  p.lock_mask = kLocks - 1;
  return RunWorkItems(&items, kernel.backward_workspace(s.head_dim), exec, [&](const WorkItem& it, float* w) {
    kernel.backward_tile(p, tasks[it.task], it.head, it.offset, w);
  });
}

// Sets n floats to zero with `threads` threads.
void ParallelZero(float* p, int64_t n, int threads) {
  if (n == 0) return;
  constexpr int64_t kChunk = int64_t{1} << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk;
    std::memset(p + begin, 0, sizeof(float) * static_cast<size_t>(std::min(kChunk, n - begin)));
  }
}

}  // namespace

const char* AttentionKernelName(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::kAuto:
      return "auto";
    case AttentionKernel::kReference:
      return "reference";
    case AttentionKernel::kScalar:
      return "scalar";
    case AttentionKernel::kAvx2:
      return "avx2";
    case AttentionKernel::kAvx512:
      return "avx512";
  }
  return "unknown";
}

std::vector<AttentionKernel> AvailableAttentionKernels() {
  std::vector<AttentionKernel> kernels = {AttentionKernel::kReference, AttentionKernel::kScalar};
#if defined(__x86_64__)
  const CpuFeatures& cpu = DetectCpuFeatures();
  if (cpu.avx2_fma) kernels.push_back(AttentionKernel::kAvx2);
  if (cpu.avx512) kernels.push_back(AttentionKernel::kAvx512);
#endif
  return kernels;
}

AttentionKernel ResolveAttentionKernel(AttentionKernel kernel) {
  if (kernel != AttentionKernel::kAuto) return kernel;
  return AvailableAttentionKernels().back();
}

int64_t AttentionPairs(std::span<const AttentionTask> tasks, bool causal) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  int64_t pairs = 0;
  for (const AttentionTask& t : tasks) {
    int64_t task_pairs = 0;
    if (!causal) {
      if (__builtin_mul_overflow(t.q_len, t.kv_len, &task_pairs)) return kMax;
    } else {
      // Row r sees max(0, r + shift + 1) keys, shift = kv_len - q_len; the
      // last row sees kv_len. Sum the arithmetic series over the rows that
      // see any, n (x / 2) with the halving done on whichever factor is even
      // (the product of 3.1e9 rows overflows before a halving after it).
      const int64_t shift = t.kv_len - t.q_len;
      const int64_t first = std::max<int64_t>(0, -shift);
      const int64_t n = t.q_len - first;
      const int64_t x = first + shift + 1 + t.kv_len;
      if (n > 0 &&
          (n % 2 == 0 ? __builtin_mul_overflow(n / 2, x, &task_pairs) : __builtin_mul_overflow(n, x / 2, &task_pairs)))
        return kMax;
    }
    if (__builtin_add_overflow(pairs, task_pairs, &pairs)) return kMax;
  }
  return pairs;
}

Status TasksFromCuSeqlens(std::span<const int32_t> cu_q, std::span<const int32_t> cu_k,
                          std::vector<AttentionTask>* tasks) {
  if (tasks == nullptr) return Status::InvalidArgument("tasks is null");
  if (cu_q.empty()) return Status::InvalidArgument("cu_seqlens_q is empty (it needs n+1 entries for n tasks)");
  if (cu_k.size() != cu_q.size()) {
    return Status::InvalidArgument(
        fmt::format("cu_seqlens_q has {} entries but cu_seqlens_k has {}", cu_q.size(), cu_k.size()));
  }
  for (const auto& [cu, name] : {std::pair{cu_q, "cu_seqlens_q"}, std::pair{cu_k, "cu_seqlens_k"}}) {
    if (cu[0] != 0) return Status::InvalidArgument(fmt::format("{}[0] must be 0, got {}", name, cu[0]));
    for (size_t i = 1; i < cu.size(); ++i) {
      if (cu[i] < cu[i - 1]) {
        return Status::InvalidArgument(
            fmt::format("{} is not non-decreasing: entry {} is {} after {}", name, i, cu[i], cu[i - 1]));
      }
    }
  }
  tasks->clear();
  for (size_t i = 0; i + 1 < cu_q.size(); ++i)
    tasks->push_back({cu_q[i], int64_t{cu_q[i + 1]} - cu_q[i], cu_k[i], int64_t{cu_k[i + 1]} - cu_k[i]});
  return Status::Ok();
}

namespace {

// A thread count the engine can honour: 0 (OpenMP's default) to kMaxThreads.
Status ValidateExec(const AttentionExec& exec) {
  if (exec.num_threads < 0 || exec.num_threads > kMaxThreads)
    return Status::InvalidArgument(
        fmt::format("exec.num_threads must be in [0, {}], got {}", kMaxThreads, exec.num_threads));
  return Status::Ok();
}

// Runs `body` with a failed allocation (of a workspace, a delta buffer, a
// work list) reported as a Status, as the API promises, not thrown.
template <class Body>
Status NoThrow(const char* what, Body&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Status::OutOfRange(fmt::format("{}: out of memory for the engine's buffers", what));
  }
}

Status ForwardImpl(const AttentionShape& s, std::span<const AttentionTask> tasks, const AttentionForwardArgs& a,
                   const AttentionExec& exec);
Status BackwardImpl(const AttentionShape& s, std::span<const AttentionTask> tasks, const AttentionBackwardArgs& a,
                    const AttentionExec& exec);

}  // namespace

Status AttentionForward(const AttentionShape& s, std::span<const AttentionTask> tasks, const AttentionForwardArgs& a,
                        const AttentionExec& exec) {
  DISTCA_RETURN_IF_ERROR(ValidateExec(exec));
  return NoThrow("attention forward", [&] { return ForwardImpl(s, tasks, a, exec); });
}

Status AttentionBackward(const AttentionShape& s, std::span<const AttentionTask> tasks, const AttentionBackwardArgs& a,
                         const AttentionExec& exec) {
  DISTCA_RETURN_IF_ERROR(ValidateExec(exec));
  return NoThrow("attention backward", [&] { return BackwardImpl(s, tasks, a, exec); });
}

namespace {

Status ForwardImpl(const AttentionShape& s, std::span<const AttentionTask> tasks, const AttentionForwardArgs& a,
                   const AttentionExec& exec) {
  DISTCA_RETURN_IF_ERROR(ValidateShape(s));
  DISTCA_RETURN_IF_ERROR(ValidateTasks(s, tasks));
  DISTCA_RETURN_IF_ERROR(RequirePointer(a.q, "args.q", s.total_q > 0));
  DISTCA_RETURN_IF_ERROR(RequirePointer(a.out, "args.out", s.total_q > 0));
  DISTCA_RETURN_IF_ERROR(RequirePointer(a.lse, "args.lse", s.total_q > 0));
  DISTCA_RETURN_IF_ERROR(RequirePointer(a.k, "args.k", s.total_k > 0));
  DISTCA_RETURN_IF_ERROR(RequirePointer(a.v, "args.v", s.total_k > 0));
  AttentionKernel kernel;
  const TiledKernel* tiled;
  DISTCA_RETURN_IF_ERROR(SelectKernel(exec.kernel, &kernel, &tiled));
  if (tiled == nullptr) {
    attn::ReferenceForward<float, double>(s, tasks, a.q, a.k, a.v, a.out, a.lse);
    return Status::Ok();
  }
  return RunTiledForward(*tiled, s, tasks, a, exec);
}

Status BackwardImpl(const AttentionShape& s, std::span<const AttentionTask> tasks, const AttentionBackwardArgs& a,
                    const AttentionExec& exec) {
  DISTCA_RETURN_IF_ERROR(ValidateShape(s));
  DISTCA_RETURN_IF_ERROR(ValidateTasks(s, tasks));
  const bool has_q = s.total_q > 0;
  const bool has_k = s.total_k > 0;
  DISTCA_RETURN_IF_ERROR(RequirePointer(a.q, "args.q", has_q));
  DISTCA_RETURN_IF_ERROR(RequirePointer(a.dout, "args.dout", has_q));
  DISTCA_RETURN_IF_ERROR(RequirePointer(a.lse, "args.lse", has_q));
  DISTCA_RETURN_IF_ERROR(RequirePointer(a.dq, "args.dq", has_q));
  DISTCA_RETURN_IF_ERROR(RequirePointer(a.k, "args.k", has_k));
  DISTCA_RETURN_IF_ERROR(RequirePointer(a.v, "args.v", has_k));
  DISTCA_RETURN_IF_ERROR(RequirePointer(a.dk, "args.dk", has_k));
  DISTCA_RETURN_IF_ERROR(RequirePointer(a.dv, "args.dv", has_k));
  if (has_q && (a.out == nullptr) == (a.delta == nullptr))
    return Status::InvalidArgument("give exactly one of args.out and args.delta");
  AttentionKernel kernel;
  const TiledKernel* tiled;
  DISTCA_RETURN_IF_ERROR(SelectKernel(exec.kernel, &kernel, &tiled));

  const float* delta = a.delta;
  std::vector<float> delta_buf;
  if (has_q && delta == nullptr) {
    delta_buf.assign(static_cast<size_t>(s.total_q * s.q_heads), 0.0f);
    const int64_t n = static_cast<int64_t>(tasks.size());
#pragma omp parallel for num_threads(TeamSize(exec, tasks.size())) schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i) {
      const AttentionTask& t = tasks[i];
      attn::ComputeDeltaRows<float, double>(s, t.q_offset, t.q_offset + t.q_len, a.dout, a.out, delta_buf.data());
    }
    delta = delta_buf.data();
  }
  if (tiled == nullptr) {
    attn::ReferenceBackward<float, double>(s, tasks, a.q, a.k, a.v, a.dout, a.lse, delta, a.dq, a.dk, a.dv);
    return Status::Ok();
  }
  const int threads = TeamSize(exec, std::numeric_limits<int>::max());
  ParallelZero(a.dq, s.total_q * s.q_heads * s.head_dim, threads);
  ParallelZero(a.dk, s.total_k * s.kv_heads * s.head_dim, threads);
  ParallelZero(a.dv, s.total_k * s.kv_heads * s.head_dim, threads);
  return RunTiledBackward(*tiled, s, tasks, a, delta, exec);
}

// The task list of a cu_seqlens batch, checked against the shape's totals.
Status VarlenTasks(const AttentionShape& s, std::span<const int32_t> cu_q, std::span<const int32_t> cu_k,
                   std::vector<AttentionTask>* tasks) {
  DISTCA_RETURN_IF_ERROR(TasksFromCuSeqlens(cu_q, cu_k, tasks));
  if (cu_q.back() != s.total_q || cu_k.back() != s.total_k) {
    return Status::InvalidArgument(fmt::format("cu_seqlens end at ({}, {}) but shape has total_q = {}, total_k = {}",
                                               cu_q.back(), cu_k.back(), s.total_q, s.total_k));
  }
  return Status::Ok();
}

}  // namespace

Status AttentionVarlenForward(const AttentionShape& s, std::span<const int32_t> cu_q, std::span<const int32_t> cu_k,
                              const AttentionForwardArgs& a, const AttentionExec& exec) {
  std::vector<AttentionTask> tasks;
  DISTCA_RETURN_IF_ERROR(VarlenTasks(s, cu_q, cu_k, &tasks));
  return AttentionForward(s, tasks, a, exec);
}

Status AttentionVarlenBackward(const AttentionShape& s, std::span<const int32_t> cu_q, std::span<const int32_t> cu_k,
                               const AttentionBackwardArgs& a, const AttentionExec& exec) {
  std::vector<AttentionTask> tasks;
  DISTCA_RETURN_IF_ERROR(VarlenTasks(s, cu_q, cu_k, &tasks));
  return AttentionBackward(s, tasks, a, exec);
}

}  // namespace distca
