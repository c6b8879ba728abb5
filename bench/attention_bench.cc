#include "bench/attention_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <utility>

#include "bench/gemm_rate.h"
#include "common/cpu_features.h"
#include "common/file_util.h"
#include "common/memory_info.h"
#include "common/timer.h"

namespace distca::bench {
namespace {

// One benchmark configuration. A "document" is one causal task over its whole
// context; "shards" are tasks of shard_len queries whose contexts are sampled
// up to context_len, all reading one shared KV prefix buffer (as on a server).
struct Case {
  bool shards = false;
  int64_t shard_len = 0;
  int64_t context_len = 0;
  int q_heads = 0;
  int kv_heads = 0;
  int head_dim = 128;
};

struct Workload {
  AttentionShape shape;
  std::vector<AttentionTask> tasks;
  std::vector<float> q, k, v, dout, out, lse, dq, dk, dv;
};

// The bytes AllocateTensors allocates for `shape`: Q, dO, O and dQ; K, V,
// dK and dV; the LSE.
double TensorBytes(const AttentionShape& shape) {
  const double qn = double(shape.total_q) * shape.q_heads * shape.head_dim;
  const double kn = double(shape.total_k) * shape.kv_heads * shape.head_dim;
  return sizeof(float) * (4 * qn + 4 * kn + double(shape.total_q) * shape.q_heads);
}

// Random Q, K, V, dO and zeroed outputs for w.shape.
void AllocateTensors(Workload* w, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t qn = w->shape.total_q * w->shape.q_heads * w->shape.head_dim;
  const int64_t kn = w->shape.total_k * w->shape.kv_heads * w->shape.head_dim;
  for (auto [v, n] : {std::pair{&w->q, qn}, {&w->dout, qn}, {&w->k, kn}, {&w->v, kn}}) {
    v->resize(n);
    for (float& x : *v) x = dist(rng);
  }
  w->out.assign(qn, 0.0f);
  w->dq.assign(qn, 0.0f);
  w->lse.assign(w->shape.total_q * w->shape.q_heads, 0.0f);
  w->dk.assign(kn, 0.0f);
  w->dv.assign(kn, 0.0f);
}

Workload MakeWorkload(const Case& c, int64_t target_pairs, uint64_t seed) {
  Workload w;
  w.shape.q_heads = c.q_heads;
  w.shape.kv_heads = c.kv_heads;
  w.shape.head_dim = c.head_dim;
  w.shape.causal = true;
  std::mt19937_64 rng(seed);
  if (!c.shards) {
    w.tasks.push_back({0, c.context_len, 0, c.context_len});
  } else {
    // Context lengths are whole multiples of the shard length in [shard, context_len].
    std::uniform_int_distribution<int64_t> blocks(1, c.context_len / c.shard_len);
    int64_t pairs = 0;
    while (pairs < target_pairs || w.tasks.size() < 2) {
      const int64_t ctx = blocks(rng) * c.shard_len;
      AttentionTask t{int64_t(w.tasks.size()) * c.shard_len, c.shard_len, 0, ctx};
      pairs += AttentionPairs({&t, 1}, true);
      w.tasks.push_back(t);
    }
  }
  int64_t max_kv = 0;
  for (const AttentionTask& t : w.tasks) max_kv = std::max(max_kv, t.kv_len);
  w.shape.total_q = int64_t(w.tasks.size()) * (c.shards ? c.shard_len : c.context_len);
  w.shape.total_k = max_kv;
  AllocateTensors(&w, rng());
  return w;
}

Status Forward(Workload& w, const AttentionExec& exec) {
  return AttentionForward(w.shape, w.tasks, {w.q.data(), w.k.data(), w.v.data(), w.out.data(), w.lse.data()}, exec);
}

Status Backward(Workload& w, const AttentionExec& exec) {
  AttentionBackwardArgs a;
  a.q = w.q.data();
  a.k = w.k.data();
  a.v = w.v.data();
  a.dout = w.dout.data();
  a.lse = w.lse.data();
  a.out = w.out.data();
  a.dq = w.dq.data();
  a.dk = w.dk.data();
  a.dv = w.dv.data();
  return AttentionBackward(w.shape, w.tasks, a, exec);
}

// Best wall time of `fn` over runs lasting at least min_seconds in all. Runs
// longer than min_seconds are measured once (their warm-up share is tiny).
template <class Fn>
double BestSeconds(Fn&& fn, double min_seconds) {
  double best = 1e30, total = 0.0;
  for (int rep = 0; total < min_seconds || rep < 1; ++rep) {
    WallTimer t;
    fn();
    const double s = t.Seconds();
    best = std::min(best, s);
    total += s;
  }
  return best;
}

// Runs the kernel (on `threads` threads) and the reference on a small batch
// of the case's head shape and checks that they agree, so that no figure
// comes from a broken kernel.
bool Validate(const Case& c, AttentionKernel kernel, int threads, std::string* error) {
  Case small = c;
  small.shards = true;
  small.shard_len = 100;
  small.context_len = 700;
  Workload w = MakeWorkload(small, 100000, 99);
  Workload ref = w;
  const AttentionExec fast{kernel, threads}, oracle{AttentionKernel::kReference, 1};
  for (Status s : {Forward(w, fast), Backward(w, fast), Forward(ref, oracle), Backward(ref, oracle)}) {
    if (!s.ok()) {
      *error = s.ToString();
      return false;
    }
  }
  // Inputs are O(1) and each row averages hundreds of terms; an error of 1e-3
  // means the kernel is wrong, not imprecise (kernel_test.cc holds the tight bounds).
  const std::pair<const std::vector<float>*, const std::vector<float>*> pairs[] = {
      {&w.out, &ref.out}, {&w.dq, &ref.dq}, {&w.dk, &ref.dk}, {&w.dv, &ref.dv}};
  for (auto [a, b] : pairs) {
    for (size_t i = 0; i < a->size(); ++i) {
      if (!(std::abs((*a)[i] - (*b)[i]) <= 1e-3f * (1.0f + std::abs((*b)[i])))) {
        *error = fmt::format("kernel {} on {} thread(s) disagrees with the reference ({} vs {}) for heads {}x{} of {}",
                             AttentionKernelName(kernel), threads, (*a)[i], (*b)[i], c.q_heads, c.kv_heads, c.head_dim);
        return false;
      }
    }
  }
  return true;
}

std::vector<Case> MakeCases(bool short_mode) {
  std::vector<Case> cases;
  const std::vector<std::pair<int, int>> heads =
      short_mode ? std::vector<std::pair<int, int>>{{8, 2}} : std::vector<std::pair<int, int>>{{8, 2}, {32, 8}};
  for (auto [hq, hkv] : heads) {
    for (int64_t len : short_mode ? std::vector<int64_t>{1024, 4096} : std::vector<int64_t>{1024, 4096, 16384, 32768})
      cases.push_back({false, len, len, hq, hkv});
    const int64_t max_ctx = short_mode ? 8192 : 32768;
    for (int64_t shard : short_mode ? std::vector<int64_t>{128, 512} : std::vector<int64_t>{64, 128, 512, 2048})
      cases.push_back({true, shard, max_ctx, hq, hkv});
  }
  return cases;
}

struct Record {
  const char* direction;
  const Case* c;
  int threads;
  double seconds;
  double gflops;
};

// Options a run can honour: thread counts one process can start, and head
// shapes the CA engine takes (the table's largest task then holds a few GB).
bool CheckOptions(const AttentionBenchOptions& o, std::string* error) {
  for (size_t i = 0; i < o.threads.size(); ++i) {
    const int t = o.threads[i];
    if (t < 1 || t > kMaxThreads) {
      *error = fmt::format("--threads {} is outside [1, {}]", t, kMaxThreads);
      return false;
    }
    const auto before = o.threads.begin() + std::ptrdiff_t(i);
    if (std::find(o.threads.begin(), before, t) != before) {
      *error = fmt::format("--threads lists {} more than once (each count is measured once)", t);
      return false;
    }
  }
  if (!(o.min_seconds >= 0 && o.min_seconds <= 3600)) {
    *error = fmt::format("--min-seconds {} is outside [0, 3600]", o.min_seconds);
    return false;
  }
  if (o.q_heads < 1 || o.q_heads > 256 || o.kv_heads < 1 || o.q_heads % o.kv_heads != 0 || o.head_dim < 1 ||
      o.head_dim > AttentionShape::kMaxHeadDim) {
    *error = fmt::format(
        "--q-heads {} / --kv-heads {} / --head-dim {}: the query heads must be in [1, 256] and a multiple of the KV "
        "heads, the head dimension in [1, {}]",
        o.q_heads, o.kv_heads, o.head_dim, AttentionShape::kMaxHeadDim);
    return false;
  }
  return true;
}

// The table's cells: query rows x K/V prefixes (those with kv >= q).
std::vector<int64_t> TableQLens(bool short_mode) {
  return short_mode ? std::vector<int64_t>{128, 512} : std::vector<int64_t>{128, 256, 512, 1024, 2048, 4096};
}
std::vector<int64_t> TableKvLens(bool short_mode) {
  return short_mode ? std::vector<int64_t>{512, 2048} : std::vector<int64_t>{128, 512, 2048, 8192, 32768};
}
// Identical tasks (sharing one K/V prefix) measured together in a cell:
// enough for a measurable call.
int64_t TableCellTasks(int64_t q, int64_t kv) {
  return std::max<int64_t>(1, (int64_t{1} << 22) / AttentionPairs(std::vector<AttentionTask>{{0, q, 0, kv}}, true));
}
// The shape a cell's workload has: its identical tasks' rows, one K/V prefix.
AttentionShape TableCellShape(const AttentionBenchOptions& o, int64_t q, int64_t kv) {
  return {.total_q = TableCellTasks(q, kv) * q,
          .total_k = kv,
          .q_heads = o.q_heads,
          .kv_heads = o.kv_heads,
          .head_dim = o.head_dim};
}

// A head shape whose largest cell would not fit in half this machine's memory
// is refused before anything is measured (it would end in the OOM killer or
// a bare allocation failure).
bool CheckTableMemory(const AttentionBenchOptions& o, std::string* error) {
  const double limit = PhysicalMemoryBytes() / 2;  // 0 (unknown): no check
  double need = 0;
  for (int64_t q : TableQLens(o.short_mode))
    for (int64_t kv : TableKvLens(o.short_mode))
      if (kv >= q) need = std::max(need, TensorBytes(TableCellShape(o, q, kv)));
  if (limit > 0 && need > limit) {
    *error = fmt::format(
        "--q-heads {} --kv-heads {} --head-dim {}: the table's largest cell holds {:.3g} GB of tensors, more than "
        "half this machine's memory ({:.3g} GB)",
        o.q_heads, o.kv_heads, o.head_dim, need * 1e-9, limit * 2e-9);
    return false;
  }
  return true;
}

}  // namespace

std::string ForwardTablePath(const std::string& table_path) {
  std::filesystem::path p(table_path);
  const std::string extension = p.extension().string();
  p.replace_filename(p.stem().string() + "-forward" + extension);
  return p.string();
}

bool MeasureAttentionCostTable(const AttentionBenchOptions& o, std::string* csv_out, std::string* forward_csv_out,
                               std::string* error) {
  if (!CheckOptions(o, error) || !CheckTableMemory(o, error)) return false;
  const AttentionKernel kernel = ResolveAttentionKernel(o.kernel);
  // The table is timed on one thread: the kernel is checked there first.
  if (!Validate({.q_heads = o.q_heads, .kv_heads = o.kv_heads, .head_dim = o.head_dim}, kernel, 1, error)) return false;
  const std::vector<int64_t> q_lens = TableQLens(o.short_mode), kv_lens = TableKvLens(o.short_mode);
  const double min_seconds = o.min_seconds > 0 ? o.min_seconds : (o.short_mode ? 0.02 : 0.2);
  const auto header = [&](const char* what) {
    return fmt::format(
        "# distca-bench attention --table-out: seconds per task, {}, kernel {}, {} q heads, {} kv heads, "
        "head_dim {}, 1 thread\nq_len,kv_len,seconds\n",
        what, AttentionKernelName(kernel), o.q_heads, o.kv_heads, o.head_dim);
  };
  std::string csv = header("forward + backward"), forward_csv = header("forward only");
  for (int64_t q : q_lens) {
    for (int64_t kv : kv_lens) {
      if (kv < q) continue;
      // Enough identical tasks (sharing one K/V prefix) for a measurable call.
      Workload w;
      w.shape = TableCellShape(o, q, kv);
      const int64_t tasks = TableCellTasks(q, kv);
      for (int64_t t = 0; t < tasks; ++t) w.tasks.push_back({t * q, q, 0, kv});
      AllocateTensors(&w, 1);
      const AttentionExec exec{kernel, 1};
      // The passes timed apart, each at its best; the backward reuses the
      // forward's output and statistics.
      Status status;
      const double forward = BestSeconds([&] { status = Forward(w, exec); }, min_seconds / 2);
      double backward = 0;
      if (status.ok()) backward = BestSeconds([&] { status = Backward(w, exec); }, min_seconds / 2);
      if (!status.ok()) {
        *error = status.ToString();
        return false;
      }
      csv += fmt::format("{},{},{:.9g}\n", q, kv, (forward + backward) / double(tasks));
      forward_csv += fmt::format("{},{},{:.9g}\n", q, kv, forward / double(tasks));
    }
  }
  *csv_out = std::move(csv);
  *forward_csv_out = std::move(forward_csv);
  return true;
}

bool RunAttentionBench(const AttentionBenchOptions& o, std::string* error) {
  if (!CheckOptions(o, error)) return false;
  if (!o.table_out.empty()) {
    const std::string forward_out = ForwardTablePath(o.table_out);
    for (const std::string& path : {o.table_out, forward_out})
      if (const Status s = CheckOutputPath(path); !s.ok()) {  // before minutes of measuring
        *error = s.ToString();
        return false;
      }
    std::string csv, forward_csv;
    if (!MeasureAttentionCostTable(o, &csv, &forward_csv, error)) return false;
    for (const auto& [path, text] : {std::pair{o.table_out, csv}, std::pair{forward_out, forward_csv}}) {
      if (const Status s = WriteTextFile(path, text); !s.ok()) {
        *error = s.ToString();
        return false;
      }
    }
    fmt::print("wrote {} and {} ({} heads x {} of {}, kernel {})\n", o.table_out, forward_out, o.q_heads, o.kv_heads,
               o.head_dim, AttentionKernelName(ResolveAttentionKernel(o.kernel)));
    return true;
  }
  const AttentionKernel kernel = ResolveAttentionKernel(o.kernel);
  const double min_seconds = o.min_seconds > 0 ? o.min_seconds : (o.short_mode ? 0.3 : 1.0);
  const int64_t target_pairs = o.short_mode ? (int64_t{4} << 20) : (int64_t{32} << 20);
  const std::vector<Case> cases = MakeCases(o.short_mode);

  // Every head shape at every thread count the run times.
  std::map<std::pair<int, int>, bool> validated;
  for (const Case& c : cases) {
    auto key = std::pair{c.q_heads, c.kv_heads};
    if (!validated[key])
      for (int t : o.threads)
        if (!Validate(c, kernel, t, error)) return false;
    validated[key] = true;
  }

  // This machine is shared and its speed drifts. Each case is measured in
  // several rounds that alternate the thread counts, with a GEMM measurement
  // before each, and the best of the rounds is kept; the best GEMM rate of the
  // whole run is the yardstick, so ratios err on the low side.
  const int rounds = o.short_mode ? 3 : 2;
  std::map<int, double> gemm;
  auto measure_gemm = [&](int t) { gemm[t] = std::max(gemm[t], MeasureGemmGflops(2048, t, 0.0)); };
  std::vector<Record> records;
  for (const Case& c : cases) {
    Workload w = MakeWorkload(c, target_pairs, 7);
    const double fwd_flops = 4.0 * double(AttentionPairs(w.tasks, true)) * c.head_dim * c.q_heads;
    const size_t first = records.size();
    for (int t : o.threads) {
      records.push_back({"forward", &c, t, 1e30, 0.0});
      records.push_back({"backward", &c, t, 1e30, 0.0});
    }
    for (int round = 0; round < rounds; ++round) {
      // Long runs average the noise out: a case whose slowest thread count
      // took over 10 s in the first round gets no more rounds, at any
      // thread count, so every count has as many samples.
      if (round > 0) {
        double slowest = 0;
        for (size_t ti = 0; ti < o.threads.size(); ++ti)
          slowest = std::max(slowest, records[first + 2 * ti].seconds + records[first + 2 * ti + 1].seconds);
        if (slowest > 10.0) break;
      }
      for (size_t ti = 0; ti < o.threads.size(); ++ti) {
        Record& fwd = records[first + 2 * ti];
        Record& bwd = records[first + 2 * ti + 1];
        const int t = o.threads[ti];
        measure_gemm(t);
        const AttentionExec exec{kernel, t};
        Status status;
        fwd.seconds = std::min(fwd.seconds, BestSeconds([&] { status = Forward(w, exec); }, min_seconds / rounds));
        if (status.ok())
          bwd.seconds = std::min(bwd.seconds, BestSeconds([&] { status = Backward(w, exec); }, min_seconds / rounds));
        if (!status.ok()) {
          *error = status.ToString();
          return false;
        }
        fwd.gflops = fwd_flops / fwd.seconds * 1e-9;
        bwd.gflops = 2.5 * fwd_flops / bwd.seconds * 1e-9;
      }
    }
  }
  for (int t : o.threads) measure_gemm(t);

  if (o.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const Record& r : records) {
      out.push_back({{"direction", r.direction},
                     {"workload", r.c->shards ? "shards" : "document"},
                     {"kernel", AttentionKernelName(kernel)},
                     {"shard_len", r.c->shard_len},
                     {"context_len", r.c->context_len},
                     {"head_dim", r.c->head_dim},
                     {"q_heads", r.c->q_heads},
                     {"kv_heads", r.c->kv_heads},
                     {"threads", r.threads},
                     {"seconds", r.seconds},
                     {"gflops", r.gflops},
                     {"gemm_gflops", gemm[r.threads]},
                     {"ratio", r.gflops / gemm[r.threads]}});
    }
    fmt::print("{}\n", out.dump(1));
    return true;
  }
  fmt::print("distca-bench attention: kernel {}, head_dim 128, fp32, causal; FLOPs count causal pairs only\n",
             AttentionKernelName(kernel));
  fmt::print("validated against the reference kernel before timing\n");
  for (auto [t, g] : gemm) fmt::print("oneDNN sgemm 2048^3, {} thread(s): {:.1f} GFLOP/s (best of the run)\n", t, g);
  // Thread scaling: a record's rate over the same case's rate on the first thread count.
  auto scaling = [&](const Record& r) -> std::string {
    for (const Record& base : records) {
      if (r.threads != o.threads[0] && base.c == r.c && base.threads == o.threads[0] &&
          std::string(base.direction) == r.direction)
        return fmt::format("{:.2f}x", r.gflops / base.gflops);
    }
    return "";
  };
  fmt::print("\n{:<9} {:<9} {:>6} {:>8} {:>7} {:>4} {:>10} {:>9} {:>7} {:>8}\n", "direction", "workload", "shard",
             "context", "heads", "thr", "time [ms]", "GFLOP/s", "/GEMM", "scaling");
  for (const Record& r : records) {
    fmt::print("{:<9} {:<9} {:>6} {:>8} {:>7} {:>4} {:>10.2f} {:>9.1f} {:>7.3f} {:>8}\n", r.direction,
               r.c->shards ? "shards" : "document", r.c->shard_len, r.c->context_len,
               fmt::format("{}x{}", r.c->q_heads, r.c->kv_heads), r.threads, r.seconds * 1e3, r.gflops,
               r.gflops / gemm[r.threads], scaling(r));
  }
  return true;
}

}  // namespace distca::bench
