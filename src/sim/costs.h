// The simulator's cost model (docs/simulator.md, "Cost model"): seconds and
// bytes of one rank (a tensor-parallel group of tp devices) for one layer.
#pragma once

#include <cstdint>

#include <optional>

#include "distca/model.h"
#include "distca/plan.h"
#include "distca/sim.h"

namespace distca::sim {

// A profile's table and, when it has one, its forward-only table, parsed
// and checked as ValidateAttentionTable describes (*forward stays empty
// without a forward table).
Status ParseAttentionTable(const AttentionTable& table, CostModel* total, std::optional<CostModel>* forward);

// Backward / forward time ratio of the linear layers (DESIGN.md section 3);
// core attention's comes from the profile (RankCosts::Attention).
inline constexpr double kBackwardLinearFactor = 2.0;

// K/V heads of a rank of tp devices: the model's, or tp when there are fewer
// (each device then holds a replica of one: tp divides or is a multiple of
// kv_heads, ValidateSimOptions).
inline int RankKvHeads(const ModelConfig& m, int tp) { return m.kv_heads < tp ? tp : m.kv_heads; }

class RankCosts {
 public:
  // REQUIRES: model and hardware valid (ValidateSimOptions), tp >= 1. (A
  // table that fails ParseAttentionTable is not used: the efficiency curve
  // takes its place.)
  // recompute_mlp: selective recomputation of the MLP (SimOptions).
  RankCosts(const ModelConfig& model, const HardwareProfile& hardware, int tp, bool recompute_mlp = false);

  // Context-independent FLOPs of one token in one layer, forward:
  // 2h(2h + 2h_kv) + 6 h ffn, with h_kv = RankKvHeads * head_dim.
  double LinearFlopsPerToken() const { return linear_flops_per_token_; }
  // Seconds of one layer's context-independent part over `tokens`, forward:
  // the FLOPs at linear_mfu, plus, with the profile's tp_collectives and tp
  // > 1, the four exposed collectives of sequence parallelism (0 for no
  // tokens).
  double LinearForward(double tokens) const { return LinearFlopsSeconds(tokens) + TpCollectives(tokens); }
  // The tensor-parallel collectives' part of LinearForward(tokens): 0
  // without tp_collectives (both terms are 0), for tp 1 or for no tokens.
  double TpCollectives(double tokens) const {
    return tokens > 0 ? tokens * tp_comm_per_token_ + tp_comm_latency_ : 0.0;
  }
  // Backward / forward FLOPs of a layer's context-independent part: 2, plus
  // the MLP's share of the forward FLOPs (6 h ffn of them) when the MLP is
  // recomputed in the backward pass.
  double BackwardLinearFactor() const { return backward_linear_factor_; }
  // Backward / forward time of the tensor-parallel collectives: 2, plus,
  // when the MLP is recomputed, its forward's all-gather and reduce-scatter
  // (2 of the layer's 4, so 0.5) run again.
  double BackwardCollectivesFactor() const { return backward_collectives_factor_; }
  // One layer's context-independent part over `tokens`, backward: the FLOPs
  // times BackwardLinearFactor, the collectives times
  // BackwardCollectivesFactor.
  double LinearBackward(double tokens) const {
    return backward_linear_factor_ * LinearFlopsSeconds(tokens) + backward_collectives_factor_ * TpCollectives(tokens);
  }
  // Share of a pass's linear FLOPs that run before core attention: forward,
  // the QKV projection (PreAttentionShare); backward, the O projection and
  // MLP backward (and the MLP's recomputation). (The collectives split by
  // their own order: LinearPass.)
  double BeforeAttentionShare(bool backward) const {
    return backward ? 1.0 - kBackwardLinearFactor * pre_attention_share_ / backward_linear_factor_
                    : pre_attention_share_;
  }
  // One layer's linear part over `tokens` in a pass (LinearForward, or
  // LinearBackward), split around core attention: the FLOPs by
  // BeforeAttentionShare, the tensor-parallel collectives by their order
  // (forward: the all-gather before the QKV projection, 1 of 4; backward:
  // those of the MLP and the O projection, 3 of 4, twice, and the
  // recomputed MLP's, which all run before attention's backward).
  struct LinearSplit {
    double before = 0, after = 0;
  };
  LinearSplit LinearPass(double tokens, bool backward) const {
    const double comm = TpCollectives(tokens), flops = LinearFlopsSeconds(tokens);
    LinearSplit s;
    if (!backward) {
      s.before = BeforeAttentionShare(false) * flops + 0.25 * comm;
      s.after = flops + comm - s.before;
    } else {
      s.after = kBackwardLinearFactor * (pre_attention_share_ * flops + 0.25 * comm);
      s.before = LinearBackward(tokens) - s.after;
    }
    return s;
  }
  // LM head (2 h V FLOPs per token), forward; runs on the last stage only.
  double HeadForward(double tokens) const { return tokens * head_flops_per_token_ / linear_rate_; }
  // Core attention of query rows [q_begin, q_end) with KV [0, q_end), each
  // pass. Forward: 4 * CausalPairs * D * Hq FLOPs at efficiency
  // eff(q_end - q_begin); or, with a matching attention table
  // (HardwareProfile::attention_tables), scale * forward_table(q_len, kv_len
  // = q_end) * (rank's query heads / table's), and without a forward table
  // scale * table(...) * (...) / (1 + attention_backward_factor). Backward:
  // with a forward table, scale * (table - forward_table)(...) * (...);
  // otherwise attention_backward_factor times the forward.
  struct AttentionSeconds {
    double forward = 0, backward = 0;
  };
  AttentionSeconds Attention(int64_t q_begin, int64_t q_end) const;
  double AttentionForward(int64_t q_begin, int64_t q_end) const { return Attention(q_begin, q_end).forward; }
  double AttentionBackward(int64_t q_begin, int64_t q_end) const { return Attention(q_begin, q_end).backward; }
  // Whether the measured table is in use; whether it splits a task's
  // forward and backward seconds as measured.
  bool measured_attention() const { return table_.has_value(); }
  bool measured_attention_split() const { return forward_table_.has_value(); }
  // The measured table's forward + backward cost of a task, unscaled (the
  // seconds divided by one factor common to every task), for a planner to
  // balance; null without a table.
  const CostModel* attention_table() const { return table_ ? &*table_ : nullptr; }
  // A document of `length` under context parallelism over c ranks (head/tail
  // or zig-zag: 2c shards of length / 2c, two per rank, each rank 1/c of the
  // pairs; c = 1: the whole document as one task). Seconds on each rank
  // (with a table: the 2c shards' total over c), each pass.
  AttentionSeconds AttentionCp(int64_t length, int c) const;
  double AttentionForwardCp(int64_t length, int c) const { return AttentionCp(length, c).forward; }
  double AttentionBackwardCp(int64_t length, int c) const { return AttentionCp(length, c).backward; }

  // All-to-all of one rank: latency + max(sent, received) / (tp * bandwidth),
  // across nodes on the profile's all_to_all link when it has one.
  double AllToAll(double sent, double received, bool inter_node) const;
  // Ring all-gather (or reduce-scatter) over `ranks` ranks of total_bytes:
  // (ranks - 1) * latency + total_bytes * (ranks - 1) / ranks / (tp * bandwidth).
  double Ring(int ranks, double total_bytes, bool inter_node) const;
  // One message between two ranks (pipeline activations).
  double PointToPoint(double bytes, bool inter_node) const;

  // K and V of one token, all heads: 2 * Hkv * D * dtype_bytes.
  double KvBytesPerToken() const { return kv_bytes_per_token_; }
  // Hidden state of one token: h * dtype_bytes (pipeline stage boundary).
  double HiddenBytesPerToken() const { return hidden_bytes_per_token_; }
  // Activation bytes one token keeps per layer on one rank (all tp devices),
  // core attention recomputed (FlashAttention keeps only its output and
  // statistics), counted tensor by tensor in 2-byte elements: attention
  // block 6h + 4h_kv (the QKV input, Q, K and V, the output that feeds the
  // O projection), MLP 2h + 6 ffn (its input, the gate and up outputs, the
  // SwiGLU output), the two norms' inputs 4h; times dtype_bytes / 2. With
  // the MLP recomputed, its 6 ffn and its input's 2h are dropped (the input
  // is the pre-MLP norm's, fused into fc1 in Transformer Engine's layer
  // spec and recomputed with it). For a
  // 4h-GeLU MLP with dropout this is Korthikanti et al. 2022's 34 s b h;
  // Llama-3-8B happens to land on 34 h too, Llama-34B on 28.6 h.
  double ActivationBytesPerToken() const { return activation_bytes_per_token_; }
  // Bytes the output layer's logits take per token on one rank (all tp
  // devices) while a micro-batch's loss is live: the vocab-parallel logits
  // in the working precision plus the float32 copy that Megatron-Core's
  // vocab-parallel cross entropy makes (VocabParallelCrossEntropy::
  // calculate_logits_max) and keeps, as the softmax, for the backward pass:
  // vocab * (dtype_bytes + 4). With sequence parallelism every tp device
  // computes all of the rank's tokens against its vocab / tp columns.
  double LogitsBytesPerToken() const { return logits_bytes_per_token_; }
  // Bytes per token on one rank (all tp devices) of the transient tensors a
  // layer's backward pass holds at its peak, the MLP's fc1 (the widest
  // GEMM): with sequence parallelism each device re-gathers the rank's whole
  // sequence of the fc1 input for the weight gradient (h a token, tp > 1)
  // and computes the input gradient for the whole sequence before its
  // reduce-scatter (h), next to the gradient of fc1's output (2 ffn / tp);
  // with the MLP recomputed also the recomputed fc1 and SwiGLU outputs
  // (3 ffn / tp), which the activations do not count. In elements of
  // dtype_bytes: tp (h [tp > 1] + h) + 2 ffn (+ 3 ffn).
  double BackwardWorkingBytesPerToken() const { return backward_working_bytes_per_token_; }
  // Share of a layer's context-independent FLOPs that run before core
  // attention in the forward pass (the QKV projection): (h + 2 h_kv) /
  // (2h + 2 h_kv + 3 ffn). The rest (O projection, MLP) runs after it; the
  // backward pass runs them in the opposite order.
  double PreAttentionShare() const { return pre_attention_share_; }
  // Backward / forward time of core attention (the profile's), where no
  // forward table splits it (measured_attention_split).
  double AttentionBackwardFactor() const { return hw_.attention_backward_factor; }
  int tp() const { return tp_; }
  // Bytes of one element in the training precision (the profile's dtype_bytes).
  double DtypeBytes() const { return hw_.dtype_bytes; }

 private:
  // The FLOPs' part of LinearForward.
  double LinearFlopsSeconds(double tokens) const {
    return tokens > 0 ? tokens * linear_flops_per_token_ / linear_rate_ : 0.0;
  }

  HardwareProfile hw_;
  int tp_;
  // The profile's measured attention table nearest to the rank's heads, with
  // the model's head dimension (HardwareProfile::attention_tables); else the
  // efficiency curve is used.
  std::optional<CostModel> table_, forward_table_;  // forward_table_ only with table_
  double table_scale_ = 1.0;                        // the table's scale times the rank's query heads over the table's
  double linear_rate_, attention_peak_;             // FLOP/s of the rank
  double linear_flops_per_token_, head_flops_per_token_, attention_flops_per_pair_;
  double backward_linear_factor_, backward_collectives_factor_;
  double kv_bytes_per_token_, hidden_bytes_per_token_, activation_bytes_per_token_, logits_bytes_per_token_;
  double backward_working_bytes_per_token_;
  double pre_attention_share_;
  double tp_comm_per_token_ = 0, tp_comm_latency_ = 0;  // per layer, forward (HardwareProfile::tp_collectives)
};

// Memory of one rank, in bytes per device (docs/simulator.md, "Memory").
struct MemoryInput {
  double stage_params = 0;        // parameters this rank's stage holds (0 for attention-only servers)
  int optimizer_shards = 1;       // ranks the distributed optimizer shards over
  bool optimizer_moments = true;  // Adam's m and v allocated (SimOptions::optimizer_moments)
  double activation_tokens = 0;   // tokens whose activations are held at once, times layers of the stage
  double logits_tokens = 0;       // last stage: tokens of the micro-batch whose logits are live (else 0)
  double working_tokens = 0;      // tokens of the largest micro-batch the rank runs (a layer's backward peak)
  double buffer_bytes = 0;        // KV all-gather or CAD send + receive buffers (whole rank)
  // CAD without the resend (whole rank): what a server keeps for the
  // backward net of the Q/K/V its owners drop; may be negative.
  double server_bytes = 0;
};
double DeviceMemoryBytes(const RankCosts& costs, const MemoryInput& in);

}  // namespace distca::sim
