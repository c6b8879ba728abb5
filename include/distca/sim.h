// The cluster-scale simulator (docs/simulator.md): predicts iteration time,
// balance, memory and traffic of one training configuration for several
// strategies, costing the project's real planner output (distca/plan.h) with
// a hardware profile. Pure computation: nothing here runs a kernel or moves a
// byte; everything is deterministic for given batches.
//
// Vocabulary (as in the planner): a "rank" is one tensor-parallel group of
// `tp` devices; a pipeline stage has G = gpus / (tp * pp) ranks; a "chunk" is
// max_doc_len (L) tokens, and an iteration processes batch_size (B) chunks.
// A micro-batch is one chunk: with context-parallel degree c it is spread over
// the c ranks of a CP group (L / c tokens each) and each of the d = G / c
// data-parallel replicas runs B / d of them. CAD holds L / c tokens per rank
// and runs waves of G / c chunks over all G ranks: c = c_min, the smallest
// power of two whose tokens fit in memory, with one pipeline stage; the
// fastest from c_min up with several (more waves, shorter bubbles).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "distca/model.h"
#include "distca/plan.h"
#include "distca/status.h"

namespace distca {

// A measured core-attention cost table for one head shape (optional in a
// profile): seconds per task, forward + backward, one device running
// q_heads x kv_heads heads, as `distca-bench attention --table-out` (CPU) or
// bench/gpu/h200_attention_table.py (GPU) writes it (CSV q_len,kv_len,seconds).
// Optionally a second table of the same grid holds the forward seconds
// alone, measured in the same run; the backward pass then costs the
// difference, and the profile's attention_backward_factor does not apply.
struct AttentionTable {
  std::string file;  // as written in the profile; relative to the profile's directory
  // The heads one device ran (a tensor-parallel rank's share of the model's).
  int q_heads = 0, kv_heads = 0, head_dim = 0;
  // Multiplies the table's seconds: what the same kernel costs inside a
  // training step (copies, synchronization) beyond the benchmark. Default: 1
  double scale = 1.0;
  std::string csv;  // the table's text; filled by LoadHardwareProfile
  // The forward-only table (optional JSON "forward_file"; relative as
  // `file`): on file's grid, below it at every point. Empty: none.
  std::string forward_file = {};
  std::string forward_csv = {};  // its text, likewise
  // Whether it can serve a model of this head dimension: loaded and
  // measured with that dimension (the ranks' heads are then matched or
  // scaled).
  bool Serves(int model_head_dim) const { return !csv.empty() && head_dim == model_head_dim; }
};

struct LinkProfile {
  double bandwidth = 0.0;  // bytes/s per device, each direction
  double latency_s = 0.0;  // per message
};

// One device type and its network (configs/hardware/*.json, docs/simulator.md).
struct HardwareProfile {
  std::string name;
  std::string source;  // where the numbers come from (free text)
  int gpus_per_node = 0;
  double peak_flops = 0.0;  // per device, FLOP/s at dtype_bytes precision
  double linear_mfu = 0.0;  // fraction of peak the context-independent layers reach
  // Tensor parallelism's collectives costed on their own (optional JSON
  // "tp_collectives"; Default: false, linear_mfu includes them): with
  // sequence parallelism a layer's forward pass over T tokens runs two
  // all-gathers (before the QKV projection and the MLP) and two
  // reduce-scatters (after the O projection and the MLP) of the rank's
  // T x h activations over its tp devices, each a ring of (tp - 1) x latency
  // + (tp - 1) / tp x T h dtype_bytes / bandwidth on the intra-node link
  // (inter-node when tp exceeds gpus_per_node), exposed; linear_mfu then
  // covers the GEMMs and element-wise work only.
  bool tp_collectives = false;
  // (query length, fraction of peak) points of core attention, q_len increasing;
  // piecewise linear in log2(q_len), clamped at both ends.
  std::vector<std::pair<double, double>> attention_efficiency;
  // Backward / forward time of core attention (optional in the JSON), for
  // the efficiency curve and for tables without a forward_file.
  // Default: 2.5, the FLOP ratio (DESIGN.md section 3)
  double attention_backward_factor = 2.5;
  // Measured tables (optional, JSON "attention_tables"). A rank that runs
  // Hq / tp query and max(1, Hkv / tp) K/V heads of head_dim D uses, of the
  // tables measured with D, the one of exactly that shape, else the one
  // nearest in query heads per K/V head, then in query heads; its seconds
  // are scaled by the ratio of query heads. With no table of D, the
  // efficiency curve. The forward share of a task is its forward table's
  // over the table's, or, with no forward table,
  // 1 / (1 + attention_backward_factor).
  std::vector<AttentionTable> attention_tables;
  int dtype_bytes = 0;        // bytes per activation element
  double memory_bytes = 0.0;  // per device
  LinkProfile intra_node, inter_node;
  // CAD's all-to-all across nodes when it differs from the link (optional
  // network.all_to_all): an all-to-all among many nodes reaches less than a
  // ring's point-to-point bandwidth.
  std::optional<LinkProfile> all_to_all;

  // Fraction of peak core attention reaches on a task of q_len query rows.
  double AttentionEfficiency(double q_len) const;
};

// Parses and validates a profile; errors name the field. An attention table
// is only named here (its csv stays empty); LoadHardwareProfile also reads
// and checks the table file.
Status ParseHardwareProfile(std::string_view json, HardwareProfile* profile);
// `overrides` change fields of the file's profile before it is validated
// (sensitivity studies: what if the NIC ran at 25 GB/s), each "FIELD=VALUE":
// FIELD a dotted path into the JSON, array elements by index
// ("network.inter_node.bandwidth", "attention_tables.0.scale"), VALUE JSON
// text. The profile's checks hold for the result, and its name lists them.
Status LoadHardwareProfile(const std::string& path, HardwareProfile* profile,
                           const std::vector<std::string>& overrides = {});
// A loaded table: its csv (and, when it names a forward_file or has a
// forward_csv, that one too) read and valid, the forward table on the
// table's grid and below it at every point. With peak_flops > 0, also no
// faster than the device can be: no grid point's seconds (times the table's
// scale) below its task's forward FLOPs at peak_flops.
Status ValidateAttentionTable(const AttentionTable& table, double peak_flops = 0);
// The smallest scale at which that last check holds for the table: the
// largest over its grid points (and its forward table's) of the task's
// forward FLOPs at peak_flops over the point's unscaled seconds; 0 when
// peak_flops is not positive. Errors: the table does not parse.
Status MinimumTableScale(const AttentionTable& table, double peak_flops, double* scale);
// The profile as ParseHardwareProfile reads it (tables by file name; their
// csv is not written).
std::string HardwareProfileJson(const HardwareProfile& profile);

enum class SimStrategy {
  kWlbIdeal,     // variable-length packing + per-document CP, best CP by sweep
  kMegatron,     // fixed-length chunks + zig-zag CP, best CP by sweep
  kDistcaPaper,  // CAD as published: paper policy, dummy work in pipeline bubbles
  kDistca,       // CAD with this project's policy; bubbles serve attention only
  kColocated,    // distca-train --attention colocated: linear layout, each rank serves its own tokens
};

const char* SimStrategyName(SimStrategy strategy);
// "wlb-ideal,megatron,distca-paper,distca,colocated" (any subset, any order, no repeats).
Status ParseSimStrategies(std::string_view list, std::vector<SimStrategy>* strategies);

// How wlb-ideal's balancer (the DistCA artifact's WLB-LLM reimplementation)
// forms the m micro-batches of each of the d replicas.
enum class WlbScope {
  // Each micro-batch's documents over the d replicas, cap: their tokens / d
  // (the earliest, functional version of the artifact's WLB test,
  // tests/test_wlb_e2e.py; the default until 2026-12-01).
  kPerMicroBatch,
  // The whole batch over all d m micro-batches, cap: B L / (d m).
  kWholeBatch,
  // As the artifact's WLB benchmark (tests/test_wlb_e2e.py, the versions
  // that run its sweeps) calls it: the whole batch over d m micro-batches
  // with a cap m times below a micro-batch's share, so that most documents
  // are set aside and then placed by workload alone. The default.
  kWholeBatchArtifactCap,
};
const char* WlbScopeName(WlbScope scope);
// "per-micro-batch", "whole-batch" or "whole-batch-artifact-cap".
Status ParseWlbScope(std::string_view name, WlbScope* scope);

// SimOptions::search_screen_margin's default. Over the 90 shapes of the
// paper's 4D configurations searched, the 54 kept at their screen would
// have run at most 1.7% shorter in full, and the search chose as the
// exact one in all 18 configurations (docs/simulator.md, "Choosing tp
// and pp").
inline constexpr double kSearchScreenMargin = 0.05;

struct SimOptions {
  ModelConfig model;         // required (ModelPreset + overrides)
  HardwareProfile hardware;  // required
  int gpus = 0;              // N, required; a multiple of tp * pp
  // Devices per rank; divides the model's query heads, and divides its K/V
  // heads or is a multiple of them (each device then holds a replica of
  // one). Default: 8
  int tp = 8;
  int pp = 1;               // pipeline stages; num_layers must be a multiple. Default: 1
  int64_t max_doc_len = 0;  // L, tokens per chunk; required
  int batch_size = 0;       // B chunks per iteration; required (see Simulate for divisibility)
  // Baselines' CP degree (divides G; G / cp must divide B); 0 = the fastest
  // of a sweep among the degrees whose memory fits. Default: 0
  int cp = 0;
  // Micro-batches (gradient-accumulation steps) per data-parallel replica.
  // 0: a micro-batch is one chunk of L tokens (Megatron's convention: B c / G
  // per replica at CP degree c; CAD: waves of G / c_min chunks). m >= 1: the
  // DistCA artifact's convention, every strategy runs the iteration's B L
  // tokens as m micro-batches per replica, each rank holding B L / (m G)
  // tokens of one: wlb-ideal repacks the batch's documents into its d m
  // micro-batches with the artifact's balancer (wlb_scope), megatron
  // gives each replica B / d chunks in m groups, CAD runs m waves over all G
  // ranks. Default: 0
  int micro_batches = 0;
  // With micro_batches set: the waves per replica of the strategies that run
  // as waves (distca-paper, distca, colocated), where they differ from the
  // baselines' micro-batches. DistCA's pipeline runs build each micro-batch's
  // ping and pong from whole sequences, at least one L-token chunk each, so
  // they cut a batch of B chunks into at most B / 2 micro-batches; the grid
  // sets this where its count would cut finer (docs/simulator.md, "Grid").
  // Default: 0 (micro_batches)
  int cad_micro_batches = 0;
  // Selective recomputation of the MLP besides core attention (the DistCA
  // artifact's EXPERIMENT_ADD_SELECTIVE_CKPT, used at 256K and longer):
  // activations drop the MLP's 6 ffn bytes per token and layer (13 h instead
  // of 34 h for Llama-3-8B), and the backward pass reruns the MLP's forward.
  // Default: false
  bool recompute_mlp = false;
  // wlb-ideal with micro_batches set: what its balancer sees at once
  // (docs/simulator.md, "wlb-ideal"). Default: kWholeBatchArtifactCap, as
  // the DistCA artifact's WLB benchmark calls its balancer
  WlbScope wlb_scope = WlbScope::kWholeBatchArtifactCap;
  // wlb-ideal keeps for the backward pass what the DistCA artifact's
  // per-document CP keeps: besides the gathered K/V, each document's K/V
  // prefixes concatenated for its two query chunks (2c - 1/2 ranks' shares
  // of K/V a layer instead of c - 1). Memory only. Default: off (the
  // prefixes as views of the gathered K/V)
  bool wlb_artifact_kv = false;
  // wlb-ideal's balancing breakpoint b in tokens, the length at which its
  // workload (l/b)^2 + l/b counts attention as much as the linear layers.
  // 0: where a document's attention FLOPs equal its linear FLOPs (53K tokens
  // for Llama-3-8B, 84K for Llama-34B). The DistCA artifact's launchers set
  // it by hand (ATTN_LINEAR_BREAKPOINT: 64000 for 8B, 131072 for 34B).
  // Default: 0
  int64_t wlb_breakpoint = 0;
  int dedicated_servers = 0;  // distca: extra attention-only ranks per stage. Default: 0
  // CAD: two nano-batches overlapping compute and traffic; off: one plan per
  // wave, its traffic exposed (distca-train --ping-pong off). Default: on
  bool ping_pong = true;
  // The bytes per row the CAD strategies' all-to-alls carry
  // (PlanModel::wire); unset: each its own, distca-paper DistCA's
  // (kDistcaArtifact), distca this runtime's (kDistca). colocated always
  // runs this runtime's, as distca-train --attention colocated does.
  // kDistcaArtifactNoResend (pp 1 only) also counts in memory what the
  // servers keep for the backward. Default: unset
  std::optional<PlanWire> cad_wire;
  // Megatron-LM's distributed optimizer: the fp32 master weights and Adam's
  // moments (12 bytes a parameter) sharded over the stage's G ranks (DP x
  // CP); off: replicated on every rank. Default: on
  bool distributed_optimizer = true;
  // Adam's two fp32 moments are in memory. Off: the run never steps the
  // optimizer, so they are never allocated (PyTorch optimizers create them
  // on the first step), as in the DistCA artifact's benchmark runs, which
  // only zero the gradients. Memory only. Default: on
  bool optimizer_moments = true;
  // Close every iteration with the data-parallel gradient sync over the
  // stage's G ranks: with the distributed optimizer, a reduce-scatter of the
  // float32 gradients and an all-gather of the updated bf16 weights; without
  // it, an all-reduce of the gradients. Exposed, as with Megatron's default
  // (overlap_grad_reduce and overlap_param_gather off). Off: left out, as if
  // fully overlapped, or as benchmarks that time the forward and backward
  // passes only. Default: on
  bool grad_sync = true;
  // CAD: the planner's eps: distca's first (raised in steps of 0.05 while
  // the budget binds); distca-paper's lowest, from which DistCA's tolerance
  // lists are tried (with one stage their first entry at or above it).
  // Default: 0.05
  double tolerance = 0.05;
  // CAD: bytes any device may send or receive in any one of a layer's four
  // all-to-alls (a rank's budget is tp times this; distca: PlanOptions::
  // comm_budget with budget_per_exchange; distca-paper: DistCA's loop,
  // CadVariant::artifact_buffer, its buffer also holding the rows a rank
  // keeps); 0 = unlimited. distca-paper's buffer is allocated memory, four
  // times as DistCA allocates it (with 0, the largest per-layer send +
  // receive); distca's runtime sizes its buffers per pass, and memory counts
  // those, whatever the budget (docs/simulator.md, "Memory"). Default: 2 GiB (DistCA's
  // NVSHMEM buffer: EXPERIMENT_NVSHMEM_BUFFER_SIZE_GB=2, multiplied by 1024^3)
  int64_t comm_budget = int64_t{2} << 30;
  // distca plans each tick by the hardware profile's measured attention
  // table (the seconds its servers spend) and by FLOPs, and keeps the plans
  // whose tick the cost model predicts shortest (docs/simulator.md,
  // "distca-paper, distca, colocated"); without a table, by FLOPs.
  // plan_by_flops: by FLOPs alone, as distca-train does without
  // --cost-table; plan_by_table: by the table alone, as distca-train does
  // with it. distca-paper always plans by FLOPs, as published. Default: off
  bool plan_by_flops = false;
  bool plan_by_table = false;
  // distca also plans each tick by FLOPs at looser bounds than `tolerance`
  // (0.1, 0.2 and 0.4 at the default; docs/simulator.md), which move
  // fewer bytes, and keeps those plans where their tick is shorter; not
  // with plan_by_flops or plan_by_table. fixed_tolerance: at `tolerance`
  // only (the tolerance sweep). Default: off
  bool fixed_tolerance = false;
  // SearchParallelism's screen: distca plans as by default but without the
  // table (by FLOPs at eps and at the looser bounds), which is several
  // times faster and, tick by tick, at most the table's gain slower.
  // Default: off
  bool screen_planning = false;
  // SearchParallelism: distca, by default (a profile with a table for the
  // model, neither plan_by_flops nor plan_by_table), is first simulated at
  // every shape without the table (screen_planning, a fraction of the
  // time) and then in full only where that screen is at most this fraction slower
  // than the fastest fitting one (docs/simulator.md, "Choosing tp and
  // pp"). Infinity: every shape in full (--search-exact). Default:
  // kSearchScreenMargin
  double search_screen_margin = kSearchScreenMargin;
  int threads = 0;  // OpenMP threads over batches; 0 = OMP_NUM_THREADS. Default: 0
};

// distca or distca-paper: the strategies that plan CAD traffic at a
// tolerance.
bool IsCadStrategy(SimStrategy strategy);
// distca-paper, distca or colocated: the strategies that run a batch as
// waves over all of a stage's ranks (SimOptions::cad_micro_batches), not as
// the context-parallel baselines' micro-batches.
bool RunsAsWaves(SimStrategy strategy);
// The wire format strategy s's all-to-alls carry under `options`:
// options.cad_wire for distca and distca-paper when set, else each its own
// (distca-paper DistCA's, distca and colocated this runtime's); none for
// wlb-ideal and megatron, which plan no CAD traffic.
std::optional<PlanWire> StrategyWire(SimStrategy strategy, const SimOptions& options);

// Seconds per layer of one iteration on an average rank: what a rank spends
// in one layer, summed over the iteration's micro-batches, averaged over the
// P * G ranks that hold tokens (CAD: all ranks' work divided by P * G, so
// attention served by dedicated servers counts too). comm is the exposed
// part: the CP all-gather / reduce-scatter, or what CAD's overlap leaves.
struct SimBreakdown {
  double forward_linear_s = 0, backward_linear_s = 0;
  double forward_attention_s = 0, backward_attention_s = 0;
  double forward_comm_s = 0, backward_comm_s = 0;
};

struct SimResult {
  SimStrategy strategy = SimStrategy::kDistca;
  double iteration_s = 0;    // mean over batches
  double tokens_per_s = 0;   // B * L / iteration_s
  double speedup = 0;        // wlb-ideal's iteration_s / this one's; 0 when wlb-ideal did not run
  double idle_fraction = 0;  // mean over batches and ranks of (iteration - busy) / iteration
  // distca-paper: the part of idle_fraction its ranks spent on dummy work in
  // pipeline bubbles (real linear time, results thrown away); 0 otherwise.
  double bubble_work_fraction = 0;
  double memory_max_bytes = 0;  // per device, max over ranks and batches
  double memory_mean_bytes = 0;
  // memory_max_bytes <= hardware.memory_bytes. False also says that no CP
  // degree (c_min for CAD) fitted and the largest one was used.
  bool memory_fits = true;
  double bytes_moved = 0;       // per iteration, mean over batches, all ranks
  double max_buffer_bytes = 0;  // CAD: largest per-rank send + receive of one layer, per device
  // Baselines: the CP degree c used; CAD: the degree c of its waves (each
  // rank holds L / c tokens per wave; c_min with one stage), 0 with
  // micro_batches set (B L / (m G) tokens per rank); colocated: 1.
  int cp = 0;
  double tolerance_used = 0;  // CAD: mean eps of the plans (after comm-budget raises)
  // Strategies that plan (distca, distca-paper, colocated): mean over the
  // plans of the busiest server's attention load over the mean load, in
  // the cost the plan balanced (FLOPs; for distca by default each kept
  // plan's own: the measured table's seconds or FLOPs): the balance eps
  // bought. The policies read eps
  // differently (distca bounds the busiest server by (1 + eps) x the mean;
  // the paper's recipients pull until within eps of it), so at one eps
  // their balance differs. 0 for the baselines; the JSON and the grid CSV
  // give it for distca and distca-paper only.
  double load_max_over_mean = 0;
  // Seconds of the gradient sync in each iteration (SimOptions::grad_sync;
  // the same for every strategy at a shape); its bytes are not in
  // bytes_moved.
  double grad_sync_s = 0;
  SimBreakdown breakdown;  // mean over batches
  std::vector<double> iteration_per_batch;
  std::vector<double> idle_per_batch;  // idle_fraction of each batch; their mean is idle_fraction
};

// Limits that keep a simulation finite in time and memory (every batch is
// sampled, planned and costed): 64x the paper's largest configuration in
// tokens (128 chunks of 128K), 16x in GPUs (512). Near both limits a run
// takes minutes on 2 cores.
inline constexpr int64_t kMaxSimIterationTokens = int64_t{1} << 30;
inline constexpr int kMaxSimGpus = 8192;
// eps is a fraction of the mean load: from 1 on a balancing policy moves
// nothing more; 1e6 leaves room for the budget search's raises and keeps the
// mean over a run's plans finite.
inline constexpr double kMaxSimTolerance = 1e6;
// Micro-batches of one iteration over all replicas (given per replica,
// --micro-batches m, up to m G at CP 1; or one per chunk, B), and with pp > 1
// that times pp (the pipeline slots the schedules keep): each costs memory and
// a pipeline tick per batch (2^24: 8 s and 1.3 GB for one batch of one stage;
// 5x that ran out of memory). Real schedules run tens to hundreds per replica.
inline constexpr int64_t kMaxSimMicroBatches = int64_t{1} << 24;
// Documents in one batch: every strategy packs, lays out and plans each of
// them (2^26 one-token documents took minutes and GBs on 256 ranks). The
// paper's batches hold thousands.
inline constexpr int64_t kMaxSimBatchDocuments = int64_t{1} << 22;
// The most memory a profile may give a device, in bytes, and so the largest
// CAD buffer per device (--comm-budget).
inline constexpr int64_t kMaxDeviceMemoryBytes = 1'000'000'000'000'000;

Status ValidateSimOptions(const SimOptions& options);

// Simulates every strategy on every batch (each a list of positive document
// lengths summing to B * L tokens; a document longer than L, possible in a
// docs file, stays one micro-batch of its own for wlb-ideal and is cut by
// megatron). Results are in `strategies` order; `speedup` is filled when
// kWlbIdeal is among them. Divisibility: the baselines only consider CP
// degrees c with G / c dividing B (with options.cp set, an error names it);
// CAD needs G / c_min to divide B (c_min is raised until it does); colocated
// needs G to divide B. With micro_batches = m set, none of these apply: every
// power of two dividing G is a CP degree, and B L >= m G is required.
Status Simulate(const SimOptions& options, const std::vector<std::vector<int64_t>>& batches,
                const std::vector<SimStrategy>& strategies, std::vector<SimResult>* results);

// Sizing a job: every (tp, pp) shape of options.gpus devices that
// ValidateSimOptions accepts with tp dividing the profile's gpus_per_node (a
// tensor-parallel group stays inside a node), in increasing tp, then pp.
std::vector<std::pair<int, int>> ParallelShapes(const SimOptions& options);

// One strategy's best shape (SearchParallelism).
struct ShapeChoice {
  int tp = 0, pp = 0;  // 0 when the strategy runs at no shape
  SimResult result;    // at that shape; speedup is over wlb-ideal's best shape
  Status status;       // why the strategy runs at no shape, or OK
};
// One shape tried: per strategy (in `strategies` order) its result, or why
// it could not be simulated there.
struct ShapeTrial {
  int tp = 0, pp = 0;
  std::vector<Status> status;
  std::vector<SimResult> results;
  // Per strategy: true where the result is the screen's (distca planned
  // without the table; see SimOptions::search_screen_margin), kept because
  // the shape could not be the fastest.
  std::vector<bool> screened;
};

// Simulates `batches` at each (tp, pp) of `shapes` (e.g. ParallelShapes;
// options' tp and pp are ignored) and picks, per strategy, the fastest shape
// whose memory fits (memory_fits), or, when none fits, the one with the least
// memory. best: in `strategies` order, speedup over the best wlb-ideal when
// it is among them (else 0). trials: every shape, in order. A strategy that
// cannot run at a shape (e.g. a batch size its ranks do not divide, a CAD
// layout over the comm budget) is skipped there with its reason; one that
// runs at no shape gets tp = pp = 0 and the reasons in its status, and the
// others their choices. An error says that no strategy runs at any shape
// (naming the first one's reasons) or that `shapes` is empty.
// distca planning by default is screened (see
// SimOptions::search_screen_margin): simulated at every shape without
// the table, then in full where that screen is within the margin of the
// fastest fitting one (at every shape when none fits), and wherever a kept
// screen would otherwise be chosen, so a choice is always simulated in
// full.
// on_shape, when given, is called with each shape's trial as soon as it is
// simulated (a search over many shapes takes minutes: the tool prints
// them); with a screen, once the screen is done, and again for a shape
// simulated in full after its call.
Status SearchParallelism(const SimOptions& options, const std::vector<std::vector<int64_t>>& batches,
                         const std::vector<SimStrategy>& strategies, const std::vector<std::pair<int, int>>& shapes,
                         std::vector<ShapeChoice>* best, std::vector<ShapeTrial>* trials,
                         const std::function<void(const ShapeTrial&)>& on_shape = nullptr);

// Fixed batches (distca-train's --docs-file): every batch is one iteration's
// global batch of T tokens, the same T for all; the G = gpus / (tp * pp)
// ranks of a stage hold T / G tokens each, i.e. one chunk of L = T / G per
// rank: sets max_doc_len = T / G and batch_size = G. Errors name the batch
// whose total differs, or a T that G does not divide.
Status ShapeFromBatches(const std::vector<std::vector<int64_t>>& batches, SimOptions* options);

// ---------------------------------------------------------------------------
// Calibrating a profile against measured training steps (distca-bench
// profile, docs/simulator.md "Measuring a profile").

// One measured step of distca-train --attention colocated: its batch and the
// slowest rank's wall time.
struct MeasuredStep {
  std::vector<int64_t> lengths;
  double step_s = 0;
};

struct ProfileFit {
  double linear_mfu = 0;  // fitted
  // Fitted factor on core attention's time: multiplies every attention
  // table's scale and divides the efficiency curve.
  double attention_factor = 0;
  std::vector<double> predicted_s;  // per step, with the fitted profile
  double max_relative_error = 0;    // |predicted / measured - 1|, largest over steps
  // The attention level is held at the fastest the device's peak allows
  // (the least-squares solution lay just beyond it; FitColocatedSteps).
  bool attention_at_peak = false;
};

// An efficiency curve (HardwareProfile::attention_efficiency) from a
// measured table's whole-document tasks (q_len == kv_len): forward +
// backward FLOPs, (1 + backward_factor) x 4 x CausalPairs(0, q) x head_dim x
// q_heads, over peak_flops x the task's seconds, one point per such task,
// capped at 1 (a kernel whose backward does fewer FLOPs than the count can
// read above 1). Errors: a malformed table, or one with no such task.
Status EfficiencyCurveFromTable(std::string_view csv, double peak_flops, int q_heads, int head_dim,
                                double backward_factor, std::vector<std::pair<double, double>>* curve);

// The backward / forward time of a table pair (AttentionTable's csv and
// forward_csv, which must pass ValidateAttentionTable): the median over the
// whole-document tasks (q_len == kv_len) of (table - forward) / forward,
// clamped to [1, 100], the range a profile's attention_backward_factor
// takes; the median itself, unclamped, in *median when given. Errors:
// invalid tables, or no whole-document task.
Status MeasuredBackwardFactor(const AttentionTable& table, double* factor, double* median = nullptr);

// Fits options->hardware's linear_mfu and attention level so that the
// simulator's colocated prediction of each step (ShapeFromBatches on the
// step's batch; options gives model, gpus, tp, pp and the rest) matches the
// measured times, least squares in relative error. A colocated step costs
// c + u a + s b (u: linear time's multiplier, s: attention's, c: transfers)
// where every rank takes part in every exchange, and piecewise so where
// some rank exchanges nothing (its clock runs on unsynchronized): three
// simulations per step linearize it around the current (u, s), and the
// least-squares solution is refined from there until it settles (at most 8
// rounds); the predictions are simulated with the fitted profile. No
// attention table may run faster than peak_flops, nor the curve, where it
// serves the model, above 1: a solution within 10% beyond that bound is held
// at it (attention_at_peak; peak_flops is itself measured), one further is
// refused. Needs at least two
// steps whose attention shares differ (the fit is refused when the steps'
// (linear, attention) columns are within about 2 degrees of each other);
// fails (naming why) when it is degenerate or gives a linear MFU outside
// (0, 1]. When a table serves the
// model, curve points the fit lifts above 1 are capped at 1 (the curve then
// serves other head shapes only); when the curve serves it, that is an error.
Status FitColocatedSteps(const std::vector<MeasuredStep>& steps, SimOptions* options, ProfileFit* fit);

// ---------------------------------------------------------------------------
// The paper-style grid (docs/simulator.md, "Grid").

struct GridPoint {
  std::string model;  // preset name
  int gpus = 0, tp = 8, pp = 1;
  int64_t max_doc_len = 0;
  int batch_size = 0;
  double elongate = 1.0;       // the Pretrain recipe's length multiplier for this L
  int micro_batches = 0;       // SimOptions::micro_batches
  int cad_micro_batches = 0;   // SimOptions::cad_micro_batches
  bool recompute_mlp = false;  // SimOptions::recompute_mlp
  std::string Label() const;   // e.g. "8B 128K 64"
};

// The largest grid elongate base (2^20): above it the grid's documents
// shrink towards one token.
inline constexpr int64_t kMaxGridElongateBase = int64_t{1} << 20;

// How the grid samples its workload and forms micro-batches.
struct GridRecipe {
  // elongate = L / elongate_base (the Pretrain recipe). Default: 64K, the
  // DistCA artifact's ELONGATE_FACTOR = NUM_TOKENS / 65536
  int64_t elongate_base = 65536;
  // SimOptions::micro_batches for every point and strategy; 0 = the
  // artifact's: 1 in 3D (the whole batch at once), 8 in 4D (its PP
  // configurations), and for CAD at most B / 2 (cad_micro_batches: its
  // micro-batches hold a ping and a pong chunk). Default: 0
  int micro_batches = 0;
};

// The paper's Table 3 ("3d": pp 1, 64-256 GPUs) or Table 4 ("4d": pp 2;
// Llama-3-8B on 64-256 GPUs, Llama-34B on 128-512): model, maximum document
// length and batch size per GPU count (docs/simulator.md, "Grid").
Status PaperGrid(std::string_view dims, std::vector<GridPoint>* points, const GridRecipe& recipe = {});

// One CSV row per (grid point, strategy); the header names every column.
std::string GridCsvHeader();
// run: the point's SimOptions, whose run-wide settings (wlb_scope, ping_pong,
// wire, comm_budget, tolerance, servers, gradient sync, optimizer sharding)
// are columns of their own; packing: how the sampled documents filled the
// batches (distca-sim's --packing), the last column.
std::string GridCsvRow(const GridPoint& point, const SimResult& result, const SimOptions& run,
                       std::string_view packing);
// A gnuplot script drawing speedup-over-wlb-ideal bars per configuration, one
// bar per strategy (like the paper's Figures 9 and 10), from a CSV written
// with GridCsvHeader/GridCsvRow, into a PNG.
std::string SpeedupPlotScript(const std::string& csv_path, const std::string& png_path, const std::string& title,
                              const std::vector<SimStrategy>& strategies);

// The tolerance sweep (the paper's Figure 12): one CSV row per (eps, CAD
// strategy), the strategies in the same order at every eps.
std::string ToleranceCsvHeader();
std::string ToleranceCsvRow(double eps, const SimResult& result);
// A gnuplot script drawing, from that CSV, iteration time and the largest
// per-layer buffer against eps, one line per strategy, into a PNG.
std::string TolerancePlotScript(const std::string& csv_path, const std::string& png_path, const std::string& title,
                                const std::vector<SimStrategy>& strategies);

}  // namespace distca
