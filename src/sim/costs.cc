#include "sim/costs.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "distca/plan.h"

namespace distca::sim {

RankCosts::RankCosts(const ModelConfig& m, const HardwareProfile& hw, int tp, bool recompute_mlp) : hw_(hw), tp_(tp) {
  const double h = m.hidden;
  // The rank's K/V width: with fewer K/V heads than tp, each device holds,
  // projects and moves a whole replicated head, tp of them in the rank.
  const double h_kv = double(RankKvHeads(m, tp)) * m.head_dim();
  linear_rate_ = tp * hw.peak_flops * hw.linear_mfu;
  attention_peak_ = tp * hw.peak_flops;
  linear_flops_per_token_ = 2 * h * (2 * h + 2 * h_kv) + 6 * h * m.ffn_hidden;
  if (hw.tp_collectives && tp > 1) {
    const LinkProfile& l = tp > hw.gpus_per_node ? hw.inter_node : hw.intra_node;
    tp_comm_latency_ = 4.0 * (tp - 1) * l.latency_s;
    tp_comm_per_token_ = 4.0 * (tp - 1) / tp * h * hw.dtype_bytes / l.bandwidth;
  }
  head_flops_per_token_ = 2 * h * m.vocab_size;
  attention_flops_per_pair_ = 4.0 * m.head_dim() * m.q_heads;
  kv_bytes_per_token_ = 2 * h_kv * hw.dtype_bytes;
  hidden_bytes_per_token_ = h * hw.dtype_bytes;
  const double mlp_flops_per_token = 6 * h * m.ffn_hidden;
  backward_linear_factor_ =
      kBackwardLinearFactor + (recompute_mlp ? mlp_flops_per_token / linear_flops_per_token_ : 0.0);
  backward_collectives_factor_ = kBackwardLinearFactor + (recompute_mlp ? 0.5 : 0.0);
  // The tensors each count is made of: ActivationBytesPerToken and
  // BackwardWorkingBytesPerToken in costs.h.
  const double kept_elements = recompute_mlp ? 10.0 * h + 4.0 * h_kv : 12.0 * h + 4.0 * h_kv + 6.0 * m.ffn_hidden;
  activation_bytes_per_token_ = kept_elements * hw.dtype_bytes / 2.0;
  logits_bytes_per_token_ = double(m.vocab_size) * (hw.dtype_bytes + 4.0);
  backward_working_bytes_per_token_ =
      (tp * ((tp > 1 ? h : 0.0) + h) + 2.0 * m.ffn_hidden + (recompute_mlp ? 3.0 * m.ffn_hidden : 0.0)) *
      hw.dtype_bytes;
  pre_attention_share_ = (h + 2 * h_kv) / (2 * h + 2 * h_kv + 3.0 * m.ffn_hidden);
  // The rank's heads: tensor parallelism splits them (K/V heads are
  // replicated when there are fewer than tp). Of the tables with the
  // model's head dimension, the rank's exact shape is best, then the
  // nearest group size (query heads per K/V head), then the nearest number
  // of query heads; ties go to the first listed.
  const int rank_q = std::max(1, m.q_heads / tp), rank_kv = std::max(1, m.kv_heads / tp);
  const auto distance = [&](const AttentionTable& t) {
    const bool exact = t.q_heads == rank_q && t.kv_heads == rank_kv;
    const double group = std::abs(std::log2(double(t.q_heads) / t.kv_heads * rank_kv / rank_q));
    return std::tuple(exact ? 0 : 1, group, std::abs(std::log2(double(t.q_heads) / rank_q)));
  };
  const AttentionTable* pick = nullptr;
  for (const AttentionTable& t : hw.attention_tables)
    if (t.Serves(m.head_dim()) && (pick == nullptr || distance(t) < distance(*pick))) pick = &t;
  CostModel table;
  if (pick != nullptr && ParseAttentionTable(*pick, &table, &forward_table_).ok()) {
    table_ = std::move(table);
    table_scale_ = pick->scale * double(rank_q) / pick->q_heads;
  }
}

RankCosts::AttentionSeconds RankCosts::Attention(int64_t q_begin, int64_t q_end) const {
  if (q_end <= q_begin) return {};
  const double f = hw_.attention_backward_factor;
  if (!table_) {
    const double flops = attention_flops_per_pair_ * double(CausalPairs(q_begin, q_end));
    const double forward = flops / (attention_peak_ * hw_.AttentionEfficiency(double(q_end - q_begin)));
    return {forward, f * forward};
  }
  const double total = table_scale_ * table_->TaskCost(q_begin, q_end);
  if (forward_table_) {
    // ValidateAttentionTable checked the forward table below the table at
    // every grid cell, so the interpolated difference is positive.
    const double forward = table_scale_ * forward_table_->TaskCost(q_begin, q_end);
    return {forward, total - forward};
  }
  return {total / (1.0 + f), f * total / (1.0 + f)};
}

RankCosts::AttentionSeconds RankCosts::AttentionCp(int64_t length, int c) const {
  if (c <= 1) return Attention(0, length);
  if (table_) {
    AttentionSeconds sum;
    for (int i = 0; i < 2 * c; ++i) {
      const AttentionSeconds shard = Attention(length * i / (2 * c), length * (i + 1) / (2 * c));
      sum.forward += shard.forward;
      sum.backward += shard.backward;
    }
    return {sum.forward / c, sum.backward / c};
  }
  const double flops = attention_flops_per_pair_ * double(CausalPairs(0, length)) / c;
  const double shard = std::max(1.0, double(length) / (2.0 * c));
  const double forward = flops / (attention_peak_ * hw_.AttentionEfficiency(shard));
  return {forward, hw_.attention_backward_factor * forward};
}

double RankCosts::AllToAll(double sent, double received, bool inter_node) const {
  const LinkProfile& l = inter_node ? (hw_.all_to_all ? *hw_.all_to_all : hw_.inter_node) : hw_.intra_node;
  return l.latency_s + std::max(sent, received) / (tp_ * l.bandwidth);
}

double RankCosts::Ring(int ranks, double total_bytes, bool inter_node) const {
  if (ranks <= 1) return 0.0;
  const LinkProfile& l = inter_node ? hw_.inter_node : hw_.intra_node;
  return (ranks - 1) * l.latency_s + total_bytes * (ranks - 1) / ranks / (tp_ * l.bandwidth);
}

double RankCosts::PointToPoint(double bytes, bool inter_node) const {
  const LinkProfile& l = inter_node ? hw_.inter_node : hw_.intra_node;
  return l.latency_s + bytes / (tp_ * l.bandwidth);
}

double DeviceMemoryBytes(const RankCosts& costs, const MemoryInput& in) {
  // Weights in the training precision (bf16: 2 B) and gradients in fp32
  // (4 B), replicated; Adam m and v in fp32 (8 B, unless the run never steps
  // the optimizer, MemoryInput::optimizer_moments) and, when the weights are
  // narrower than fp32, an fp32 master copy (4 B), sharded over the
  // data-parallel ranks. bf16: 6 + 12 / shards B per parameter; fp32 (the
  // cpu profile, as distca-train): 8 + 8 / shards.
  const double dt = costs.DtypeBytes(), full = std::max(4.0, dt);
  const double optimizer = (in.optimizer_moments ? 2.0 * full : 0.0) + (dt < full ? full : 0.0);
  const double states = in.stage_params * (dt + full) + in.stage_params * optimizer / std::max(1, in.optimizer_shards);
  // The logits live while the loss and the output layer's backward run,
  // before any layer's backward, whose transient peak comes after them.
  const double activations = in.activation_tokens * costs.ActivationBytesPerToken() +
                             std::max(in.logits_tokens * costs.LogitsBytesPerToken(),
                                      in.working_tokens * costs.BackwardWorkingBytesPerToken());
  return (states + activations + in.buffer_bytes + in.server_bytes) / costs.tp();
}

}  // namespace distca::sim
