// Simulate: validation, the strategy table, the memory-bounded CP sweep and
// CAD's c_min, OpenMP over batches, and the aggregation of per-batch outcomes
// into SimResults.
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <new>
#include <numeric>
#include <optional>

#include "common/cpu_features.h"
#include "common/enum_names.h"
#include "sim/strategy.h"

namespace distca {
namespace {

using StrategyFn = Status (*)(const sim::SimContext&, const std::vector<int64_t>&, int, sim::BatchOutcome*,
                              sim::BatchCarry*);

// How a strategy's CP degree (the `cp` its function gets) is chosen.
enum class CpChoice {
  kSweep,   // context-parallel baselines: the fastest degree whose memory fits
  kMinFit,  // CAD: c_min, the smallest degree whose L / c tokens per rank fit
  kOne,     // colocated: 1
};

struct StrategyEntry {
  SimStrategy id;
  const char* name;
  CpChoice cp;
  StrategyFn run;
  // DistCA's buffer (CadVariant::artifact_buffer): with a comm budget its
  // batches run in order, each starting from the buffer the one before left
  // (BatchCarry), and its memory counts the buffer
  // kDistcaArtifactBufferCopies times; otherwise batches run in parallel.
  bool distca_buffer;
};

constexpr StrategyEntry kStrategies[] = {
    {SimStrategy::kWlbIdeal, "wlb-ideal", CpChoice::kSweep, sim::SimulateWlbIdeal, false},
    {SimStrategy::kMegatron, "megatron", CpChoice::kSweep, sim::SimulateMegatron, false},
    {SimStrategy::kDistcaPaper, "distca-paper", CpChoice::kMinFit, sim::SimulateDistcaPaper, true},
    {SimStrategy::kDistca, "distca", CpChoice::kMinFit, sim::SimulateDistca, false},
    {SimStrategy::kColocated, "colocated", CpChoice::kOne, sim::SimulateColocated, false},
};

const StrategyEntry& Entry(SimStrategy s) {
  for (const StrategyEntry& e : kStrategies)
    if (e.id == s) return e;
  return kStrategies[0];
}

Status ValidateBatches(const SimOptions& o, const std::vector<std::vector<int64_t>>& batches) {
  if (batches.empty()) return Status::InvalidArgument("no batches to simulate");
  const int64_t want = int64_t{o.batch_size} * o.max_doc_len;
  for (size_t b = 0; b < batches.size(); ++b) {
    if (int64_t(batches[b].size()) > kMaxSimBatchDocuments)
      return Status::OutOfRange(fmt::format("batch {} holds {} documents, above the simulator's limit of {} per batch",
                                            b, batches[b].size(), kMaxSimBatchDocuments));
    int64_t total = 0;
    for (size_t i = 0; i < batches[b].size(); ++i) {
      const int64_t len = batches[b][i];
      if (len <= 0 || len > want)
        return Status::InvalidArgument(fmt::format(
            "batch {} document {} has length {}, outside [1, batch_size x max_doc_len = {}]", b, i, len, want));
      total += len;
    }
    if (total != want)
      return Status::InvalidArgument(
          fmt::format("batch {} holds {} tokens, not batch_size x max_doc_len = {}", b, total, want));
  }
  return Status::Ok();
}

// Aggregates the outcomes of every batch.
SimResult Summarize(const SimOptions& o, SimStrategy id, int cp, const std::vector<sim::BatchOutcome>& outcomes) {
  SimResult r;
  r.strategy = id;
  r.cp = cp;
  const double n = double(outcomes.size());
  double memory_sum = 0, memory_count = 0, tolerance_sum = 0, load_ratio_sum = 0;
  int plans = 0;
  for (const sim::BatchOutcome& b : outcomes) {
    r.iteration_per_batch.push_back(b.iteration_s);
    r.iteration_s += b.iteration_s / n;
    double idle = 0;
    // A rank busy a few ulps longer than the iteration (rounding; more is an
    // error, checked per batch) idles 0.
    for (double busy : b.busy_s)
      idle += b.iteration_s > 0 ? std::max(0.0, (b.iteration_s - busy) / b.iteration_s) : 0.0;
    r.idle_per_batch.push_back(idle / double(std::max<size_t>(1, b.busy_s.size())));
    r.idle_fraction += r.idle_per_batch.back() / n;
    if (b.iteration_s > 0 && !b.busy_s.empty())
      r.bubble_work_fraction += b.bubble_work_s / double(b.busy_s.size()) / b.iteration_s / n;
    for (double mem : b.memory_bytes) {
      r.memory_max_bytes = std::max(r.memory_max_bytes, mem);
      memory_sum += mem;
      ++memory_count;
    }
    r.bytes_moved += b.bytes_moved / n;
    r.max_buffer_bytes = std::max(r.max_buffer_bytes, b.max_buffer_bytes);
    tolerance_sum += b.tolerance_sum;
    load_ratio_sum += b.load_ratio_sum;
    plans += b.plans;
    SimBreakdown& s = r.breakdown;
    s.forward_linear_s += b.breakdown.forward_linear_s / n;
    s.backward_linear_s += b.breakdown.backward_linear_s / n;
    s.forward_attention_s += b.breakdown.forward_attention_s / n;
    s.backward_attention_s += b.breakdown.backward_attention_s / n;
    s.forward_comm_s += b.breakdown.forward_comm_s / n;
    s.backward_comm_s += b.breakdown.backward_comm_s / n;
  }
  r.memory_mean_bytes = memory_count > 0 ? memory_sum / memory_count : 0.0;
  r.memory_fits = r.memory_max_bytes <= o.hardware.memory_bytes;
  r.tolerance_used = plans > 0 ? tolerance_sum / plans : 0.0;
  r.load_max_over_mean = plans > 0 ? load_ratio_sum / plans : 0.0;
  r.tokens_per_s = r.iteration_s > 0 ? double(o.batch_size) * double(o.max_doc_len) / r.iteration_s : 0.0;
  return r;
}

}  // namespace

namespace sim {

SimContext::SimContext(const SimOptions& o) : options(o), costs(o.model, o.hardware, o.tp, o.recompute_mlp) {
  stage_ranks = o.gpus / (o.tp * o.pp);
  stage_layers = o.model.num_layers / o.pp;
  // Replicated K/V heads (RankKvHeads) add their projections' weights.
  stage_params =
      (double(ParameterCount(o.model)) + 2.0 * o.model.num_layers * double(o.model.hidden) * o.model.head_dim() *
                                             (RankKvHeads(o.model, o.tp) - o.model.kv_heads)) /
      o.pp;
  optimizer_shards = o.distributed_optimizer ? stage_ranks : 1;
  for (int s = 0; s < o.pp; ++s)
    stage_inter_node |= SpansNodes(int64_t{s} * stage_ranks * o.tp, int64_t{stage_ranks} * o.tp);
  // Device d sends to device d + G tp of the next stage. Some such pair
  // straddles a node boundary exactly when the pipeline spans more than one
  // node, even where stages are smaller than a node and some boundaries
  // stay inside one, and a tick waits for its slowest message: exact for a
  // tick in which every boundary sends. A fill or drain tick whose active
  // boundaries all lie inside a node (stages smaller than a node only; never
  // in the grids) is charged the inter-node link too.
  pipeline_inter_node = o.pp > 1 && o.gpus > o.hardware.gpus_per_node;
  cp_inter_node_.assign(stage_ranks + 1, 0);
  for (int c = 1; c <= stage_ranks; ++c) {
    if (stage_ranks % c != 0) continue;
    for (int64_t g = 0; g < int64_t{o.pp} * (stage_ranks / c) && !cp_inter_node_[c]; ++g)
      cp_inter_node_[c] = SpansNodes(g * c * o.tp, int64_t{c} * o.tp);
  }
}

bool SimContext::SpansNodes(int64_t first, int64_t count) const {
  const int64_t node = options.hardware.gpus_per_node;
  return count > 0 && first / node != (first + count - 1) / node;
}

int SimContext::MicroBatchesPerReplica(int c) const {
  if (c <= 0 || stage_ranks % c != 0) return 0;
  if (options.micro_batches > 0) return options.micro_batches;
  const int replicas = stage_ranks / c;
  return options.batch_size % replicas == 0 ? options.batch_size / replicas : 0;
}

double SimContext::GradSyncSeconds() const {
  if (!options.grad_sync) return 0.0;
  // Gradients in fp32 (or the training precision, if wider); the
  // distributed optimizer then gathers the updated weights in the training
  // precision, and without it the reduce-scatter and all-gather form an
  // all-reduce of the gradients.
  const double grad = std::max(4.0, double(options.hardware.dtype_bytes));
  const double gathered = options.distributed_optimizer ? options.hardware.dtype_bytes : grad;
  return costs.Ring(stage_ranks, stage_params * grad, stage_inter_node) +
         costs.Ring(stage_ranks, stage_params * gathered, stage_inter_node);
}

Status AddGradSync(const SimContext& ctx, BatchOutcome* out) {
  // Ranks are numbered stage by stage, a stage's G ranks before its servers.
  const size_t ranks = out->busy_s.size(), stages = size_t(ctx.options.pp);
  const size_t stride = ranks / stages;
  if (ranks % stages != 0 || stride < size_t(ctx.stage_ranks))
    return Status::Internal(
        fmt::format("{} ranks' busy times are not {} stages of at least {} ranks", ranks, stages, ctx.stage_ranks));
  const double sync = ctx.GradSyncSeconds();
  out->iteration_s += sync;
  for (size_t r = 0; r < ranks; ++r)
    if (r % stride < size_t(ctx.stage_ranks)) out->busy_s[r] += sync;
  return Status::Ok();
}

double SimContext::CadRankTokens(int c) const {
  if (options.micro_batches > 0)
    return double(options.batch_size) * double(options.max_doc_len) / (double(options.micro_batches) * stage_ranks);
  return double(options.max_doc_len) / c;
}

}  // namespace sim

const char* SimStrategyName(SimStrategy strategy) { return Entry(strategy).name; }

bool IsCadStrategy(SimStrategy strategy) {
  return strategy == SimStrategy::kDistca || strategy == SimStrategy::kDistcaPaper;
}

bool RunsAsWaves(SimStrategy strategy) { return Entry(strategy).cp != CpChoice::kSweep; }

namespace {

// The options the strategies that run as waves see: their own count
// (cad_micro_batches) as micro_batches. REQUIRES: cad_micro_batches > 0.
SimOptions WaveOptions(const SimOptions& o) {
  SimOptions w = o;
  w.micro_batches = o.cad_micro_batches;
  w.cad_micro_batches = 0;
  return w;
}

}  // namespace

std::optional<PlanWire> StrategyWire(SimStrategy strategy, const SimOptions& options) {
  switch (strategy) {
    case SimStrategy::kDistcaPaper:
      return options.cad_wire.value_or(PlanWire::kDistcaArtifact);
    case SimStrategy::kDistca:
      return options.cad_wire.value_or(PlanWire::kDistca);
    case SimStrategy::kColocated:
      return PlanWire::kDistca;  // distca-train --attention colocated's, whatever --wire says
    case SimStrategy::kWlbIdeal:
    case SimStrategy::kMegatron:
      break;
  }
  return std::nullopt;
}

namespace {
constexpr std::pair<WlbScope, const char*> kWlbScopes[] = {
    {WlbScope::kPerMicroBatch, "per-micro-batch"},
    {WlbScope::kWholeBatch, "whole-batch"},
    {WlbScope::kWholeBatchArtifactCap, "whole-batch-artifact-cap"},
};
}  // namespace

const char* WlbScopeName(WlbScope scope) { return EnumName(kWlbScopes, scope); }

Status ParseWlbScope(std::string_view name, WlbScope* scope) {
  return ParseEnumName(kWlbScopes, name, "wlb-ideal balancing scope", scope);
}

Status ParseSimStrategies(std::string_view list, std::vector<SimStrategy>* strategies) {
  strategies->clear();
  size_t begin = 0;
  while (begin <= list.size()) {
    size_t end = list.find(',', begin);
    if (end == std::string_view::npos) end = list.size();
    const std::string_view name = list.substr(begin, end - begin);
    const StrategyEntry* found = nullptr;
    for (const StrategyEntry& e : kStrategies)
      if (name == e.name) found = &e;
    if (found == nullptr)
      return Status::InvalidArgument(
          fmt::format("unknown strategy '{}' (expected wlb-ideal, megatron, distca-paper, distca or colocated)", name));
    if (std::find(strategies->begin(), strategies->end(), found->id) != strategies->end())
      return Status::InvalidArgument(fmt::format("strategy '{}' is listed twice", name));
    strategies->push_back(found->id);
    begin = end + 1;
  }
  return Status::Ok();
}

Status ValidateSimOptions(const SimOptions& o) {
  DISTCA_RETURN_IF_ERROR(ValidateModelConfig(o.model).WithContext("model"));
  const HardwareProfile& h = o.hardware;
  if (!(h.peak_flops > 0) || !(h.linear_mfu > 0) || h.dtype_bytes <= 0 || h.gpus_per_node <= 0 ||
      !(h.intra_node.bandwidth > 0) || !(h.inter_node.bandwidth > 0) || h.attention_efficiency.empty() ||
      !(h.attention_backward_factor >= 1))
    return Status::InvalidArgument("hardware profile is incomplete (load one with LoadHardwareProfile)");
  for (const AttentionTable& t : h.attention_tables)
    DISTCA_RETURN_IF_ERROR(ValidateAttentionTable(t, h.peak_flops).WithContext("hardware profile"));
  if (o.gpus <= 0 || o.tp <= 0 || o.pp <= 0)
    return Status::InvalidArgument(fmt::format("gpus ({}), tp ({}) and pp ({}) must be positive", o.gpus, o.tp, o.pp));
  if (o.plan_by_flops && o.plan_by_table)
    return Status::InvalidArgument("distca plans by FLOPs or by the table, not both alone: set one of the two");
  // DistCA's pipeline schedule plans the backward anew and resends Q/K/V.
  if (o.cad_wire == PlanWire::kDistcaArtifactNoResend && o.pp > 1)
    return Status::InvalidArgument(
        fmt::format("wire {} keeps Q/K/V on the servers, which DistCA does without pipeline stages only (pp {})",
                    PlanWireName(*o.cad_wire), o.pp));
  // Tensor parallelism splits the query heads; K/V heads are split too, or
  // replicated when there are fewer of them than tp (as Megatron-LM allows).
  if (o.model.q_heads % o.tp != 0 ||
      (o.model.kv_heads % o.tp != 0 && (o.model.kv_heads > o.tp || o.tp % o.model.kv_heads != 0)))
    return Status::InvalidArgument(
        fmt::format("tp ({}) must divide the {} query heads and divide, or be a multiple of, the {} K/V heads", o.tp,
                    o.model.q_heads, o.model.kv_heads));
  // ... and the MLP's columns (Megatron-LM's column-parallel first GEMM).
  if (o.model.ffn_hidden % o.tp != 0)
    return Status::InvalidArgument(
        fmt::format("tp ({}) must divide the MLP's {} columns (ffn_hidden_size)", o.tp, o.model.ffn_hidden));
  // tp x pp in 64 bits: two large factors would overflow an int (and a
  // product wrapping to 0 would divide by zero below).
  const int64_t tp_pp = int64_t{o.tp} * o.pp;
  if (tp_pp > o.gpus || o.gpus % tp_pp != 0)
    return Status::InvalidArgument(
        fmt::format("gpus ({}) is not a multiple of tp x pp ({} x {} = {})", o.gpus, o.tp, o.pp, tp_pp));
  if (o.model.num_layers % o.pp != 0)
    return Status::InvalidArgument(
        fmt::format("the model's {} layers do not split into pp = {} equal stages", o.model.num_layers, o.pp));
  if (o.gpus > kMaxSimGpus)
    return Status::OutOfRange(fmt::format("gpus ({}) is above the simulator's limit of {}", o.gpus, kMaxSimGpus));
  const int G = o.gpus / (o.tp * o.pp);
  if (o.max_doc_len <= 0) return Status::InvalidArgument("max_doc_len must be positive");
  if (o.batch_size <= 0)
    return Status::InvalidArgument(fmt::format("batch size must be positive, got {} chunks", o.batch_size));
  if (o.max_doc_len > kMaxSimIterationTokens || int64_t{o.batch_size} * o.max_doc_len > kMaxSimIterationTokens)
    return Status::OutOfRange(
        fmt::format("batch size x max_doc_len = {} x {} tokens per iteration is above the simulator's limit of {}",
                    o.batch_size, o.max_doc_len, kMaxSimIterationTokens));
  if (o.cp < 0 || (o.cp > 0 && G % o.cp != 0))
    return Status::InvalidArgument(fmt::format("cp ({}) must divide the {} ranks per stage", o.cp, G));
  if (o.micro_batches < 0) return Status::InvalidArgument("micro-batches must be >= 0");
  if (o.cad_micro_batches < 0) return Status::InvalidArgument("CAD micro-batches must be >= 0");
  if (o.cad_micro_batches > 0) {
    if (o.micro_batches == 0)
      return Status::InvalidArgument("CAD micro-batches apply with micro-batches set (the baselines' count)");
    // The waves must hold as the baselines' micro-batches must.
    DISTCA_RETURN_IF_ERROR(ValidateSimOptions(WaveOptions(o)).WithContext("CAD micro-batches"));
  }
  // Micro-batches in all: given, a replica of one rank (cp 1) runs m of
  // them, G such replicas m G; else one per chunk, B, whatever the replicas.
  const int64_t in_all = o.micro_batches > 0 ? int64_t{o.micro_batches} * G : int64_t{o.batch_size};
  if (o.micro_batches > 0 && in_all > kMaxSimMicroBatches)
    return Status::OutOfRange(
        fmt::format("{} micro-batches per replica over {} rank{} per stage (up to {} in all, at CP 1) is above the "
                    "simulator's limit of {} micro-batches",
                    o.micro_batches, G, G == 1 ? "" : "s", in_all, kMaxSimMicroBatches));
  if (o.micro_batches == 0 && in_all > kMaxSimMicroBatches)
    return Status::OutOfRange(
        fmt::format("batch size {} chunks, one micro-batch each, is above the simulator's limit of {} micro-batches: "
                    "give --micro-batches",
                    o.batch_size, kMaxSimMicroBatches));
  // The pipeline schedules keep every micro-batch's times on every stage:
  // micro-batches in all x pp (pp 512 with a million chunk micro-batches
  // ran past 8 GB).
  if (o.pp > 1 && in_all * o.pp > kMaxSimMicroBatches)
    return Status::OutOfRange(
        fmt::format("{} micro-batches in all over pp = {} stages ({} pipeline slots) is above the simulator's limit "
                    "of {}",
                    in_all, o.pp, in_all * o.pp, kMaxSimMicroBatches));
  if (o.micro_batches > 0 && int64_t{o.batch_size} * o.max_doc_len < in_all)
    return Status::InvalidArgument(
        fmt::format("{} micro-batches over {} ranks per stage leave less than one token per rank of the batch's {} "
                    "(batch size {} x max_doc_len {})",
                    o.micro_batches, G, int64_t{o.batch_size} * o.max_doc_len, o.batch_size, o.max_doc_len));
  if (o.micro_batches == 0 && o.cp > 0 && o.batch_size % (G / o.cp) != 0)
    return Status::InvalidArgument(
        fmt::format("batch size ({} chunks) is not a multiple of the {} data-parallel replicas at cp {} (G / cp = {} / "
                    "{}): every replica runs the same number of micro-batches",
                    o.batch_size, G / o.cp, o.cp, G, o.cp));
  if (o.dedicated_servers < 0) return Status::InvalidArgument("dedicated servers must be >= 0");
  // Dedicated servers are GPUs too (tp each, on every stage).
  if (const int64_t server_gpus = int64_t{o.dedicated_servers} * o.tp * o.pp; o.gpus + server_gpus > kMaxSimGpus)
    return Status::OutOfRange(
        fmt::format("gpus ({}) plus {} dedicated servers per stage ({} GPUs at tp {}, pp {}) make {} GPUs, above the "
                    "simulator's limit of {}",
                    o.gpus, o.dedicated_servers, server_gpus, o.tp, o.pp, o.gpus + server_gpus, kMaxSimGpus));
  if (!(o.tolerance >= 0) || !(o.tolerance <= kMaxSimTolerance))
    return Status::InvalidArgument(
        fmt::format("tolerance must be a number in [0, {:g}], got {}", kMaxSimTolerance, o.tolerance));
  if (o.comm_budget < 0) return Status::InvalidArgument("comm budget must be >= 0");
  // The buffer is counted in a device's memory: at most the largest memory
  // a profile may give a device (0 means no fixed buffer).
  if (o.comm_budget > kMaxDeviceMemoryBytes)
    return Status::OutOfRange(fmt::format(
        "comm budget {} bytes per device is above the limit of {} (a profile's largest device memory; 0 means no "
        "fixed buffer)",
        o.comm_budget, kMaxDeviceMemoryBytes));
  if (o.wlb_breakpoint < 0 || o.wlb_breakpoint > kMaxSimIterationTokens)
    return Status::InvalidArgument(
        fmt::format("wlb-ideal's breakpoint must be in [0, {}] tokens (0: from the model's "
                    "FLOPs), got {}",
                    kMaxSimIterationTokens, o.wlb_breakpoint));
  if (o.threads < 0) return Status::InvalidArgument(fmt::format("threads must not be negative, got {}", o.threads));
  if (o.threads > kMaxThreads)
    return Status::InvalidArgument(fmt::format("threads must be at most {}, got {}", kMaxThreads, o.threads));
  return Status::Ok();
}

Status Simulate(const SimOptions& options, const std::vector<std::vector<int64_t>>& batches,
                const std::vector<SimStrategy>& strategies, std::vector<SimResult>* results) {
  if (results == nullptr) return Status::InvalidArgument("results is null");
  DISTCA_RETURN_IF_ERROR(ValidateSimOptions(options));
  DISTCA_RETURN_IF_ERROR(ValidateBatches(options, batches));
  const sim::SimContext ctx(options);
  // The strategies that run as waves, with their own count if given.
  std::optional<sim::SimContext> own_waves;
  if (options.cad_micro_batches > 0) own_waves.emplace(WaveOptions(options));
  const sim::SimContext& wave_ctx = own_waves ? *own_waves : ctx;
  const int n = static_cast<int>(batches.size());
  // No more threads than batches, nor than the flag allows: the default
  // (OMP_NUM_THREADS) is the environment's, unchecked.
  const int threads = std::clamp(options.threads > 0 ? options.threads : omp_get_max_threads(), 1,
                                 std::max(1, std::min(n, kMaxThreads)));

  // Powers of two dividing G that split the batch into whole micro-batches
  // per replica (or whole waves), smallest first.
  std::vector<int> degrees;
  for (int c = 1; c <= ctx.stage_ranks; c *= 2)
    if (ctx.MicroBatchesPerReplica(c) > 0) degrees.push_back(c);

  std::vector<SimResult> out;
  for (SimStrategy id : strategies) {
    const StrategyEntry& e = Entry(id);
    const sim::SimContext& sc = RunsAsWaves(id) ? wave_ctx : ctx;
    const SimOptions& so = sc.options;
    std::vector<int> cps;
    switch (e.cp) {
      case CpChoice::kSweep:
        cps = so.cp > 0 ? std::vector<int>{so.cp} : degrees;
        if (cps.empty())
          return Status::InvalidArgument(
              fmt::format("{}: no CP degree c (a power of two dividing the {} ranks per stage) makes the batch size "
                          "({} chunks) a multiple of the G / c data-parallel replicas",
                          e.name, sc.stage_ranks, so.batch_size));
        break;
      case CpChoice::kMinFit: {
        if (so.micro_batches > 0) {  // ranks hold B L / (m G) tokens whatever c
          cps = {1};
          break;
        }
        if (degrees.empty())
          return Status::InvalidArgument(
              fmt::format("{}: no c (a power of two dividing the {} ranks per stage) makes the batch size ({} chunks) "
                          "a multiple of the G / c chunks of a wave",
                          e.name, sc.stage_ranks, so.batch_size));
        // From the smallest degree whose nominal L / c tokens per rank fit
        // up; the simulated memory (whole documents per wave make some waves
        // a little larger, and distca's buffers are known once planned)
        // decides, below. Only DistCA's buffer is allocated up front.
        size_t first = degrees.size() - 1;
        for (size_t i = 0; i < degrees.size(); ++i) {
          const int copies = e.distca_buffer ? sim::kDistcaArtifactBufferCopies : 0;
          if (sim::CadMemoryBytes(sc, degrees[i], copies) <= so.hardware.memory_bytes) {
            first = i;
            break;
          }
        }
        cps.assign(degrees.begin() + long(first), degrees.end());
        break;
      }
      case CpChoice::kOne:
        if (sc.MicroBatchesPerReplica(1) == 0)
          return Status::InvalidArgument(
              fmt::format("{}: the batch size ({} chunks) must be a multiple of the {} ranks per stage (CP 1: one "
                          "chunk per rank and wave)",
                          e.name, so.batch_size, sc.stage_ranks));
        cps = {1};
        break;
    }
    // Baselines: the fastest degree whose memory fits; CAD: the first degree
    // (smallest) whose memory fits with one stage, the fastest from c_min up
    // with several. If none fits, the one needing the least
    // memory (the fastest among those within 1% of it: with micro_batches
    // set, the degree barely changes the memory), flagged by memory_fits =
    // false.
    std::vector<SimResult> tried;
    // A degree at which the strategy cannot run at all (DistCA's pipeline
    // schedule finds no tolerance that fits its buffer: FailedPrecondition)
    // is skipped; the first such reason is the error when no degree runs.
    Status skipped;
    std::vector<int> skipped_degrees;
    for (int cp : cps) {
      std::vector<sim::BatchOutcome> outcomes(n);
      std::vector<Status> status(n);
      // One batch, its gradient sync included. Nothing may be thrown out of
      // the parallel loop below (it would end the process): a failed
      // allocation becomes the batch's error, in either loop.
      const auto run_batch = [&](int b, sim::BatchCarry* carry) -> Status {
        try {
          DISTCA_RETURN_IF_ERROR(e.run(sc, batches[b], cp, &outcomes[b], carry));
          return sim::AddGradSync(sc, &outcomes[b]);
        } catch (const std::bad_alloc&) {
          return Status::OutOfRange(fmt::format("cp {}: out of memory", cp));
        } catch (const std::exception& ex) {
          return Status::Internal(fmt::format("cp {}: {}", cp, ex.what()));
        }
      };
      if (e.distca_buffer && so.comm_budget > 0) {
        sim::BatchCarry carry;
        for (int b = 0; b < n; ++b) {
          status[b] = run_batch(b, &carry);
          if (!status[b].ok()) break;  // the batches after it would start from a carry it never set
        }
      } else {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
        for (int b = 0; b < n; ++b) status[b] = run_batch(b, nullptr);
      }
      const auto failed = std::find_if(status.begin(), status.end(), [](const Status& st) { return !st.ok(); });
      if (failed != status.end() && failed->code() == StatusCode::kFailedPrecondition && cps.size() > 1) {
        if (skipped.ok())
          skipped = failed->WithContext(fmt::format("{}, cp {}, batch {}", e.name, cp, failed - status.begin()));
        skipped_degrees.push_back(cp);
        continue;
      }
      for (int b = 0; b < n; ++b) {
        if (!status[b].ok()) return status[b].WithContext(fmt::format("{}, batch {}", e.name, b));
        // A rank's busy time sums the iteration's terms in another order:
        // rounding may put it a few ulps above the iteration, no more.
        const sim::BatchOutcome& done = outcomes[b];
        for (size_t r = 0; r < done.busy_s.size(); ++r)
          if (done.busy_s[r] > done.iteration_s * (1 + 1e-9))
            return Status::Internal(fmt::format("{}, batch {}: rank {} is busy {} s in a {} s iteration", e.name, b, r,
                                                done.busy_s[r], done.iteration_s));
      }
      tried.push_back(Summarize(so, id, e.cp == CpChoice::kMinFit && so.micro_batches > 0 ? 0 : cp, outcomes));
      tried.back().grad_sync_s = sc.GradSyncSeconds();
      // CAD with one stage stops at the first degree that fits (a larger c
      // only cuts the same work into more, smaller waves); with pipeline
      // stages it tries the larger ones too (more waves, shorter bubbles)
      // until one is slower than the degree before it that fit: the bubbles
      // shrink as 1 / waves while the per-wave costs grow.
      if (e.cp == CpChoice::kMinFit && tried.back().memory_fits) {
        if (so.pp == 1) break;
        const size_t k = tried.size();
        if (k >= 2 && tried[k - 2].memory_fits && tried[k - 1].iteration_s > tried[k - 2].iteration_s) break;
      }
    }
    if (tried.empty())
      return skipped_degrees.size() > 1
                 ? Status(skipped.code(), fmt::format("no degree runs (cp {} tried); the first: {}",
                                                      fmt::join(skipped_degrees, ", "), skipped.message()))
                 : skipped;
    auto faster = [](const SimResult& a, const SimResult& b) { return a.iteration_s < b.iteration_s; };
    std::vector<SimResult> pool;
    for (const SimResult& r : tried)
      if (r.memory_fits) pool.push_back(r);
    if (pool.empty()) {
      const double least = std::min_element(tried.begin(), tried.end(), [](const SimResult& a, const SimResult& b) {
                             return a.memory_max_bytes < b.memory_max_bytes;
                           })->memory_max_bytes;
      for (const SimResult& r : tried)
        if (r.memory_max_bytes <= 1.01 * least) pool.push_back(r);
    }
    // The fastest of the degrees tried that fit.
    SimResult best = *std::min_element(pool.begin(), pool.end(), faster);
    if (!std::isfinite(best.iteration_s) || !(best.iteration_s > 0))
      return Status::InvalidArgument(fmt::format(
          "{}: the simulated iteration time is {} (check the hardware profile's figures)", e.name, best.iteration_s));
    out.push_back(std::move(best));
  }
  for (const SimResult& r : out) {
    if (r.strategy != SimStrategy::kWlbIdeal) continue;
    for (SimResult& x : out) x.speedup = x.iteration_s > 0 ? r.iteration_s / x.iteration_s : 0.0;
  }
  *results = std::move(out);
  return Status::Ok();
}

}  // namespace distca
