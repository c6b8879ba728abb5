// The dispatcher and attention server.
//
// Canonical order. For an (owner o, server s) pair both sides enumerate the
// same row runs: s's tasks sorted by (document, q_begin), each cut by o's
// pieces, give the query runs; s's documents in ascending order, [0, max
// q_end) cut by o's pieces, give the K/V runs. The owner packs rows from its
// local layout in that order; the server unpacks them into its assembled
// buffers (one Q row per task row, one K/V prefix per document). Rows whose
// owner is the server itself are copied locally and never sent.
//
// Messages (fp32; "row" = one token's Hq*D or Hkv*D values, "stat" = Hq):
//   forward  owner -> server  Q rows | K rows | V rows
//            server -> owner  O rows | LSE stats
//   backward owner -> server  stateless: Q | dO | LSE | delta | K | V
//                             cached:    dO | delta
//            server -> owner  dQ rows | dK rows | dV rows   (partials, summed by owners)
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "distca/runtime.h"

namespace distca {

// A run of rows: `count` consecutive rows starting at `src` on the sending
// side and at `dst` on the receiving side.
struct Run {
  int64_t src = 0;
  int64_t dst = 0;
  int64_t count = 0;
};

// What moves between this rank and one peer.
struct PeerLayout {
  // This rank as owner, the peer as server: local rows -> peer's buffer rows.
  std::vector<Run> q_out, kv_out;
  // This rank as server, the peer as owner: peer's local rows -> our buffer rows.
  std::vector<Run> q_in, kv_in;
  int64_t q_out_rows = 0, kv_out_rows = 0, q_in_rows = 0, kv_in_rows = 0;
};

struct AttentionDispatcher::Layout {
  int rank = 0;
  int world = 0;
  DispatchOptions options;
  int64_t local_tokens = 0;
  std::map<int, std::vector<std::pair<PlanPiece, int64_t>>> local_pieces;  // doc -> (piece, local row)
  std::vector<PeerLayout> peers;
  // Server side: assembled buffer sizes and the engine's task list.
  int64_t server_q_rows = 0;
  int64_t server_kv_rows = 0;
  std::vector<AttentionTask> tasks;
  DispatchTraffic traffic;
};

// Where a context is in its passes: the last phase that completed. Every
// phase checks it, so a phase called out of order fails instead of reading
// buffers that another phase released or that a transfer still fills.
enum class ContextPhase { kIdle, kForwardStarted, kForwardServed, kForwardDone, kBackwardStarted, kBackwardServed };

struct AttentionContext::State {
  // A transfer still in flight writes into recv: wait for it before the
  // buffers go (it ends, at the latest, at the local backend's timeout or
  // with the MPI job's abort).
  ~State() {
    if (in_flight()) (void)request.Wait();
  }
  bool in_flight() { return request.valid() && !request.Test(); }
  // Server buffers: assembled Q/K/V (kept until backward in cached mode).
  std::vector<float> q, k, v, out, lse, dout, delta, dq, dk, dv;
  // Exchange buffers and counts of the pass in flight.
  std::vector<float> send, recv;
  std::vector<int64_t> send_counts, recv_counts;
  CommRequest request;
  // A phase that fails leaves kIdle: only a Start phase may follow.
  ContextPhase phase = ContextPhase::kIdle;
};

AttentionContext::AttentionContext() : state_(std::make_unique<State>()) {}
AttentionContext::~AttentionContext() = default;
AttentionContext::AttentionContext(AttentionContext&&) noexcept = default;
AttentionContext& AttentionContext::operator=(AttentionContext&&) noexcept = default;

int64_t AttentionContext::held_bytes() const {
  const State& st = *state_;
  int64_t floats = 0;
  for (const std::vector<float>* v :
       {&st.q, &st.k, &st.v, &st.out, &st.lse, &st.dout, &st.delta, &st.dq, &st.dk, &st.dv, &st.send, &st.recv})
    floats += static_cast<int64_t>(v->capacity());
  return floats * int64_t{sizeof(float)};
}

namespace {

using Layout = AttentionDispatcher::Layout;

int64_t QWidth(const Layout& l) { return int64_t{l.options.q_heads} * l.options.head_dim; }
int64_t KvWidth(const Layout& l) { return int64_t{l.options.kv_heads} * l.options.head_dim; }
int64_t StatWidth(const Layout& l) { return l.options.q_heads; }

// Copies rows along runs: dst[run.dst + i] = src[run.src + i] (width floats
// per row); `reverse` swaps the roles of src and dst offsets.
void CopyRuns(const std::vector<Run>& runs, const float* src, float* dst, int64_t width, bool reverse = false) {
  for (const Run& r : runs) {
    const int64_t s = reverse ? r.dst : r.src, d = reverse ? r.src : r.dst;
    std::memcpy(dst + d * width, src + s * width, sizeof(float) * size_t(r.count * width));
  }
}

// Gathers rows of runs into a contiguous stream (src offsets), or scatters a
// stream into rows (dst offsets). Returns the stream end.
float* Gather(const std::vector<Run>& runs, const float* rows, int64_t width, float* stream, bool use_dst = false) {
  for (const Run& r : runs) {
    const int64_t at = use_dst ? r.dst : r.src;
    std::memcpy(stream, rows + at * width, sizeof(float) * size_t(r.count * width));
    stream += r.count * width;
  }
  return stream;
}
const float* Scatter(const std::vector<Run>& runs, const float* stream, float* rows, int64_t width,
                     bool use_src = false, bool add = false) {
  for (const Run& r : runs) {
    float* d = rows + (use_src ? r.src : r.dst) * width;
    const int64_t n = r.count * width;
    if (add) {
      for (int64_t i = 0; i < n; ++i) d[i] += stream[i];
    } else {
      std::memcpy(d, stream, sizeof(float) * size_t(n));
    }
    stream += n;
  }
  return stream;
}

// Stats (LSE, delta) live as (Hq, rows) on both sides; streams carry Hq
// values per row, row-major.
float* GatherStats(const std::vector<Run>& runs, const float* stats, int64_t rows, int heads, float* stream,
                   bool use_dst = false) {
  for (const Run& r : runs) {
    const int64_t at = use_dst ? r.dst : r.src;
    for (int64_t i = 0; i < r.count; ++i)
      for (int h = 0; h < heads; ++h) *stream++ = stats[h * rows + at + i];
  }
  return stream;
}
const float* ScatterStats(const std::vector<Run>& runs, const float* stream, float* stats, int64_t rows, int heads,
                          bool use_src = false) {
  for (const Run& r : runs) {
    const int64_t at = use_src ? r.src : r.dst;
    for (int64_t i = 0; i < r.count; ++i)
      for (int h = 0; h < heads; ++h) stats[h * rows + at + i] = *stream++;
  }
  return stream;
}

Status Exchange(Comm& comm, Layout& l, AttentionContext::State& st) {
  std::vector<int64_t> send_bytes(l.world), recv_bytes(l.world);
  for (int p = 0; p < l.world; ++p) {
    send_bytes[p] = st.send_counts[p] * int64_t(sizeof(float));
    recv_bytes[p] = st.recv_counts[p] * int64_t(sizeof(float));
    l.traffic.sent += send_bytes[p];
    l.traffic.received += recv_bytes[p];
  }
  st.send_counts = std::move(send_bytes);  // kept alive until Wait
  st.recv_counts = std::move(recv_bytes);
  st.request = comm.IAlltoallv(st.send.data(), st.send_counts, st.recv.data(), st.recv_counts);
  return Status::Ok();
}

// Empties a buffer and returns its memory (clear() would keep it): a
// context lives for its layer's whole step, and what a server no longer
// needs must not stay allocated through the other layers.
template <class... V>
void Release(V&... buffers) {
  ((V().swap(buffers)), ...);
}

const char* PhaseName(ContextPhase p) {
  switch (p) {
    case ContextPhase::kIdle:
      return "no pass in progress";
    case ContextPhase::kForwardStarted:
      return "StartForward";
    case ContextPhase::kForwardServed:
      return "ServeForward";
    case ContextPhase::kForwardDone:
      return "FinishForward";
    case ContextPhase::kBackwardStarted:
      return "StartBackward";
    case ContextPhase::kBackwardServed:
      return "ServeBackward";
  }
  return "?";
}

// Serve and Finish phases follow one phase exactly. The context is left
// idle until the phase completes.
Status EnterPhase(AttentionContext::State& st, const char* call, ContextPhase after) {
  if (st.phase != after)
    return Status::FailedPrecondition(fmt::format("{} must follow {} on its context; the last phase was: {}", call,
                                                  PhaseName(after), PhaseName(st.phase)));
  st.phase = ContextPhase::kIdle;
  return Status::Ok();
}

// A Start phase reassigns the exchange buffers: no transfer may be filling them.
Status EnterStart(AttentionContext::State& st, const char* call) {
  if (st.in_flight())
    return Status::FailedPrecondition(
        fmt::format("{}: the context's exchange after {} is still in flight", call, PhaseName(st.phase)));
  st.phase = ContextPhase::kIdle;
  return Status::Ok();
}

// Sizes the send and receive buffers from per-peer float counts.
void Size(AttentionContext::State& st, const std::vector<int64_t>& send, const std::vector<int64_t>& recv) {
  st.send_counts = send;
  st.recv_counts = recv;
  int64_t s = 0, r = 0;
  for (int64_t x : send) s += x;
  for (int64_t x : recv) r += x;
  st.send.assign(size_t(s), 0.0f);
  st.recv.assign(size_t(r), 0.0f);
}

}  // namespace

AttentionDispatcher::AttentionDispatcher(std::unique_ptr<Layout> layout) : layout_(std::move(layout)) {}
AttentionDispatcher::~AttentionDispatcher() = default;
int AttentionDispatcher::rank() const { return layout_->rank; }
int64_t AttentionDispatcher::local_tokens() const { return layout_->local_tokens; }
const DispatchTraffic& AttentionDispatcher::traffic() const { return layout_->traffic; }

int64_t AttentionDispatcher::LocalRow(int doc, int64_t pos) const {
  auto it = layout_->local_pieces.find(doc);
  if (it == layout_->local_pieces.end()) return -1;
  for (const auto& [p, row] : it->second)
    if (p.begin <= pos && pos < p.end) return row + (pos - p.begin);
  return -1;
}

Status AttentionDispatcher::Create(const Plan& plan, int rank, const DispatchOptions& o,
                                   std::unique_ptr<AttentionDispatcher>* out) {
  if (out == nullptr) return Status::InvalidArgument("out is null");
  // The layouts below index by the plan's ranks, documents and rows: a plan
  // from a file must hold together before anything is indexed.
  DISTCA_RETURN_IF_ERROR(ValidatePlanStructure(plan).WithContext("plan"));
  if (rank < 0 || rank >= plan.servers())
    return Status::InvalidArgument(fmt::format("rank {} is not in the plan's {} servers", rank, plan.servers()));
  if (plan.model.wire != PlanWire::kDistca)
    return Status::InvalidArgument(fmt::format("the plan is costed for the '{}' wire format; this runtime sends '{}'",
                                               PlanWireName(plan.model.wire), PlanWireName(PlanWire::kDistca)));
  if (o.q_heads <= 0 || o.kv_heads <= 0 || o.head_dim <= 0 || o.q_heads % o.kv_heads != 0)
    return Status::InvalidArgument(
        fmt::format("bad head shape: q_heads {}, kv_heads {}, head_dim {}", o.q_heads, o.kv_heads, o.head_dim));
  // The plan's bytes (and any budget it was built under) are what this
  // runtime sends only for its own row shape: fp32 rows of these heads.
  const PlanModel& m = plan.model;
  if (m.q_heads != o.q_heads || m.kv_heads != o.kv_heads || m.head_dim != o.head_dim ||
      m.dtype_bytes != int(sizeof(float)))
    return Status::InvalidArgument(fmt::format(
        "the plan is costed for q_heads {}, kv_heads {}, head_dim {} in {}-byte elements; this runtime sends "
        "q_heads {}, kv_heads {}, head_dim {} in 4-byte floats (plan it with that model: distca-plan --q-heads "
        "{} --kv-heads {} --head-dim {} --dtype-bytes 4)",
        m.q_heads, m.kv_heads, m.head_dim, m.dtype_bytes, o.q_heads, o.kv_heads, o.head_dim, o.q_heads, o.kv_heads,
        o.head_dim));
  auto l = std::make_unique<Layout>();
  l->rank = rank;
  l->world = plan.servers();
  l->options = o;
  l->peers.assign(l->world, PeerLayout{});

  // Local rows of every rank's pieces (each rank lays its pieces out in plan order).
  std::vector<int64_t> next_row(plan.ranks, 0);
  std::vector<std::vector<int64_t>> piece_row(plan.documents.size());
  for (size_t d = 0; d < plan.documents.size(); ++d) {
    for (const PlanPiece& p : plan.documents[d].pieces) {
      piece_row[d].push_back(next_row[p.rank]);
      if (p.rank == rank) l->local_pieces[int(d)].push_back({p, next_row[p.rank]});
      next_row[p.rank] += p.end - p.begin;
    }
  }
  l->local_tokens = rank < plan.ranks ? next_row[rank] : 0;
  // The owner's local row of position pos in piece i of a document.
  auto local_row_of = [&](int doc, size_t piece, int64_t pos) {
    return piece_row[doc][piece] + (pos - plan.documents[doc].pieces[piece].begin);
  };

  // Every server's assembled buffers, in canonical order; keep the runs that
  // touch this rank (as owner or as server).
  std::vector<std::vector<const PlanTask*>> by_server(l->world);
  for (const PlanTask& t : plan.tasks) {
    if (t.server < 0 || t.server >= l->world)
      return Status::InvalidArgument(fmt::format("a task names server {}, which does not exist", t.server));
    by_server[t.server].push_back(&t);
  }
  for (int s = 0; s < l->world; ++s) {
    auto& tasks = by_server[s];
    std::sort(tasks.begin(), tasks.end(), [](const PlanTask* a, const PlanTask* b) {
      return a->doc != b->doc ? a->doc < b->doc : a->q_begin < b->q_begin;
    });
    // Query rows.
    int64_t q_rows = 0;
    std::map<int, int64_t> kv_end;  // doc -> max q_end, ascending doc order
    std::vector<std::pair<const PlanTask*, int64_t>> q_offsets;
    for (const PlanTask* t : tasks) {
      q_offsets.push_back({t, q_rows});
      ForEachPieceOverlapping(plan.documents[t->doc], t->q_begin, t->q_end,
                              [&](size_t piece, const PlanPiece& p, int64_t lo, int64_t hi) {
                                const Run run{local_row_of(t->doc, piece, lo), q_rows + (lo - t->q_begin), hi - lo};
                                if (s == rank) l->peers[p.rank].q_in.push_back(run);
                                if (p.rank == rank) l->peers[s].q_out.push_back(run);
                              });
      q_rows += t->q_end - t->q_begin;
      kv_end[t->doc] = std::max(kv_end[t->doc], t->q_end);
    }
    // K/V prefixes, one per document.
    int64_t kv_rows = 0;
    std::map<int, int64_t> kv_offset;
    for (const auto& [doc, end] : kv_end) {
      kv_offset[doc] = kv_rows;
      ForEachPieceOverlapping(plan.documents[doc], 0, end,
                              [&](size_t piece, const PlanPiece& p, int64_t lo, int64_t hi) {
                                const Run run{local_row_of(doc, piece, lo), kv_rows + lo, hi - lo};
                                if (s == rank) l->peers[p.rank].kv_in.push_back(run);
                                if (p.rank == rank) l->peers[s].kv_out.push_back(run);
                              });
      kv_rows += end;
    }
    if (s == rank) {
      l->server_q_rows = q_rows;
      l->server_kv_rows = kv_rows;
      for (const auto& [t, off] : q_offsets)
        l->tasks.push_back({off, t->q_end - t->q_begin, kv_offset[t->doc], t->q_end});
    }
  }
  for (PeerLayout& p : l->peers) {
    for (const Run& r : p.q_out) p.q_out_rows += r.count;
    for (const Run& r : p.kv_out) p.kv_out_rows += r.count;
    for (const Run& r : p.q_in) p.q_in_rows += r.count;
    for (const Run& r : p.kv_in) p.kv_in_rows += r.count;
  }
  out->reset(new AttentionDispatcher(std::move(l)));
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// Forward.

Status AttentionDispatcher::CheckComm(const Comm& comm) const {
  const Layout& l = *layout_;
  if (comm.size() != l.world || comm.rank() != l.rank)
    return Status::InvalidArgument(fmt::format("comm is rank {} of {}, the dispatcher was built for rank {} of {}",
                                               comm.rank(), comm.size(), l.rank, l.world));
  return Status::Ok();
}

Status AttentionDispatcher::StartForward(Comm& comm, const float* q, const float* k, const float* v,
                                         AttentionContext* ctx) {
  Layout& l = *layout_;
  DISTCA_RETURN_IF_ERROR(CheckComm(comm));
  AttentionContext::State& st = ctx->state();
  DISTCA_RETURN_IF_ERROR(EnterStart(st, "StartForward"));
  const int64_t qw = QWidth(l), kw = KvWidth(l);
  st.q.assign(size_t(l.server_q_rows * qw), 0.0f);
  st.k.assign(size_t(l.server_kv_rows * kw), 0.0f);
  st.v.assign(size_t(l.server_kv_rows * kw), 0.0f);
  std::vector<int64_t> send(l.world, 0), recv(l.world, 0);
  for (int p = 0; p < l.world; ++p) {
    if (p == l.rank) continue;
    send[p] = l.peers[p].q_out_rows * qw + 2 * l.peers[p].kv_out_rows * kw;
    recv[p] = l.peers[p].q_in_rows * qw + 2 * l.peers[p].kv_in_rows * kw;
  }
  Size(st, send, recv);
  float* stream = st.send.data();
  for (int p = 0; p < l.world; ++p) {
    const PeerLayout& peer = l.peers[p];
    if (p == l.rank) {  // rows this server holds: copied, never sent
      CopyRuns(peer.q_in, q, st.q.data(), qw);
      CopyRuns(peer.kv_in, k, st.k.data(), kw);
      CopyRuns(peer.kv_in, v, st.v.data(), kw);
      continue;
    }
    stream = Gather(peer.q_out, q, qw, stream);
    stream = Gather(peer.kv_out, k, kw, stream);
    stream = Gather(peer.kv_out, v, kw, stream);
  }
  DISTCA_RETURN_IF_ERROR(Exchange(comm, l, st));
  st.phase = ContextPhase::kForwardStarted;
  return Status::Ok();
}

Status AttentionDispatcher::ServeForward(Comm& comm, AttentionContext* ctx) {
  Layout& l = *layout_;
  AttentionContext::State& st = ctx->state();
  DISTCA_RETURN_IF_ERROR(EnterPhase(st, "ServeForward", ContextPhase::kForwardStarted));
  DISTCA_RETURN_IF_ERROR(st.request.Wait());
  const int64_t qw = QWidth(l), kw = KvWidth(l);
  const float* stream = st.recv.data();
  for (int p = 0; p < l.world; ++p) {
    if (p == l.rank) continue;
    const PeerLayout& peer = l.peers[p];
    stream = Scatter(peer.q_in, stream, st.q.data(), qw);
    stream = Scatter(peer.kv_in, stream, st.k.data(), kw);
    stream = Scatter(peer.kv_in, stream, st.v.data(), kw);
  }
  // One fused call over all of this server's tasks.
  st.out.assign(st.q.size(), 0.0f);
  st.lse.assign(size_t(l.server_q_rows * StatWidth(l)), 0.0f);
  const AttentionShape shape{.total_q = l.server_q_rows,
                             .total_k = l.server_kv_rows,
                             .q_heads = l.options.q_heads,
                             .kv_heads = l.options.kv_heads,
                             .head_dim = l.options.head_dim,
                             .causal = true,
                             .softmax_scale = l.options.softmax_scale};
  DISTCA_RETURN_IF_ERROR(AttentionForward(shape, l.tasks,
                                          {st.q.data(), st.k.data(), st.v.data(), st.out.data(), st.lse.data()},
                                          l.options.exec)
                             .WithContext(fmt::format("attention server {}", l.rank)));
  // Results back to their owners.
  std::vector<int64_t> send(l.world, 0), recv(l.world, 0);
  const int heads = l.options.q_heads;
  for (int p = 0; p < l.world; ++p) {
    if (p == l.rank) continue;
    send[p] = l.peers[p].q_in_rows * (qw + heads);
    recv[p] = l.peers[p].q_out_rows * (qw + heads);
  }
  Size(st, send, recv);
  float* out_stream = st.send.data();
  for (int p = 0; p < l.world; ++p) {
    if (p == l.rank) continue;
    out_stream = Gather(l.peers[p].q_in, st.out.data(), qw, out_stream, /*use_dst=*/true);
    out_stream = GatherStats(l.peers[p].q_in, st.lse.data(), l.server_q_rows, heads, out_stream, /*use_dst=*/true);
  }
  if (l.options.backward == BackwardMode::kStateless) {
    Release(st.q, st.k, st.v);
  }
  DISTCA_RETURN_IF_ERROR(Exchange(comm, l, st));
  st.phase = ContextPhase::kForwardServed;
  return Status::Ok();
}

Status AttentionDispatcher::FinishForward(Comm&, float* out, float* lse, AttentionContext* ctx) {
  Layout& l = *layout_;
  AttentionContext::State& st = ctx->state();
  DISTCA_RETURN_IF_ERROR(EnterPhase(st, "FinishForward", ContextPhase::kForwardServed));
  DISTCA_RETURN_IF_ERROR(st.request.Wait());
  const int64_t qw = QWidth(l);
  const int heads = l.options.q_heads;
  // Rows served here go straight to their places.
  const PeerLayout& self = l.peers[l.rank];
  CopyRuns(self.q_in, st.out.data(), out, qw, /*reverse=*/true);
  for (const Run& r : self.q_in)
    for (int64_t i = 0; i < r.count; ++i)
      for (int h = 0; h < heads; ++h) lse[h * l.local_tokens + r.src + i] = st.lse[h * l.server_q_rows + r.dst + i];
  const float* stream = st.recv.data();
  for (int p = 0; p < l.world; ++p) {
    if (p == l.rank) continue;
    stream = Scatter(l.peers[p].q_out, stream, out, qw, /*use_src=*/true);
    stream = ScatterStats(l.peers[p].q_out, stream, lse, l.local_tokens, heads, /*use_src=*/true);
  }
  Release(st.out);  // O stays with its owner; servers never need it again
  // The exchange's buffers are done with; without a cache the server's
  // statistics too (the backward dispatch brings them again).
  Release(st.send, st.recv);
  if (l.options.backward == BackwardMode::kStateless) Release(st.lse);
  st.phase = ContextPhase::kForwardDone;
  return Status::Ok();
}

Status AttentionDispatcher::Forward(Comm& comm, const float* q, const float* k, const float* v, float* out, float* lse,
                                    AttentionContext* ctx) {
  DISTCA_RETURN_IF_ERROR(StartForward(comm, q, k, v, ctx));
  DISTCA_RETURN_IF_ERROR(ServeForward(comm, ctx));
  return FinishForward(comm, out, lse, ctx);
}

// ---------------------------------------------------------------------------
// Backward.

Status AttentionDispatcher::StartBackward(Comm& comm, const float* q, const float* k, const float* v, const float* out,
                                          const float* lse, const float* dout, AttentionContext* ctx) {
  Layout& l = *layout_;
  DISTCA_RETURN_IF_ERROR(CheckComm(comm));
  AttentionContext::State& st = ctx->state();
  const bool cached = l.options.backward == BackwardMode::kCached;
  if (cached && st.phase != ContextPhase::kForwardDone)
    return Status::FailedPrecondition(
        fmt::format("cached backward needs the forward of the same AttentionContext to have finished; the last "
                    "phase was: {}",
                    PhaseName(st.phase)));
  DISTCA_RETURN_IF_ERROR(EnterStart(st, "StartBackward"));
  const int64_t qw = QWidth(l), kw = KvWidth(l);
  const int heads = l.options.q_heads;
  // delta = rowsum(dO * O) per (head, local row): servers never need O.
  std::vector<float> delta(size_t(heads * l.local_tokens), 0.0f);
  for (int64_t row = 0; row < l.local_tokens; ++row) {
    for (int h = 0; h < heads; ++h) {
      const float* a = dout + (row * heads + h) * l.options.head_dim;
      const float* b = out + (row * heads + h) * l.options.head_dim;
      double sum = 0;
      for (int d = 0; d < l.options.head_dim; ++d) sum += double(a[d]) * double(b[d]);
      delta[h * l.local_tokens + row] = float(sum);
    }
  }
  if (!cached) {
    st.q.assign(size_t(l.server_q_rows * qw), 0.0f);
    st.k.assign(size_t(l.server_kv_rows * kw), 0.0f);
    st.v.assign(size_t(l.server_kv_rows * kw), 0.0f);
    st.lse.assign(size_t(l.server_q_rows * heads), 0.0f);
  }
  st.dout.assign(size_t(l.server_q_rows * qw), 0.0f);
  st.delta.assign(size_t(l.server_q_rows * heads), 0.0f);
  std::vector<int64_t> send(l.world, 0), recv(l.world, 0);
  const int64_t q_row_floats = cached ? qw + heads : 2 * qw + 2 * heads;  // [Q] dO [LSE] delta
  for (int p = 0; p < l.world; ++p) {
    if (p == l.rank) continue;
    send[p] = l.peers[p].q_out_rows * q_row_floats + (cached ? 0 : 2 * l.peers[p].kv_out_rows * kw);
    recv[p] = l.peers[p].q_in_rows * q_row_floats + (cached ? 0 : 2 * l.peers[p].kv_in_rows * kw);
  }
  Size(st, send, recv);
  float* stream = st.send.data();
  for (int p = 0; p < l.world; ++p) {
    const PeerLayout& peer = l.peers[p];
    if (p == l.rank) {
      CopyRuns(peer.q_in, dout, st.dout.data(), qw);
      for (const Run& r : peer.q_in)
        for (int64_t i = 0; i < r.count; ++i)
          for (int h = 0; h < heads; ++h) {
            st.delta[h * l.server_q_rows + r.dst + i] = delta[h * l.local_tokens + r.src + i];
            if (!cached) st.lse[h * l.server_q_rows + r.dst + i] = lse[h * l.local_tokens + r.src + i];
          }
      if (!cached) {
        CopyRuns(peer.q_in, q, st.q.data(), qw);
        CopyRuns(peer.kv_in, k, st.k.data(), kw);
        CopyRuns(peer.kv_in, v, st.v.data(), kw);
      }
      continue;
    }
    if (!cached) stream = Gather(peer.q_out, q, qw, stream);
    stream = Gather(peer.q_out, dout, qw, stream);
    if (!cached) stream = GatherStats(peer.q_out, lse, l.local_tokens, heads, stream);
    stream = GatherStats(peer.q_out, delta.data(), l.local_tokens, heads, stream);
    if (!cached) {
      stream = Gather(peer.kv_out, k, kw, stream);
      stream = Gather(peer.kv_out, v, kw, stream);
    }
  }
  DISTCA_RETURN_IF_ERROR(Exchange(comm, l, st));
  st.phase = ContextPhase::kBackwardStarted;
  return Status::Ok();
}

Status AttentionDispatcher::ServeBackward(Comm& comm, AttentionContext* ctx) {
  Layout& l = *layout_;
  AttentionContext::State& st = ctx->state();
  DISTCA_RETURN_IF_ERROR(EnterPhase(st, "ServeBackward", ContextPhase::kBackwardStarted));
  DISTCA_RETURN_IF_ERROR(st.request.Wait());
  const bool cached = l.options.backward == BackwardMode::kCached;
  const int64_t qw = QWidth(l), kw = KvWidth(l);
  const int heads = l.options.q_heads;
  const float* stream = st.recv.data();
  for (int p = 0; p < l.world; ++p) {
    if (p == l.rank) continue;
    const PeerLayout& peer = l.peers[p];
    if (!cached) stream = Scatter(peer.q_in, stream, st.q.data(), qw);
    stream = Scatter(peer.q_in, stream, st.dout.data(), qw);
    if (!cached) stream = ScatterStats(peer.q_in, stream, st.lse.data(), l.server_q_rows, heads);
    stream = ScatterStats(peer.q_in, stream, st.delta.data(), l.server_q_rows, heads);
    if (!cached) {
      stream = Scatter(peer.kv_in, stream, st.k.data(), kw);
      stream = Scatter(peer.kv_in, stream, st.v.data(), kw);
    }
  }
  st.dq.assign(st.q.size(), 0.0f);
  st.dk.assign(st.k.size(), 0.0f);
  st.dv.assign(st.v.size(), 0.0f);
  const AttentionShape shape{.total_q = l.server_q_rows,
                             .total_k = l.server_kv_rows,
                             .q_heads = l.options.q_heads,
                             .kv_heads = l.options.kv_heads,
                             .head_dim = l.options.head_dim,
                             .causal = true,
                             .softmax_scale = l.options.softmax_scale};
  AttentionBackwardArgs a;
  a.q = st.q.data();
  a.k = st.k.data();
  a.v = st.v.data();
  a.dout = st.dout.data();
  a.lse = st.lse.data();
  a.delta = st.delta.data();
  a.dq = st.dq.data();
  a.dk = st.dk.data();
  a.dv = st.dv.data();
  DISTCA_RETURN_IF_ERROR(
      AttentionBackward(shape, l.tasks, a, l.options.exec).WithContext(fmt::format("attention server {}", l.rank)));
  std::vector<int64_t> send(l.world, 0), recv(l.world, 0);
  for (int p = 0; p < l.world; ++p) {
    if (p == l.rank) continue;
    send[p] = l.peers[p].q_in_rows * qw + 2 * l.peers[p].kv_in_rows * kw;
    recv[p] = l.peers[p].q_out_rows * qw + 2 * l.peers[p].kv_out_rows * kw;
  }
  Size(st, send, recv);
  float* out_stream = st.send.data();
  for (int p = 0; p < l.world; ++p) {
    if (p == l.rank) continue;
    out_stream = Gather(l.peers[p].q_in, st.dq.data(), qw, out_stream, /*use_dst=*/true);
    out_stream = Gather(l.peers[p].kv_in, st.dk.data(), kw, out_stream, /*use_dst=*/true);
    out_stream = Gather(l.peers[p].kv_in, st.dv.data(), kw, out_stream, /*use_dst=*/true);
  }
  // The server's buffers are done with (dq/dk/dv of local rows still to place).
  Release(st.q, st.k, st.v, st.dout, st.lse, st.delta);
  DISTCA_RETURN_IF_ERROR(Exchange(comm, l, st));
  st.phase = ContextPhase::kBackwardServed;
  return Status::Ok();
}

Status AttentionDispatcher::FinishBackward(Comm&, float* dq, float* dk, float* dv, AttentionContext* ctx) {
  Layout& l = *layout_;
  AttentionContext::State& st = ctx->state();
  DISTCA_RETURN_IF_ERROR(EnterPhase(st, "FinishBackward", ContextPhase::kBackwardServed));
  DISTCA_RETURN_IF_ERROR(st.request.Wait());
  const int64_t qw = QWidth(l), kw = KvWidth(l);
  std::fill(dk, dk + l.local_tokens * kw, 0.0f);
  std::fill(dv, dv + l.local_tokens * kw, 0.0f);
  const PeerLayout& self = l.peers[l.rank];
  CopyRuns(self.q_in, st.dq.data(), dq, qw, /*reverse=*/true);
  // Partial dK/dV are summed in fp32: this rank's own server first, then the
  // other servers in rank order (a fixed order: with a one-thread CA engine,
  // whose own sums are then ordered too, runs are reproducible).
  for (const Run& r : self.kv_in) {
    for (int64_t i = 0; i < r.count * kw; ++i) {
      dk[r.src * kw + i] += st.dk[r.dst * kw + i];
      dv[r.src * kw + i] += st.dv[r.dst * kw + i];
    }
  }
  const float* stream = st.recv.data();
  for (int p = 0; p < l.world; ++p) {
    if (p == l.rank) continue;
    stream = Scatter(l.peers[p].q_out, stream, dq, qw, /*use_src=*/true);
    stream = Scatter(l.peers[p].kv_out, stream, dk, kw, /*use_src=*/true, /*add=*/true);
    stream = Scatter(l.peers[p].kv_out, stream, dv, kw, /*use_src=*/true, /*add=*/true);
  }
  Release(st.dq, st.dk, st.dv, st.send, st.recv);
  return Status::Ok();
}

Status AttentionDispatcher::WaitTransfer(AttentionContext* ctx) { return ctx->state().request.Wait(); }

bool AttentionDispatcher::TestTransfer(AttentionContext* ctx) { return ctx->state().request.Test(); }

int64_t AttentionDispatcher::PendingTransferBytes(AttentionContext* ctx) {
  int64_t bytes = 0;
  for (int64_t x : ctx->state().send_counts) bytes += x;
  for (int64_t x : ctx->state().recv_counts) bytes += x;
  return bytes;
}

Status AttentionDispatcher::Backward(Comm& comm, const float* q, const float* k, const float* v, const float* out,
                                     const float* lse, const float* dout, float* dq, float* dk, float* dv,
                                     AttentionContext* ctx) {
  DISTCA_RETURN_IF_ERROR(StartBackward(comm, q, k, v, out, lse, dout, ctx));
  DISTCA_RETURN_IF_ERROR(ServeBackward(comm, ctx));
  return FinishBackward(comm, dq, dk, dv, ctx);
}

}  // namespace distca
