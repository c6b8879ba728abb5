// The training loop (include/distca/train.h).
#include <fmt/format.h>
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string_view>
#include <vector>

#include "common/cpu_features.h"
#include "common/memory_info.h"
#include "common/timer.h"
#include "distca/pingpong.h"
#include "distca/train.h"

namespace distca {
namespace {

// What every rank sends rank 0 after a step.
struct RankReport {
  double tokens, attn_s, linear_s, comm_s, wait_s, busy_s, peak_rss_bytes, step_s, sent_bytes;
};

// Resets the process's peak resident set (Linux: VmHWM) so that each step
// reports its own peak; silently a no-op where unsupported.
void ResetPeakRss() {
  if (std::FILE* f = std::fopen("/proc/self/clear_refs", "w")) {
    std::fputs("5", f);
    std::fclose(f);
  }
}

// The process's peak resident set since the last reset, in bytes.
int64_t PeakRssBytes() {
  if (std::FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    long long kib = -1;
    while (std::fgets(line, sizeof line, f) != nullptr)
      if (std::sscanf(line, "VmHWM: %lld kB", &kib) == 1) break;
    std::fclose(f);
    if (kib >= 0) return int64_t{kib} * 1024;
  }
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return int64_t{u.ru_maxrss} * 1024;  // Linux reports KiB
}

// The plans of one step: one per nano-batch, and which batch documents each holds.
struct StepPlans {
  std::vector<Plan> plans;
  std::vector<std::vector<int>> nano_docs;  // batch indices per nano-batch, in batch order
};

Status BuildStepPlans(const std::vector<int64_t>& lengths, const TrainOptions& o, int data_ranks, StepPlans* out) {
  const ModelConfig& m = o.model;
  PlanOptions po;
  po.ranks = data_ranks;
  po.block = o.block;
  po.model = {m.q_heads, m.kv_heads, m.head_dim(), int(sizeof(float))};
  const bool cad = o.attention == AttentionMode::kCad;
  po.policy = cad ? o.policy : PlanPolicy::kColocated;
  po.dedicated_servers = cad ? o.servers : 0;
  po.tolerance = o.tolerance;
  out->nano_docs.clear();
  if (cad && o.ping_pong && lengths.size() >= 2) {
    DISTCA_RETURN_IF_ERROR(SplitNanoBatches(lengths, 2, &out->nano_docs));
    // Every rank holds a token of each nano-batch (the linear layout's
    // contract): where a nano-batch has fewer tokens than ranks (a batch
    // of one long document and a few short ones), the step runs as one,
    // without ping-pong, as it does for a batch of one document.
    for (const std::vector<int>& nano : out->nano_docs) {
      int64_t tokens = 0;
      for (int d : nano) tokens += lengths[size_t(d)];
      if (tokens < data_ranks) {
        out->nano_docs.clear();
        break;
      }
    }
  }
  if (out->nano_docs.empty()) {
    out->nano_docs.emplace_back();
    for (int i = 0; i < static_cast<int>(lengths.size()); ++i) out->nano_docs[0].push_back(i);
  }
  const CostModel flops = CostModel::Flops(po.model);
  const CostModel& cost = o.cost_table ? *o.cost_table : flops;  // no copy of the table per step
  out->plans.resize(out->nano_docs.size());
  for (size_t n = 0; n < out->nano_docs.size(); ++n) {
    std::vector<int64_t> nano_lengths;
    for (int d : out->nano_docs[n]) nano_lengths.push_back(lengths[size_t(d)]);
    DISTCA_RETURN_IF_ERROR(
        BuildPlan(nano_lengths, po, cost, &out->plans[n]).WithContext(fmt::format("nano-batch {}", n)));
  }
  return Status::Ok();
}

// This rank's token rows of nano-batch n, in the dispatcher's local order.
TokenRows RowsOf(const Batch& batch, const Plan& plan, const std::vector<int>& nano_docs, int rank) {
  TokenRows rows;
  for (size_t i = 0; i < plan.documents.size(); ++i) {
    const std::vector<int32_t>& doc = batch.docs[size_t(nano_docs[i])];
    const int64_t len = static_cast<int64_t>(doc.size());
    for (const PlanPiece& p : plan.documents[i].pieces) {
      if (p.rank != rank) continue;
      for (int64_t pos = p.begin; pos < p.end; ++pos) {
        rows.tokens.push_back(doc[size_t(pos)]);
        rows.positions.push_back(pos);
        rows.targets.push_back(pos + 1 < len ? doc[size_t(pos + 1)] : -1);
      }
    }
  }
  return rows;
}

// CA cost per server (FLOPs, or the cost table's seconds) summed over the
// nano-batches: max / mean.
double LoadMaxOverMean(const std::vector<Plan>& plans) {
  std::vector<double> load;
  for (const Plan& p : plans) {
    load.resize(std::max(load.size(), p.stats.load.size()), 0.0);
    for (size_t s = 0; s < p.stats.load.size(); ++s) load[s] += p.stats.load[s];
  }
  double sum = 0, mx = 0;
  for (double l : load) {
    sum += l;
    mx = std::max(mx, l);
  }
  return sum > 0 ? mx / (sum / double(load.size())) : 1.0;
}

// The cosine schedule's length: --lr-decay-steps, or the run's steps.
int64_t DecaySteps(const TrainOptions& o) { return o.lr_decay_steps > 0 ? o.lr_decay_steps : o.steps; }
LrSchedule ScheduleOf(const TrainOptions& o) { return {o.lr, o.min_lr, o.warmup_steps, DecaySteps(o)}; }

Status CheckOptions(const Comm& comm, const TrainOptions& o) {
  DISTCA_RETURN_IF_ERROR(ValidateModelConfig(o.model));
  // One token id leaves nothing to predict: every loss and gradient is 0.
  if (o.model.vocab_size < 2)
    return Status::InvalidArgument(fmt::format(
        "--vocab-size must be >= 2, got {}: a one-token vocabulary has nothing to predict", o.model.vocab_size));
  if (o.steps < 1) return Status::InvalidArgument(fmt::format("--steps must be >= 1, got {}", o.steps));
  if (o.threads < 1 || o.threads > kMaxThreads)
    return Status::InvalidArgument(fmt::format("--threads must be in [1, {}], got {}", kMaxThreads, o.threads));
  // Every rank on this machine runs its own OpenMP team.
  if (int64_t{o.threads} * comm.machine_ranks() > kMaxThreads)
    return Status::InvalidArgument(
        fmt::format("--threads {} on each of the {} ranks on this machine is {} threads, above the limit of {}",
                    o.threads, comm.machine_ranks(), int64_t{o.threads} * comm.machine_ranks(), kMaxThreads));
  if (o.block < 1) return Status::InvalidArgument(fmt::format("--block must be >= 1, got {}", o.block));
  if (o.servers < 0) return Status::InvalidArgument(fmt::format("--servers must be >= 0, got {}", o.servers));
  if (o.attention == AttentionMode::kCad && o.servers >= comm.size())
    return Status::InvalidArgument(
        fmt::format("--servers {} leaves no rank for the model: the job has {} ranks", o.servers, comm.size()));
  if (o.attention == AttentionMode::kColocated && o.servers > 0)
    return Status::InvalidArgument("--servers needs --attention cad");
  // A colocated plan keeps every rank's attention at home: the servers
  // would hold no tokens and do no work (balance 2.000, exit 0).
  if (o.policy == PlanPolicy::kColocated && o.servers > 0)
    return Status::InvalidArgument(
        "--servers with --policy colocated: a colocated plan gives dedicated servers no work (use --policy distca or "
        "paper)");
  if (o.data.docs_file.empty() && o.data.batches.empty() && o.tokens_per_rank <= 0)
    return Status::InvalidArgument("--tokens-per-rank is required (and positive) unless --docs-file gives the batches");
  if (o.tokens_per_rank > 0 && o.tokens_per_rank < o.block)
    return Status::InvalidArgument(
        fmt::format("--tokens-per-rank {} is smaller than one block ({} tokens)", o.tokens_per_rank, o.block));
  // The batch, tokens per rank x data ranks, must fit the data layer's
  // limit (and an int64 on the way).
  if (o.tokens_per_rank > kMaxTokensPerBatch / comm.size())
    return Status::OutOfRange(
        fmt::format("--tokens-per-rank {} over {} ranks is above the limit of {} tokens per batch", o.tokens_per_rank,
                    comm.size(), kMaxTokensPerBatch));
  if (!(o.lr > 0) || !(o.min_lr >= 0) || o.min_lr > o.lr || !std::isfinite(o.lr))
    return Status::InvalidArgument(
        fmt::format("need 0 <= --min-lr <= --lr, --lr > 0 and finite, got {} and {}", o.min_lr, o.lr));
  const AdamWOptions& a = o.adamw;
  if (!(a.weight_decay >= 0) || !std::isfinite(a.weight_decay))
    return Status::InvalidArgument(fmt::format("--weight-decay must be finite and >= 0, got {}", a.weight_decay));
  if (!(a.beta1 >= 0 && a.beta1 < 1) || !(a.beta2 >= 0 && a.beta2 < 1) || !(a.eps > 0) || !std::isfinite(a.eps))
    return Status::InvalidArgument(
        fmt::format("AdamW needs betas in [0, 1) and a finite eps > 0, got {}, {} and {}", a.beta1, a.beta2, a.eps));
  if (!(o.grad_clip >= 0) || !std::isfinite(o.grad_clip))
    return Status::InvalidArgument(fmt::format("--clip-grad must be finite and >= 0, got {}", o.grad_clip));
  if (o.warmup_steps < 0 || o.lr_decay_steps < 0)
    return Status::InvalidArgument(fmt::format("--warmup-steps and --lr-decay-steps must be >= 0, got {} and {}",
                                               o.warmup_steps, o.lr_decay_steps));
  // The cosine starts where the warmup ends: a warmup past the schedule's
  // end would raise the rate after it should have decayed, then drop it.
  const int64_t decay_steps = DecaySteps(o);
  if (o.warmup_steps > decay_steps)
    return Status::InvalidArgument(fmt::format(
        "--warmup-steps {} is longer than the learning-rate schedule ({} steps: --lr-decay-steps, or --steps)",
        o.warmup_steps, decay_steps));
  return Status::Ok();
}

// What a step's batch must hold: --tokens-per-rank x the data ranks when
// given, at least one block per rank, and something to predict.
Status CheckBatch(const std::vector<int64_t>& lengths, const TrainOptions& o, int data_ranks) {
  int64_t tokens = 0, targets = 0;
  for (int64_t len : lengths) {
    tokens += len;
    targets += len - 1;
  }
  if (o.tokens_per_rank > 0 && tokens != o.tokens_per_rank * data_ranks)
    return Status::InvalidArgument(fmt::format("the batch holds {} tokens, not --tokens-per-rank {} x {} ranks", tokens,
                                               o.tokens_per_rank, data_ranks));
  if (tokens / data_ranks < o.block)
    return Status::InvalidArgument(
        fmt::format("{} tokens over {} ranks is less than one block ({}) per rank", tokens, data_ranks, o.block));
  if (targets == 0) return Status::InvalidArgument("every document has one token; nothing to predict");
  return Status::Ok();
}

// A run that cannot fit is refused before it allocates, rather than left to
// the OOM killer. Per rank, at least: fp32 weights, gradients and AdamW's two
// moments (16 bytes per parameter), and the activations and buffers the
// backward pass holds at its start, in floats:
// - per token and layer, (5h + 2 Hq D + 2 Hkv D + 2 ffn + Hq + 2): what
//   ModelPass keeps (the layer input, attention norm output, attention output
//   and mid-layer residual, the MLP norm output, gate and up, and both norms'
//   reciprocal RMS) and what the executor keeps (Q, K, V, O and the LSE; the
//   SwiGLU output is recomputed); in the cached backward also the server's
//   copies of Q, K, V and the LSE, (Hq D + 2 Hkv D + Hq);
// - per token, (2h + D + 2 Hq D + 2 Hkv D): ModelPass's last output, the
//   residual's gradient and the rotary tables, and the executor's dO, dQ, dK
//   and dV;
// - per row of the largest nano-batch (half the rank's tokens with CAD's
//   ping-pong, else all of them), (h + (Hq + 2 Hkv) D + 4 ffn): ModelPass's
//   scratch for the projections, the MLP and their gradients; and the
//   attention server's working set for one layer's backward, (3 Hq D + 4 Hkv D
//   + 2 Hq): Q, K, V, dO, the LSE and delta, dQ, dK and dV (in the cached
//   backward (2 Hq D + 2 Hkv D + Hq), Q, K, V and the LSE being held
//   already); a server's rows are counted at a rank's own tokens, which they
//   are over the ranks, and the exchanges' buffers, which depend on the
//   plan, are left out;
// plus one chunk of logits (ModelPass computes the LM head in chunks of at
// most kDefaultMaxLogitFloats floats, or one row), or, where a checkpoint is
// loaded before the first step allocates them, the larger of those and what
// loading holds (kLoadBytesPerParameter); times the ranks that share this
// machine (Comm::machine_ranks: all of them with the local backend, the
// node's under MPI); plus, with a save directory, what rank 0's save builds
// while the step's buffers are held (kSaveBytesPerParameter, once).
// Containers' limits are not seen; set memory_bytes. Measured against the
// peak resident size (docs/training.md), this is 2-5% below it with
// colocated attention and 5-14% below with CAD, whose two nano-batches are
// rarely equal halves.
Status CheckMemory(const Comm& comm, const TrainOptions& o, int64_t tokens_per_rank) {
  const ModelConfig& m = o.model;
  const int64_t params = ParameterCount(m);
  const double state = 16.0 * double(params);
  const double h = m.hidden, D = m.head_dim(), ffn = m.ffn_hidden, Hq = m.q_heads, Hkv = m.kv_heads;
  const bool cad = o.attention == AttentionMode::kCad;
  // The dispatcher keeps the servers' copies in the cached backward with
  // any plan (--compare runs a colocated variant in that mode too).
  const bool cached = o.backward == BackwardMode::kCached;
  const double per_token_layer =
      5.0 * h + 2.0 * Hq * D + 2.0 * Hkv * D + 2.0 * ffn + Hq + 2.0 + (cached ? Hq * D + 2.0 * Hkv * D + Hq : 0.0);
  const double per_token = double(m.num_layers) * per_token_layer + 2.0 * h + D + 2.0 * Hq * D + 2.0 * Hkv * D;
  const double per_nano_row = h + (Hq + 2.0 * Hkv) * D + 4.0 * ffn +
                              (cached ? 2.0 * Hq * D + 2.0 * Hkv * D + Hq : 3.0 * Hq * D + 4.0 * Hkv * D + 2.0 * Hq);
  const double nano_rows = cad && o.ping_pong ? std::ceil(double(tokens_per_rank) / 2) : double(tokens_per_rank);
  const double logits = 4.0 * std::min(double(m.vocab_size) * double(tokens_per_rank),
                                       std::max(double(m.vocab_size), double(ModelPass::kDefaultMaxLogitFloats)));
  const double saving = o.save_dir.empty() ? 0.0 : double(kSaveBytesPerParameter) * double(params);
  const double activations = 4.0 * (per_token * double(tokens_per_rank) + per_nano_row * nano_rows) + logits;
  const double loading = o.load_dir.empty() ? 0.0 : double(kLoadBytesPerParameter) * double(params);
  const double transient = std::max(activations, loading);
  const int sharing = comm.machine_ranks();
  // Loading comes before the first step; a save after one, with the step's
  // buffers still held.
  const double need = std::max((state + transient) * sharing, (state + activations) * sharing + saving);
  double limit = o.memory_bytes;
  const char* what = "memory_bytes";
  if (limit <= 0) {
    limit = PhysicalMemoryBytes();  // 0, unknown: no check
    what = "this machine's RAM";
  }
  if (limit > 0 && need > limit)
    return Status::InvalidArgument(fmt::format(
        "model {} ({} parameters) at {} tokens per rank needs at least {:.3g} GB per rank ({:.3g} for weights, "
        "gradients and AdamW state, {:.3g} for {}), {} rank(s) on this machine{}: {:.3g} GB, more than {} "
        "({:.3g} GB)",
        m.name, params, tokens_per_rank, (state + transient) * 1e-9, state * 1e-9, transient * 1e-9,
        loading > activations ? "loading the checkpoint" : "activations", sharing,
        saving > 0 ? fmt::format(", and {:.3g} GB to write a checkpoint", saving * 1e-9) : "", need * 1e-9, what,
        limit * 1e-9));
  return Status::Ok();
}

// Sums `value` over ranks in double precision: every rank sends its double
// to every rank, and each sums them in rank order (the same sum, to the
// bit, everywhere).
Status AllreduceDouble(Comm& comm, double* value) {
  const size_t n = static_cast<size_t>(comm.size());
  const std::vector<double> send(n, *value);
  std::vector<double> recv(n, 0.0);
  const std::vector<int64_t> counts(n, int64_t{sizeof(double)});
  DISTCA_RETURN_IF_ERROR(comm.Alltoallv(send.data(), counts, recv.data(), counts));
  double sum = 0;
  for (double v : recv) sum += v;
  *value = sum;
  return Status::Ok();
}

// FNV-1a, 64-bit.
struct Fnv {
  uint64_t hash = 1469598103934665603ull;
  void Add(uint64_t bits) { hash = (hash ^ bits) * 1099511628211ull; }
};

// Rank 0's copy of the `bytes` at `mine` into *root, and how many ranks
// hold other bytes (*differing): every rank returns the same count.
Status CompareWithRoot(Comm& comm, const void* mine, void* root, size_t bytes, int* differing) {
  std::memcpy(root, mine, bytes);
  DISTCA_RETURN_IF_ERROR(comm.Broadcast(root, static_cast<int64_t>(bytes), 0));
  float differs = std::memcmp(mine, root, bytes) != 0 ? 1.0f : 0.0f;
  DISTCA_RETURN_IF_ERROR(comm.AllreduceSum(&differs, 1));
  *differing = static_cast<int>(differs);
  return Status::Ok();
}

// Every rank starts from the same state: the step, the data position, the
// weights (hashed over about 2^20 to 2^21 evenly spaced parameters) and the
// step it trains to. Under mpirun each process loads its own --load (a
// job's processes may even be given different ones), and ranks that resumed
// at different steps, or that stop at different ones, would wait on each
// other's collectives forever; at one step with other weights they would
// train apart silently.
Status CheckRanksStartAlike(Comm& comm, int64_t step, int64_t final_step, const DataPosition& data,
                            const Transformer& model) {
  struct Start {
    int64_t step, final_step, data_step, epoch, cursor, offset;
    uint64_t weights;
  };
  Fnv weights;  // over the sampled parameters' bits
  const int64_t n = model.size(), stride = std::max<int64_t>(1, n >> 20);
  for (int64_t i = 0; i < n; i += stride) {
    uint32_t bits = 0;
    std::memcpy(&bits, model.params() + i, sizeof bits);
    weights.Add(bits);
  }
  const Start mine{step, final_step, data.step, data.epoch, data.cursor, data.offset, weights.hash};
  Start root{};
  int differs = 0;
  DISTCA_RETURN_IF_ERROR(
      CompareWithRoot(comm, &mine, &root, sizeof mine, &differs).WithContext("comparing the ranks' starting states"));
  if (differs == 0) return Status::Ok();
  const auto describe = [](const Start& s) {
    return fmt::format("step {} of {}, data position ({}, {}, {}, {}), weights hash {:016x}", s.step, s.final_step,
                       s.data_step, s.epoch, s.cursor, s.offset, s.weights);
  };
  if (std::memcmp(&mine, &root, sizeof mine) != 0)
    return Status::FailedPrecondition(fmt::format(
        "rank {} starts from another state than rank 0: every rank must resume from the same checkpoint and "
        "train to the same --steps ({} against {})",
        comm.rank(), describe(mine), describe(root)));
  return Status::FailedPrecondition(
      fmt::format("{} rank(s) start from another state than rank 0: every rank must resume from the same checkpoint "
                  "and train to the same --steps",
                  differs));
}

// Every rank plans with the same cost: each process reads its own
// --cost-table, and ranks given different tables (node-local copies that
// differ, as `distca-bench profile` writes one per machine) would plan
// different exchanges (see CheckRanksReadAlike).
Status CheckRanksPlanAlike(Comm& comm, const TrainOptions& o) {
  Fnv h;
  h.Add(o.cost_table ? 1 : 0);
  if (o.cost_table) {
    for (const std::vector<double>* v :
         {&o.cost_table->q_grid(), &o.cost_table->kv_grid(), &o.cost_table->grid_seconds()}) {
      h.Add(v->size());
      for (double x : *v) h.Add(std::bit_cast<uint64_t>(x));
    }
  }
  uint64_t root = 0;
  int differs = 0;
  DISTCA_RETURN_IF_ERROR(CompareWithRoot(comm, &h.hash, &root, sizeof root, &differs));
  if (differs == 0) return Status::Ok();
  return Status::FailedPrecondition(
      fmt::format("{} rank(s) plan with another cost table than rank 0 (--cost-table): every rank must be given the "
                  "same table",
                  differs));
}

// Every rank read the same batch (its documents' lengths and tokens). Each
// rank reads the data itself; ranks given different data (node-local
// copies that differ) would plan different exchanges, whose messages then
// do not match: MPI's behaviour after such an error is undefined (a crash
// inside the library was seen).
Status CheckRanksReadAlike(Comm& comm, const Batch& batch) {
  Fnv h;
  for (const std::vector<int32_t>& doc : batch.docs) {
    h.Add(doc.size());
    for (int32_t id : doc) h.Add(static_cast<uint32_t>(id));
  }
  uint64_t root = 0;
  int differs = 0;
  DISTCA_RETURN_IF_ERROR(CompareWithRoot(comm, &h.hash, &root, sizeof root, &differs));
  if (differs == 0) return Status::Ok();
  constexpr const char* kSameData =
      "every rank must be given the same data (--data, --docs-file and the files they name)";
  if (h.hash != root)
    return Status::FailedPrecondition(
        fmt::format("rank {} read another batch than rank 0 ({} documents, {} tokens, hash {:016x} against rank 0's "
                    "{:016x}): {}",
                    comm.rank(), batch.docs.size(), batch.tokens(), h.hash, root, kSameData));
  return Status::FailedPrecondition(fmt::format("{} rank(s) read another batch than rank 0: {}", differs, kSameData));
}

}  // namespace

const char* AttentionModeName(AttentionMode mode) { return mode == AttentionMode::kCad ? "cad" : "colocated"; }

Status ParseAttentionMode(std::string_view name, AttentionMode* mode) {
  if (name == "cad")
    *mode = AttentionMode::kCad;
  else if (name == "colocated")
    *mode = AttentionMode::kColocated;
  else
    return Status::InvalidArgument(fmt::format("unknown attention mode '{}': use colocated or cad", name));
  return Status::Ok();
}

std::string DescribeSchedule(const LrSchedule& s) {
  return fmt::format("lr {} to min-lr {}, warmup {} steps, decay over {} steps", s.lr, s.min_lr, s.warmup_steps,
                     s.decay_steps);
}

Status CheckTrainOptions(const Comm& comm, const TrainOptions& options) {
  DISTCA_RETURN_IF_ERROR(CheckOptions(comm, options));
  // A fixed batch size needs no data to check memory.
  if (options.tokens_per_rank > 0) DISTCA_RETURN_IF_ERROR(CheckMemory(comm, options, options.tokens_per_rank));
  return Status::Ok();
}

Status Train(Comm& comm, const TrainOptions& options, const std::function<void(const StepMetrics&)>& on_step) {
  DISTCA_RETURN_IF_ERROR(CheckOptions(comm, options));
  const TrainOptions& o = options;
  const int rank = comm.rank();
  const int data_ranks = comm.size() - (o.attention == AttentionMode::kCad ? o.servers : 0);
  omp_set_num_threads(o.threads);

  DataOptions data = o.data;
  data.seed = o.seed;
  data.vocab_size = o.model.vocab_size;  // indexed ids are checked against it, synthetic ids drawn below it
  data.tokens_per_batch = o.tokens_per_rank * data_ranks;
  DISTCA_RETURN_IF_ERROR(BatchStream::ReadInputFilesOnce(&data));
  std::unique_ptr<BatchStream> stream;
  DISTCA_RETURN_IF_ERROR(BatchStream::Open(data, &stream));
  // A save directory that cannot be written is found before the first step,
  // not after the run has trained.
  if (!o.save_dir.empty() && rank == 0) DISTCA_RETURN_IF_ERROR(CheckCheckpointDirectory(o.save_dir));
  if (stream->vocab_size() > o.model.vocab_size)
    return Status::InvalidArgument(fmt::format("the data's token ids go up to {} but the model's vocabulary is {}",
                                               stream->vocab_size() - 1, o.model.vocab_size));
  DISTCA_RETURN_IF_ERROR(CheckMemory(comm, o, (stream->max_tokens_per_batch() + data_ranks - 1) / data_ranks));

  std::unique_ptr<Transformer> model;
  DISTCA_RETURN_IF_ERROR(Transformer::Create(o.model, &model));
  model->InitWeights(o.seed);
  AdamW optimizer(*model, o.adamw);

  int64_t step = 0;
  if (!o.load_dir.empty()) {
    TrainState state;
    DISTCA_RETURN_IF_ERROR(LoadCheckpoint(o.load_dir, model.get(), &optimizer, &state));
    if (state.seed != o.seed)
      return Status::InvalidArgument(
          fmt::format("{} was trained with --seed {}, this run has --seed {}", o.load_dir, state.seed, o.seed));
    // Resuming continues the checkpoint's learning-rate schedule; another
    // one would silently change what the resumed steps train on.
    if (state.schedule != ScheduleOf(o))
      return Status::InvalidArgument(fmt::format(
          "{} was trained on the learning-rate schedule {}; this run's is {}. Give the same --lr, --min-lr, "
          "--warmup-steps and --lr-decay-steps to continue it (--lr-decay-steps defaults to --steps: set it "
          "to the final step in every run)",
          o.load_dir, DescribeSchedule(state.schedule), DescribeSchedule(ScheduleOf(o))));
    DISTCA_RETURN_IF_ERROR(stream->Seek(state.data));
    step = state.step;
    if (step >= o.steps)
      return Status::InvalidArgument(
          fmt::format("{} is at step {}; --steps {} leaves nothing to train", o.load_dir, step, o.steps));
  }
  // Given batches that the run will reach (step i uses batch i mod their
  // count) are checked now, not at the step that reaches one, after steps
  // trained and maybe saved; other sources step by step.
  const int64_t given = static_cast<int64_t>(data.batches.size());
  for (int64_t i = step; given > 0 && i < std::min(o.steps, step + given); ++i) {
    const size_t b = static_cast<size_t>(i % given);
    DISTCA_RETURN_IF_ERROR(
        CheckBatch(data.batches[b], o, data_ranks)
            .WithContext(
                fmt::format("{}: batches[{}]", o.data.docs_file.empty() ? "given batches" : o.data.docs_file, b)));
  }
  DISTCA_RETURN_IF_ERROR(CheckRanksStartAlike(comm, step, o.steps, stream->position(), *model));
  DISTCA_RETURN_IF_ERROR(CheckRanksPlanAlike(comm, o));

  PingPongOptions exec_options;
  exec_options.layers = o.model.num_layers;
  exec_options.ping_pong = o.ping_pong;
  exec_options.tracer = o.tracer;
  exec_options.dispatch.q_heads = o.model.q_heads;
  exec_options.dispatch.kv_heads = o.model.kv_heads;
  exec_options.dispatch.head_dim = o.model.head_dim();
  exec_options.dispatch.backward = o.backward;
  exec_options.dispatch.exec.num_threads = o.threads;
  ModelPass pass(model.get(), o.threads);
  const int64_t decay_steps = DecaySteps(o);

  while (step < o.steps) {
    ResetPeakRss();
    WallTimer step_timer;
    const double cpu_start = ThreadCpuSeconds();
    Batch batch;
    DISTCA_RETURN_IF_ERROR(stream->Next(&batch).WithContext(fmt::format("step {}", step + 1)));
    DISTCA_RETURN_IF_ERROR(CheckRanksReadAlike(comm, batch).WithContext(fmt::format("step {}", step + 1)));
    const std::vector<int64_t> lengths = batch.lengths();
    const int64_t tokens = batch.tokens();
    DISTCA_RETURN_IF_ERROR(CheckBatch(lengths, o, data_ranks).WithContext(fmt::format("step {}", step + 1)));
    int64_t targets = 0;
    for (int64_t len : lengths) targets += len - 1;

    StepPlans sp;
    DISTCA_RETURN_IF_ERROR(BuildStepPlans(lengths, o, data_ranks, &sp).WithContext(fmt::format("step {}", step + 1)));
    std::unique_ptr<PingPongExecutor> executor;
    DISTCA_RETURN_IF_ERROR(PingPongExecutor::Create(&comm, sp.plans, exec_options, &executor));
    std::vector<TokenRows> nanos;
    int64_t my_tokens = 0;
    for (size_t n = 0; n < sp.plans.size(); ++n) {
      nanos.push_back(RowsOf(batch, sp.plans[n], sp.nano_docs[n], rank));
      my_tokens += nanos.back().size();
    }

    model->ZeroGrads();
    double loss_sum = 0;
    int64_t my_targets = 0;
    DISTCA_RETURN_IF_ERROR(pass.Begin(std::move(nanos), 1.0 / double(targets)));
    DISTCA_RETURN_IF_ERROR(executor->Forward(pass).WithContext(fmt::format("step {}: forward", step + 1)));
    DISTCA_RETURN_IF_ERROR(pass.Loss(&loss_sum, &my_targets));
    DISTCA_RETURN_IF_ERROR(executor->Backward(pass).WithContext(fmt::format("step {}: backward", step + 1)));
    DISTCA_RETURN_IF_ERROR(pass.End());
    const double busy = ThreadCpuSeconds() - cpu_start;

    // Waiting for the slowest rank, then the gradient all-reduce.
    WallTimer wait_timer;
    {
      Tracer::Scope span(o.tracer, rank, "compute", "wait for slowest rank");
      DISTCA_RETURN_IF_ERROR(
          comm.Barrier().WithContext(fmt::format("step {}: barrier before the all-reduce", step + 1)));
    }
    const double barrier_s = wait_timer.Seconds();
    WallTimer allreduce_timer;
    {
      Tracer::Scope span(o.tracer, rank, "compute", "all-reduce gradients", model->size() * int64_t{sizeof(float)});
      DISTCA_RETURN_IF_ERROR(comm.AllreduceSum(model->grads(), model->size())
                                 .WithContext(fmt::format("step {}: all-reduce of the gradients", step + 1)));
      DISTCA_RETURN_IF_ERROR(
          AllreduceDouble(comm, &loss_sum).WithContext(fmt::format("step {}: all-reduce of the loss", step + 1)));
    }
    const double allreduce_s = allreduce_timer.Seconds();
    const double grad_norm = ClipGradNorm(model->grads(), model->size(), o.grad_clip);
    // Both are all-reduced, so every rank stops here alike, before a
    // non-finite update could reach the weights, the moments or a
    // checkpoint.
    if (!std::isfinite(loss_sum) || !std::isfinite(grad_norm))
      return Status::FailedPrecondition(fmt::format("step {}: the {} is not finite (lower --lr?)", step + 1,
                                                    std::isfinite(loss_sum) ? "gradient norm" : "loss"));
    const float lr = CosineLearningRate(step, o.warmup_steps, decay_steps, o.lr, o.min_lr);
    optimizer.Step(model.get(), lr);
    ++step;

    const ExecutorTimes& et = executor->times();
    int64_t sent = 0;
    for (int n = 0; n < executor->nano_batches(); ++n) sent += executor->dispatcher(n).traffic().sent;
    const RankReport mine{double(my_tokens),
                          et.attention_seconds,
                          pass.times().linear_seconds,
                          et.transfer_seconds + allreduce_s,
                          et.exposed_comm_seconds + barrier_s,
                          busy,
                          double(PeakRssBytes()),
                          step_timer.Seconds(),
                          double(sent)};
    std::vector<RankReport> reports;
    DISTCA_RETURN_IF_ERROR(
        GatherToRoot(comm, mine, &reports).WithContext(fmt::format("step {}: gathering the ranks' reports", step)));

    if (!o.save_dir.empty() && rank == 0 && ((o.save_every > 0 && step % o.save_every == 0) || step == o.steps)) {
      const TrainState state{step, stream->position(), o.seed, ScheduleOf(o)};
      DISTCA_RETURN_IF_ERROR(SaveCheckpoint(o.save_dir, *model, optimizer, state));
    }
    // No rank runs ahead of a failed save; the others wait for rank 0's
    // save however long it takes (a failure still ends the wait).
    if (!o.save_dir.empty())
      DISTCA_RETURN_IF_ERROR(
          comm.BarrierAfterLongWork().WithContext(fmt::format("step {}: barrier after the checkpoint", step)));

    if (rank == 0 && on_step) {
      StepMetrics m;
      m.step = step;
      m.loss = loss_sum / double(targets);
      m.lr = lr;
      m.grad_norm = grad_norm;
      m.documents = static_cast<int64_t>(lengths.size());
      m.tokens = tokens;
      m.load_max_over_mean = LoadMaxOverMean(sp.plans);
      for (size_t r = 0; r < reports.size(); ++r) {
        const RankReport& x = reports[r];
        m.step_s = std::max(m.step_s, x.step_s);
        m.comm_bytes += int64_t(x.sent_bytes);
        m.ranks.push_back(
            {int(r), int64_t(x.tokens), x.attn_s, x.linear_s, x.comm_s, x.wait_s, x.busy_s, int64_t(x.peak_rss_bytes)});
      }
      m.tokens_per_s = m.step_s > 0 ? double(tokens) / m.step_s : 0.0;
      on_step(m);
    }
  }
  return Status::Ok();
}

}  // namespace distca
