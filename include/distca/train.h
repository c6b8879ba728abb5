// The training loop: data-parallel training of the Llama-style model over
// the ranks of a Comm, with core attention colocated (each rank attends over
// its own tokens) or disaggregated (CAD: planned, dispatched, ping-pong).
//
// Every step: the global batch from the BatchStream (identical on every
// rank), the planner's linear layout gives every rank the same number of
// tokens, plans are built (CAD with ping-pong: one per nano-batch), the model
// runs forward and backward through the PingPongExecutor, gradients are
// summed over ranks (loss = mean next-token cross-entropy over the global
// batch), clipped, and AdamW updates the replicated weights.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "distca/comm.h"
#include "distca/dataset.h"
#include "distca/model.h"
#include "distca/plan.h"
#include "distca/runtime.h"
#include "distca/status.h"
#include "distca/trace.h"

namespace distca {

enum class AttentionMode {
  kColocated,  // every rank runs attention for its own tokens: the baseline
  kCad,        // core attention disaggregated (default)
};
const char* AttentionModeName(AttentionMode mode);
Status ParseAttentionMode(std::string_view name, AttentionMode* mode);

struct TrainOptions {
  ModelConfig model;
  DataOptions data;             // tokens_per_batch is set from tokens_per_rank
  int64_t tokens_per_rank = 0;  // 0: only with a docs file (batch total / ranks)
  int64_t steps = 10;           // train until this step (a resumed run continues to it)
  float lr = 3e-4f;             // peak learning rate. Default: 3e-4
  float min_lr = 3e-5f;         // end of the cosine. Default: 3e-5
  int64_t warmup_steps = 0;     // Default: 0
  int64_t lr_decay_steps = 0;   // cosine length. 0 = steps. Default: 0
  double grad_clip = 1.0;       // global norm; 0 = off. Default: 1
  AdamWOptions adamw;
  uint64_t seed = 1234;  // weights and data. Default: 1234

  AttentionMode attention = AttentionMode::kCad;
  PlanPolicy policy = PlanPolicy::kDistca;           // CAD. Default: distca
  double tolerance = 0.05;                           // CAD eps. Default: 0.05
  int servers = 0;                                   // CAD dedicated attention servers. Default: 0
  BackwardMode backward = BackwardMode::kStateless;  // CAD. Default: stateless
  bool ping_pong = true;                             // CAD. Default: on
  int64_t block = 128;                               // task granularity. Default: 128
  // CAD: the planner balances this measured table's seconds
  // (CostModel::FromTableCsv: the kernel's time per task) instead of FLOPs.
  // Default: none (FLOPs)
  std::optional<CostModel> cost_table;

  // Bytes the job may hold on this machine: a run whose fp32 weights,
  // gradients and AdamW moments (16 bytes per parameter) and activations,
  // times the ranks on the machine (Comm::machine_ranks), exceed it is
  // refused. 0 = the machine's physical RAM. Default: 0
  double memory_bytes = 0;
  int threads = 1;           // OpenMP threads per rank (GEMMs, CA engine). Default: 1
  std::string save_dir;      // checkpoints (docs/checkpoint_format.md); "" = none
  int64_t save_every = 0;    // 0 = only at the end (when save_dir is set)
  std::string load_dir;      // resume from this checkpoint
  Tracer* tracer = nullptr;  // Chrome trace of compute and comm spans
};

// One rank's share of a step. Times are seconds of this step.
struct RankStepMetrics {
  int rank = 0;
  int64_t tokens = 0;          // tokens this rank holds for the linear layers
  double attn_s = 0.0;         // running CA tasks as a server
  double linear_s = 0.0;       // the model's layers other than core attention
  double comm_s = 0.0;         // attention transfers (posting to completion) + gradient all-reduce
  double wait_s = 0.0;         // blocked: transfers not hidden + waiting for the slowest rank in the all-reduce
  double busy_s = 0.0;         // thread CPU time of the rank's compute thread (excludes the all-reduce)
  int64_t peak_rss_bytes = 0;  // peak resident set of the process during the step (local ranks share one)
};

struct StepMetrics {
  int64_t step = 0;                 // 1-based
  double loss = 0.0;                // mean next-token cross-entropy (nats) over the global batch
  double step_s = 0.0;              // slowest rank's wall time of the step
  double tokens_per_s = 0.0;        // global tokens / step_s
  double load_max_over_mean = 1.0;  // CA cost per server (FLOPs, or the cost table's seconds), max / mean
  int64_t comm_bytes = 0;           // attention bytes moved (all ranks, sent)
  double lr = 0.0;
  double grad_norm = 0.0;  // before clipping
  int64_t documents = 0;
  int64_t tokens = 0;                  // global batch
  std::vector<RankStepMetrics> ranks;  // complete on rank 0 only
};

// The checks Train makes of its options before anything else and, with
// tokens_per_rank set, its memory check (a tool running several
// configurations, or measuring before it trains, checks them first).
Status CheckTrainOptions(const Comm& comm, const TrainOptions& options);
// Trains on this rank; every rank of `comm` calls it with the same options.
// `on_step` runs on rank 0 after every step. Rank 0 writes checkpoints.
Status Train(Comm& comm, const TrainOptions& options, const std::function<void(const StepMetrics&)>& on_step);

// Checkpoints (docs/checkpoint_format.md): DIR/step-N/{model.safetensors,
// optimizer.safetensors, state.json} written under a temporary name, fsynced
// and renamed; DIR/latest names the newest one (replaced atomically).
// The learning-rate schedule as a run resolves it (decay_steps:
// --lr-decay-steps, or the run's --steps when that is 0). A checkpoint
// records it, and a run resumed from one must train on the same schedule.
struct LrSchedule {
  float lr = 0, min_lr = 0;
  int64_t warmup_steps = 0, decay_steps = 0;
  bool operator==(const LrSchedule&) const = default;
};
std::string DescribeSchedule(const LrSchedule& s);

struct TrainState {
  int64_t step = 0;
  DataPosition data;
  uint64_t seed = 0;
  LrSchedule schedule;
};
Status SaveCheckpoint(const std::string& dir, const Transformer& model, const AdamW& optimizer,
                      const TrainState& state);
// Whether SaveCheckpoint can write into DIR, checked before a run trains:
// the directory can be created or written, and nothing blocks the 'latest'
// file it replaces (a directory by that name, or by its staging name).
Status CheckCheckpointDirectory(const std::string& dir);
// Whether `path`'s file name is one a checkpoint directory holds (its step
// directories' files, or `latest`).
bool IsCheckpointFile(const std::string& path);
// Loads DIR's latest checkpoint (or DIR itself when it holds state.json).
// Fails without touching model/optimizer when the files are missing, corrupt
// or were written for a different model shape. Beyond the model and the
// optimizer, loading holds at most kLoadBytesPerParameter bytes per parameter
// at once (a tensor file's bytes and its tensors), freed when it returns.
inline constexpr int64_t kLoadBytesPerParameter = 16;
// Saving builds each tensor file in memory before writing it: at most the
// optimizer file's two moments, 8 bytes per parameter, while the step's
// buffers are still held.
inline constexpr int64_t kSaveBytesPerParameter = 8;
Status LoadCheckpoint(const std::string& dir, Transformer* model, AdamW* optimizer, TrainState* state);

// Safetensors (https://github.com/huggingface/safetensors): 8-byte little-
// endian header size, JSON header, raw little-endian data. F32 only here.
struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;
};
Status WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                        const std::vector<std::pair<std::string, std::string>>& metadata);
// Reads every tensor into `data` (name -> values) after checking the header.
struct SafetensorsFile {
  struct Entry {
    std::vector<int64_t> shape;
    std::vector<float> values;
  };
  std::vector<std::pair<std::string, Entry>> tensors;  // in file order
  std::vector<std::pair<std::string, std::string>> metadata;
  const Entry* Find(const std::string& name) const;
};
// Files over 8 bytes + the header limit + max_data_bytes are refused unread.
Status ReadSafetensors(const std::string& path, SafetensorsFile* file,
                       uint64_t max_data_bytes = std::numeric_limits<uint64_t>::max());

}  // namespace distca
