// A batch, its plan, and the check that disaggregated attention over ranks
// equals single-process attention over the whole batch. Shared by the gtest
// suite (local backend) and the mpirun check program.
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <random>
#include <vector>

#include "attn/attention_testing.h"
#include "distca/attention.h"
#include "distca/comm.h"
#include "distca/plan.h"
#include "distca/runtime.h"

namespace distca::testing {

struct DispatchCase {
  std::vector<int64_t> lengths;
  int ranks = 1;
  int servers = 0;  // dedicated
  PlanPolicy policy = PlanPolicy::kDistca;
  BackwardMode backward = BackwardMode::kStateless;
  int q_heads = 4, kv_heads = 2, head_dim = 16;
  uint64_t seed = 1;
};

// Global tensors of the whole batch in document order (documents concatenated).
struct GlobalBatch {
  AttentionShape shape;
  std::vector<AttentionTask> whole;  // one task per document
  std::vector<int64_t> doc_start;    // global row of each document's position 0
  std::vector<float> q, k, v, dout;
};

inline GlobalBatch MakeGlobalBatch(const DispatchCase& c) {
  GlobalBatch g;
  g.shape = {.total_q = 0, .total_k = 0, .q_heads = c.q_heads, .kv_heads = c.kv_heads, .head_dim = c.head_dim};
  for (int64_t len : c.lengths) {
    g.doc_start.push_back(g.shape.total_q);
    g.whole.push_back({g.shape.total_q, len, g.shape.total_q, len});
    g.shape.total_q += len;
  }
  g.shape.total_k = g.shape.total_q;
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  auto fill = [&](std::vector<float>& x, int64_t n) {
    x.resize(size_t(n));
    for (float& e : x) e = dist(rng);
  };
  fill(g.q, g.shape.total_q * c.q_heads * c.head_dim);
  fill(g.k, g.shape.total_k * c.kv_heads * c.head_dim);
  fill(g.v, g.shape.total_k * c.kv_heads * c.head_dim);
  fill(g.dout, g.shape.total_q * c.q_heads * c.head_dim);
  return g;
}

// The whole batch as one single-process attention problem (the oracle's input).
inline Batch WholeBatch(const GlobalBatch& g) {
  Batch b;
  b.shape = g.shape;
  b.tasks = g.whole;
  b.q = g.q;
  b.k = g.k;
  b.v = g.v;
  b.dout = g.dout;
  return b;
}

struct DistributedResult {
  std::vector<float> out, lse, dq, dk, dv;  // global layout
  std::vector<int64_t> sent, received;      // per rank, bytes
  // Per rank, bytes the attention context held allocated between the passes
  // and after the backward pass.
  std::vector<int64_t> held_between, held_after;
};

// Runs forward and backward on every rank of `comm`, each rank placing its
// local rows into the global result (rows are disjoint, so no races).
inline Status RunDistributed(Comm& comm, const DispatchCase& c, const Plan& plan, const GlobalBatch& g,
                             DistributedResult* r) {
  DispatchOptions o;
  o.q_heads = c.q_heads;
  o.kv_heads = c.kv_heads;
  o.head_dim = c.head_dim;
  o.backward = c.backward;
  o.exec.num_threads = 1;
  std::unique_ptr<AttentionDispatcher> d;
  DISTCA_RETURN_IF_ERROR(AttentionDispatcher::Create(plan, comm.rank(), o, &d));
  const int64_t n = d->local_tokens();
  const int64_t qw = int64_t{c.q_heads} * c.head_dim, kw = int64_t{c.kv_heads} * c.head_dim;
  // Local rows <-> global rows.
  std::vector<int64_t> global_row(size_t(n), -1);
  for (size_t doc = 0; doc < plan.documents.size(); ++doc)
    for (int64_t pos = 0; pos < plan.documents[doc].length; ++pos) {
      const int64_t row = d->LocalRow(int(doc), pos);
      if (row >= 0) global_row[size_t(row)] = g.doc_start[doc] + pos;
    }
  auto gather = [&](const std::vector<float>& src, int64_t w) {
    std::vector<float> x(size_t(n * w));
    for (int64_t i = 0; i < n; ++i) std::copy_n(src.begin() + global_row[i] * w, w, x.begin() + i * w);
    return x;
  };
  const std::vector<float> q = gather(g.q, qw), k = gather(g.k, kw), v = gather(g.v, kw), dout = gather(g.dout, qw);
  std::vector<float> out(q.size()), lse(size_t(n * c.q_heads)), dq(q.size()), dk(k.size()), dv(v.size());
  AttentionContext ctx;
  DISTCA_RETURN_IF_ERROR(d->Forward(comm, q.data(), k.data(), v.data(), out.data(), lse.data(), &ctx));
  r->held_between[comm.rank()] = ctx.held_bytes();
  DISTCA_RETURN_IF_ERROR(d->Backward(comm, q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), dq.data(),
                                     dk.data(), dv.data(), &ctx));
  r->held_after[comm.rank()] = ctx.held_bytes();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t gr = global_row[i];
    std::copy_n(out.begin() + i * qw, qw, r->out.begin() + gr * qw);
    std::copy_n(dq.begin() + i * qw, qw, r->dq.begin() + gr * qw);
    std::copy_n(dk.begin() + i * kw, kw, r->dk.begin() + gr * kw);
    std::copy_n(dv.begin() + i * kw, kw, r->dv.begin() + gr * kw);
    for (int h = 0; h < c.q_heads; ++h) r->lse[h * g.shape.total_q + gr] = lse[h * n + i];
  }
  r->sent[comm.rank()] = d->traffic().sent;
  r->received[comm.rank()] = d->traffic().received;
  return Status::Ok();
}

inline DistributedResult EmptyResult(const GlobalBatch& g, int world) {
  DistributedResult r;
  r.out.assign(g.q.size(), 0.0f);
  r.dq.assign(g.q.size(), 0.0f);
  r.dk.assign(g.k.size(), 0.0f);
  r.dv.assign(g.v.size(), 0.0f);
  r.lse.assign(size_t(g.shape.total_q * g.shape.q_heads), 0.0f);
  r.sent.assign(size_t(world), 0);
  r.held_between.assign(size_t(world), 0);
  r.held_after.assign(size_t(world), 0);
  r.received.assign(size_t(world), 0);
  return r;
}

inline Status MakePlan(const DispatchCase& c, Plan* plan) {
  PlanOptions o;
  o.ranks = c.ranks;
  o.dedicated_servers = c.servers;
  o.policy = c.policy;
  o.block = 32;
  o.model = {.q_heads = c.q_heads, .kv_heads = c.kv_heads, .head_dim = c.head_dim, .dtype_bytes = 4};
  const CostModel cost = CostModel::Flops(o.model);
  DISTCA_RETURN_IF_ERROR(BuildPlan(c.lengths, o, cost, plan));
  return ValidatePlan(*plan, cost);
}

}  // namespace distca::testing
