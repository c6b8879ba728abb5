// Disaggregated core attention: the dispatcher and the attention server.
//
// Every rank holds the same Plan. AttentionDispatcher compiles, for this
// rank, which rows it sends to which server and where each server puts them,
// so that no layout metadata travels: messages carry exactly the rows the
// planner counts (a task's Q rows the server does not hold, the K/V rows of
// [0, max q_end) once per (document, server), none for rows the server holds).
//
// Local layout: rank r < plan.ranks holds its pieces' tokens in plan order
// (documents in order, each piece's positions ascending): Q (local, Hq, D),
// K and V (local, Hkv, D), O (local, Hq, D), LSE (Hq, local), fp32. Dedicated
// servers (ranks >= plan.ranks) hold no tokens. The Comm must have
// plan.servers() ranks.
//
// Each pass has three phases so that an executor can overlap them with other
// work: Start (pack and post the exchange to the servers), Serve (finish that
// exchange, run this rank's CA tasks, post the results back), Finish (finish
// the return exchange and place the results). Forward and Backward run all
// three. Every rank must run the phases of a pass in the same order.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "distca/attention.h"
#include "distca/comm.h"
#include "distca/plan.h"
#include "distca/status.h"

namespace distca {

enum class BackwardMode {
  kStateless,  // Default: the owner resends Q, K, V with dO, LSE and delta; servers keep nothing
  kCached,     // servers keep forward's Q, K, V and LSE until backward; the owner sends dO and delta
};

struct DispatchOptions {
  int q_heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  float softmax_scale = 0.0f;                        // Default: 1/sqrt(head_dim)
  BackwardMode backward = BackwardMode::kStateless;  // Default: stateless
  AttentionExec exec;                                // the server's CA engine settings
};

// Per-pass state: what a server keeps between forward and backward in cached
// mode, and the buffers of a pass in flight. One per (layer, nano-batch).
// Its phases run in order: StartForward, ServeForward, FinishForward, then
// (a cached backward needs that forward) StartBackward, ServeBackward,
// FinishBackward. A Serve or Finish phase called out of that order, and a
// Start phase while the context's last exchange is still in flight, fail
// with FailedPrecondition and change nothing; a phase that fails once begun
// (a failed transfer, the CA engine) leaves the context where only a Start
// phase may follow. Destroying a context waits for its exchange in flight.
class AttentionContext {
 public:
  AttentionContext();
  ~AttentionContext();
  AttentionContext(AttentionContext&&) noexcept;
  AttentionContext& operator=(AttentionContext&&) noexcept;
  struct State;
  State& state() { return *state_; }
  // Bytes of buffers the context holds allocated now: between the passes,
  // what the server caches (cached mode: its Q, K, V and statistics;
  // stateless: nothing); after the backward pass, nothing.
  int64_t held_bytes() const;

 private:
  std::unique_ptr<State> state_;
};

// Bytes this rank sent and received in the passes so far.
struct DispatchTraffic {
  int64_t sent = 0;
  int64_t received = 0;
};

class AttentionDispatcher {
 public:
  // Compiles this rank's send and receive layouts. The plan must validate.
  static Status Create(const Plan& plan, int rank, const DispatchOptions& options,
                       std::unique_ptr<AttentionDispatcher>* out);
  ~AttentionDispatcher();

  int rank() const;
  int64_t local_tokens() const;  // rows of this rank's local layout
  // Where document position `pos` of `doc` lives on this rank, or -1.
  int64_t LocalRow(int doc, int64_t pos) const;
  const DispatchTraffic& traffic() const;

  // Forward: q, k, v in; out, lse written for every local row.
  Status StartForward(Comm& comm, const float* q, const float* k, const float* v, AttentionContext* ctx);
  Status ServeForward(Comm& comm, AttentionContext* ctx);
  Status FinishForward(Comm& comm, float* out, float* lse, AttentionContext* ctx);
  Status Forward(Comm& comm, const float* q, const float* k, const float* v, float* out, float* lse,
                 AttentionContext* ctx);

  // Backward from dO and the forward's O and LSE (q, k, v are needed in
  // stateless mode and ignored in cached mode). Writes dq; dk and dv are
  // overwritten with the sum of every server's partial gradients (fp32).
  Status StartBackward(Comm& comm, const float* q, const float* k, const float* v, const float* out, const float* lse,
                       const float* dout, AttentionContext* ctx);
  Status ServeBackward(Comm& comm, AttentionContext* ctx);
  Status FinishBackward(Comm& comm, float* dq, float* dk, float* dv, AttentionContext* ctx);
  Status Backward(Comm& comm, const float* q, const float* k, const float* v, const float* out, const float* lse,
                  const float* dout, float* dq, float* dk, float* dv, AttentionContext* ctx);

  // Waits for the exchange the last Start or Serve phase of `ctx` posted.
  // The next phase waits for it anyway; an executor calls this on its comm
  // thread so that the transfer progresses while compute runs. Thread-safe
  // with respect to phases on other contexts.
  static Status WaitTransfer(AttentionContext* ctx);
  // True when WaitTransfer would not block; drives MPI progress.
  static bool TestTransfer(AttentionContext* ctx);
  // Bytes sent plus received by that exchange.
  static int64_t PendingTransferBytes(AttentionContext* ctx);

  struct Layout;

 private:
  explicit AttentionDispatcher(std::unique_ptr<Layout> layout);
  // The comm is the one the dispatcher was built for (its rank and size).
  Status CheckComm(const Comm& comm) const;
  std::unique_ptr<Layout> layout_;
};

}  // namespace distca
