#include "bench/dispatch_bench.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "bench/bench_ranks.h"
#include "bench/median.h"
#include "common/file_util.h"
#include "common/memory_info.h"
#include "common/timer.h"
#include "distca/comm.h"
#include "distca/pingpong.h"
#include "distca/workload.h"
#include "oneapi/dnnl/dnnl.h"

namespace distca::bench {
namespace {

constexpr int kHq = 8, kHkv = 2, kDim = 64;  // hidden 512, K/V width 128
constexpr int kHidden = kHq * kDim;
constexpr int kKvWidth = kHkv * kDim;
constexpr int kFfn = 2 * kHidden;
// Peak memory a rank takes per token it holds (the layer stack's tensors,
// the executor's saved activations and exchange buffers, the attention
// engine's workspace): measured as peak RSS over ranks and tokens, 43 KB in
// short mode and 46 KB in full mode; used only to refuse a run that cannot
// fit.
constexpr double kBytesPerToken = 48 * 1024.0;

// C (m x n) = A (m x k) * B (k x n), row-major, one thread.
void Gemm(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c, float beta = 0.0f) {
  if (m == 0) return;
  dnnl_sgemm('N', 'N', m, n, k, 1.0f, a, k, b, n, beta, c, n);
}

// A layer stack whose non-attention compute is real GEMMs of a Llama-like
// layer (QKV projection; O projection and a two-matrix MLP), with backward
// doing twice the forward's GEMM work. Values stay bounded; only time matters.
class GemmStack : public LayerCallbacks {
 public:
  GemmStack(const PingPongExecutor& ex, int layers) {
    std::mt19937 rng(3);
    std::normal_distribution<float> d(0.0f, 0.02f);
    auto weights = [&](int64_t n) {
      std::vector<float> w(static_cast<size_t>(n));
      for (float& x : w) x = d(rng);
      return w;
    };
    w_qkv_ = weights(int64_t{kHidden} * (kHidden + 2 * kKvWidth));
    w_o_ = weights(int64_t{kHidden} * kHidden);
    w_up_ = weights(int64_t{kHidden} * kFfn);
    w_down_ = weights(int64_t{kFfn} * kHidden);
    for (int n = 0; n < ex.nano_batches(); ++n) {
      const int64_t rows = ex.local_tokens(n);
      std::vector<float> x(size_t(rows * kHidden));
      for (float& e : x) e = std::normal_distribution<float>(0.0f, 1.0f)(rng);
      x_.push_back(std::move(x));
      qkv_.emplace_back(size_t(rows * (kHidden + 2 * kKvWidth)));
      tmp_.emplace_back(size_t(rows * kFfn));
    }
    (void)layers;
  }

  Status BeforeAttention(int, int n, float* q, float* k, float* v) override {
    const int64_t rows = Rows(n);
    Gemm(rows, kHidden + 2 * kKvWidth, kHidden, x_[n].data(), w_qkv_.data(), qkv_[n].data());
    for (int64_t r = 0; r < rows; ++r) {
      const float* src = qkv_[n].data() + r * (kHidden + 2 * kKvWidth);
      std::copy_n(src, kHidden, q + r * kHidden);
      std::copy_n(src + kHidden, kKvWidth, k + r * kKvWidth);
      std::copy_n(src + kHidden + kKvWidth, kKvWidth, v + r * kKvWidth);
    }
    return Status::Ok();
  }
  Status AfterAttention(int, int n, const float* out, const float*) override {
    const int64_t rows = Rows(n);
    Gemm(rows, kHidden, kHidden, out, w_o_.data(), x_[n].data(), 1.0f);  // x += O Wo
    Gemm(rows, kFfn, kHidden, x_[n].data(), w_up_.data(), tmp_[n].data());
    Gemm(rows, kHidden, kFfn, tmp_[n].data(), w_down_.data(), x_[n].data(), 1.0f);  // x += MLP(x)
    for (float& e : x_[n]) e = std::clamp(e, -4.0f, 4.0f);
    return Status::Ok();
  }
  Status BeforeAttentionBackward(int, int n, float* dout) override {
    const int64_t rows = Rows(n);
    // The MLP's and O projection's backward: twice their forward GEMMs.
    for (int rep = 0; rep < 2; ++rep) {
      Gemm(rows, kFfn, kHidden, x_[n].data(), w_up_.data(), tmp_[n].data());
      Gemm(rows, kHidden, kFfn, tmp_[n].data(), w_down_.data(), dout);
      Gemm(rows, kHidden, kHidden, x_[n].data(), w_o_.data(), dout, 1.0f);
    }
    for (int64_t i = 0; i < rows * kHidden; ++i) dout[i] = std::clamp(dout[i], -1.0f, 1.0f);
    return Status::Ok();
  }
  Status AfterAttentionBackward(int, int n, const float* dq, const float*, const float*) override {
    const int64_t rows = Rows(n);
    for (int rep = 0; rep < 2; ++rep) Gemm(rows, kHidden + 2 * kKvWidth, kHidden, dq, w_qkv_.data(), qkv_[n].data());
    return Status::Ok();
  }

 private:
  int64_t Rows(int n) const { return int64_t(x_[n].size()) / kHidden; }
  std::vector<float> w_qkv_, w_o_, w_up_, w_down_;
  std::vector<std::vector<float>> x_, qkv_, tmp_;
};

// One rank's figures for one batch. Bytes are what the rank sent (every
// byte is sent by one rank and received by another: summed over ranks, the
// bytes that crossed).
struct CaseResult {
  int64_t bytes_sent = 0, bytes_planned = 0;
  double exchange_seconds = 0, exchange_bytes = 0;  // the isolated exchange: best time, bytes sent
  // [serial, ping-pong]: medians over the repetitions.
  double step_seconds[2] = {0, 0};
  double exposed_fraction[2] = {0, 0};
  double busy_seconds[2] = {0, 0};  // the rank's compute thread's CPU time
};

}  // namespace

bool RunDispatchBench(const DispatchBenchOptions& o, std::string* error) {
  // One rank sends nothing: 0 bytes at 0 GB/s measures no link.
  if (ChosenBackend(CommOptions{}) == CommOptions::Backend::kLocal && o.local_ranks < 2) {
    *error = TooFewRanks(o.local_ranks);
    return false;
  }
  std::vector<int64_t> pool;
  Status s = ReadLengthsFile(o.lengths_file, &pool);
  if (s.ok() && !o.trace_file.empty()) s = CheckOutputPath(o.trace_file);  // before minutes of measuring
  if (!s.ok()) {
    *error = s.ToString();
    return false;
  }
  const int layers = o.short_mode ? 2 : 4;
  const int batches = o.short_mode ? 1 : 3;
  // Serial and ping-pong alternate which runs first; each repetition runs
  // both, after one untimed pass of each (first GEMM calls, first large
  // transfers).
  const int reps = o.short_mode ? 1 : 3;
  const int64_t tokens_per_rank = o.short_mode ? 4096 : 16384;
  nlohmann::json records = nlohmann::json::array();
  CommOptions co;
  co.local_ranks = o.local_ranks;
  std::string backend;
  int ranks = 0;
  Tracer tracer;  // shared by the local backend's rank threads
  // Ranks on one machine share its memory (the local backend's all live in
  // this process): refused before they allocate, not by the OOM killer; the
  // local backend's before its ranks start, MPI's once each knows how many
  // share its machine.
  const bool local = ChosenBackend(co) == CommOptions::Backend::kLocal;
  const auto check_memory = [&](int machine_ranks) -> Status {
    const double need = kBytesPerToken * double(tokens_per_rank) * machine_ranks;
    if (const double ram = PhysicalMemoryBytes(); ram > 0 && need > ram)
      return Status::InvalidArgument(
          fmt::format("{} ranks on this machine at {} tokens each need about {:.3g} GB, more than its RAM ({:.3g} GB)",
                      machine_ranks, tokens_per_rank, need * 1e-9, ram * 1e-9));
    return Status::Ok();
  };
  if (local) {
    if (s = check_memory(o.local_ranks); !s.ok()) {
      *error = s.ToString();
      return false;
    }
  }
  s = RunOnRanks(co, [&](Comm& comm) -> Status {
    if (comm.size() < 2) return Status::InvalidArgument(TooFewRanks(comm.size()));  // mpirun -np 1
    if (!local) DISTCA_RETURN_IF_ERROR(check_memory(comm.machine_ranks()));
    omp_set_num_threads(1);  // one thread per rank
    if (comm.rank() == 0) {
      backend = comm.backend();
      ranks = comm.size();
    }
    for (int b = 0; b < batches; ++b) {
      // Pretrain recipe, lengths scaled down to this machine's token budget.
      WorkloadRecipe r;
      r.tokens_per_batch = tokens_per_rank * comm.size();
      r.upsample = 4;
      r.filter_ratio = 0.5;
      r.elongate = 0.5;
      r.seed = 11 + uint64_t(b);
      std::vector<std::vector<int64_t>> sampled;
      DISTCA_RETURN_IF_ERROR(SampleBatches(pool, r, 1, &sampled));
      std::vector<std::vector<int>> nano_docs;
      DISTCA_RETURN_IF_ERROR(SplitNanoBatches(sampled[0], 2, &nano_docs)
                                 .WithContext(fmt::format("batch {} of {} tokens from {} (ping-pong needs two "
                                                          "documents a batch; the pool's may be longer than a batch)",
                                                          b, r.tokens_per_batch, o.lengths_file)));
      PlanOptions po;
      po.ranks = comm.size();
      po.model = {.q_heads = kHq, .kv_heads = kHkv, .head_dim = kDim, .dtype_bytes = 4};
      const CostModel cost = CostModel::Flops(po.model);
      std::vector<Plan> plans;
      for (const auto& docs : nano_docs) {
        std::vector<int64_t> lengths;
        for (int d : docs) lengths.push_back(sampled[0][d]);
        plans.emplace_back();
        DISTCA_RETURN_IF_ERROR(BuildPlan(lengths, po, cost, &plans.back()));
      }
      CaseResult result;
      std::vector<double> step[2], exposed[2], busy[2];
      // One pass of a variant; `timed` records it.
      auto pass = [&](int variant, bool timed, bool traced) -> Status {
        PingPongOptions eo;
        eo.layers = layers;
        eo.ping_pong = variant == 1;
        eo.dispatch.q_heads = kHq;
        eo.dispatch.kv_heads = kHkv;
        eo.dispatch.head_dim = kDim;
        eo.dispatch.exec.num_threads = 1;
        if (traced) eo.tracer = &tracer;
        std::unique_ptr<PingPongExecutor> ex;
        DISTCA_RETURN_IF_ERROR(PingPongExecutor::Create(&comm, plans, eo, &ex));
        GemmStack stack(*ex, layers);
        DISTCA_RETURN_IF_ERROR(comm.Barrier());
        const double cpu0 = ThreadCpuSeconds();
        WallTimer t;
        DISTCA_RETURN_IF_ERROR(ex->Forward(stack));
        DISTCA_RETURN_IF_ERROR(ex->Backward(stack));
        const double seconds = t.Seconds(), cpu = ThreadCpuSeconds() - cpu0;
        if (!timed) return Status::Ok();
        step[variant].push_back(seconds);
        exposed[variant].push_back(ex->exposed_comm_seconds() / seconds);
        busy[variant].push_back(cpu);
        if (variant == 0 && step[0].size() == 1) {
          // Bytes: what this rank sent (all layers) against the plans' count.
          for (int n = 0; n < 2; ++n) {
            result.bytes_sent += ex->dispatcher(n).traffic().sent;
            result.bytes_planned += layers * plans[n].stats.traffic.sent[comm.rank()];
          }
        }
        return Status::Ok();
      };
      for (int variant = 0; variant < 2; ++variant) DISTCA_RETURN_IF_ERROR(pass(variant, false, false));
      // The trace is of a ping-pong pass of its own, untimed: tracing costs
      // time that the serial passes would not pay.
      if (!o.trace_file.empty() && b == 0) DISTCA_RETURN_IF_ERROR(pass(1, false, true));
      for (int rep = 0; rep < reps; ++rep)
        for (int i = 0; i < 2; ++i) DISTCA_RETURN_IF_ERROR(pass(rep % 2 == 0 ? i : 1 - i, true, false));
      for (int v = 0; v < 2; ++v) {
        result.step_seconds[v] = Median(step[v]);
        result.exposed_fraction[v] = Median(exposed[v]);
        result.busy_seconds[v] = Median(busy[v]);
      }
      {
        // Exchange rate in isolation: after a barrier every rank packs and
        // sends one forward pass's Q/K/V and waits for its own; best of three.
        DispatchOptions d;
        d.q_heads = kHq;
        d.kv_heads = kHkv;
        d.head_dim = kDim;
        d.exec.num_threads = 1;
        std::unique_ptr<AttentionDispatcher> disp;
        DISTCA_RETURN_IF_ERROR(AttentionDispatcher::Create(plans[0], comm.rank(), d, &disp));
        const int64_t rows = disp->local_tokens();
        std::vector<float> q(size_t(rows * kHidden), 0.1f), kv(size_t(rows * kKvWidth), 0.1f);
        std::vector<float> out(q.size()), lse(size_t(rows * kHq));
        result.exchange_seconds = 1e30;
        for (int rep = 0; rep < 3; ++rep) {
          AttentionContext ctx;
          DISTCA_RETURN_IF_ERROR(comm.Barrier());
          const int64_t sent0 = disp->traffic().sent;
          WallTimer t;
          DISTCA_RETURN_IF_ERROR(disp->StartForward(comm, q.data(), kv.data(), kv.data(), &ctx));
          DISTCA_RETURN_IF_ERROR(AttentionDispatcher::WaitTransfer(&ctx));
          result.exchange_seconds = std::min(result.exchange_seconds, t.Seconds());
          result.exchange_bytes = double(disp->traffic().sent - sent0);
          DISTCA_RETURN_IF_ERROR(disp->ServeForward(comm, &ctx));
          DISTCA_RETURN_IF_ERROR(disp->FinishForward(comm, out.data(), lse.data(), &ctx));
        }
      }
      if (result.bytes_sent != result.bytes_planned)
        return Status::Internal(fmt::format("rank {} sent {} bytes, the plans say {}", comm.rank(), result.bytes_sent,
                                            result.bytes_planned));
      std::vector<CaseResult> all;
      DISTCA_RETURN_IF_ERROR(GatherToRoot(comm, result, &all));
      if (!o.trace_file.empty() && b == 0 && std::string(comm.backend()) == "mpi")
        DISTCA_RETURN_IF_ERROR(tracer.WriteChromeJson(
            comm.rank() == 0 ? o.trace_file : fmt::format("{}.rank{}", o.trace_file, comm.rank())));
      if (comm.rank() != 0) continue;
      // Bytes summed over ranks; the exchange rate is all ranks' bytes over
      // the slowest rank's time; times and fractions are the slowest rank's.
      int64_t sent = 0;
      double exchange_s = 0, exchange_bytes = 0, step_s[2] = {0, 0}, exposed_f[2] = {0, 0}, busy_s[2] = {0, 0};
      for (const CaseResult& c : all) {
        sent += c.bytes_sent;
        exchange_s = std::max(exchange_s, c.exchange_seconds);
        exchange_bytes += c.exchange_bytes;
        for (int v = 0; v < 2; ++v) {
          step_s[v] = std::max(step_s[v], c.step_seconds[v]);
          exposed_f[v] = std::max(exposed_f[v], c.exposed_fraction[v]);
          busy_s[v] = std::max(busy_s[v], c.busy_seconds[v]);
        }
      }
      records.push_back({{"backend", backend},
                         {"ranks", comm.size()},
                         {"ranks_per_core", double(comm.size()) / std::max(1u, std::thread::hardware_concurrency())},
                         {"batch", b},
                         {"layers", layers},
                         {"repetitions", reps},
                         {"tokens_per_rank", tokens_per_rank},
                         {"bytes_sent", sent},
                         {"gbytes_per_s", exchange_s > 0 ? exchange_bytes * 1e-9 / exchange_s : 0.0},
                         {"step_s_serial", step_s[0]},
                         {"step_s_pingpong", step_s[1]},
                         {"busy_s_serial", busy_s[0]},
                         {"busy_s_pingpong", busy_s[1]},
                         {"exposed_comm_fraction_serial", exposed_f[0]},
                         {"exposed_comm_fraction_pingpong", exposed_f[1]}});
    }
    return Status::Ok();
  });
  if (!s.ok()) {
    *error = s.ToString();
    return false;
  }
  if (!o.trace_file.empty() && backend == "local") {
    s = tracer.WriteChromeJson(o.trace_file);
    if (!s.ok()) {
      *error = s.ToString();
      return false;
    }
  }
  if (records.empty()) return true;  // not rank 0 of an MPI job
  if (o.json) {
    for (const auto& r : records) fmt::print("{}\n", r.dump());
    return true;
  }
  fmt::print(
      "distca-bench dispatch: {} backend, {} ranks ({:.1f} per core), {} layers, {} tokens per rank, heads {}x{}, "
      "head_dim {};\nsynthetic layers of real GEMMs (hidden {}, MLP {}), one thread per rank; medians of {} "
      "repetitions, serial and ping-pong alternating; slowest rank\n\n",
      backend, ranks, records[0]["ranks_per_core"].get<double>(), layers, tokens_per_rank, kHq, kHkv, kDim, kHidden,
      kFfn, reps);
  fmt::print("{:>5} {:>12} {:>7} {:>17} {:>17} {:>17}\n", "batch", "bytes sent", "GB/s", "step s ser / pp",
             "busy s ser / pp", "exposed ser / pp");
  for (const auto& r : records) {
    fmt::print("{:>5} {:>10.1f}MB {:>7.2f} {:>8.3f} / {:<6.3f} {:>8.3f} / {:<6.3f} {:>8.3f} / {:<6.3f}\n",
               r["batch"].get<int>(), r["bytes_sent"].get<double>() * 1e-6, r["gbytes_per_s"].get<double>(),
               r["step_s_serial"].get<double>(), r["step_s_pingpong"].get<double>(), r["busy_s_serial"].get<double>(),
               r["busy_s_pingpong"].get<double>(), r["exposed_comm_fraction_serial"].get<double>(),
               r["exposed_comm_fraction_pingpong"].get<double>());
  }
  fmt::print("\nbytes sent equal the planner's count on every rank (checked)\n");
  return true;
}

}  // namespace distca::bench
